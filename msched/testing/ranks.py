"""Run functions on N CPU ranks of a real ``torch.distributed`` (gloo) group.

`RankPool` and `run_on_ranks` are how msched tests sharded graphs (tensor-parallel
all-reduces, expert-parallel all-to-alls) on one CPU machine; the pytest plugin's
``msched_ranks`` fixture runs on a `RankPools` kept for the whole session.  Why processes: a
collective needs every rank of its group to take part, so the ranks must run at once, each
with its own ``torch.distributed`` state.  Starting a rank imports torch (seconds), so a pool
starts its ranks once and runs many functions on them; `run_on_ranks` is a pool used once.

How:

1. ``fn``, its arguments and the settings are pickled in the parent, so a lambda or a local
   function fails at once with `msched.InvalidArgumentError` instead of in ``world_size``
   children, and before any process starts.
2. On the first call (and the first after a failure) ``world_size`` processes are started in
   the ``spawn`` context (never ``fork``: torch's threads do not survive it).  Each joins
   ``gloo`` through a file store in a new temporary folder only the user can read (no TCP
   store: one listens on every interface of the machine), with gloo's own sockets on the
   loopback interface unless ``GLOO_SOCKET_IFNAME`` says otherwise, and reports that it is
   ready.  The folder is removed when the ranks are stopped.
3. Each call sends every rank, over its own pipe, the pickled ``fn`` and the parent's
   environment variables, working directory and ``sys.path`` at the time of the call.  The
   rank takes them over (as a process started then would have them), resets the process-wide
   state listed in `RankPool` to what it was right after the rank joined its group, calls
   ``fn(rank, world_size, *args, **kwargs)``, moves the tensors of the result to the CPU and
   sends the result back pickled.  An exception is sent back as its traceback, and the rank
   then waits to be killed (leaving would fail its peers with a secondary error that could
   reach the parent first).
4. The parent waits for every rank until ``timeout`` seconds have passed.  A rank that raised,
   or died without a result, makes it kill every rank (a peer may be stuck in a collective)
   and raise `msched.RankFailedError` with the rank and the child's traceback; the timeout
   kills every rank and raises `msched.RanksTimeoutError` naming the ranks that had not
   finished.  The next call starts fresh processes.

A hang in a collective (one rank skips it, or the ranks call them in different orders) is
therefore a test failure after ``timeout`` seconds, not a run that never ends.  No rank
outlives its pool: `RankPool.close` stops them (the pool's finalizer and an ``atexit`` hook do
it when the pool is forgotten or the interpreter exits), and a rank whose parent process has
gone (killed, or crashed) exits within a second on its own.
"""

from __future__ import annotations

import datetime
import math
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from msched.errors import InvalidArgumentError, RankFailedError, RanksTimeoutError, one_line
from msched.limits import positive_int

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

__all__ = ["DEFAULT_TIMEOUT", "MAX_WORLD_SIZE", "RankPool", "RankPools", "run_on_ranks"]

#: Seconds a call waits for all ranks by default, and a pool waits for its ranks to start
#: (starting each process imports torch: a few seconds per rank on a busy machine).
DEFAULT_TIMEOUT = 120.0
#: The most ranks a pool runs.  Each rank is a CPU process that imports torch (about 200-300
#: MB of memory, and seconds of CPU to start), so 16 ranks already take 3-5 GB; a typo such
#: as ``world_size=300`` would exhaust a test machine's memory before any timeout fires.  The
#: graphs msched tests shard over 2-8 ranks (tensor and expert parallelism within one node).
MAX_WORLD_SIZE = 16
_WHY_MAX_WORLD_SIZE = (
    f"a pool runs at most MAX_WORLD_SIZE = {MAX_WORLD_SIZE} ranks (each is a process that "
    "imports torch, 200-300 MB of memory)"
)
#: True in a rank's process: a function running on a rank cannot start ranks of its own (a
#: rank is a daemon process, and those may not have children).
_IN_RANK = False
_LOOPBACK_NAMES = ("lo", "lo0")
#: gloo's own limit on a collective; the parent's timeout stops a hung call long before.
_GROUP_TIMEOUT = datetime.timedelta(hours=6)
#: Seconds the ranks get to exit when a pool closes (they exit at once: nothing to tear down).
_CLOSE_GRACE = 5.0
#: How often (seconds) a rank looks whether its parent process is still there.
_PARENT_POLL = 0.5


def run_on_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = DEFAULT_TIMEOUT,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` CPU ranks of one gloo
    process group and return each rank's result, in rank order.

    The one-shot form of `RankPool`: it starts ``world_size`` processes, runs ``fn`` once and
    stops them; ``timeout`` counts the start of the processes too.  Use a `RankPool` (or the
    ``msched_ranks`` fixture) to run several functions on one start.

    ``fn`` runs inside an initialised default group (``torch.distributed.get_rank()`` agrees
    with ``rank``; its name, ``"0"``, is what functional collectives name it by).  ``fn``,
    ``args``, ``kwargs`` and the results must pickle: ``fn`` is a module-level function (or a
    ``functools.partial`` of one), not a lambda or a local function.  Tensors in the result
    (also inside lists, tuples and dicts) come back on the CPU.  ``world_size`` and
    ``timeout`` are taken by this function, so ``fn`` cannot receive keyword arguments of
    those names.

    Raises `msched.InvalidArgumentError` for a ``world_size`` that is not an int in
    ``1..MAX_WORLD_SIZE``, a ``timeout`` that is not a finite number > 0, an ``fn`` that is
    not callable or does not pickle, or a call from a function running on a rank (nested
    ranks are not supported), all before any process starts; `msched.RankFailedError` when
    a rank raises (its message names the exception: a result that does not pickle, too) or
    dies; `msched.RanksTimeoutError` when the ranks have not all finished after ``timeout``
    seconds (all are killed).
    """
    payload = _checked_payload(fn, args, kwargs, world_size, timeout)
    with RankPool(world_size, start_timeout=timeout) as pool:
        return pool._call(payload, timeout, time.monotonic() + timeout)


class RankPool:
    """``world_size`` CPU processes joined in one gloo group once, running many functions.

    ``pool.run(fn, *args, timeout=120.0, **kwargs)`` is `run_on_ranks` on the pool's
    processes: the same arguments, checks, results and errors, but the processes are started
    by the first call (``start_timeout`` seconds at most, not counted in its ``timeout``) and
    kept for the next.  After a call that fails (a rank raised or died, or time ran out) every
    rank is killed, and the next call starts new ones.  ``close()`` (or leaving a ``with``
    block) stops the ranks; a closed pool starts again if it is called again.  A pool belongs
    to the process (and thread) that made it.

    What a call sees: each call runs in the same processes and the same default process group
    as the calls before it.  Before each call a rank takes over the parent's environment
    variables, working directory and ``sys.path`` as they are at that moment, and resets to
    their values right after it joined its group: torch's global random generator (reseeded
    with the seed it started with, so each call draws what the first call drew; seed it
    yourself where the numbers matter), grad mode, the default dtype and the number of
    intra-op threads.  When something
    has been compiled, Dynamo's in-memory caches are reset (`torch.compiler.reset`) and so
    are Inductor's in-process caches, as in a new process; caches on disk are kept.  Anything
    else a function leaves behind stays for the next: modules it imported and their globals,
    process groups it made with ``new_group``, Python's ``random`` state, environment
    variables read only when torch was imported.  A function that destroys the default group
    gets its results, and the pool starts new processes for the next call.
    """

    def __init__(self, world_size: int = 2, *, start_timeout: float = DEFAULT_TIMEOUT) -> None:
        self._world_size = _check_world_size(world_size)
        _check_timeout(start_timeout, "start_timeout")
        self._start_timeout = float(start_timeout)
        self._owner = os.getpid()
        self._processes: list[BaseProcess] = []  # mutated in place: the finalizer holds it
        self._connections: list[Connection] = []
        self._folders: list[str] = []  # the rendezvous folder of the running ranks
        self._finalizer = weakref.finalize(
            self, _kill, self._processes, self._connections, self._owner, self._folders
        )

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self._world_size

    @property
    def pids(self) -> tuple[int, ...]:
        """The process ids of the running ranks, in rank order; ``()`` when none run."""
        return tuple(p.pid for p in self._processes if p.pid is not None)

    def run(
        self, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TIMEOUT, **kwargs: Any
    ) -> list[Any]:
        """``fn(rank, world_size, *args, **kwargs)`` on every rank; each rank's result, in
        rank order.  Raises what `run_on_ranks` raises; ``timeout`` counts from the moment the
        ranks (started first if none run) are sent the call."""
        payload = _checked_payload(fn, args, kwargs, self._world_size, timeout)
        return self._call(payload, timeout, None)

    def close(self) -> None:
        """Ask every rank to exit (flushing its output); kill those still running after a few
        seconds.  Nothing is left running; a later `run` starts new ranks."""
        if os.getpid() != self._owner:
            return
        for connection in self._connections:
            try:
                connection.send_bytes(b"")
            except OSError:  # that rank is gone already
                pass
        _stop(self._processes, _CLOSE_GRACE)
        self._kill()

    def __enter__(self) -> RankPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RankPool(world_size={self._world_size}, pids={list(self.pids)})"

    def _call(self, payload: bytes, timeout: float, deadline: float | None) -> list[Any]:
        """Run a checked payload; ``deadline`` (the clock of `time.monotonic`) bounds the
        start and the call together, else the call gets ``timeout`` after the start."""
        if os.getpid() != self._owner:
            raise RuntimeError("a RankPool runs only in the process that made it")
        try:
            if not self._running():
                self._start(deadline)
            message = pickle.dumps((payload, dict(os.environ), os.getcwd(), list(sys.path)))
            for rank, connection in enumerate(self._connections):
                try:
                    connection.send_bytes(message)
                except OSError:
                    _raise_died(rank, self._processes[rank])
            if deadline is None:
                deadline = time.monotonic() + timeout
            replies = self._collect(deadline, timeout, starting=False)
        except BaseException:
            self._kill()  # a peer may be stuck in a collective
            raise
        if any(reply.retire for reply in replies):  # a function left its default group
            self.close()
        return [pickle.loads(reply.result or b"") for reply in replies]

    def _running(self) -> bool:
        """Whether every rank runs; if one has gone (killed from outside), stop the rest."""
        if self._processes and all(p.exitcode is None for p in self._processes):
            return True
        self._kill()
        return False

    def _kill(self) -> None:
        _kill(self._processes, self._connections, self._owner, self._folders)

    def _start(self, deadline: float | None) -> None:
        try:
            self._spawn()
            if deadline is None:
                deadline = time.monotonic() + self._start_timeout
            self._collect(deadline, self._start_timeout, starting=True)
        except RankFailedError:
            self._kill()
            raise

    def _spawn(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        folder = tempfile.mkdtemp(prefix="msched-ranks-")  # mode 0700: the user's only
        self._folders.append(folder)
        init_method = "file://" + os.path.join(folder, "rendezvous")
        for rank in range(self._world_size):
            parent_end, child_end = context.Pipe(duplex=True)
            process = context.Process(
                target=_rank_main,
                args=(rank, self._world_size, init_method, child_end, os.getpid()),
                name=f"msched-rank-{rank}",
                daemon=True,
            )
            self._processes.append(process)
            self._connections.append(parent_end)
            process.start()
            child_end.close()  # the parent's copy: the rank sees EOF if the parent goes

    def _collect(self, deadline: float, timeout: float, *, starting: bool) -> list[_Reply]:
        """Every rank's reply, in rank order; raise as soon as one failed, a process died or
        time ran out."""
        from multiprocessing.connection import wait

        replies: dict[int, _Reply] = {}
        while len(replies) < self._world_size:
            waiting = [r for r in range(self._world_size) if r not in replies]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                _raise_timeout(waiting, self._world_size, timeout, starting)
            connections = [self._connections[r] for r in waiting]
            sentinels = [self._processes[r].sentinel for r in waiting]
            ready = wait([*connections, *sentinels], timeout=remaining)
            for rank in waiting:
                if self._connections[rank] in ready:
                    replies[rank] = self._receive(rank)
            for rank in waiting:
                if rank in replies or self._processes[rank].sentinel not in ready:
                    continue
                if not self._connections[rank].poll():  # else its reply is read next round
                    _raise_died(rank, self._processes[rank])
        return [replies[rank] for rank in range(self._world_size)]

    def _receive(self, rank: int) -> _Reply:
        try:
            reply = pickle.loads(self._connections[rank].recv_bytes())
        except (EOFError, OSError):
            _raise_died(rank, self._processes[rank])
        assert isinstance(reply, _Reply)
        if reply.error:
            cause = next((ln for ln in reversed(reply.error.splitlines()) if ln.strip()), "")
            raise RankFailedError(
                f"rank {rank} raised {cause.strip()}; every rank was stopped.  Its "
                f"traceback:\n{reply.error}",
                rank=rank,
                child_traceback=reply.error,
            )
        return reply


class RankPools:
    """One `RankPool` per world size, each started on first use: what the ``msched_ranks``
    fixture returns ``run`` of, for a whole test session."""

    def __init__(self, *, start_timeout: float = DEFAULT_TIMEOUT) -> None:
        _check_timeout(start_timeout, "start_timeout")
        self._start_timeout = start_timeout
        self._pools: dict[int, RankPool] = {}

    def pool(self, world_size: int = 2) -> RankPool:
        """The pool of ``world_size`` ranks (made now if there is none yet)."""
        _check_world_size(world_size)
        if world_size not in self._pools:
            self._pools[world_size] = RankPool(world_size, start_timeout=self._start_timeout)
        return self._pools[world_size]

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        world_size: int = 2,
        timeout: float = DEFAULT_TIMEOUT,
        **kwargs: Any,
    ) -> list[Any]:
        """`RankPool.run` on the pool of ``world_size`` ranks."""
        payload = _checked_payload(fn, args, kwargs, world_size, timeout)
        return self.pool(world_size)._call(payload, timeout, None)

    def close(self) -> None:
        """Close every pool."""
        for pool in self._pools.values():
            pool.close()


def _check_world_size(world_size: object) -> int:
    return positive_int(world_size, "world_size", MAX_WORLD_SIZE, _WHY_MAX_WORLD_SIZE)


def _check_timeout(timeout: object, name: str) -> None:
    """A positive, finite number of seconds: infinity is refused (a hang must fail, and the
    ranks' waits cannot take it), as are NaN, bools and other types."""
    number = isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
    if not number or not 0 < timeout < math.inf:  # type: ignore[operator]
        raise InvalidArgumentError(
            f"{name} must be a finite number of seconds > 0, got {timeout!r} (a call that "
            "hangs must fail after some time: give a large number for a slow one)"
        )


def _checked_payload(
    fn: object, args: tuple[Any, ...], kwargs: Mapping[str, Any], world_size: int, timeout: float
) -> bytes:
    if _IN_RANK:
        raise InvalidArgumentError(
            "run_on_ranks and RankPool.run cannot be called from a function running on a rank "
            "(nested ranks are not supported: a rank is a daemon process, which may not start "
            "processes); call the collectives of the group the rank is in instead"
        )
    _check_world_size(world_size)
    _check_timeout(timeout, "timeout")
    if not callable(fn):
        raise InvalidArgumentError(f"fn must be callable, got {fn!r} ({type(fn).__name__})")
    try:
        return pickle.dumps((fn, args, dict(kwargs)))
    except Exception as error:
        raise InvalidArgumentError(
            f"the ranks receive fn and its arguments pickled, and "
            f"{getattr(fn, '__qualname__', fn)!r} or an argument does not pickle ({error}): "
            "use a function defined at module level (or functools.partial of one), not a "
            "lambda or a function defined inside another"
        ) from error


@dataclass
class _Reply:
    """What one rank sends back: its result (pickled; ``None`` for "joined the group"), or
    the text of its traceback; ``retire`` when the call left the rank outside its group."""

    rank: int
    result: bytes | None
    error: str
    retire: bool = False


def _raise_died(rank: int, process: BaseProcess) -> NoReturn:
    process.join(timeout=1.0)
    raise RankFailedError(
        f"rank {rank} exited with code {process.exitcode} without a result (killed, or it "
        "called os._exit or sys.exit): every rank was stopped",
        rank=rank,
    )


def _raise_timeout(late: list[int], world_size: int, timeout: float, starting: bool) -> None:
    if starting:
        raise RanksTimeoutError(
            f"ranks {late} of {world_size} had not joined the gloo group after {timeout:g} s "
            "and were killed (starting a rank imports torch: raise the timeout on a busy "
            "machine)",
            ranks=tuple(late),
            timeout=timeout,
        )
    raise RanksTimeoutError(
        f"ranks {late} of {world_size} had not finished after {timeout:g} s and were killed "
        "(a rank waiting in a collective the others never join: one skipped it, or they "
        "issued collectives in different orders); raise timeout= if they are only slow",
        ranks=tuple(late),
        timeout=timeout,
    )


def _stop(processes: list[BaseProcess], grace: float) -> None:
    """Give the processes ``grace`` seconds in all to exit."""
    deadline = time.monotonic() + grace
    for process in processes:
        if process.pid is not None:
            process.join(timeout=max(0.0, deadline - time.monotonic()))


def _kill(
    processes: list[BaseProcess], connections: list[Connection], owner: int, folders: list[str]
) -> None:
    """Kill and reap every process still running, close the pipes, remove the rendezvous
    folders, empty the lists (in the ``owner`` process only: the ranks are not the children of
    any other)."""
    if os.getpid() != owner:
        return
    for process in processes:
        if process.pid is not None and process.exitcode is None:
            process.kill()
    for process in processes:
        if process.pid is not None:
            process.join(timeout=5)
    for connection in connections:
        connection.close()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    processes.clear()
    connections.clear()
    folders.clear()


# --- the rank's side ------------------------------------------------------------------------


@dataclass
class _Baseline:
    """The process-wide state a rank resets before each call: as it was once it joined."""

    seed: int
    grad: bool
    dtype: Any
    threads: int
    gloo_ifname: str | None

    @classmethod
    def now(cls) -> _Baseline:
        import torch

        return cls(
            seed=torch.initial_seed(),
            grad=torch.is_grad_enabled(),
            dtype=torch.get_default_dtype(),
            threads=torch.get_num_threads(),
            gloo_ifname=os.environ.get("GLOO_SOCKET_IFNAME"),
        )

    def apply(self, environ: dict[str, str], cwd: str, path: list[str]) -> None:
        import torch

        if self.gloo_ifname is not None:
            environ.setdefault("GLOO_SOCKET_IFNAME", self.gloo_ifname)
        for key in [key for key in os.environ if key not in environ]:
            del os.environ[key]
        for key, value in environ.items():
            if os.environ.get(key) != value:
                os.environ[key] = value
        os.chdir(cwd)
        sys.path[:] = path
        torch.manual_seed(self.seed)
        torch.set_grad_enabled(self.grad)
        torch.set_default_dtype(self.dtype)
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if "torch._dynamo" in sys.modules:
            torch.compiler.reset()
        if "torch._inductor.utils" in sys.modules:
            from torch._inductor.utils import clear_caches

            clear_caches()


def _rank_main(
    rank: int, world_size: int, init_method: str, connection: Connection, parent: int
) -> None:
    """The body of one rank's process (module level, so that ``spawn`` can import it)."""
    global _IN_RANK  # noqa: PLW0603 - set once, in the rank's own process
    _IN_RANK = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the ranks
    _exit_with_parent(parent)
    try:
        _join_group(rank, world_size, init_method)
        baseline = _Baseline.now()
        reply = _Reply(rank, None, "")
    except BaseException:
        reply = _Reply(rank, None, traceback.format_exc() or "(no traceback)")
    while True:
        try:
            connection.send_bytes(pickle.dumps(reply))
        except OSError:  # the parent has gone
            return
        if reply.error:
            # Leaving would close this rank's sockets and fail its peers with "connection
            # closed by peer", which could reach the parent before this error: wait to be
            # killed (or for the parent to go).
            _wait_for_the_parent(connection)
            return
        try:
            message = connection.recv_bytes()
        except (EOFError, OSError):  # the parent has gone
            return
        if not message:  # close: nothing to tear down (gloo's sockets close with the process)
            _flush()
            os._exit(0)
        reply = _run_one(rank, world_size, message, baseline)
        _flush()  # what fn printed reaches the terminal even if this rank is killed next


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # closed or replaced by fn
            pass


def _run_one(rank: int, world_size: int, message: bytes, baseline: _Baseline) -> _Reply:
    import torch.distributed as dist

    try:
        payload, environ, cwd, path = pickle.loads(message)
        baseline.apply(environ, cwd, path)
        fn, args, kwargs = pickle.loads(payload)
        value = _to_cpu(fn(rank, world_size, *args, **kwargs))
        try:
            result = pickle.dumps(value)
        except Exception as error:
            raise InvalidArgumentError(
                f"the result of fn ({type(value).__name__}) does not pickle: {one_line(error)} "
                "(return tensors, numbers, strings and containers of them)"
            ) from error
    except BaseException:
        return _Reply(rank, None, traceback.format_exc() or "(no traceback)")
    return _Reply(rank, result, "", retire=not dist.is_initialized())


def _wait_for_the_parent(connection: Connection) -> None:
    try:
        connection.recv_bytes()
    except (EOFError, OSError):
        pass


def _exit_with_parent(parent: int) -> None:
    """Exit this process soon after ``parent`` is gone, even while a collective hangs."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_POLL)
        os._exit(1)

    threading.Thread(target=watch, name="msched-rank-parent-watch", daemon=True).start()


def _join_group(rank: int, world_size: int, init_method: str) -> None:
    _loopback_for_gloo()
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=_GROUP_TIMEOUT,
    )


def _loopback_for_gloo() -> None:
    """Keep gloo's sockets on the loopback interface unless the user chose one."""
    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    names = {name for _, name in socket.if_nameindex()}
    for name in _LOOPBACK_NAMES:
        if name in names:
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it (inside lists, tuples and dicts too) on the CPU."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_to_cpu(v) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: _to_cpu(v) for k, v in value.items()}
    return value

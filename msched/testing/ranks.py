"""Run a function on N CPU ranks of a real ``torch.distributed`` (gloo) group.

`run_on_ranks` is how msched tests sharded graphs (tensor-parallel all-reduces, expert-parallel
all-to-alls) on one CPU machine, and what the pytest plugin's ``msched_ranks`` fixture returns.
Why processes: a collective needs every rank of its group to take part, so the ranks must run
at once, each with its own ``torch.distributed`` state.

How:

1. ``fn``, its arguments and the settings are pickled in the parent, so a lambda or a local
   function fails at once with `msched.InvalidArgumentError` instead of in ``world_size``
   children.
2. A free port on 127.0.0.1 is taken by binding a socket to port 0; ``world_size`` processes
   are started in the ``spawn`` context (never ``fork``: torch's threads do not survive it).
3. Each child joins ``gloo`` at ``tcp://127.0.0.1:<port>`` (gloo's own sockets on the loopback
   interface unless ``GLOO_SOCKET_IFNAME`` says otherwise), calls ``fn(rank, world_size,
   *args, **kwargs)``, moves the tensors of the result to the CPU, pickles it and sends it
   back; then it destroys its process group.  An exception is sent back as its traceback, and
   the rank then waits to be killed (leaving would fail its peers with a secondary error that
   could reach the parent first).
4. The parent waits for every rank until ``timeout`` seconds have passed in all.  A rank that
   raised, or died without a result, kills every rank and raises `msched.RankFailedError`
   with the rank and the child's traceback; the timeout kills every rank and raises
   `msched.RanksTimeoutError` naming the ranks that had not finished.  When rank 0 finds the
   port taken (another process bound it between steps 2 and 3), the run starts over once on
   a new port.

A hang in a collective (one rank skips it, or the ranks call them in different orders) is
therefore a test failure after ``timeout`` seconds, not a run that never ends.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue as queue_module
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from msched.errors import InvalidArgumentError, RankFailedError, RanksTimeoutError
from msched.limits import positive_int

__all__ = ["DEFAULT_TIMEOUT", "run_on_ranks"]

#: Seconds `run_on_ranks` waits for all ranks by default (starting each process imports torch:
#: a few seconds per rank on a busy machine).
DEFAULT_TIMEOUT = 120.0
_HOST = "127.0.0.1"
_PORT_TAKEN = ("EADDRINUSE", "Address already in use")
_LOOPBACK_NAMES = ("lo", "lo0")


def run_on_ranks(
    fn: Callable[..., Any],
    *args: Any,
    world_size: int = 2,
    timeout: float = DEFAULT_TIMEOUT,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` CPU ranks of one gloo
    process group and return each rank's result, in rank order.

    ``fn`` runs inside an initialised default group (``torch.distributed.get_rank()`` agrees
    with ``rank``; its name, ``"0"``, is what functional collectives name it by).  ``fn``,
    ``args``, ``kwargs`` and the results must pickle: ``fn`` is a module-level function (or a
    ``functools.partial`` of one), not a lambda or a local function.  Tensors in the result
    (also inside lists, tuples and dicts) come back on the CPU.  ``world_size`` and
    ``timeout`` are taken by this function, so ``fn`` cannot receive keyword arguments of
    those names.

    Raises `msched.InvalidArgumentError` for a ``world_size`` that is not an int >= 1, a
    ``timeout`` that is not a positive number, or an ``fn`` that is not callable or does not
    pickle; `msched.RankFailedError` when a rank raises or dies; `msched.RanksTimeoutError`
    when the ranks have not all finished after ``timeout`` seconds (all are killed).
    """
    payload = _checked_payload(fn, args, kwargs, world_size, timeout)
    try:
        return _run(payload, world_size, timeout)
    except RankFailedError as error:
        if not _port_was_taken(error):
            raise
    return _run(payload, world_size, timeout)


def _port_was_taken(error: RankFailedError) -> bool:
    """Whether rank 0 failed to bind the port chosen for the run (taken since it was free)."""
    return error.rank == 0 and any(marker in error.child_traceback for marker in _PORT_TAKEN)


def _checked_payload(
    fn: object, args: tuple[Any, ...], kwargs: Mapping[str, Any], world_size: int, timeout: float
) -> bytes:
    positive_int(world_size, "world_size")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(f"timeout must be a number of seconds > 0, got {timeout!r}")
    if not callable(fn):
        raise InvalidArgumentError(f"fn must be callable, got {fn!r} ({type(fn).__name__})")
    try:
        return pickle.dumps((fn, args, dict(kwargs)))
    except Exception as error:
        raise InvalidArgumentError(
            f"run_on_ranks sends fn and its arguments to the rank processes by pickling, and "
            f"{getattr(fn, '__qualname__', fn)!r} or an argument does not pickle ({error}): "
            "use a function defined at module level (or functools.partial of one), not a "
            "lambda or a function defined inside another"
        ) from error


@dataclass
class _Reply:
    """What one rank sends back: its result (pickled) or the text of its traceback."""

    rank: int
    result: bytes | None
    error: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def _run(payload: bytes, world_size: int, timeout: float) -> list[Any]:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    init_method = f"tcp://{_HOST}:{_free_port()}"
    processes = [
        context.Process(
            target=_child,
            args=(rank, world_size, init_method, timeout, payload, queue),
            name=f"msched-rank-{rank}",
            daemon=True,
        )
        for rank in range(world_size)
    ]
    grace = 0.0  # a failed run kills every rank at once
    try:
        for process in processes:
            process.start()
        replies = _collect(queue, processes, timeout)
        grace = 5.0  # each rank has sent its result and is leaving its group
    finally:
        _stop(processes, grace)
        queue.close()
    return [pickle.loads(replies[rank].result or b"") for rank in range(world_size)]


def _collect(queue: Any, processes: list[Any], timeout: float) -> dict[int, _Reply]:
    """Every rank's reply; raise as soon as one failed, a process died or time ran out."""
    deadline = time.monotonic() + timeout
    replies: dict[int, _Reply] = {}
    while len(replies) < len(processes):
        try:
            reply = queue.get(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
        except queue_module.Empty:  # look at the processes and the clock
            _check_alive(processes, replies, queue)
            if time.monotonic() >= deadline:
                _raise_timeout(processes, replies, timeout)
            continue
        if reply.error:
            _raise_failed(reply)
        replies[reply.rank] = reply
    return replies


def _check_alive(processes: list[Any], replies: dict[int, _Reply], queue: Any) -> None:
    """Raise for a rank whose process ended without a reply (killed, or exited early)."""
    for rank, process in enumerate(processes):
        if rank in replies or process.exitcode is None:
            continue
        try:  # its reply may have arrived after the last look at the queue
            reply = queue.get(timeout=0.5)
        except queue_module.Empty:
            reply = None
        if reply is not None:
            if reply.error:
                _raise_failed(reply)
            replies[reply.rank] = reply
            continue
        raise RankFailedError(
            f"rank {rank} of {len(processes)} exited with code {process.exitcode} without "
            "a result (killed, or it called os._exit or sys.exit): every rank was stopped",
            rank=rank,
        )


def _raise_failed(reply: _Reply) -> None:
    raise RankFailedError(
        f"rank {reply.rank} raised; every rank was stopped.  Its traceback:\n{reply.error}",
        rank=reply.rank,
        child_traceback=reply.error,
    )


def _raise_timeout(processes: list[Any], replies: dict[int, _Reply], timeout: float) -> None:
    late = tuple(rank for rank in range(len(processes)) if rank not in replies)
    raise RanksTimeoutError(
        f"ranks {list(late)} of {len(processes)} had not finished after {timeout:g} s and "
        "were killed (a rank waiting in a collective the others never join: one skipped it, "
        "or they issued collectives in different orders); raise timeout= if they are only slow",
        ranks=late,
        timeout=timeout,
    )


def _stop(processes: list[Any], grace: float) -> None:
    """Give the ranks ``grace`` seconds in all to exit, then kill the rest and reap them."""
    deadline = time.monotonic() + grace
    for process in processes:
        if process.pid is not None:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.pid is not None and process.exitcode is None:
            process.kill()
            process.join(timeout=5)


def _child(
    rank: int, world_size: int, init_method: str, timeout: float, payload: bytes, queue: Any
) -> None:
    """The body of one rank's process (module level, so that ``spawn`` can import it)."""
    import torch.distributed as dist

    try:
        _join_group(rank, world_size, init_method, timeout)
        fn, args, kwargs = pickle.loads(payload)
        reply = _Reply(rank, pickle.dumps(_to_cpu(fn(rank, world_size, *args, **kwargs))), "")
    except BaseException:
        reply = _Reply(rank, None, traceback.format_exc() or "(no traceback)")
    _send(queue, reply)
    if reply.error:
        # Leaving would close this rank's sockets and fail its peers with "connection closed
        # by peer", which could reach the parent before this error: wait to be killed.
        time.sleep(timeout)
    elif dist.is_initialized():
        dist.destroy_process_group()


def _send(queue: Any, reply: _Reply) -> None:
    queue.put(reply)
    queue.close()
    queue.join_thread()


def _join_group(rank: int, world_size: int, init_method: str, timeout: float) -> None:
    _loopback_for_gloo()
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout),
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

"""`RankPool` and `run_on_ranks`: functions on N real gloo ranks, results in rank order,
failures named, processes reused until a failure and never left behind.

Starting ranks imports torch in each (a few seconds), so the tests share the session's pool of
the ``msched_ranks`` fixture where they can: the failure tests kill it by design and check that
the next call starts it again, which leaves it running for the tests after them.  A hang is
given a timeout of a few seconds, so it fails here instead of hanging the run.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import msched
from msched.testing.ranks import MAX_WORLD_SIZE, RankPool, RankPools, run_on_ranks

RunOnRanks = Callable[..., list[Any]]


def _all_reduced(rank: int, world_size: int, scale: float, *, offset: float = 0.0) -> dict:
    t = torch.full((2,), float(rank + 1)) * scale + offset
    dist.all_reduce(t)
    return {
        "rank": rank,
        "dist_rank": dist.get_rank(),
        "size": world_size,
        "sum": [t],
        "pid": os.getpid(),
    }


def _pid_and_sum(rank: int, world_size: int, scale: float) -> tuple[int, float]:
    t = torch.tensor([float(rank + 1) * scale])
    dist.all_reduce(t)
    return os.getpid(), t.item()


def _raises_on_rank_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("rank one cannot go on")
    dist.barrier()  # rank 0 would wait here for ever: the parent stops it
    return rank


def _skips_the_collective_on_rank_one(rank: int, world_size: int) -> int:
    if rank != 1:
        dist.all_reduce(torch.ones(1))
    else:  # goes on with other work; were it to leave, gloo would fail rank 0 at once
        time.sleep(600)
    return rank


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _pids(run: RunOnRanks) -> list[int]:
    return [pid for pid, _ in run(_pid_and_sum, 1.0)]


def test_results_come_back_in_rank_order_and_the_one_shot_form_leaves_no_process() -> None:
    results = run_on_ranks(_all_reduced, 2.0, world_size=3, offset=1.0)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert [r["dist_rank"] for r in results] == [0, 1, 2]
    assert {r["size"] for r in results} == {3}
    for r in results:  # (1+2+3) * 2 + 3 * 1
        assert torch.equal(r["sum"][0], torch.full((2,), 15.0))
    pids = {r["pid"] for r in results}
    assert len(pids) == 3 and os.getpid() not in pids
    assert not any(_alive(pid) for pid in pids)  # its pool was closed


def test_a_partial_of_a_module_function_runs(msched_ranks: RunOnRanks) -> None:
    results = msched_ranks(functools.partial(_all_reduced, scale=1.0))
    assert [r["rank"] for r in results] == [0, 1]


def test_many_calls_on_the_pool_run_in_the_same_processes(msched_ranks: RunOnRanks) -> None:
    first = msched_ranks(_pid_and_sum, 1.0)
    pids = [pid for pid, _ in first]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    for scale in (1.0, 2.0, 3.0, 4.0, 5.0):
        assert msched_ranks(_pid_and_sum, scale) == [(pid, 3.0 * scale) for pid in pids]


def test_an_exception_on_rank_one_names_the_rank_and_the_next_call_starts_afresh(
    msched_ranks: RunOnRanks,
) -> None:
    before = _pids(msched_ranks)
    start = time.monotonic()
    with pytest.raises(msched.RankFailedError, match="rank 1 raised") as raised:
        msched_ranks(_raises_on_rank_one, timeout=60.0)
    assert raised.value.rank == 1
    assert "ValueError: rank one cannot go on" in raised.value.child_traceback
    assert "_raises_on_rank_one" in str(raised.value)
    assert time.monotonic() - start < 30  # rank 0 was killed, not waited for
    assert not any(_alive(pid) for pid in before)  # a peer may have been stuck: all killed
    after = msched_ranks(_all_reduced, 1.0)
    assert [torch.equal(r["sum"][0], torch.full((2,), 3.0)) for r in after] == [True, True]
    assert set(_pids(msched_ranks)).isdisjoint(before)


def test_a_rank_left_waiting_in_a_collective_fails_with_the_timeout_and_the_next_call_works(
    msched_ranks: RunOnRanks,
) -> None:
    before = _pids(msched_ranks)  # the ranks run: the timeout counts the call alone
    start = time.monotonic()
    with pytest.raises(msched.RanksTimeoutError, match=r"after 3 s and were killed") as raised:
        msched_ranks(_skips_the_collective_on_rank_one, timeout=3.0)
    assert 0 in raised.value.ranks and raised.value.timeout == 3.0
    assert 3.0 <= time.monotonic() - start < 20
    assert not any(_alive(pid) for pid in before)
    assert [s for _, s in msched_ranks(_pid_and_sum, 2.0)] == [6.0, 6.0]


def test_the_one_shot_form_counts_the_start_in_its_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(msched.RanksTimeoutError, match=r"after 0\.5 s and were killed"):
        run_on_ranks(_all_reduced, 1.0, timeout=0.5)  # importing torch alone takes longer
    assert time.monotonic() - start < 15


def _leaves_state_behind(rank: int, world_size: int) -> float:
    draw = torch.randn(1).item()
    os.environ["MSCHED_LEFT_BEHIND"] = "1"
    os.chdir("/")
    torch.set_grad_enabled(False)
    torch.set_default_dtype(torch.float64)
    return draw


def _state(rank: int, world_size: int) -> dict[str, Any]:
    return {
        "left": os.environ.get("MSCHED_LEFT_BEHIND"),
        "parent": os.environ.get("MSCHED_FROM_THE_TEST"),
        "cwd": os.getcwd(),
        "grad": torch.is_grad_enabled(),
        "dtype": torch.get_default_dtype(),
        "draw": torch.randn(1).item(),
    }


def test_a_call_sees_the_callers_environment_not_the_state_a_call_before_left(
    msched_ranks: RunOnRanks, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    draws = msched_ranks(_leaves_state_behind)
    monkeypatch.setenv("MSCHED_FROM_THE_TEST", "yes")
    monkeypatch.chdir(tmp_path)
    for rank, state in enumerate(msched_ranks(_state)):
        assert state == {
            "left": None,
            "parent": "yes",
            "cwd": str(tmp_path),
            "grad": True,
            "dtype": torch.float32,
            "draw": draws[rank],  # the generator reseeded as it started
        }


def _leaves_the_group(rank: int, world_size: int) -> int:
    dist.destroy_process_group()
    return os.getpid()


@pytest.mark.slow
def test_a_function_that_leaves_the_group_gets_its_results_and_new_ranks_follow() -> None:
    pools = RankPools()
    try:
        pids = pools.run(_leaves_the_group)
        assert len(set(pids)) == 2 and not any(_alive(pid) for pid in pids)
        assert set(_pids(pools.run)).isdisjoint(pids)
    finally:
        pools.close()


@pytest.mark.slow
def test_a_closed_pool_stops_its_ranks_and_starts_again_when_called() -> None:
    with RankPool(world_size=1) as pool:
        assert pool.pids == ()
        assert pool.run(_pid_and_sum, 1.0)[0][1] == 1.0
        (pid,) = pool.pids
        assert _alive(pid) and pid != os.getpid()
    assert pool.pids == () and not _alive(pid)
    assert pool.run(_pid_and_sum, 2.0)[0][1] == 2.0
    pool.close()
    assert pool.pids == ()


def _local_function_of_a_test() -> object:
    def local(rank: int, world_size: int) -> int:
        return rank

    return local


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: run_on_ranks(_all_reduced, 1.0, world_size=0), "world_size must be >= 1"),
        (lambda: run_on_ranks(_all_reduced, 1.0, world_size="2"), "world_size must be an int"),
        (lambda: run_on_ranks(_all_reduced, 1.0, world_size=True), "world_size must be an int"),
        (lambda: run_on_ranks(_all_reduced, 1.0, timeout=0), "timeout must be a finite number"),
        (lambda: run_on_ranks(_all_reduced, 1.0, timeout="1"), "timeout must be a finite number"),
        (lambda: run_on_ranks("fn"), "fn must be callable"),
        (lambda: run_on_ranks(lambda rank, size: rank), "not a lambda"),
        (lambda: run_on_ranks(_local_function_of_a_test()), "does not pickle"),
        (lambda: run_on_ranks(_all_reduced, lambda: 1), "an argument does not pickle"),
        (lambda: RankPool(0), "world_size must be >= 1"),
        (lambda: RankPool(2, start_timeout=-1), "start_timeout must be a finite number"),
        (lambda: RankPool(1).run(lambda rank, size: rank), "not a lambda"),
        (lambda: RankPool(1).run(_all_reduced, timeout=True), "timeout must be a finite number"),
        (lambda: RankPools().run(_all_reduced, world_size=1.5), "world_size must be an int"),
        (lambda: run_on_ranks(_all_reduced, 1.0, world_size=10**6), "world_size must be <= 16"),
        (lambda: RankPool(MAX_WORLD_SIZE + 1), "MAX_WORLD_SIZE = 16"),
        (lambda: RankPools().pool(300), "world_size must be <= 16"),
        (lambda: run_on_ranks(_all_reduced, 1.0, timeout=math.inf), "finite number of seconds"),
        (lambda: run_on_ranks(_all_reduced, 1.0, timeout=math.nan), "finite number of seconds"),
        (lambda: RankPool(1, start_timeout=math.inf), "start_timeout must be a finite"),
        (lambda: RankPools().run(_all_reduced, timeout=math.inf), "timeout must be a finite"),
    ],
    ids=[
        *("zero", "str", "bool", "timeout0", "timeout-str", "uncallable", "lambda", "local"),
        *("arg", "pool-zero", "pool-start", "pool-lambda", "pool-timeout", "pools-size"),
        *("huge", "pool-huge", "pools-huge", "timeout-inf", "timeout-nan", "start-inf"),
        "pools-timeout-inf",
    ],
)
def test_bad_arguments_are_refused_before_any_process_starts(
    call, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr(RankPool, "_spawn", no_process)
    with pytest.raises(msched.InvalidArgumentError, match=message):
        call()


def _result_that_does_not_pickle(rank: int, world_size: int) -> object:
    return lambda: rank


def _nested(rank: int, world_size: int) -> list[Any]:
    return run_on_ranks(_pid_and_sum, 1.0, world_size=1)


def test_a_result_that_does_not_pickle_names_the_cause(msched_ranks: RunOnRanks) -> None:
    with pytest.raises(msched.RankFailedError) as raised:
        msched_ranks(_result_that_does_not_pickle, world_size=1, timeout=60)
    first = str(raised.value).splitlines()[0]
    assert "the result of fn (function) does not pickle" in first
    assert "local object" in first  # the pickling error's own words


def test_calling_ranks_from_a_rank_is_refused_clearly(msched_ranks: RunOnRanks) -> None:
    with pytest.raises(msched.RankFailedError) as raised:
        msched_ranks(_nested, world_size=1, timeout=60)
    first = str(raised.value).splitlines()[0]
    assert "InvalidArgumentError" in first and "nested ranks are not supported" in first
    assert "daemonic" not in raised.value.child_traceback


def _listening_addresses(pid: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) of the TCP sockets process
    ``pid`` has open in the LISTEN state."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        for fields in (line.split() for line in lines):
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(fields[1].split(":")[0])
    return found


def _met(rank: int, world_size: int) -> int:
    dist.barrier()
    return rank


_LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1 and ::1


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads Linux's /proc")
def test_no_socket_of_a_pool_listens_beyond_loopback_and_its_folder_goes() -> None:
    """The ranks met at a TCP store (``tcp://127.0.0.1:<port>``), whose server listened on
    every interface of the machine while the tests ran: anyone on the network could reach it."""
    with RankPool(world_size=2) as pool:
        assert pool.run(_met) == [0, 1]
        (folder,) = pool._folders
        assert os.stat(folder).st_mode & 0o077 == 0  # the user's only
        for pid in (os.getpid(), *pool.pids):
            addresses = _listening_addresses(pid)
            assert addresses <= _LOOPBACK, (pid, addresses)
    assert not Path(folder).exists()

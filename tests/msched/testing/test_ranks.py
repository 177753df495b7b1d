"""`run_on_ranks`: a function on N real gloo ranks, results in rank order, failures named.

Every run starts processes that import torch (a few seconds each), so each behaviour is one
run; a hang is given a timeout of a few seconds, so it fails here instead of hanging the run.
"""

from __future__ import annotations

import functools
import time

import pytest
import torch
import torch.distributed as dist

import msched
from msched.testing.ranks import run_on_ranks


def _all_reduced(rank: int, world_size: int, scale: float, *, offset: float = 0.0) -> dict:
    t = torch.full((2,), float(rank + 1)) * scale + offset
    dist.all_reduce(t)
    return {"rank": rank, "dist_rank": dist.get_rank(), "size": world_size, "sum": [t]}


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


def test_results_come_back_in_rank_order_and_an_all_reduce_sums() -> None:
    results = run_on_ranks(_all_reduced, 2.0, world_size=3, offset=1.0)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert [r["dist_rank"] for r in results] == [0, 1, 2]
    assert {r["size"] for r in results} == {3}
    for r in results:  # (1+2+3) * 2 + 3 * 1
        assert torch.equal(r["sum"][0], torch.full((2,), 15.0))


def test_a_partial_of_a_module_function_runs_on_one_rank() -> None:
    assert run_on_ranks(functools.partial(_all_reduced, scale=1.0), world_size=1)[0]["rank"] == 0


def test_an_exception_on_rank_one_names_the_rank_and_holds_its_traceback() -> None:
    start = time.monotonic()
    with pytest.raises(msched.RankFailedError, match="rank 1 raised") as raised:
        run_on_ranks(_raises_on_rank_one, timeout=60.0)
    assert raised.value.rank == 1
    assert "ValueError: rank one cannot go on" in raised.value.child_traceback
    assert "_raises_on_rank_one" in str(raised.value)
    assert time.monotonic() - start < 50  # rank 0 was killed, not waited for


def test_a_rank_left_waiting_in_a_collective_fails_with_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(msched.RanksTimeoutError, match=r"after 4 s and were killed") as raised:
        run_on_ranks(_skips_the_collective_on_rank_one, timeout=4.0)
    assert 0 in raised.value.ranks and raised.value.timeout == 4.0
    assert time.monotonic() - start < 30


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
        (lambda: run_on_ranks(_all_reduced, 1.0, timeout=0), "timeout must be a number"),
        (lambda: run_on_ranks(_all_reduced, 1.0, timeout="1"), "timeout must be a number"),
        (lambda: run_on_ranks("fn"), "fn must be callable"),
        (lambda: run_on_ranks(lambda rank, size: rank), "not a lambda"),
        (lambda: run_on_ranks(_local_function_of_a_test()), "does not pickle"),
        (lambda: run_on_ranks(_all_reduced, lambda: 1), "an argument does not pickle"),
    ],
    ids=["zero", "str", "bool", "timeout0", "timeout-str", "uncallable", "lambda", "local", "arg"],
)
def test_bad_arguments_are_refused_before_any_process_starts(call, message: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=message):
        call()

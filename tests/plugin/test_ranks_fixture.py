"""The ``msched_ranks`` fixture: a downstream test runs a sharded schedule on two gloo ranks,
and the tests of a session (of an xdist worker) share one start of the ranks."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SHARDED_TESTS = """
import os

import pytest
import torch
import torch.distributed as dist

import msched
from msched.models.decoders import decoder_stack


def scheduled_tp_stack(rank, world_size, num_streams):
    stack = decoder_stack(n_layers=1, capture_layers=(0,), tp=world_size)
    x, dest = stack.example_inputs()
    want = stack.gm(x, dest)
    msched.schedule(stack.gm, num_streams)
    x2, dest2 = stack.example_inputs()
    out = stack.gm(x2, dest2)
    return torch.allclose(out, want, atol=1e-5) and torch.allclose(dest2, dest, atol=1e-5)


def rank_pid(rank, world_size):
    return os.getpid()


def record_the_ranks(msched_ranks):
    pids = msched_ranks(rank_pid)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.environ["RANK_PIDS_FILE"], "a") as file:
        file.write(f"{worker} {pids!r}\\n")


@pytest.mark.multistream(streams=[2])
def test_tp_stack_on_two_ranks(msched_ranks, num_streams):
    assert msched_ranks(scheduled_tp_stack, num_streams) == [True, True]
    record_the_ranks(msched_ranks)


def test_another_test_on_two_ranks(msched_ranks):
    record_the_ranks(msched_ranks)


def rank_one_fails(rank, world_size):
    if rank == 1:
        raise RuntimeError("shard mismatch on rank one")
    dist.barrier()


def test_a_failing_rank(msched_ranks):  # three ranks: the two-rank pool stays up
    msched_ranks(rank_one_fails, world_size=3, timeout=60.0)
"""
WITHOUT_HYPOTHESIS = ("-p", "no:hypothesispytest")


@pytest.mark.parametrize(
    "xdist",
    [pytest.param(False, id="serial"), pytest.param(True, id="xdist", marks=pytest.mark.slow)],
)
def test_the_ranks_fixture_runs_a_sharded_schedule_and_names_a_failing_rank(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, xdist: bool
) -> None:
    monkeypatch.setenv("CI", "1")
    pids_file = pytester.path / "rank-pids.txt"
    monkeypatch.setenv("RANK_PIDS_FILE", str(pids_file))
    pytester.makepyfile(test_sharded=SHARDED_TESTS)
    args = ("-n", "2") if xdist else ()
    result = pytester.runpytest_subprocess("-v", *args, *WITHOUT_HYPOTHESIS)
    result.assert_outcomes(passed=2, failed=1)
    by_worker = _rank_pids(pids_file)
    assert sum(len(runs) for runs in by_worker.values()) == 2
    for runs in by_worker.values():  # the ranks started once per worker, for both tests
        assert len(set(runs)) == 1 and len(set(runs[0])) == 2
    result.stdout.fnmatch_lines(
        [
            "*RankFailedError: rank 1 raised RuntimeError: shard mismatch on rank one;"
            " every rank was stopped*",
            "*RuntimeError: shard mismatch on rank one*",
        ]
    )
    passed = "*PASSED*test_tp_stack_on_two_ranks?streams2?*"  # xdist puts the verdict first
    result.stdout.fnmatch_lines(
        [passed if xdist else "*test_tp_stack_on_two_ranks?streams2? PASSED*"]
    )


def _rank_pids(path: Path) -> dict[str, list[tuple[int, ...]]]:
    """The ranks' pids each test saw, by xdist worker (``main`` without xdist)."""
    by_worker: dict[str, list[tuple[int, ...]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        worker, pids = line.split(" ", 1)
        by_worker[worker].append(tuple(ast.literal_eval(pids)))
    return by_worker

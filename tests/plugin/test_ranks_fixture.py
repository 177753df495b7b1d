"""The ``msched_ranks`` fixture: a downstream test runs a sharded schedule on two gloo ranks."""

from __future__ import annotations

import pytest

SHARDED_TESTS = """
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


@pytest.mark.multistream(streams=[2])
def test_tp_stack_on_two_ranks(msched_ranks, num_streams):
    assert msched_ranks(scheduled_tp_stack, num_streams) == [True, True]


def rank_one_fails(rank, world_size):
    if rank == 1:
        raise RuntimeError("shard mismatch on rank one")
    dist.barrier()


def test_a_failing_rank(msched_ranks):
    msched_ranks(rank_one_fails, timeout=60.0)
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
    pytester.makepyfile(test_sharded=SHARDED_TESTS)
    args = ("-n", "2") if xdist else ()
    result = pytester.runpytest_subprocess("-v", *args, *WITHOUT_HYPOTHESIS)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*RankFailedError: rank 1 raised; every rank was stopped*",
            "*RuntimeError: shard mismatch on rank one*",
        ]
    )
    passed = "*PASSED*test_tp_stack_on_two_ranks?streams2?*"  # xdist puts the verdict first
    result.stdout.fnmatch_lines(
        [passed if xdist else "*test_tp_stack_on_two_ranks?streams2? PASSED*"]
    )

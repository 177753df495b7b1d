"""`msched.schedule` of the sharded stacks on 1-3 streams, run on two gloo ranks.

Each case is scheduled and run on both ranks (one start of the ranks for all of them): the
output and capture buffer equal the unscheduled run, the host issues the collectives in the
original order, and `msched.verify` finds the schedule correct.  (The collective order is
what issue 34 adds to the scheduler.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.msched.models.sharded import CASES, STREAMS, run_all_scheduled

Runs = list[dict[str, dict[int, dict[str, Any]]]]


@pytest.fixture(scope="module")
def scheduled_runs(msched_ranks: Callable[..., list[Any]]) -> Runs:
    return msched_ranks(run_all_scheduled, timeout=400.0)


def _each_rank(runs: Runs, case: str, k: int) -> list[dict[str, Any]]:
    found = [r[case][k] for r in runs]
    for rank, f in enumerate(found):
        assert not f["error"], f"rank {rank}: {f['error']}"
    return found


@pytest.mark.parametrize("k", STREAMS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_scheduled_sharded_stack_computes_the_unscheduled_numbers(
    scheduled_runs: Runs, case: str, k: int
) -> None:
    for f in _each_rank(scheduled_runs, case, k):
        assert f["out"] <= 1e-5 and f["dest"] <= 1e-5


@pytest.mark.parametrize("k", STREAMS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_scheduled_sharded_stack_issues_its_collectives_in_the_original_order(
    scheduled_runs: Runs, case: str, k: int
) -> None:
    for f in _each_rank(scheduled_runs, case, k):
        assert f["after"] == f["before"]


@pytest.mark.parametrize("k", STREAMS)
@pytest.mark.parametrize("case", list(CASES))
def test_a_scheduled_sharded_stack_verifies(scheduled_runs: Runs, case: str, k: int) -> None:
    for f in _each_rank(scheduled_runs, case, k):
        assert f["verify"], f["violations"]

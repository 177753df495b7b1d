"""`msched.execute` runs scheduled sharded stacks on two gloo ranks.

The adversarial executor runs a scheduled graph in orders that respect only the schedule's
happens-before.  With collectives, each order must still issue them in the original order
on every rank (or the ranks hang: a timeout here), run each ``wait_tensor`` after its
collective, and give the unscheduled numbers on each rank.
"""

from __future__ import annotations

from typing import Any

import pytest

from msched.testing.ranks import run_on_ranks
from tests.msched.proof.executor_ranks import CASES, ORDERS, STREAMS, run_executor


@pytest.fixture(scope="module")
def executed() -> list[dict[str, Any]]:
    return run_on_ranks(run_executor, timeout=400.0)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("k", STREAMS)
@pytest.mark.parametrize("case", list(CASES))
def test_the_executor_runs_a_scheduled_sharded_stack_like_the_unscheduled_one(
    executed: list[dict[str, Any]], case: str, k: int, order: str
) -> None:
    for rank, found in enumerate(executed):
        assert found[f"{case}/{k}/verify"], rank
        run = found[f"{case}/{k}/{order}"]
        assert run["failure"] is None, (rank, run)
        assert run["out"] <= 1e-5 and run["dest"] <= 1e-5, (rank, run)
        assert run["collectives"], (rank, run)  # issued in the original order
        assert run["differs"] is (False if order == "search" else None), (rank, run)

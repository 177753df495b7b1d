"""The exact mode: `msched.optimal_makespan` and ``msched.schedule(..., effort="optimal")``."""

from __future__ import annotations

import math
import sys

import pytest
import torch

import msched
from msched.models.decoders import decoder_stack
from msched.pictures.explain import placement_text
from msched.scheduling import assign
from msched.testing import families


def _moe() -> torch.fx.GraphModule:
    """An MoE layer the list schedule misses the optimum on, by one, on 3 streams."""
    return families.moe_layer(3)


def test_optimal_makespan_proves_the_optimum_below_the_list_schedule() -> None:
    pytest.importorskip("ortools")
    gm = _moe()
    fast = msched.schedule(_moe(), 3)
    best = msched.optimal_makespan(gm, 3, time_limit=20)
    assert best.proven and best.makespan == best.bound == 75.0 < fast.makespan == 76.0
    assert fast.lower_bound <= best.makespan
    assert all(n.op == "call_function" for n in best.start)  # compute nodes only
    assert not any(n.target in msched.ops.STREAM_OPS for n in gm.graph.nodes)  # gm unchanged


def test_the_optimal_effort_runs_the_solver_timetable_as_fast_as_it_claims() -> None:
    pytest.importorskip("ortools")
    gm = _moe()
    x = torch.randn(4, 4)
    expected = gm(x)
    sched = msched.schedule(gm, 3, effort="optimal", time_limit=20)
    assert sched.optimal is not None and sched.optimal.proven
    assert sched.makespan == 75.0 == msched.simulate(gm).makespan
    assert msched.verify(gm, original=sched.original).ok
    assert torch.equal(gm(x), expected)
    a = sched.assignment
    assert a is not None
    kernel = next(n for n in a.order if a.reasons[n].rule == assign.TIMETABLE)
    assert "the exact mode's timetable (CP-SAT)" in placement_text(sched, kernel)


def test_the_optimal_effort_keeps_a_list_schedule_that_meets_the_bound() -> None:
    stack = decoder_stack(3, (0, 2))
    fast = msched.schedule(decoder_stack(3, (0, 2)).gm, 3)
    sched = msched.schedule(stack.gm, 3, effort="optimal")  # no solver run: no ortools needed
    assert fast.makespan == fast.lower_bound == sched.makespan
    assert sched.optimal is not None and sched.optimal.proven
    assert stack.gm.code == fast.gm.code


def test_the_optimal_effort_is_deterministic() -> None:
    pytest.importorskip("ortools")
    codes = set()
    for _ in range(2):
        gm = families.moe_layer(11)
        msched.schedule(gm, 4, effort="optimal", time_limit=1)
        codes.add(gm.code)
    assert len(codes) == 1


def test_without_ortools_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "ortools" or m.startswith("ortools.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ortools", None)  # makes ``import ortools...`` fail
    gm = _moe()
    before = gm.code
    with pytest.raises(msched.MissingDependencyError, match=r"msched's optimal extra"):
        msched.optimal_makespan(gm, 3)
    with pytest.raises(ImportError, match=r"pip install 'ortools>=9\.8'"):
        msched.schedule(gm, 3, effort="optimal")
    assert gm.code == before


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"effort": "fast?"}, "effort must be one of 'fast', 'optimal', got 'fast\\?'"),
        ({"effort": "optimal", "time_limit": -1}, "time_limit must be a positive number"),
        ({"effort": "optimal", "time_limit": 0}, "time_limit must be a positive number"),
        ({"effort": "optimal", "time_limit": math.nan}, "time_limit must be a positive"),
        ({"effort": "optimal", "time_limit": True}, "time_limit must be a positive"),
        ({"effort": "optimal", "time_limit": "1"}, "time_limit must be a positive"),
    ],
)
def test_bad_effort_arguments_are_invalid_and_leave_the_graph(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    gm = _moe()
    before = gm.code
    with pytest.raises(msched.InvalidArgumentError, match=match):
        msched.schedule(gm, 3, **kwargs)
    assert gm.code == before


def test_optimal_makespan_checks_its_arguments() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="expects a torch.fx.GraphModule"):
        msched.optimal_makespan(object(), 2)  # type: ignore[arg-type]
    with pytest.raises(msched.InvalidArgumentError, match="time_limit"):
        msched.optimal_makespan(_moe(), 2, time_limit=-3)

"""`msched.analysis.bounds`: a lower bound that is tight where the old one was loose, and
never above the optimum CP-SAT proves."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx import Graph, GraphModule

import msched
import msched.testing.strategies as mst
from msched.analysis import bounds
from msched.analysis.bounds import makespan_lower_bound, node_costs
from msched.scheduling.exact import solve
from msched.scheduling.levels import bottom_levels
from msched.testing import families

aten = torch.ops.aten


def _fan_out(experts: int) -> GraphModule:
    """A matmul feeding ``experts`` matmuls, summed by a chain of adds."""
    g = Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    head = g.call_function(aten.mm.default, (x, w))
    total = g.call_function(aten.mm.default, (head, w))
    for _ in range(experts - 1):
        total = g.call_function(
            aten.add.Tensor, (total, g.call_function(aten.mm.default, (head, w)))
        )
    g.output(total)
    return GraphModule(torch.nn.Module(), g)


def _bound(gm: GraphModule, streams: int) -> float:
    dag = msched.build_dag(gm)
    cost = node_costs(dag, msched.DefaultCostModel())
    return makespan_lower_bound(dag.nodes, dag.preds, cost, streams)


def test_the_work_after_a_node_counts() -> None:
    # After ``head`` (10) the 4 expert matmuls and 3 adds (43) must run: 10 + 43 / 2 = 31.5
    # on 2 streams, where the critical path is 10 + 10 + 3 = 23 and total / 2 is 26.5.
    gm = _fan_out(4)
    assert _bound(gm, 2) == 31.5
    assert msched.schedule(gm, 2).lower_bound == 31.5
    assert _bound(gm, 3) > max(23, 53 / 3)


def test_one_stream_bound_is_the_total() -> None:
    assert _bound(_fan_out(3), 1) == 10 + 30 + 2


def _optimum(gm: GraphModule, streams: int) -> float:
    """The optimum CP-SAT proves without being told the bound under test."""
    pytest.importorskip("ortools")
    dag = msched.build_dag(gm)
    cost = node_costs(dag, msched.DefaultCostModel())
    best = solve(dag, cost, streams, 30.0, known_bound=False)
    assert best.proven
    return best.makespan


@settings(max_examples=30, deadline=None)
@given(mst.graphs(max_nodes=10), st.integers(2, 3))
def test_the_bound_never_exceeds_the_optimum_on_generated_graphs(gm: GraphModule, k: int) -> None:
    assert _bound(gm, k) <= _optimum(gm, k) + 1e-9


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 3))
def test_the_bound_never_exceeds_the_optimum_on_layered_dags(seed: int, k: int) -> None:
    gm = families.layered_dag(seed, layers=4, width=3)
    assert _bound(gm, k) <= _optimum(gm, k) + 1e-9


def test_a_schedule_meeting_the_critical_path_computes_no_longest_paths(monkeypatch) -> None:
    # Two independent matmul chains on 2 streams: the list schedule's makespan is the critical
    # path, which assign_streams already has (its bottom levels), so the bound costs no pass.
    g = Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    a = g.call_function(aten.mm.default, (g.call_function(aten.mm.default, (x, w)), w))
    b = g.call_function(aten.mm.default, (g.call_function(aten.mm.default, (x, w)), w))
    g.output((a, b))
    calls: list[int] = []
    real = bounds._paths
    monkeypatch.setattr(bounds, "_paths", lambda *args: calls.append(1) or real(*args))
    sched = msched.schedule(GraphModule(torch.nn.Module(), g), 2)
    assert sched.makespan == sched.lower_bound == 20.0
    assert calls == []


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 4))
def test_the_bound_given_the_critical_path_is_the_bound(seed: int, k: int) -> None:
    gm = families.layered_dag(seed, layers=6, width=3)
    dag = msched.build_dag(gm)
    cost = node_costs(dag, msched.DefaultCostModel())
    critical = max(bottom_levels(dag, cost).values())
    for reached in (math.inf, critical, critical + 5.0):
        given_path = makespan_lower_bound(dag.nodes, dag.preds, cost, k, reached, critical)
        assert given_path == makespan_lower_bound(dag.nodes, dag.preds, cost, k, reached)

from __future__ import annotations

import torch
from torch.fx import Graph

import msched
from msched.scheduling.assign import _Lane, assign_streams, bottom_levels
from msched.testing.decoders import decoder_stack

from .graphs import eagle3_graph, module

aten = torch.ops.aten


def _two_chains() -> tuple[Graph, dict[str, torch.fx.Node]]:
    g = Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    a1 = g.call_function(aten.mm.default, (x, w))
    b1 = g.call_function(aten.mm.default, (x, w))
    a2 = g.call_function(aten.mm.default, (a1, w))
    out = g.call_function(aten.add.Tensor, (a2, b1))
    g.output(out)
    return g, {"a1": a1, "b1": b1, "a2": a2, "out": out}


def test_critical_path_runs_on_stream_0_and_the_side_branch_on_stream_1() -> None:
    g, n = _two_chains()
    dag = msched.build_dag(module(g))
    a = assign_streams(dag, 2, msched.DefaultCostModel())
    assert [a.stream[n[k]] for k in ("a1", "a2", "b1", "out")] == [0, 0, 1, 0]
    assert [(a.start[n[k]], a.finish[n[k]]) for k in ("a1", "b1", "a2", "out")] == [
        (0.0, 10.0),
        (0.0, 10.0),
        (10.0, 20.0),
        (20.0, 21.0),
    ]
    assert [x.name for x in a.order] == ["mm_default", "mm_default_1", "mm_default_2", "add_tensor"]
    assert a.makespan == 21.0 and a.critical_path == 21.0 and a.lower_bound == 21.0


def test_one_stream_serialises_in_priority_order() -> None:
    g, n = _two_chains()
    a = assign_streams(msched.build_dag(module(g)), 1, msched.DefaultCostModel())
    assert set(a.stream.values()) == {0}
    assert a.makespan == 31.0 == a.total_cost


def test_bottom_levels_count_the_longest_path_to_the_exit() -> None:
    g, n = _two_chains()
    dag = msched.build_dag(module(g))
    cost = {node: msched.DefaultCostModel().cost(node) for node in dag.nodes}
    level = bottom_levels(dag, cost)
    assert [level[n[k]] for k in ("a1", "a2", "b1", "out")] == [21.0, 11.0, 11.0, 1.0]


def test_capture_is_inserted_next_to_its_producer_not_at_the_end() -> None:
    stack = decoder_stack(12, (1, 5, 11))
    dag = msched.build_dag(stack.gm)
    a = assign_streams(dag, 2, msched.DefaultCostModel())
    for cap in stack.captures:
        src = cap.kwargs["src"]
        assert a.start[cap] == max(a.finish[d] for d in dag.dependencies(cap)), cap.name
        assert a.start[cap] == a.finish[src], cap.name


def test_ties_are_broken_by_graph_index() -> None:
    gm, nodes = eagle3_graph()
    first = assign_streams(msched.build_dag(gm), 3, msched.DefaultCostModel())
    again = assign_streams(msched.build_dag(gm), 3, msched.DefaultCostModel())
    assert [x.name for x in first.order] == [x.name for x in again.order]
    assert first.stream == again.stream


def test_lane_finds_the_earliest_gap_that_fits() -> None:
    lane = _Lane()
    lane.occupy(0.0, 10.0)
    lane.occupy(12.0, 20.0)
    lane.occupy(25.0, 30.0)
    assert lane.earliest(0.0, 2.0) == 10.0
    assert lane.earliest(0.0, 3.0) == 20.0
    assert lane.earliest(21.0, 5.0) == 30.0
    lane.occupy(10.0, 12.0)
    assert (lane.starts, lane.ends) == ([0.0, 25.0], [20.0, 30.0])


def test_one_stream_assignment_follows_the_input_order() -> None:
    stack = decoder_stack(3, (0, 2))
    sched = msched.schedule(stack.gm, 1)
    a = sched.assignment
    compute = [n for n in stack.gm.graph.nodes if n.op == "call_function"]
    assert list(a.order) == compute
    starts = [a.start[n] for n in compute]
    assert starts == sorted(starts)
    assert a.start[stack.captures[0]] < a.start[stack.captures[1]] < a.makespan
    assert sched.makespan == a.total_cost

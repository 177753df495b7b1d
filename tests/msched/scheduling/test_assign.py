from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx import Graph, Node

import msched
from msched.analysis.bounds import node_costs
from msched.analysis.communication import split_communication
from msched.models.decoders import decoder_stack
from msched.pictures.explain import explain_lines, placement_text
from msched.scheduling import assign
from msched.scheduling.assign import Assignment, _Lane, assign_streams
from msched.scheduling.levels import bottom_levels, issue_levels
from msched.testing import families

from ..graphs import eagle3_graph, module
from ..sharded_graphs import two_microbatches

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


@pytest.mark.parametrize(
    ("groups", "first"),
    [(("0", "0"), {"xa": 80.0, "w": 80.0, "lin1_a": 80.0, "ar_a": 70.0}), (("0", "1"), {})],
)
def test_issue_levels_run_through_the_next_collective_of_the_group(
    groups: tuple[str, str], first: dict[str, float]
) -> None:
    """``lin1 -> all_reduce -> wait -> lin2`` twice (10, 30 of communication, 0, 10): by
    bottom level both chains are alike; on one channel micro-batch a's communication holds
    back b's, so a's chain is longer by b's 30."""
    gm = two_microbatches(groups)
    dag = msched.build_dag(gm)
    cost, comm = split_communication(dag.nodes, node_costs(dag, msched.DefaultCostModel()))
    assert comm is not None
    plain = {n.name: v for n, v in bottom_levels(dag, cost, comm).items()}
    issued = {n.name: v for n, v in issue_levels(dag, cost, comm).items()}
    names = ("lin1_a", "ar_a", "wait_a", "lin1_b", "ar_b", "wait_b")
    assert [plain[k] for k in names] == [50.0, 40.0, 10.0] * 2
    assert issued == {**plain, **first}


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


def _gap_by_scan(starts: list[float], ends: list[float], est: float, cost: float) -> float:
    """The earliest gap of at least ``cost`` at or after ``est``, block by block."""
    t = est
    for s, e in zip(starts, ends, strict=True):
        if e <= t:
            continue
        if s - t >= cost:
            return t
        t = max(t, e)
    return t


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 60), st.sampled_from([0.5, 1.0, 1, 2.0, 3.0, 10.0, 20.0])),
        max_size=60,
    )
)
def test_lane_gap_search_matches_a_block_by_block_scan(jobs: list[tuple[int, float]]) -> None:
    # As the list schedule uses a lane: find the earliest gap, then occupy it.  The gaps the
    # lane keeps for its search must give what scanning its blocks one by one gives.
    lane = _Lane()
    for est, cost in jobs:
        expected = _gap_by_scan(lane.starts, lane.ends, float(est), cost)
        assert lane.earliest(float(est), cost) == expected
        lane.occupy(expected, expected + cost)
        gaps = [s - e for s, e in zip(lane.starts[1:], lane.ends[:-1], strict=True)]
        assert lane.gaps[1:] == gaps
        assert all(g > 0 for g in gaps)  # blocks stay merged


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


# --- placements: why each node got its stream ---------------------------------------------


def _rule_from_outcome(a: Assignment, deps: dict[Node, set[str]], node: Node) -> str:
    """The rule that must have placed ``node``, read from where and when it runs (an oracle
    independent of how `assign` records it)."""
    if node.op in ("placeholder", "get_attr"):
        return assign.INPUT
    if node.op == "output":
        return assign.OUTPUT
    why = a.reasons[node]
    ready = max((a.finish[d] for d in deps), default=0.0)
    assert why.ready == ready, node.name
    if why.producer is not None:
        assert why.producer in deps and a.finish[why.producer] == ready, node.name
        assert why.tied == (sum(a.finish[d] == ready for d in deps) > 1), node.name
    home = a.stream[why.producer] if why.producer is not None else 0
    if a.finish[node] == a.start[node]:
        assert (a.stream[node], a.start[node]) == (home, ready), node.name
        return assign.ZERO_COST
    if (a.stream[node], a.start[node]) == (home, ready):
        return assign.AFFINITY
    needed = (ready, ready + a.finish[node] - a.start[node])  # when it would have run there
    overlapping = [m for m in a.order if a.stream[m] == home and _overlaps(a, m, needed)]
    assert overlapping, f"{node.name} left the stream of its producer, which was idle"
    return assign.FIRST_FREE if a.start[node] == ready else assign.EARLIEST_GAP


def _overlaps(a: Assignment, node: Node, interval: tuple[float, float]) -> bool:
    return a.start[node] < interval[1] and a.finish[node] > interval[0]


_PHRASES = {
    assign.INPUT: "graph inputs and weights are ready on stream 0",
    assign.OUTPUT: "output always runs on stream 0",
    assign.ZERO_COST: "zero-cost nodes follow their producer",
    assign.AFFINITY: "it stays on that stream, which is idle then",
    assign.FIRST_FREE: "is the first free for it (starts at",
    assign.EARLIEST_GAP: "is the first free for it (starts at",
}


@pytest.mark.parametrize(("moe", "streams"), [(True, 3), (False, 2), (True, 4)])
def test_every_placement_matches_the_outcome_and_explain_says_it(moe: bool, streams: int) -> None:
    stack = decoder_stack(12, (1, 5, 11), moe=moe)
    sched = msched.schedule(stack.gm, streams)
    a, dag = sched.assignment, msched.build_dag(sched.original)
    by_name = {n.name: n for n in sched.gm.graph.nodes}
    rules = set()
    for original in dag.nodes:
        node = by_name[original.name]
        deps = {by_name[d.name]: r for d, r in dag.dependencies(original).items()}
        rule = _rule_from_outcome(a, deps, node)
        assert a.reasons[node].rule == rule, node.name
        text = placement_text(sched, node)
        assert _PHRASES[rule] in text, (node.name, rule, text)
        producer = a.reasons[node].producer
        if rule not in (assign.INPUT, assign.OUTPUT) and producer is not None:
            assert f"its dependency {producer.name} finishes last" in text, node.name
            assert f"on stream {a.stream[producer]}" in text, node.name
        if a.reasons[node].inserted:
            assert any(
                a.stream[m] == a.stream[node] and a.start[m] >= a.finish[node] for m in a.order
            )
        rules.add(rule)
    assert {assign.INPUT, assign.OUTPUT, assign.AFFINITY} <= rules
    assert rules & {assign.FIRST_FREE, assign.EARLIEST_GAP}
    for capture in stack.captures:
        lines = explain_lines(sched, capture)
        assert lines[lines.index(f"Why stream {a.stream[capture]}:") + 1] == "  " + placement_text(
            sched, capture
        )


def test_a_capture_is_placed_by_a_recorded_rule_next_to_its_producer() -> None:
    stack = decoder_stack(12, (1, 5, 11))
    a = assign_streams(msched.build_dag(stack.gm), 2, msched.DefaultCostModel())
    for cap in stack.captures:
        why = a.reasons[cap]
        assert why.producer is cap.kwargs["src"] and a.start[cap] == why.ready, cap.name
    last = stack.captures[-1]
    assert a.reasons[last].priority == a.finish[last] - a.start[last]  # only the exit follows


def test_a_zero_cost_view_follows_its_producer_onto_its_stream() -> None:
    g, n = _two_chains()
    with g.inserting_before(n["out"]):
        view = g.call_function(aten.t.default, (n["b1"],))
    n["out"].replace_input_with(n["b1"], view)
    sched = msched.schedule(module(g), 2)
    why = sched.assignment.reasons[view]
    assert (why.rule, why.producer) == (assign.ZERO_COST, n["b1"])
    assert sched.stream_of(view) == sched.stream_of(n["b1"]) == 1
    assert "zero-cost nodes follow their producer" in placement_text(sched, view)


def test_one_stream_placements_say_the_input_order_is_kept() -> None:
    stack = decoder_stack(3, (0, 2))
    sched = msched.schedule(stack.gm, 1)
    rules = {sched.assignment.reasons[n].rule for n in stack.gm.graph.nodes}
    assert rules == {assign.INPUT, assign.IN_ORDER, assign.OUTPUT}
    assert "input order is kept" in placement_text(sched, stack.captures[0])


def test_a_pass_over_the_reversed_dag_wins_where_the_first_pass_falls_short() -> None:
    gm = families.layered_dag(8)  # 21 nodes; the bottom-level pass starts a short matmul late
    dag = msched.build_dag(gm)
    model = msched.DefaultCostModel()
    first = assign_streams(dag, 2, model, passes=())
    final = assign_streams(dag, 2, model)
    assert (first.makespan, final.makespan) == (41.0, 33.0)
    assert final.lower_bound <= 33.0
    sched = msched.schedule(gm, 2)
    assert sched.makespan == 33.0 == msched.simulate(gm).makespan
    assert msched.verify(gm, original=sched.original).ok
    # The winning pass placed every node by the forward rules, with its own priorities.
    assert {final.reasons[n].rule for n in final.order} <= {
        assign.ZERO_COST,
        assign.AFFINITY,
        assign.FIRST_FREE,
        assign.EARLIEST_GAP,
    }


def test_no_second_pass_runs_when_the_first_meets_the_lower_bound() -> None:
    g, _ = _two_chains()
    dag = msched.build_dag(module(g))
    a = assign_streams(dag, 2, msched.DefaultCostModel())
    assert a.makespan == a.lower_bound
    assert all(
        a.reasons[n].priority == level
        for n, level in bottom_levels(
            dag, {n: msched.DefaultCostModel().cost(n) for n in dag.nodes}
        ).items()
    )


def test_unknown_pass_names_are_refused() -> None:
    g, _ = _two_chains()
    with pytest.raises(msched.InvalidArgumentError, match="unknown pass 'sideways'"):
        assign_streams(msched.build_dag(module(g)), 2, msched.DefaultCostModel(), ("sideways",))

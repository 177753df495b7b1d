from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given
from torch.fx import GraphModule

import msched
import msched.testing.strategies as mst
from msched.analysis.nodes import INPUT_OPS
from msched.models.decoders import decoder_stack
from msched.proof.interpreter import interpret
from msched.scheduling import pipeline

from ..graphs import cyclic_graph, eagle3_graph, eagle3_inputs, hazard_graph, within
from ..hb import happens_before

aten = torch.ops.aten
STREAM_OPS = set(msched.ops.STREAM_OPS)
STACKS = [(6, (1, 3, 5)), (6, (1, 3, 4)), (12, (1, 5, 11)), (12, (1, 5, 8))]


def stream_op_nodes(gm: GraphModule, op: object | None = None) -> list[torch.fx.Node]:
    targets = STREAM_OPS if op is None else {op}
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]


def names(gm: GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes]


def test_eagle3_capture_runs_before_output_and_output_waits_for_it() -> None:
    gm, nodes = eagle3_graph()
    x, w, dest = eagle3_inputs()
    expected_dest = dest.clone()
    expected = gm(x, w, expected_dest)
    sched = msched.schedule(gm, 2)
    order = names(gm)
    assert order.index("capture") < order.index("output")
    assert sched.stream_of(nodes["capture"]) == 1  # this graph puts it on the aux stream
    hb = happens_before(gm)
    waits_on_0 = [w for w in hb.waits if w.stream == 0]
    joining = [w for w in waits_on_0 if w.event[1] >= hb.position["capture"][1] > w.before[1]]
    assert joining, "no wait on stream 0 joins the capture"
    assert order.index(joining[0].node.name) < order.index("output")
    got = gm(x, w, dest)
    assert torch.equal(got, expected) and torch.equal(dest, expected_dest)


def test_without_exit_edges_the_exit_does_not_join_the_capture_and_verify_says_so() -> None:
    gm, nodes = eagle3_graph()
    sched = msched.schedule(gm, 2, exit_edges=False)  # the ablation: the Eagle3 bug
    assert sched.stream_of(nodes["capture"]) == 1
    assert not happens_before(gm).ordered("capture", "output")
    report = msched.verify(gm, original=sched.original)
    assert [(v.kind, v.nodes) for v in report.violations] == [
        ("exit-not-joined", ("capture", "output"))
    ]
    with pytest.raises(TypeError):
        msched.schedule(eagle3_graph()[0], 2, None, False)  # type: ignore[misc]  (keyword only)


@pytest.mark.parametrize("streams", [2, 3])
@pytest.mark.parametrize(("layers", "captures"), STACKS)
def test_decoder_stack_keeps_every_capture(
    layers: int, captures: tuple[int, ...], streams: int
) -> None:
    stack = decoder_stack(layers, captures, moe=layers == 12)
    expected_out, expected_dest = stack.reference()
    sched = msched.schedule(stack.gm, streams)
    order = names(stack.gm)
    hb = happens_before(stack.gm)
    for cap in stack.captures:
        assert order.index(cap.name) < order.index("output")
        assert hb.ordered(cap.name, "output"), f"output does not happen after {cap.name}"
    stack.gm.recompile()
    lines = stack.gm.code.splitlines()
    ret = next(i for i, line in enumerate(lines) if line.strip().startswith("return"))
    for cap in stack.captures:
        line = next(i for i, text in enumerate(lines) if text.strip().startswith(f"{cap.name} = "))
        assert line < ret
    x, dest = stack.example_inputs()
    out = stack.gm(x, dest)
    assert torch.equal(out, expected_out)
    assert torch.equal(dest, expected_dest)
    assert sched.makespan >= sched.lower_bound > 0


def test_positional_captures_schedule_like_keyword_captures() -> None:
    by_kw = decoder_stack(12, (1, 5, 11), capture_kwargs=True)
    by_pos = decoder_stack(12, (1, 5, 11), capture_kwargs=False)
    s_kw, s_pos = msched.schedule(by_kw.gm, 3), msched.schedule(by_pos.gm, 3)
    assert names(by_kw.gm) == names(by_pos.gm)
    assert [s_kw.stream_of(n) for n in by_kw.captures] == [
        s_pos.stream_of(n) for n in by_pos.captures
    ]
    x, dest = by_pos.example_inputs()
    by_pos.gm(x, dest)
    assert torch.equal(dest, by_kw.reference()[1])


@pytest.mark.parametrize("kind", ["war", "raw", "waw"])
def test_hazards_are_ordered_across_streams(kind: str) -> None:
    split = []
    for streams in (2, 3, 4):
        gm, nodes = hazard_graph(kind)
        x, w = torch.randn(4, 4), torch.randn(4, 4)
        expected = gm(x.clone(), w)
        sched = msched.schedule(gm, streams)
        hb = happens_before(gm)
        first, second = nodes["first"].name, nodes["second"].name
        assert hb.ordered(first, second), f"{kind}: {first} and {second} race on {streams} streams"
        split.append(sched.stream_of(nodes["first"]) != sched.stream_of(nodes["second"]))
        got = gm(x.clone(), w)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert any(split), "the hazard pair never landed on two streams: the test has no teeth"


def test_one_stream_keeps_order_and_adds_nothing() -> None:
    stack = decoder_stack(6, (1, 3, 5))
    before, code = names(stack.gm), stack.gm.code
    sched = msched.schedule(stack.gm, 1)
    assert names(stack.gm) == before and stack.gm.code == code
    assert not stream_op_nodes(stack.gm)
    assert sched.num_events == sched.num_waits == 0
    assert {sched.stream_of(n) for n in stack.gm.graph.nodes} == {0}


def test_scheduled_module_runs_without_recompile_and_keeps_names() -> None:
    stack = decoder_stack(6, (1, 3, 5), moe=True)
    original_nodes = list(stack.gm.graph.nodes)
    before = [n.name for n in original_nodes]
    expected_out, expected_dest = stack.reference()
    sched = msched.schedule(stack.gm, 3)
    assert "msched_wait_event(" in stack.gm.code  # called directly (msched.scheduling.codegen)
    kept = [n for n in stack.gm.graph.nodes if n.target not in STREAM_OPS]
    assert sorted(n.name for n in kept) == sorted(before)
    assert set(kept) == set(original_nodes)  # the same Node objects, rewired in place
    x, dest = stack.example_inputs()
    assert torch.equal(stack.gm(x, dest), expected_out) and torch.equal(dest, expected_dest)
    assert sched.num_waits == interpret(stack.gm).num_waits
    records = [n.args[0] for n in stream_op_nodes(stack.gm, msched.ops.record_event)]
    for switch in stream_op_nodes(stack.gm, msched.ops.set_stream):  # a switch's records
        records += switch.args[2] if len(switch.args) > 2 else []  # type: ignore[operator]
    assert sched.num_events == len(set(records)) == len(records)
    assert [n.name for n in sched.original.graph.nodes] == before
    assert not any(n.target in STREAM_OPS for n in sched.original.graph.nodes)


@pytest.mark.parametrize("streams", [2, 3, 4])
@pytest.mark.parametrize(("layers", "captures"), STACKS[::2])
def test_every_wait_orders_a_dependency_nothing_earlier_orders(
    layers: int, captures: tuple[int, ...], streams: int
) -> None:
    stack = decoder_stack(layers, captures, moe=True)
    sched = msched.schedule(stack.gm, streams)
    assert_no_redundant_wait(stack.gm, sched)


@given(mst.graphs(min_nodes=2), mst.stream_counts())
def test_no_wait_is_covered_by_another_wait_on_generated_graphs(
    gm: GraphModule, streams: int
) -> None:
    # About 2% of generated graphs have a node that needs two streams where the wait for one
    # already covers the other; waiting on both in stream order would emit a redundant wait.
    assert_no_redundant_wait(gm, msched.schedule(gm, streams), require_waits=False)


def assert_no_redundant_wait(
    gm: GraphModule, sched: msched.Schedule, require_waits: bool = True
) -> None:
    """Every wait is needed: without it some dependency (or a stream's entry) is unordered."""
    pairs = _cross_stream_pairs(gm, sched)
    hb = happens_before(gm)
    assert _all_ordered(hb, pairs), "the schedule itself leaves a dependency unordered"
    for wait in hb.waits:
        without = happens_before(gm, skip_steps=frozenset({wait.step}))
        assert not _all_ordered(without, pairs), (
            f"{wait.node.name} on stream {wait.stream} is redundant: every dependency is "
            "ordered without it"
        )
    assert sched.num_waits == len(hb.waits)
    assert hb.waits or not require_waits


def _cross_stream_pairs(gm: GraphModule, sched: msched.Schedule) -> list[tuple[str, str]]:
    """(dependency, node) pairs of the original program, plus (entry, first node) per stream."""
    dag = msched.build_dag(sched.original)
    hb = happens_before(gm)
    pairs = [
        (dep.name, node.name)
        for node in dag.nodes
        for dep in dag.preds[node]
        if dep.op not in INPUT_OPS
    ]
    first = _first_node_per_stream(gm, hb)
    pairs += [("<entry>", name) for s, name in first.items() if s != 0]
    return pairs


def _all_ordered(hb, pairs: list[tuple[str, str]]) -> bool:  # type: ignore[no-untyped-def]
    for dep, node in pairs:
        if dep == "<entry>":
            if hb.knows[node][0] < hb.entry:
                return False
        elif not hb.ordered(dep, node):
            return False
    return True


def _first_node_per_stream(gm: GraphModule, hb) -> dict[int, str]:  # type: ignore[no-untyped-def]
    first: dict[int, str] = {}
    for name in hb.host_order:
        if name in hb.position and hb.position[name][1] > 0:
            first.setdefault(hb.position[name][0], name)
    return first


SCRIPT = textwrap.dedent(
    """
    import msched
    from msched.models.decoders import decoder_stack
    stack = decoder_stack(6, (1, 3, 5), moe=True)
    msched.schedule(stack.gm, 3)
    print(stack.gm.code)
    """
)


def test_same_graph_gives_byte_identical_code_across_processes_and_hash_seeds() -> None:
    outputs = []
    for seed in ("0", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        run = subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
        )
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1]
    assert "wait_event" in outputs[0]


def _without_output() -> GraphModule:
    gm, _ = eagle3_graph()
    gm.graph.erase_node(next(n for n in gm.graph.nodes if n.op == "output"))
    return gm


def _node_after_output() -> GraphModule:
    gm, nodes = eagle3_graph()
    out = next(n for n in gm.graph.nodes if n.op == "output")
    out.append(nodes["capture"])
    return gm


def _used_before_defined() -> GraphModule:
    gm, nodes = eagle3_graph()
    nodes["h"].prepend(nodes["a"])  # relu(h) now comes before h
    return gm


def _foreign_input() -> GraphModule:
    gm, nodes = eagle3_graph()
    stranger = torch.fx.Graph().placeholder("stranger")
    nodes["b"].args = (stranger, *nodes["b"].args[1:])
    return gm


@pytest.mark.parametrize(
    ("make", "streams", "error", "match"),
    [
        (lambda: eagle3_graph()[0], 0, msched.InvalidArgumentError, "num_streams must be >= 1"),
        (lambda: eagle3_graph()[0], -2, msched.InvalidArgumentError, "num_streams must be >= 1"),
        (lambda: eagle3_graph()[0], 2.0, msched.InvalidArgumentError, "must be an int"),
        (lambda: eagle3_graph()[0], "2", msched.InvalidArgumentError, "must be an int"),
        (lambda: eagle3_graph()[0], True, msched.InvalidArgumentError, "must be an int"),
        (_without_output, 2, msched.InvalidGraphError, "no output"),
        (_node_after_output, 2, msched.InvalidGraphError, "nodes after output: capture"),
        (_used_before_defined, 2, msched.InvalidGraphError, "which comes after it in the graph"),
        (_foreign_input, 3, msched.InvalidGraphError, "'stranger', which is not a node of this"),
        (cyclic_graph, 2, msched.InvalidGraphError, "has a cycle: cos -> matmul -> cos "),
        (lambda: cyclic_graph(True), 2, msched.InvalidGraphError, "has a cycle: cos -> cos "),
        (lambda: eagle3_graph()[0], 65, msched.InvalidArgumentError, "must be <= 64, got 65"),
        (lambda: eagle3_graph()[0], 4096, msched.InvalidArgumentError, "MAX_STREAMS = 64"),
        (lambda: eagle3_graph()[0], None, msched.InvalidArgumentError, "must be an int"),
    ],
)
def test_bad_input_raises_and_leaves_the_graph_untouched(make, streams, error, match) -> None:  # type: ignore[no-untyped-def]
    gm = make()
    before = [(n.name, n.op, n.target, n.args, dict(n.kwargs)) for n in gm.graph.nodes]
    with within(10), pytest.raises(error, match=match):
        msched.schedule(gm, streams)
    assert [(n.name, n.op, n.target, n.args, dict(n.kwargs)) for n in gm.graph.nodes] == before


@pytest.mark.parametrize("thing", [torch.nn.Linear(2, 2), torch.fx.Graph(), "gm"])
def test_non_graph_module_is_rejected(thing: object) -> None:
    with pytest.raises(msched.MschedError, match="expects a torch.fx.GraphModule"):
        msched.schedule(thing, 2)  # type: ignore[arg-type]


def test_already_scheduled_graph_is_rejected() -> None:
    gm, _ = eagle3_graph()
    msched.schedule(gm, 2)
    code = gm.code
    with pytest.raises(msched.InvalidGraphError, match="already scheduled"):
        msched.schedule(gm, 2)
    assert gm.code == code


def test_failure_while_rewriting_restores_the_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    module = pipeline
    gm, _ = eagle3_graph()
    before, code = names(gm), gm.code

    real_relink = module.relink
    calls = []

    def broken_relink(graph, order):  # type: ignore[no-untyped-def]
        calls.append(order)
        if len(calls) > 1:  # the restore after the failure
            return real_relink(graph, order)
        order[-1].prepend(order[3])
        raise RuntimeError("disk full")

    monkeypatch.setattr(module, "relink", broken_relink)
    with pytest.raises(RuntimeError, match="disk full"):
        msched.schedule(gm, 2)
    assert names(gm) == before and gm.code == code


def test_bad_cost_model_is_rejected_by_name() -> None:
    class Negative:
        def cost(self, node: torch.fx.Node) -> float:
            return -1.0

    gm, _ = eagle3_graph()
    with pytest.raises(msched.InvalidArgumentError, match="Negative gave -1.0"):
        msched.schedule(gm, 2, cost_model=Negative())


def test_exit_edges_must_be_a_bool_and_the_graph_is_left_as_it_was() -> None:
    """``exit_edges="no"`` was truthy: the Dag kept its exit edges without a word."""
    gm, _ = eagle3_graph()
    code = gm.code
    with pytest.raises(
        msched.InvalidArgumentError, match=r"exit_edges must be True or False, got 'no' \(str\)"
    ):
        msched.schedule(gm, 2, exit_edges="no")  # type: ignore[arg-type]
    assert gm.code == code


def test_the_most_streams_allowed_schedule_and_verify() -> None:
    gm, _ = eagle3_graph()
    sched = msched.schedule(gm, msched.MAX_STREAMS)
    assert sched.num_streams == msched.MAX_STREAMS
    report = msched.verify(gm, original=sched.original, num_streams=msched.MAX_STREAMS)
    assert report.ok, str(report)


def test_a_switch_and_the_waits_right_after_it_are_one_node() -> None:
    stack = decoder_stack(6, (1, 3, 5), moe=True)
    sched = msched.schedule(stack.gm, 3)
    nodes = list(stack.gm.graph.nodes)
    switches = stream_op_nodes(stack.gm, msched.ops.set_stream)
    fused = [n for n in switches if len(n.args) > 1 and n.args[1]]
    assert fused and all(all(type(e) is int for e in n.args[1]) for n in fused)
    assert all(len(n.args) == 1 or not n.args[1] for n in switches if n not in fused)
    # A wait_event node is left only where no switch comes right before it: the stream went on.
    for wait in stream_op_nodes(stack.gm, msched.ops.wait_event):
        before = nodes[nodes.index(wait) - 1]
        assert before.target is not msched.ops.set_stream, wait.name
    steps = interpret(stack.gm).steps
    in_lists = sum(len(n.args[1]) for n in fused)
    assert sched.num_waits == in_lists + len(stream_op_nodes(stack.gm, msched.ops.wait_event))
    assert sched.num_waits == sum(1 for st in steps if st.kind == "wait_event")
    assert msched.verify(stack.gm, original=sched.original).ok


def test_a_record_right_before_a_switch_is_in_that_switch() -> None:
    stack = decoder_stack(6, (1, 3, 5), moe=True)
    sched = msched.schedule(stack.gm, 3)
    nodes = list(stack.gm.graph.nodes)
    recording = [n for n in stream_op_nodes(stack.gm, msched.ops.set_stream) if len(n.args) > 2]
    assert recording and all(
        n.args[2] and all(type(e) is int for e in n.args[2]) for n in recording
    )
    program = interpret(stack.gm)
    for switch in recording:  # records the last node the old stream issued, on that stream
        before = nodes[nodes.index(switch) - 1]
        assert before.target not in STREAM_OPS and before.op == "call_function", switch.name
        old = program.stream_of[before]
        mine = [st for st in program.steps if st.node is switch]
        assert [st.kind for st in mine[: len(switch.args[2])]] == ["record_event"] * len(
            switch.args[2]  # type: ignore[arg-type]
        )
        assert all(st.stream == old for st in mine if st.kind == "record_event")
    # A record_event node is left only where its stream goes on: no switch right after it.
    for record in stream_op_nodes(stack.gm, msched.ops.record_event):
        after = nodes[nodes.index(record) + 1]
        assert after.target is not msched.ops.set_stream, record.name
    assert msched.verify(stack.gm, original=sched.original).ok


def test_schedule_memory_is_peak_memory_of_the_scheduled_module_computed_once() -> None:
    from torch.fx.experimental.proxy_tensor import make_fx

    def branches(x: torch.Tensor) -> torch.Tensor:
        return (x @ x).relu() + (x * 2).sigmoid()

    gm = make_fx(branches, tracing_mode="fake")(torch.zeros(512, 512))  # 1 MiB each
    sched = msched.schedule(gm, 2)
    memory = sched.memory
    assert memory is sched.memory
    assert memory == msched.peak_memory(gm)
    assert memory.allocated == 3 * 1024 * 1024  # two branch results and one more at the join
    plain = msched.schedule(decoder_stack(2, (1,)).gm, 2)  # no fake values
    with pytest.raises(msched.InvalidArgumentError, match=r"msched.peak_memory\(sched.gm"):
        plain.memory  # noqa: B018

"""Verifying graphs rebuilt by another scheduler, whose stream ops live in another namespace."""

from __future__ import annotations

import pytest
import torch
from torch.fx import GraphModule

import msched
from msched.models.decoders import decoder_stack
from msched.proof.dialects import Dialect
from msched.proof.interpreter import interpret

from ..scheduled import Scheduled, aten, define_stream_ops, unjoined_aux_start

NAMESPACE = "msched_test_trtllm"
_lib = define_stream_ops(NAMESPACE)


def trtllm_schedule(wait_for_a: bool) -> GraphModule:
    """``a`` on stream 0, ``b = a @ w`` on stream 1, ``out = b + a`` on stream 0."""
    s = Scheduled(Dialect.from_namespace(NAMESPACE))
    x, w = s.input("x"), s.input("w")
    a = s.op("a", aten.mm.default, x, w)
    s.record(1)
    s.stream(1)
    if wait_for_a:
        s.wait(1)
    else:
        s.wait(0)
    s.keep(a, 1)
    b = s.op("b", aten.mm.default, a, w)
    s.record(2)
    s.stream(0)
    s.wait(2)
    s.keep(b, 0)
    return s.done(s.op("out", aten.add.Tensor, b, a))


def test_a_race_in_another_dialect_is_found() -> None:
    dialect = Dialect.from_namespace(NAMESPACE)
    assert msched.verify(trtllm_schedule(wait_for_a=True), dialect=dialect).ok
    report = msched.verify(trtllm_schedule(wait_for_a=False), dialect=dialect)
    kinds = [(v.kind, v.hazard, v.nodes, v.streams) for v in report.violations]
    # wait_event(0) waits for an event nobody recorded, so `b` neither joins stream 0 nor `a`.
    assert kinds == [
        ("unrecorded-event", None, (report.violations[0].nodes[0],), (1,)),
        ("race", "data", ("b",), (1,)),
        ("race", "data", ("a", "b"), (0, 1)),
    ]
    targets = {n.target for n in trtllm_schedule(False).graph.nodes}
    assert torch.ops.msched_test_trtllm.wait_event.default in targets
    assert not targets & set(msched.ops.STREAM_OPS)


def test_without_a_dialect_the_graph_s_own_is_detected() -> None:
    good, bad = trtllm_schedule(wait_for_a=True), trtllm_schedule(wait_for_a=False)
    assert Dialect.detect(good) == Dialect.from_namespace(NAMESPACE)
    assert msched.verify(good).ok
    detected = msched.verify(bad)
    assert detected.violations == msched.verify(bad, dialect=NAMESPACE).violations != ()
    assert Dialect.detect(decoder_stack(2, (1,)).gm) == Dialect()  # no stream ops: msched


def test_msched_s_dialect_still_refuses_foreign_stream_ops() -> None:
    gm = trtllm_schedule(wait_for_a=True)
    with pytest.raises(msched.InvalidGraphError, match="stream ops of two dialects are mixed"):
        msched.verify(gm, dialect="msched")


def test_detecting_a_graph_with_two_dialects_names_both() -> None:
    gm = trtllm_schedule(wait_for_a=True)
    first = next(n for n in gm.graph.nodes if n.op == "call_function")
    with gm.graph.inserting_before(first):
        gm.graph.call_function(msched.ops.record_event, (9,))
    match = rf"mixes the stream ops of 2 dialects: msched \(record_event\); {NAMESPACE} \("
    for call in (lambda: Dialect.detect(gm), lambda: msched.verify(gm)):
        with pytest.raises(msched.InvalidGraphError, match=match):
            call()


def test_two_dialects_mixed_in_one_graph_are_rejected() -> None:
    gm = trtllm_schedule(wait_for_a=True)
    graph = gm.graph
    first = next(n for n in graph.nodes if n.op == "call_function")
    with graph.inserting_before(first):
        graph.call_function(msched.ops.record_event, (9,))
    with pytest.raises(msched.InvalidGraphError, match=r"msched::record_event .* two dialects"):
        msched.verify(gm, dialect=Dialect.from_namespace(NAMESPACE))


def test_a_dialect_resolves_its_ops_lazily() -> None:
    dialect = Dialect.from_namespace("msched_test_lazy")  # no such ops yet
    lib = torch.library.Library("msched_test_lazy", "DEF")
    for schema in ("set_stream(int s) -> ()", "record_event(int e) -> ()",
                   "wait_event(int e) -> ()", "record_stream(Tensor t, int s) -> ()"):  # fmt: skip
        lib.define(schema)
    report = msched.verify(unjoined_aux_start(dialect), dialect=dialect)
    assert [(v.kind, v.nodes) for v in report.violations] == [("race", ("b",))]


def test_dialect_of_explicit_ops_equals_the_default() -> None:
    explicit = Dialect(
        set_stream=msched.ops.set_stream,
        record_event=msched.ops.record_event,
        wait_event=msched.ops.wait_event,
        record_stream=msched.ops.record_stream,
    )
    stack_gm = trtllm_schedule(wait_for_a=True)
    assert explicit == Dialect()
    read_as_msched = (
        "the stream op msched_test_trtllm::record_event of the msched_test_trtllm dialect "
        "but the graph is read in the msched dialect"
    )
    with pytest.raises(msched.InvalidGraphError, match=read_as_msched):
        msched.verify(stack_gm, dialect=explicit)
    with pytest.raises(msched.InvalidArgumentError, match="not an op namespace"):
        Dialect.from_namespace("not a namespace")


def test_a_registered_op_namespace_is_a_dialect_by_name() -> None:
    assert msched.verify(trtllm_schedule(wait_for_a=True), dialect=NAMESPACE).ok
    report = msched.verify(trtllm_schedule(wait_for_a=False), dialect=NAMESPACE)
    by_object = msched.verify(
        trtllm_schedule(wait_for_a=False), dialect=Dialect.from_namespace(NAMESPACE)
    )
    assert report.violations == by_object.violations


def test_steps_name_the_event_or_the_stream_of_each_stream_op() -> None:
    program = interpret(trtllm_schedule(wait_for_a=True), dialect=NAMESPACE)
    fields = [(s.kind, s.stream, s.event, s.to_stream) for s in program.steps]
    assert fields[2:7] == [
        ("compute", 0, None, None),  # a
        ("record_event", 0, 1, None),
        ("set_stream", 1, None, 1),
        ("wait_event", 1, 1, None),
        ("record_stream", 1, None, 1),
    ]
    keep = program.steps[6]
    assert keep.tensor is not None and keep.tensor.name == "a"
    assert all(s.tensor is None for s in program.steps if s.kind != "record_stream")


def _switch_graph(fused: bool) -> GraphModule:
    """Stream 1 waits for events 0 and 2 right after switching: one node or three."""
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.call_function(msched.ops.record_event, (0,))
    g.call_function(msched.ops.record_event, (2,))
    if fused:
        g.call_function(msched.ops.set_stream, (1, [0, 2]))
    else:
        g.call_function(msched.ops.set_stream, (1,))
        g.call_function(msched.ops.wait_event, (0,))
        g.call_function(msched.ops.wait_event, (2,))
    y = g.call_function(aten.relu.default, (x,))
    g.call_function(msched.ops.record_event, (1,))
    g.call_function(msched.ops.set_stream, (0,), {"wait_events": [1]} if fused else {})
    if not fused:
        g.call_function(msched.ops.wait_event, (1,))
    g.output(y)
    return GraphModule(torch.nn.Module(), g)


def _actions(gm: GraphModule) -> list[tuple[object, ...]]:
    return [(s.kind, s.stream, s.event, s.to_stream) for s in interpret(gm).steps]


def test_a_switch_that_waits_reads_as_the_switch_then_one_wait_per_event() -> None:
    fused, plain = _switch_graph(True), _switch_graph(False)
    assert _actions(fused) == _actions(plain)  # positional and keyword lists alike
    assert interpret(fused).num_waits == 3
    steps = interpret(fused).steps
    switch = next(s.node for s in steps if s.kind == "set_stream")
    assert [s.kind for s in steps if s.node is switch] == ["set_stream", "wait_event", "wait_event"]
    assert msched.verify(fused).ok and msched.verify(plain).ok
    x = torch.tensor([-1.0, 2.0])
    assert torch.equal(fused(x), plain(x))  # no-ops on CPU


def test_the_plain_four_ops_and_trtllm_read_as_before() -> None:
    plain = _switch_graph(False)
    switches = [s for s in interpret(plain).steps if s.kind == "set_stream"]
    assert all(len(s.node.args) == 1 for s in switches)  # set_stream(s): a switch, no wait
    assert [s.node for s in interpret(plain).steps if s.kind == "wait_event"] == [
        n for n in plain.graph.nodes if n.target is msched.ops.wait_event
    ]
    ns = getattr(torch.ops, NAMESPACE)  # the four-op shape in another namespace (trtllm's)
    for node in plain.graph.nodes:
        if node.target in msched.ops.STREAM_OPS:
            node.target = getattr(ns, node.target._schema.name.split("::")[1]).default
    assert _actions(plain) == _actions(_switch_graph(False))
    assert interpret(plain, Dialect.from_namespace(NAMESPACE)).num_waits == 3


@pytest.mark.parametrize("events", [5, [1, -2], [1, "e"], [True]])
def test_a_switch_waits_only_for_literal_event_ids(events: object) -> None:
    g = torch.fx.Graph()
    g.call_function(msched.ops.set_stream, (1, events))
    g.output(None)
    with pytest.raises(msched.InvalidGraphError, match="set_stream node 'set_stream_default'"):
        interpret(g)

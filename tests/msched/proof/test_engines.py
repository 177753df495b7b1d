"""Other engines' stream encodings, hand-built as their passes emit them: TensorRT-LLM's four
ops, AutoDeploy's passthrough functions and events by name, a graph mixing PyTorch's
``torch.ops.streams`` with ``trtllm`` ops, and a dialect defined from scratch.

Each engine gets the same four programs: a clean side-stream computation (ok), a buffer
written on the side stream and never joined (``exit-not-joined`` naming the write), a side
value returned without a join (named), and the caller's stream writing a tensor in place
while the side stream reads it (``race``/``war`` naming both).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo  # noqa: F401  (registers torch.ops.streams)
from torch.fx import Graph, GraphModule, Node

import msched
from msched.proof import actions
from msched.proof.dialects import Dialect
from msched.proof.interpreter import interpret

from ..scheduled import define_stream_ops
from .test_dialect import NAMESPACE  # noqa: F401  (keeps the shared test namespace defined)

aten = torch.ops.aten

if not hasattr(torch.ops.trtllm, "set_stream"):
    _TRTLLM = define_stream_ops("trtllm")

_AD = torch.library.Library("auto_deploy", "FRAGMENT")
if not hasattr(torch.ops.auto_deploy, "record_event"):
    _AD.define("record_event(int device, str stream_name) -> ()")
    _AD.define("wait_event(int device, str stream_name) -> ()")
    for _name in ("record_event", "wait_event"):
        _AD.impl(_name, lambda *args: None, "CompositeExplicitAutograd")


# AutoDeploy's passthrough helpers, as its multi-stream transforms insert them (identity
# functions that switch streams as a side effect); the dialect knows them by name.
def record_event_passthrough(x: torch.Tensor, *, device: int = -1) -> torch.Tensor:
    return x


def begin_aux_stream_passthrough(x: torch.Tensor, *, device: int = -1) -> torch.Tensor:
    return x


def end_aux_stream_passthrough(x: torch.Tensor, *, device: int = -1) -> torch.Tensor:
    return x


def wait_aux_stream_passthrough(x: torch.Tensor, *, device: int = -1) -> torch.Tensor:
    return x


class Builder:
    def __init__(self) -> None:
        self.graph = Graph()

    def input(self, name: str) -> Node:
        return self.graph.placeholder(name)

    def op(self, name: str, target: Any, *args: Any) -> Node:
        return self.graph.create_node("call_function", target, args, name=name)

    def call(self, target: Any, *args: Any) -> Node:
        return self.graph.call_function(target, args)

    def done(self, result: Any) -> GraphModule:
        self.graph.output(result)
        return GraphModule(torch.nn.Module(), self.graph)


trt = torch.ops.trtllm


def trtllm_program(bug: str) -> GraphModule:
    b = Builder()
    x, buf = b.input("x"), b.input("buf")
    b.call(trt.record_event.default, 0)
    b.call(trt.set_stream.default, 1)
    b.call(trt.wait_event.default, 0)
    if bug == "never-joined":
        m = b.op("m", aten.mul.Tensor, x, 2)
        b.op("write", aten.copy_.default, buf, m)
        b.call(trt.set_stream.default, 0)
        return b.done(b.op("out", aten.add.Tensor, x, 1))
    y = b.op("y", aten.mul.Tensor, x, 2)
    b.call(trt.record_event.default, 1)
    b.call(trt.set_stream.default, 0)
    if bug == "returned":
        return b.done(y)
    if bug == "war":
        w = b.op("write", aten.add_.Tensor, x, 1)
        b.call(trt.wait_event.default, 1)
        return b.done(b.op("out", aten.add.Tensor, y, w))
    b.call(trt.wait_event.default, 1)
    return b.done(b.op("out", aten.add.Tensor, y, 1))


def autodeploy_program(bug: str) -> GraphModule:
    b = Builder()
    x, buf = b.input("x"), b.input("buf")
    x1 = b.call(begin_aux_stream_passthrough, x)
    if bug == "never-joined":
        m = b.op("m", aten.mul.Tensor, x1, 2)
        w = b.op("write", aten.copy_.default, buf, m)
        b.call(end_aux_stream_passthrough, w)
        return b.done(b.op("out", aten.add.Tensor, x, 1))
    y = b.op("y", aten.mul.Tensor, x1, 2)
    y1 = b.call(end_aux_stream_passthrough, y)
    if bug == "returned":
        return b.done(y1)
    if bug == "war":
        w = b.op("write", aten.add_.Tensor, x, 1)
        y2 = b.call(wait_aux_stream_passthrough, y1)
        return b.done(b.op("out", aten.add.Tensor, y2, w))
    a = b.op("routed", aten.neg.default, x)
    y2 = b.call(wait_aux_stream_passthrough, y1)
    return b.done(b.op("out", aten.add.Tensor, y2, a))


PROGRAMS = {"trtllm": trtllm_program, "autodeploy": autodeploy_program}


@pytest.mark.parametrize("engine", PROGRAMS)
@pytest.mark.parametrize("dialect", ["named", "detected"])
def test_each_engine_s_four_programs_are_judged_right(engine: str, dialect: str) -> None:
    build: Callable[[str], GraphModule] = PROGRAMS[engine]
    chosen = Dialect.named(engine) if dialect == "named" else None

    def check(bug: str) -> list[tuple[str, str | None, tuple[str, ...]]]:
        report = msched.verify(build(bug), dialect=chosen)
        return [(v.kind, v.hazard, v.nodes) for v in report.violations]

    assert check("clean") == []
    assert check("never-joined") == [("exit-not-joined", None, ("write", "output"))]
    assert check("returned") == [("exit-not-joined", None, ("y", "output"))]
    assert check("war") == [("race", "war", ("y", "write"))]


def test_trtllm_is_detected_by_its_op_names() -> None:
    assert Dialect.detect(trtllm_program("clean")) == Dialect.named("trtllm")
    assert Dialect.detect(autodeploy_program("clean")).name == "autodeploy"


def test_autodeploy_passthroughs_are_switches_records_and_waits() -> None:
    program = interpret(autodeploy_program("clean"))
    acts = [(s.kind, s.stream, s.event) for s in program.steps if s.kind != "compute"]
    main, aux = 1, 2  # events named by a string are numbered after the int ids (0)
    assert acts == [
        ("record_event", 0, main),  # begin: record main on the caller's stream,
        ("set_stream", 1, None),  # switch to aux,
        ("wait_event", 1, main),  # aux waits for it
        ("record_event", 1, aux),  # end: record aux, switch back (no join)
        ("set_stream", 0, None),
        ("wait_event", 0, aux),  # wait_aux: the join
    ]
    y = next(n for n in program.stream_of if n.name == "y")
    assert program.stream_of[y] == 1
    assert set(program.passthrough.values()) <= {n for n in program.stream_of if n.op != "output"}


def test_autodeploy_events_are_re_recorded_and_a_wait_binds_to_the_latest() -> None:
    """Two aux blocks in a row reuse the events ``main`` and ``aux``: the second block's join
    waits for its own record, so leaving out only that join is caught."""

    def two_blocks(second_join: bool) -> GraphModule:
        b = Builder()
        x = b.input("x")
        outs = []
        for k in (1, 2):
            x1 = b.call(begin_aux_stream_passthrough, x)
            y = b.op(f"y{k}", aten.mul.Tensor, x1, k)
            y1 = b.call(end_aux_stream_passthrough, y)
            if k == 1 or second_join:
                y1 = b.call(wait_aux_stream_passthrough, y1)
            outs.append(b.op(f"out{k}", aten.neg.default, y1))
        return b.done(b.op("out", aten.add.Tensor, *outs))

    assert msched.verify(two_blocks(True)).ok
    report = msched.verify(two_blocks(False))
    assert [(v.kind, v.nodes) for v in report.violations] == [("race", ("y2", "out2"))]


def test_autodeploy_raw_event_ops_record_and_wait_on_the_current_stream() -> None:
    ad = torch.ops.auto_deploy
    b = Builder()
    x = b.input("x")
    x1 = b.call(begin_aux_stream_passthrough, x)
    y = b.op("y", aten.mul.Tensor, x1, 2)
    b.call(ad.record_event.default, 0, "aux")
    x2 = b.call(end_aux_stream_passthrough, x)
    b.call(ad.wait_event.default, 0, "aux")
    gm = b.done(b.op("out", aten.add.Tensor, y, x2))
    assert msched.verify(gm).ok


def mixed_program(trt_join: bool, torch_join: bool) -> GraphModule:
    """TensorRT-LLM style: its own ops for one side stream, PyTorch's stream annotation and
    ``streams.wait_stream`` for another (index 0 is the caller's stream in both)."""
    st = torch.ops.streams
    b = Builder()
    x = b.input("x")
    b.call(st.wait_stream.default, 1, 0)  # torch stream 1 joins the caller
    z = b.op("z", aten.neg.default, x)
    z.meta["custom"] = {"stream": 1}
    b.call(trt.record_event.default, 0)
    b.call(trt.set_stream.default, 1)
    b.call(trt.wait_event.default, 0)
    y = b.op("y", aten.relu.default, x)
    b.call(trt.record_event.default, 1)
    b.call(trt.set_stream.default, 0)
    if trt_join:
        b.call(trt.wait_event.default, 1)
    if torch_join:
        b.call(st.wait_stream.default, 0, 1)
    return b.done(b.op("out", aten.add.Tensor, y, z))


def test_a_graph_mixing_torch_streams_and_trtllm_ops_is_one_program() -> None:
    gm = mixed_program(True, True)
    dialect = Dialect.detect(gm)
    assert dialect.name == "torch+trtllm"
    program = interpret(gm)
    assert program.num_streams == 3  # the caller's, trtllm's stream 1, torch's index 1
    ran = {s.node.name: s.stream for s in program.steps if s.kind == "compute"}
    assert ran["y"] == 1 and ran["z"] == 2 and ran["out"] == 0
    assert msched.verify(gm).ok
    assert [v.nodes for v in msched.verify(mixed_program(False, True)).violations] == [("y", "out")]
    assert [v.nodes for v in msched.verify(mixed_program(True, False)).violations] == [("z", "out")]


# --- a dialect of one's own ------------------------------------------------------------------

_TOY = torch.library.Library("msched_test_toy", "DEF")
_TOY.define("fork(int stream) -> ()")  # the stream waits for the caller's, then runs
_TOY.define("join(int stream) -> ()")  # back to the caller's stream, which waits for it
for _name in ("fork", "join"):
    _TOY.impl(_name, lambda *args: None, "CompositeExplicitAutograd")


def _toy_fork(node: Node) -> list[actions.Action]:
    s = actions.int_argument(node, 0, "toy fork")
    return [actions.wait_stream(s, 0), actions.switch(s)]


def _toy_join(node: Node) -> list[actions.Action]:
    s = actions.int_argument(node, 0, "toy join")
    return [actions.switch(0), actions.wait_stream(0, s)]


TOY = Dialect.define(
    "toy", {"msched_test_toy::fork": _toy_fork, torch.ops.msched_test_toy.join: _toy_join}
)


def toy_program(join: bool) -> GraphModule:
    toy = torch.ops.msched_test_toy
    b = Builder()
    x = b.input("x")
    b.call(toy.fork.default, 1)
    y = b.op("y", aten.relu.default, x)
    if join:
        b.call(toy.join.default, 1)
    else:
        b.call(trt.set_stream.default, 0)
    return b.done(b.op("out", aten.neg.default, y))


def test_a_dialect_defined_from_readers_verifies_its_graphs() -> None:
    assert msched.verify(toy_program(True), dialect=TOY).ok
    program = interpret(toy_program(True), dialect=TOY)
    assert [s.kind for s in program.steps if s.kind != "compute"] == [
        "wait_stream",
        "set_stream",
        "set_stream",
        "wait_stream",
    ]
    assert program.num_waits == 2
    broken = toy_program(False)
    with pytest.raises(msched.InvalidGraphError, match="trtllm dialect but the graph is read"):
        msched.verify(broken, dialect=TOY)
    report = msched.verify(broken, dialect=TOY | Dialect.named("trtllm"))
    assert [(v.kind, v.nodes) for v in report.violations] == [("race", ("y", "out"))]


def test_a_reader_that_returns_no_action_objects_is_an_error() -> None:
    bad = Dialect.define("bad", {"msched_test_toy::fork": lambda node: ["switch"]})
    with pytest.raises(msched.InvalidGraphError, match="which is no action"):
        interpret(toy_program(True), dialect=bad)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: Dialect.named("cuda"), r"unknown dialect 'cuda': the built-in dialects are"),
        (lambda: Dialect.named("trtllm", caller_stream=1), "takes no options"),
        (lambda: Dialect.named("torch", caller_stream="x"), "caller_stream must be"),
        (lambda: Dialect.named("torch", caller_stream=-1), "caller_stream must be"),
        (lambda: Dialect.define("empty", {}), "needs at least one op"),
        (lambda: Dialect.define("x", {"a::b": 3}), "is not callable"),
    ],
)
def test_bad_dialect_arguments_are_refused(call: Callable[[], object], match: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=match):
        call()


def torch_program() -> GraphModule:
    """PyTorch's encoding alone: a node annotated with stream 1, joined both ways."""
    b = Builder()
    x = b.input("x")
    b.call(torch.ops.streams.wait_stream.default, 1, 0)
    z = b.op("z", aten.neg.default, x)
    z.meta["custom"] = {"stream": 1}
    b.call(torch.ops.streams.wait_stream.default, 0, 1)
    return b.done(b.op("out", aten.add.Tensor, z, 1))


def msched_program() -> GraphModule:
    """msched's four ops: a side-stream node, joined both ways."""
    b = Builder()
    x = b.input("x")
    for op, arg in ((msched.ops.record_event, 0), (msched.ops.set_stream, 1)):
        b.call(op, arg)
    b.call(msched.ops.wait_event, 0)
    y = b.op("y", aten.mul.Tensor, x, 2)
    for op, arg in ((msched.ops.record_event, 1), (msched.ops.set_stream, 0)):
        b.call(op, arg)
    b.call(msched.ops.wait_event, 1)
    return b.done(b.op("out", aten.add.Tensor, y, 1))


CLEAN_PROGRAMS: dict[str, Callable[[], GraphModule]] = {
    "msched": msched_program,
    "trtllm": lambda: trtllm_program("clean"),
    "torch": torch_program,
    "autodeploy": lambda: autodeploy_program("clean"),
}


@pytest.mark.parametrize("name", CLEAN_PROGRAMS)
def test_each_built_in_dialect_reads_its_engine_s_graph_and_no_other(name: str) -> None:
    built_in = {other: Dialect.named(other) for other in CLEAN_PROGRAMS}
    gm = CLEAN_PROGRAMS[name]()
    assert Dialect.detect(gm) == built_in[name]
    assert msched.verify(gm, dialect=built_in[name]).ok
    for other, dialect in built_in.items():
        if other != name:
            mixed = f"of the {name} dialect but the graph is read in the {other} dialect"
            with pytest.raises(msched.InvalidGraphError, match=re.escape(mixed)):
                msched.verify(gm, dialect=dialect)


def test_the_built_in_dialects_are_four_different_ones() -> None:
    built_in = [Dialect.named(name) for name in CLEAN_PROGRAMS]
    assert all(a != b for i, a in enumerate(built_in) for b in built_in[i + 1 :])
    assert Dialect.named("msched") == Dialect()
    assert Dialect.named("torch", caller_stream=(0, 2)) != Dialect.named("torch")


def _boom(node: Node) -> list[actions.Action]:
    raise ZeroDivisionError("boom")


@pytest.mark.parametrize(
    "dialect, match",
    [
        (Dialect.define("raises", {"msched_test_toy::fork": _boom}), "ZeroDivisionError: boom"),
        (
            Dialect.define(
                "unhashable", {"msched_test_toy::fork": lambda n: [actions.switch([1])]}
            ),
            r"names the stream \[1\]",
        ),
        (
            Dialect.define("meta", {"msched_test_toy::join": _toy_join}, node_stream=_boom),
            "ZeroDivisionError: boom",
        ),
    ],
)
def test_a_reader_that_fails_is_said_as_the_node_it_could_not_read(
    dialect: Dialect, match: str
) -> None:
    with pytest.raises(msched.InvalidGraphError, match=rf"cannot read node|{match}") as info:
        interpret(toy_program(True), dialect=dialect)
    assert re.search(match, str(info.value))


def test_a_non_index_caller_stream_is_refused() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="caller_stream must be"):
        Dialect.named("torch", caller_stream=1.5)


def test_a_report_says_which_engine_stream_and_event_each_number_is() -> None:
    report = msched.verify(autodeploy_program("war"))
    # Only what the violations name: the race names stream 1, no event.
    assert report.legend == ("stream 1 = AutoDeploy stream 'aux'",)
    assert str(report).endswith("where " + "; ".join(report.legend))
    assert msched.verify(trtllm_program("war")).legend == ()  # int ids are their own names


def test_msched_s_ops_read_the_same_through_the_fast_path_and_the_readers() -> None:
    """`interpret` appends the steps of plain four-op nodes directly; the same ops read
    through their readers (wrapped, so the fast path does not know them) give equal steps."""
    from msched.models.decoders import decoder_stack
    from msched.proof import dialects

    sched = msched.schedule(decoder_stack(3, (0, 2), moe=True).gm, 3)
    readers = {
        getattr(msched.ops, kind): (lambda r: lambda node: r(node))(dialects.FOUR_OP_READERS[kind])
        for kind in dialects.FOUR_OPS
    }
    slow = interpret(sched.gm, Dialect.define("slow", readers))
    fast = interpret(sched.gm)
    assert fast.steps == slow.steps and fast.stream_of == slow.stream_of
    assert any(
        s.kind == "record_event" and s.node.target is msched.ops.set_stream for s in fast.steps
    )

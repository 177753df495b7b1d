"""`msched.scheduling.codegen`: a scheduled module calls its stream ops on the runtime directly,
the graph keeps the ops, and anything that could intercept an op still sees it."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx import PH, CodeGen, Graph, GraphModule, symbolic_trace
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.graph import _PyTreeCodeGen
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import msched
from msched.models.decoders import decoder_stack
from msched.runtime import StreamRuntime
from msched.scheduling import pipeline
from msched.scheduling.codegen import DirectStreamCalls, direct_stream_calls

from ..test_runtime import FakeCuda

STREAM_OPS = set(msched.ops.STREAM_OPS)


def stream_op_targets(gm: GraphModule) -> list[Any]:
    return [n.target for n in gm.graph.nodes if n.target in STREAM_OPS]


def scheduled_stack(n_layers: int = 4) -> tuple[Any, msched.Schedule]:
    stack = decoder_stack(n_layers, tuple(range(1, n_layers, 2)), moe=True)
    return stack, msched.schedule(stack.gm, 3)


def with_default_codegen(gm: GraphModule) -> GraphModule:
    """A copy of ``gm`` whose code calls the ops through the dispatcher, as FX writes it."""
    other = copy.deepcopy(gm)
    other.graph.set_codegen(CodeGen())
    other.recompile()
    return other


def test_a_scheduled_module_calls_the_runtime_and_its_graph_keeps_the_ops() -> None:
    stack, sched = scheduled_stack()
    expected = stack.reference()
    code = sched.gm.code
    for name in ("set_stream", "record_event", "wait_event", "record_stream"):
        assert f"torch.ops.msched.{name}" not in code and f"msched_{name}(" in code
    targets = stream_op_targets(sched.gm)
    assert set(targets) == STREAM_OPS
    assert len(targets) == len(stream_op_targets(with_default_codegen(sched.gm)))
    out, dest = stack.example_inputs()
    result = sched.gm(out, dest)
    assert torch.equal(result, expected[0]) and torch.equal(dest, expected[1])
    assert msched.verify(sched.gm).ok


def test_direct_calls_drive_a_cuda_runtime_exactly_as_the_ops_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stack, sched = scheduled_stack()
    through_ops = with_default_codegen(sched.gm)
    logs = []
    for gm in (through_ops, sched.gm):
        api = FakeCuda()
        runtime = StreamRuntime(api)
        with runtime.active():
            gm(*stack.example_inputs())
        logs.append(api.log)
        if gm is through_ops:  # from here on, reaching an op is an error
            for name in ("set_stream", "record_event", "wait_event", "record_stream"):
                monkeypatch.setattr(msched.ops, name, _unexpected_op)
    assert logs[0] == logs[1]
    assert {entry[0] for entry in logs[1]} == {"set", "record", "wait"}


def _unexpected_op(*args: object) -> None:
    raise AssertionError(f"the dispatcher was reached with {args}")


class LoggingDispatchMode(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


class LoggingFunctionMode(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", [LoggingDispatchMode, LoggingFunctionMode])
def test_a_mode_sees_every_stream_op(mode: type) -> None:
    stack, sched = scheduled_stack(2)
    with torch.no_grad(), mode() as logging:
        sched.gm(*stack.example_inputs())
    seen = [f for f in logging.seen if f in STREAM_OPS]
    assert seen == stream_op_targets(sched.gm)


def test_make_fx_and_torch_compile_of_a_scheduled_module_keep_the_stream_ops() -> None:
    stack, sched = scheduled_stack(2)
    expected = stream_op_targets(sched.gm)
    retraced = make_fx(sched.gm)(*stack.example_inputs())
    assert stream_op_targets(retraced) == expected
    sched.gm(*stack.example_inputs())  # a lazy module generates its code first (Dynamo skips it)
    assert stream_op_targets(msched.trace_streams(sched.gm, *stack.example_inputs())) == expected


def test_the_profiler_shows_the_stream_ops() -> None:
    stack, sched = scheduled_stack(2)
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.no_grad(), torch.profiler.profile(activities=cpu) as prof:
        sched.gm(*stack.example_inputs())
    names = [str(op._schema.name) for op in stream_op_targets(sched.gm)]
    assert [e.name for e in prof.events() if e.name in names] == names


def test_record_stream_of_a_tensor_subclass_goes_through_the_op() -> None:
    seen = []

    class Traced(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append(func)
            return super().__torch_function__(func, types, args, kwargs or {})

    t = torch.zeros(2).as_subclass(Traced)
    msched.ops.direct_record_stream(t, 1)
    msched.ops.direct_record_stream(torch.zeros(2), 1)
    assert seen == [msched.ops.record_stream]


def _stream_op_graph(placeholder: str = "x") -> GraphModule:
    g = Graph()
    x = g.placeholder(placeholder)
    g.call_function(msched.ops.set_stream, (1, [0]))
    y = g.call_function(torch.ops.aten.relu.default, (x,))
    g.call_function(msched.ops.record_event, (1,))
    g.call_function(msched.ops.set_stream, (0, [1]))
    g.output(y)
    return GraphModule(torch.nn.Module(), g)


def test_a_parameter_named_like_a_direct_call_keeps_that_op_on_the_dispatcher() -> None:
    gm = direct_stream_calls(_stream_op_graph("msched_set_stream"))
    code = gm.code
    assert "def forward(self, msched_set_stream):" in code  # the parameter keeps its name
    assert "torch.ops.msched.set_stream.default(1, [0])" in code  # it hides the direct name
    assert "msched_record_event(1)" in code  # the other ops are direct
    assert torch.equal(gm(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


def test_a_pytree_argument_named_like_a_direct_call_is_not_hidden() -> None:
    class Model(torch.nn.Module):
        def forward(self, msched_set_stream: dict[str, torch.Tensor]) -> torch.Tensor:
            return msched_set_stream["a"].relu() + msched_set_stream["b"].sin()

    gm = symbolic_trace(Model(), concrete_args={"msched_set_stream": {"a": PH, "b": PH}})
    inputs = {"a": torch.randn(4), "b": torch.randn(4)}
    expected = gm(inputs)
    msched.schedule(gm, 3)
    assert stream_op_targets(gm) and "def forward(self, msched_set_stream)" in gm.code
    assert torch.allclose(gm(inputs), expected)


def test_a_node_named_like_a_direct_call_is_renamed() -> None:
    gm = _stream_op_graph()
    relu = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.relu.default)
    relu.name = "msched_record_event"
    direct_stream_calls(gm)
    assert "msched_record_event(1)" in gm.code and "msched_record_event_1 = " in gm.code
    assert torch.equal(gm(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


def test_the_code_written_out_of_a_scheduled_module_imports_the_direct_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gm = direct_stream_calls(_stream_op_graph())
    gm.to_folder(tmp_path / "written", "Written")
    monkeypatch.syspath_prepend(str(tmp_path))
    written = importlib.import_module("written").Written()
    assert (
        "from msched.ops import direct_set_stream as msched_set_stream"
        in (tmp_path / "written" / "module.py").read_text()
    )
    assert torch.equal(written(torch.tensor([-1.0, 2.0])), torch.tensor([0.0, 2.0]))


def test_dynamo_sees_the_arguments_each_node_has() -> None:
    stack, sched = scheduled_stack(2)
    sched.gm(*stack.example_inputs())  # a lazy module generates its code first (Dynamo skips it)
    traced = msched.trace_streams(sched.gm, *stack.example_inputs())

    def calls(gm: GraphModule) -> list[tuple[Any, ...]]:
        return [(n.target, n.args, n.kwargs) for n in gm.graph.nodes if n.target in STREAM_OPS]

    captured = calls(traced)
    assert [(t, tuple(a[1:]), k) for t, a, k in captured] == [
        (t, tuple(a[1:]), k) for t, a, k in calls(sched.gm)
    ]  # record_stream's tensor is Dynamo's own node; the integers and lists are the node's


def test_use_direct_calls_off_sends_every_call_through_the_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reached: list[tuple[Any, ...]] = []
    monkeypatch.setattr(msched.ops, "set_stream", lambda *args: reached.append(args))
    previous = msched.ops.use_direct_calls(False)
    try:
        msched.ops.direct_set_stream(1, [2])
    finally:
        assert msched.ops.use_direct_calls(previous) is False
    msched.ops.direct_set_stream(0)  # on again: the runtime, not the op
    assert previous is True and reached == [(1, [2])]


def test_a_functorch_transform_takes_the_op() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        msched.ops.direct_record_stream(x, 1)
        return x * 2

    with pytest.raises(RuntimeError, match="msched::record_stream"):  # no batching rule
        torch.func.vmap(f)(torch.ones(3, 2))


def test_a_code_generator_with_slots_is_copied_with_them() -> None:
    class Slotted(CodeGen):
        __slots__ = ("tag",)

        def __init__(self) -> None:
            super().__init__()
            self.tag = "kept"

    gm = _stream_op_graph()
    gm.graph.set_codegen(Slotted())
    direct_stream_calls(gm)
    assert isinstance(gm.graph._codegen, Slotted) and gm.graph._codegen.tag == "kept"
    assert "msched_set_stream(1, [0])" in gm.code


def test_direct_stream_calls_is_idempotent_and_changes_only_the_code() -> None:
    gm = _stream_op_graph()
    nodes = [(n.name, n.target, n.args) for n in gm.graph.nodes]
    direct_stream_calls(gm)
    codegen, code = gm.graph._codegen, gm.code
    assert direct_stream_calls(gm) is gm and gm.graph._codegen is codegen and gm.code == code
    assert [(n.name, n.target, n.args) for n in gm.graph.nodes] == nodes
    assert type(codegen).__name__ == "DirectStreamCallsCodeGen"
    assert "torch.ops.aten.relu.default(x)" in code  # the rest of the code is FX's own


def test_another_code_generator_is_kept() -> None:
    def f(d: dict[str, torch.Tensor]) -> torch.Tensor:
        torch.ops.msched.set_stream.default(1)
        total = d["a"] + d["b"]
        torch.ops.msched.set_stream.default(0)
        return total

    gm = symbolic_trace(f, concrete_args={"d": {"a": PH, "b": PH}})
    for node in list(gm.graph.nodes):  # symbolic_trace ran the int-only ops; add them back
        if node.op == "call_function":
            with gm.graph.inserting_before(node):
                gm.graph.call_function(msched.ops.set_stream, (1,))
    gm.recompile()
    direct_stream_calls(gm)
    assert isinstance(gm.graph._codegen, _PyTreeCodeGen)
    assert isinstance(gm.graph._codegen, DirectStreamCalls)
    assert "tree_flatten_spec" in gm.code and "msched_set_stream(1)" in gm.code
    a, b = torch.ones(2), torch.full((2,), 2.0)
    assert torch.equal(gm({"a": a, "b": b}), a + b)

    class Custom(CodeGen):
        def additional_globals(self) -> list[tuple[str, Any]]:
            return [("custom_marker", 7)]

    custom = _stream_op_graph()
    custom.graph.set_codegen(Custom())
    direct_stream_calls(custom)
    assert isinstance(custom.graph._codegen, Custom)
    assert custom.forward.__globals__["custom_marker"] == 7
    assert "msched_record_event(1)" in custom.code


def test_a_failed_rewrite_restores_the_code_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = decoder_stack(2, (1,))
    gm = stack.gm
    codegen, code = gm.graph._codegen, gm.code
    real = gm.recompile
    calls = []

    def broken() -> Any:
        calls.append(type(gm.graph._codegen))
        if len(calls) == 1:
            raise RuntimeError("disk full")
        return real()

    monkeypatch.setattr(gm, "recompile", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        pipeline.schedule(gm, 2)
    assert issubclass(calls[0], DirectStreamCalls)  # it failed after installing
    assert gm.graph._codegen is codegen and gm.code == code
    assert not stream_op_targets(gm)

"""`msched.verify(..., cuda_graph=True)`: the CUDA-graph capture rules (`msched.proof.capture`).

Each fault is shown on a hand-made program, in msched's dialect and in PyTorch's (``torch``,
traced from user stream code on CPU or written by hand), next to its fixed twin, which
verifies clean.  Without ``cuda_graph`` the host synchronizations verify ok (what the rules
add); msched's own schedules of the decoder stacks are capture-safe.
"""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
import torch._dynamo  # noqa: F401  (registers torch.ops.streams)
from torch.fx import Graph, GraphModule

import msched
from msched.models.decoders import decoder_stack
from msched.proof.capture import CAPTURE_KINDS, host_sync_reason
from msched.proof.verifier import VIOLATION_KINDS, Report

from ..scheduled import Scheduled, aten, two_streams, unjoined_aux_start


def faults(report: Report) -> list[tuple[str, tuple[str, ...]]]:
    """The capture faults of ``report``, as (kind, nodes)."""
    return [(v.kind, v.nodes) for v in report.violations if v.kind in CAPTURE_KINDS]


def test_the_capture_kinds_are_violation_kinds() -> None:
    assert CAPTURE_KINDS == ("capture-sync", "capture-fork", "capture-join")
    assert set(CAPTURE_KINDS) <= set(VIOLATION_KINDS)


def test_cuda_graph_must_be_a_bool() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="cuda_graph must be True or False"):
        msched.verify(two_streams(), cuda_graph="yes")  # type: ignore[arg-type]


# -- capture-sync: the host synchronizes inside (msched's dialect) ---------------------------

x_ = torch.ones(4)
SYNCS: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {
    "item": (aten._local_scalar_dense.default, (), {}),
    "item-composite": (aten.item.default, (), {}),
    "bool": (aten.is_nonzero.default, (), {}),
    "equal": (aten.equal.default, ("x",), {}),
    "nonzero": (aten.nonzero.default, (), {}),
    "argwhere": (aten.argwhere.default, (), {}),
    "masked_select": (aten.masked_select.default, ("x",), {}),
    "unique": (aten._unique2.default, (), {}),
    "unique_consecutive": (aten.unique_consecutive.default, (), {}),
    "bincount": (aten.bincount.default, (), {}),
    "repeat_interleave": (aten.repeat_interleave.Tensor, (), {}),
    "repeat_interleave-self": (aten.repeat_interleave.self_Tensor, ("x",), {}),
}
TWINS: dict[str, tuple[Any, tuple[Any, ...], dict[str, Any]]] = {
    "nonzero_static": (aten.nonzero_static.default, (), {"size": 4}),
    "repeat_interleave-output_size": (aten.repeat_interleave.Tensor, (), {"output_size": 8}),
    "repeat_interleave-int": (aten.repeat_interleave.self_int, (2,), {}),
    "assert_async": (aten._assert_async.msg, ("ok",), {}),
    "relu": (aten.relu.default, (), {}),
}


def _one_op(target: Any, more: tuple[Any, ...], kwargs: dict[str, Any]) -> GraphModule:
    """``x`` on stream 0, ``w = relu(x)`` on a joined stream 1, then the op of ``x``."""
    s = Scheduled()
    x = s.input("x")
    s.record(0)
    s.stream(1)
    s.wait(0)
    w = s.op("w", aten.relu.default, x)
    s.record(1)
    s.stream(0)
    s.wait(1)
    args = [x, *(x if a == "x" else a for a in more)]
    node = s.graph.create_node("call_function", target, tuple(args), kwargs, name="op")
    return s.done((w, node))


@pytest.mark.parametrize("name", list(SYNCS))
def test_a_host_synchronizing_op_is_capture_sync(name: str) -> None:
    gm = _one_op(*SYNCS[name])
    assert msched.verify(gm).ok  # race-free: only capture forbids it
    report = msched.verify(gm, cuda_graph=True)
    assert faults(report) == [("capture-sync", ("op",))]
    (v,) = report.violations
    assert v.message.startswith("`op` (aten::")
    assert "the host synchronizes with the device inside the program" in v.message


@pytest.mark.parametrize("name", list(TWINS))
def test_an_op_whose_size_the_host_knows_is_capture_safe(name: str) -> None:
    assert msched.verify(_one_op(*TWINS[name]), cuda_graph=True).ok


def test_host_sync_reason_reads_dynamo_level_calls() -> None:
    graph = Graph()
    x = graph.placeholder("x")
    n = graph.placeholder("n")
    nodes = {
        "item": graph.call_method("item", (x,)),
        "tolist": graph.call_method("tolist", (x,)),
        "query": graph.call_method("query", (x,)),
        "nonzero": graph.call_function(torch.nonzero, (x,)),
        "repeat_tensor": graph.call_function(torch.repeat_interleave, (x, n)),
        "repeat_sized": graph.call_function(torch.repeat_interleave, (x, n), {"output_size": 8}),
        "repeat_int": graph.call_function(torch.repeat_interleave, (x, 2)),
        "mul": graph.call_method("mul", (x, 2)),
        "add": graph.call_function(operator.add, (x, x)),
    }
    reasons = {name: host_sync_reason(node) for name, node in nodes.items()}
    assert {name for name, why in reasons.items() if why} == {
        "item",
        "tolist",
        "query",
        "nonzero",
        "repeat_tensor",
    }
    assert "Tensor.item()" in str(reasons["item"])
    assert "output size" in str(reasons["nonzero"])


# -- capture-fork / capture-join (msched's dialect) ----------------------------------------


def test_the_clean_two_stream_schedule_is_capture_safe() -> None:
    assert msched.verify(two_streams(), cuda_graph=True).ok


def test_side_stream_work_before_joining_is_capture_fork() -> None:
    gm = unjoined_aux_start()
    assert faults(msched.verify(gm, cuda_graph=True)) == [
        ("capture-fork", ("b",)),
        ("capture-fork", ("record_event_default", "wait_event_default")),
    ]
    messages = [v.message for v in msched.verify(gm, cuda_graph=True).of_kind("capture-fork")]
    assert messages[0].startswith("stream 1 issues `b` before it joined the capture")
    assert "waits for event 1, recorded by `record_event_default` on stream 1" in messages[1]


def test_side_stream_work_stream_0_never_waits_for_is_capture_join() -> None:
    report = msched.verify(two_streams(join_exit=False), cuda_graph=True)
    assert faults(report) == [("capture-join", ("capture",))]
    assert report.of_kind("exit-not-joined")  # today's rule still says it too
    (v,) = report.of_kind("capture-join")
    assert v.message.startswith("stream 1 runs `capture` and stream 0 never waits for it")


def _trailing_wait(rejoin: bool) -> GraphModule:
    """Stream 1 joins, computes ``b`` (joined), then waits once more on stream 0; with
    ``rejoin`` stream 0 waits for stream 1 after that wait."""
    s = Scheduled()
    x = s.input("x")
    s.record(0)
    s.stream(1)
    s.wait(0)
    b = s.op("b", aten.relu.default, x)
    s.record(1)
    s.stream(0)
    s.wait(1)
    c = s.op("c", aten.neg.default, b)
    s.record(2)
    s.stream(1)
    s.wait(2)
    if rejoin:
        s.record(3)
    s.stream(0)
    if rejoin:
        s.wait(3)
    return s.done(c)


def test_a_side_stream_that_joined_last_by_a_wait_must_be_rejoined_after_it() -> None:
    unjoined = _trailing_wait(rejoin=False)
    assert msched.verify(unjoined).ok  # nothing races: only capture needs the rejoin
    (v,) = msched.verify(unjoined, cuda_graph=True).violations
    assert (v.kind, v.nodes, v.streams) == ("capture-join", ("wait_event_default_2",), (1,))
    assert msched.verify(_trailing_wait(rejoin=True), cuda_graph=True).ok


def test_a_stream_joins_the_capture_through_another_side_stream() -> None:
    """Stream 2 waits on a record of stream 1 made after stream 1 joined: it is captured."""
    s = Scheduled()
    x = s.input("x")
    s.record(0)
    s.stream(1)
    s.wait(0)
    a = s.op("a", aten.relu.default, x)
    s.record(1)
    s.stream(2)
    s.wait(1)
    b = s.op("b", aten.neg.default, a)
    s.record(2)
    s.stream(0)
    s.wait(2)
    gm = s.done(b)
    assert msched.verify(gm, cuda_graph=True).ok


@pytest.mark.parametrize("streams", [1, 2, 3, 4])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_msched_schedules_of_decoder_stacks_are_capture_safe(moe: bool, streams: int) -> None:
    stack = decoder_stack(6, (1, 3, 5), moe=moe)
    sched = msched.schedule(stack.gm, streams)
    report = msched.verify(stack.gm, original=sched.original, cuda_graph=True)
    assert report.ok, str(report)


# -- the torch dialect: user stream code traced on CPU, and by hand --------------------------

side = torch.Stream(device="cpu")
done = torch.Event(device="cpu")


def joined(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x.relu() * 2
    caller.wait_stream(side)
    return y + 1


def event_synchronized(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x.relu() * 2
    done.record(side)
    done.synchronize()
    caller.wait_stream(side)
    return y + 1


def stream_synchronized(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x.relu() * 2
    side.synchronize()
    caller.wait_stream(side)
    return y + 1


def works_before_joining(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    with side:
        y = x.relu() * 2
    side.wait_stream(caller)
    caller.wait_stream(side)
    return y + 1


def never_rejoined(x: torch.Tensor) -> torch.Tensor:
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x.relu() * 2
    return y + 1


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
@pytest.mark.parametrize(
    ("fn", "kind"),
    [
        (event_synchronized, "capture-sync"),
        (stream_synchronized, "capture-sync"),
        (works_before_joining, "capture-fork"),
        (never_rejoined, "capture-join"),
    ],
    ids=lambda p: getattr(p, "__name__", p),
)
def test_traced_user_code_with_a_capture_fault_is_reported(fn, kind: str, stage: str) -> None:
    gm = msched.trace_streams(fn, torch.randn(4), stage=stage)
    found = faults(msched.verify(gm, cuda_graph=True))
    assert [k for k, _ in found] == [kind], found
    assert msched.verify(
        msched.trace_streams(joined, torch.randn(4), stage=stage), cuda_graph=True
    ).ok


def test_traced_synchronize_names_the_node() -> None:
    gm = msched.trace_streams(stream_synchronized, torch.randn(4))
    assert msched.verify(gm).ok  # the barrier orders everything: no race
    (v,) = msched.verify(gm, cuda_graph=True).violations
    assert v.nodes == ("synchronize_stream",)
    assert v.message.startswith("`synchronize_stream` makes the host wait for stream 1")


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
def test_traced_item_and_nonzero_are_capture_sync(stage: str) -> None:
    def scalar_and_size(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = (x > 0).sum().item()  # a size read on the host
        return x.nonzero().sum(), torch.zeros(n)

    config = torch._dynamo.config
    with config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True):
        gm = msched.trace_streams(scalar_and_size, torch.randn(4), stage=stage)
    found = faults(msched.verify(gm, cuda_graph=True))
    assert [k for k, _ in found] == ["capture-sync", "capture-sync"], found
    assert msched.verify(gm).ok


def _torch_graph(sync: Any | None) -> GraphModule:
    """A hand-made ``torch`` dialect program: side stream (table index 1) joins through an
    event, computes, rejoins; ``sync`` (a ``streams.synchronize_*`` call) before output."""
    streams = torch.ops.streams
    graph = Graph()
    x = graph.placeholder("x")
    graph.call_function(streams.record_event.default, (2, 0))
    graph.call_function(streams.wait_event.default, (2, 1))
    y = graph.call_function(aten.relu.default, (x,))
    y.meta["custom"] = {"stream": 1}
    graph.call_function(streams.record_event.default, (3, 1))
    graph.call_function(streams.wait_event.default, (3, 0))
    if sync is not None:
        graph.call_function(sync[0], sync[1])
    graph.output(y)
    gm = GraphModule(torch.nn.Module(), graph)
    return gm


@pytest.mark.parametrize(
    "sync",
    [
        (torch.ops.streams.synchronize_device.default, ("cuda", 0)),
        (torch.ops.streams.synchronize_event.default, (3,)),
        (torch.ops.streams.synchronize_stream.default, (1,)),
    ],
    ids=["device", "event", "stream"],
)
def test_hand_made_torch_synchronize_is_capture_sync(sync: Any) -> None:
    gm = _torch_graph(sync)
    assert [k for k, _ in faults(msched.verify(gm, cuda_graph=True))] == ["capture-sync"]
    assert msched.verify(_torch_graph(None), cuda_graph=True).ok


@pytest.mark.slow
def test_msched_pieces_and_their_inductor_kernel_orders_are_capture_safe() -> None:
    """TinyDecoder compiled piecewise on 3 streams by both compilers: each scheduled piece
    (FX) and each final kernel order Inductor generated for msched's pieces is capture-safe."""
    from msched.models.decoders import TinyDecoder

    model = TinyDecoder(2, 16, (1,), moe=True)
    x, cap = model.example_inputs(4)
    for gm in msched.compile_pieces(model, x, cap, num_streams=3, piecewise=True):
        assert msched.verify(gm, cuda_graph=True).ok, gm
    b = msched.backend(num_streams=3, compiler="inductor", piecewise=True)
    torch.compiler.reset()
    with torch.no_grad():
        torch.compile(model, backend=b)(x, torch.zeros_like(cap))
    orders = [p.kernel_order for p in b.pieces]
    assert len(orders) >= 2 and all(order is not None for order in orders)
    for piece in b.pieces:
        assert piece.kernel_order is not None
        report = msched.verify(piece.kernel_order, cuda_graph=True)
        assert report.ok, f"{piece.name}: {report}"


def bool_mask_indexing(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    y[y > 0] = 1.0  # index_put_ with a mask: positions read on the host
    return x[x > 0].sum() + torch.where(x > 0)[0].sum()  # new sizes (unbacked symbols)


def integer_indexing(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    positions = torch.tensor([0, 2])
    y[positions] = 1.0
    return x[positions].sum() + torch.where(x > 0, x, y).sum()


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
def test_boolean_mask_indexing_is_capture_sync_and_integer_indexing_is_not(stage: str) -> None:
    """``x[mask]``, ``y[mask] = v`` and one-argument ``torch.where`` each run ``nonzero``
    (sampling and MoE code): every one verified capture-safe before."""
    gm = msched.trace_streams(bool_mask_indexing, torch.randn(4), torch.randn(4), stage=stage)
    found = faults(msched.verify(gm, cuda_graph=True))
    # torch 2.15's AOT autograd writes ``y[mask] = v`` as ``masked_fill``, which reads no
    # position on the host: then only ``x[mask]`` and ``where`` synchronize.
    masked_fill = any(n.target is torch.ops.aten.masked_fill.Scalar for n in gm.graph.nodes)
    expected = 2 if stage == "aot" and masked_fill else 3
    assert [k for k, _ in found] == ["capture-sync"] * expected, found
    fine = msched.trace_streams(integer_indexing, torch.randn(4), torch.randn(4), stage=stage)
    assert msched.verify(fine, cuda_graph=True).ok

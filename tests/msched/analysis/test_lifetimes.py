"""The record_stream rule: a record only where the allocator could reuse a block too early."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx import Graph

import msched
from msched.analysis.effects import compute_effects, produces_tensor
from msched.analysis.lifetimes import allocates, unsafe_cross_stream_uses
from msched.analysis.nodes import node_named
from msched.models.decoders import decoder_stack

from ..graphs import module
from ..hb import happens_before

aten = torch.ops.aten
RECORD = msched.ops.record_stream


def _records(gm: torch.fx.GraphModule) -> list[tuple[str, int]]:
    return [(n.args[0].name, n.args[1]) for n in gm.graph.nodes if n.target is RECORD]


def _fan_out() -> torch.fx.GraphModule:
    """``h`` (stream 0) is read by ``b`` and ``d`` on the two auxiliary streams.

    ``e`` on stream 0 is the first allocation after ``h``'s last use (``d``).  It waits for
    ``d`` but not for ``b``, so without ``h.record_stream(<b's stream>)`` the allocator could
    hand ``h``'s block to ``e`` while ``b`` still reads it.
    """
    g = Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    h = g.create_node("call_function", aten.relu.default, (x,), name="h")
    a = g.create_node("call_function", aten.mm.default, (h, w), name="a")
    b = g.create_node("call_function", aten.mm.default, (h, w), name="b")
    b2 = g.create_node("call_function", aten.mm.default, (b, w), name="b2")
    d = g.create_node("call_function", aten.mm.default, (h, w), name="d")
    e = g.create_node("call_function", aten.mul.Tensor, (a, d), name="e")
    f = g.create_node("call_function", aten.mm.default, (e, w), name="f")
    g.output(g.create_node("call_function", aten.add.Tensor, (f, b2), name="out"))
    return module(g)


def test_record_stream_is_emitted_where_the_producer_stream_allocates_before_joining() -> None:
    gm = _fan_out()
    sched = msched.schedule(gm, 3, keep_alive=False)
    b_stream = sched.stream_of("b")
    assert sched.stream_of("h") == sched.stream_of("e") == 0
    assert {b_stream, sched.stream_of("d")} == {1, 2}
    order = [n.name for n in gm.graph.nodes]
    assert order.index("e") > max(order.index("b"), order.index("d"))  # after h is freed
    hb = happens_before(gm)
    assert hb.ordered("d", "e") and not hb.ordered("b", "e")
    assert _records(gm) == [("h", b_stream)]


def test_by_default_the_tensor_is_kept_alive_until_its_stream_joins_instead() -> None:
    # Stream 0 joins b's stream first at out (it waits for b2): h lives until then, its
    # record_stream for its own stream (which the allocator ignores) right before out.
    gm = _fan_out()
    sched = msched.schedule(gm, 3)
    assert sched.stream_of("h") == 0
    assert _records(gm) == [("h", 0)]
    order = [n.name for n in gm.graph.nodes]
    keep = next(n.name for n in gm.graph.nodes if n.target is RECORD)
    assert order.index(keep) == order.index("out") - 1
    assert msched.verify(gm, original=sched.original).ok


def test_no_record_stream_when_the_producer_stream_joins_first() -> None:
    stack = decoder_stack(2, (1,), moe=False)
    msched.schedule(stack.gm, 3)
    hb = happens_before(stack.gm)
    # q, k and v read the normed hidden state on three streams; attention on stream 0 joins
    # k and v before anything else is allocated on stream 0, so no record is needed for it.
    norm = node_named(stack.gm, "mul_tensor_2")
    users = {u.name: hb.position[u.name][0] for u in norm.users}
    assert len(set(users.values())) == 3, users
    assert not [r for r in _records(stack.gm) if r[0] == "mul_tensor_2"]


@pytest.mark.parametrize("streams", [2, 3, 4])
def test_every_unsafe_use_of_a_schedule_has_its_record(streams: int) -> None:
    stack = decoder_stack(12, (1, 5, 11), moe=True)
    msched.schedule(stack.gm, streams, keep_alive=False)
    recorded = set(_records(stack.gm))
    unsafe = _unsafe_in(stack.gm)
    assert {(u.tensor.name, u.stream) for u in unsafe} == recorded
    if streams > 2:
        assert unsafe, "no cross-stream use needs a record: the test has no teeth"


@pytest.mark.parametrize("streams", [3, 4])
def test_every_unsafe_use_of_a_schedule_is_kept_alive_until_its_join(streams: int) -> None:
    stack = decoder_stack(12, (1, 5, 11), moe=True)
    msched.schedule(stack.gm, streams)
    hb = happens_before(stack.gm)
    unsafe = _unsafe_in(stack.gm)  # the keep-alives are stream ops: not counted as uses
    assert unsafe, "no cross-stream use needs protection: the test has no teeth"
    kept = set(_records(stack.gm))
    for use in unsafe:
        home = hb.position[use.root.name][0]
        assert (use.tensor.name, home) in kept, use
    assert msched.verify(stack.gm).ok


def _unsafe_in(gm: torch.fx.GraphModule) -> list:  # type: ignore[type-arg]
    """Re-derive the unsafe uses from the emitted graph alone (host order, vector clocks)."""
    hb = happens_before(gm)
    compute = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target not in msched.ops.STREAM_OPS
    ]
    stream = {n: hb.position[n.name][0] for n in compute}
    seq = {n: hb.position[n.name][1] for n in compute}
    knows = {n: hb.knows[n.name] for n in compute}
    effects = msched.build_dag(gm).effects
    out = next(n for n in gm.graph.nodes if n.op == "output")
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr"):
            stream[n] = 0
    return unsafe_cross_stream_uses(
        compute,
        out,
        stream,
        seq,
        knows,
        effects.root,
        produces_tensor,
        lambda n: allocates(n, effects),
    )


def _fan_out_traced() -> torch.fx.GraphModule:
    """`_fan_out` as `torch.fx.symbolic_trace` writes it: Python operators and a
    ``torch.nn.Linear`` call, no ``meta["val"]``."""

    class FanOut(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            h = self.proj(x) + x
            a, b, d = h @ w, h @ w, h @ w
            b2 = b @ w
            e = a * d
            return (e @ w) + b2

    return torch.fx.symbolic_trace(FanOut())


FC = torch.ops._c10d_functional


def _one_of_each() -> Graph:
    """One node of each kind `allocates` tells apart, named after what it is."""
    g = Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    made = {"fresh": g.create_node("call_function", aten.mm.default, (x, w), name="fresh")}
    made["view"] = g.create_node("call_function", aten.view.default, (x, [-1]), name="view")
    made["transposed"] = g.create_node("call_function", aten.t.default, (w,), name="transposed")
    halves = g.create_node("call_function", aten.split.Tensor, (x, 2), name="halves")
    made["element"] = g.create_node("call_function", operator.getitem, (halves, 0), name="element")
    made["in_place"] = g.create_node("call_function", aten.add_.Tensor, (w, 1), name="in_place")
    made["reshaped"] = g.create_node(
        "call_function", aten.reshape.default, (x, [-1]), name="reshaped"
    )
    issue = g.create_node("call_function", FC.all_reduce.default, (x, "sum", "0"), name="issue")
    made["issue"] = issue
    made["wait"] = g.create_node("call_function", FC.wait_tensor.default, (issue,), name="wait")
    made["unknown"] = g.create_node("call_function", print, (x,), name="unknown")
    g.output((made["fresh"], made["wait"]))
    return g


@pytest.mark.parametrize(
    ("name", "takes_a_block"),
    [
        ("x", False),  # a graph input: the caller's
        ("fresh", True),
        ("view", False),
        ("transposed", False),
        ("halves", False),  # a tuple of views
        ("element", False),  # getitem: its producer allocated
        ("wait", False),  # wait_tensor returns its input
        ("issue", True),  # the all_reduce's result
        ("reshaped", True),  # may copy
        ("in_place", True),  # kernels may take scratch space
        ("unknown", True),
    ],
)
def test_which_nodes_may_take_a_freed_block(name: str, takes_a_block: bool) -> None:
    g = _one_of_each()
    assert allocates(node_named(g, name), compute_effects(g)) is takes_a_block


def test_operators_and_nn_modules_of_a_traced_graph_produce_tensors() -> None:
    gm = _fan_out_traced()
    by_name = {n.name: n for n in gm.graph.nodes}
    assert produces_tensor(by_name["proj"]) and produces_tensor(by_name["add"])
    assert produces_tensor(by_name["matmul"])
    g = Graph()
    x = g.placeholder("x")
    size = g.call_method("size", (x, 0))
    assert not produces_tensor(g.call_function(operator.add, (size, 1)))


def test_traced_graph_gets_and_needs_its_record_stream() -> None:
    gm = _fan_out_traced()
    sched = msched.schedule(gm, 3)
    records = _records(gm)
    assert records and {name for name, _ in records} <= {"add", "proj"}, gm.code
    assert msched.verify(gm, original=sched.original).ok
    for node in [n for n in gm.graph.nodes if n.target is RECORD]:
        gm.graph.erase_node(node)
    kinds = [v.kind for v in msched.verify(gm, original=sched.original).violations]
    assert "missing-record-stream" in kinds

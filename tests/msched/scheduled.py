"""Hand-written scheduled graphs: compute nodes with chosen names plus explicit stream ops."""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

import msched
import msched.models.decoders  # noqa: F401  (registers msched::inplace_slice_copy)
from msched.proof.dialects import Dialect

aten = torch.ops.aten
capture_op = torch.ops.msched.inplace_slice_copy.default


class Scheduled:
    """Append compute nodes and stream ops to a graph, in host order.

    ``ops`` is the dialect used for the stream ops (msched's by default).
    """

    def __init__(self, dialect: Dialect | None = None) -> None:
        self.graph = Graph()
        self.ops = dialect or Dialect()

    def input(self, name: str) -> Node:
        return self.graph.placeholder(name)

    def op(self, name: str, target: Any, *args: Any) -> Node:
        return self.graph.create_node("call_function", target, args, name=name)

    def capture(self, name: str, dest: Node, src: Node, start: int = 0, end: int = 4) -> Node:
        return self.op(name, capture_op, dest, src, start, end)

    def _stream_op(self, kind: str, *args: Any) -> Node:
        target = getattr(self.ops, kind)
        if isinstance(target, str):
            namespace, name = target.split("::")
            target = getattr(getattr(torch.ops, namespace), name).default
        return self.graph.call_function(target, args)

    def stream(self, s: int) -> Node:
        return self._stream_op("set_stream", s)

    def record(self, event: int) -> Node:
        return self._stream_op("record_event", event)

    def wait(self, event: int) -> Node:
        return self._stream_op("wait_event", event)

    def keep(self, tensor: Node, s: int) -> Node:
        return self._stream_op("record_stream", tensor, s)

    def done(self, result: Any) -> GraphModule:
        self.graph.output(result)
        return GraphModule(torch.nn.Module(), self.graph)


def unjoined_aux_start(dialect: Dialect | None = None) -> GraphModule:
    """Stream 1 reads the input ``x`` in ``b`` without ever joining stream 0 first."""
    s = Scheduled(dialect)
    x = s.input("x")
    s.stream(1)
    b = s.op("b", torch.ops.aten.relu.default, x)
    s.record(1)
    s.stream(0)
    s.wait(1)
    s.keep(b, 0)
    return s.done(b)


def unscheduled(gm: GraphModule) -> GraphModule:
    """``gm`` without its msched stream ops: the original program, in the same node order."""
    graph = Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and node.target in msched.ops.STREAM_OPS:
            graph.erase_node(node)
    return GraphModule(gm, graph)


def two_streams(
    *, join_exit: bool = True, wait_for_a: bool = True, record: bool = True
) -> GraphModule:
    """``a = x @ w`` and ``c = x @ w`` on stream 0; ``b = a @ w`` and ``capture(dest, b)``
    on stream 1; ``d = c @ w`` and ``out = d + b`` on stream 0.  Flags leave out one
    synchronisation each: the exit's join of the capture, the wait for ``a``, and
    ``record_stream(a, 1)``."""
    s = Scheduled()
    x, w, dest = s.input("x"), s.input("w"), s.input("dest")
    s.record(0)
    a = s.op("a", aten.mm.default, x, w)
    s.record(1)
    c = s.op("c", aten.mm.default, x, w)
    s.stream(1)
    s.wait(0)
    if wait_for_a:
        s.wait(1)
    if record:
        s.keep(a, 1)
    b = s.op("b", aten.mm.default, a, w)
    s.record(2)
    s.capture("capture", dest, b)
    if join_exit:
        s.record(3)
    s.stream(0)
    d = s.op("d", aten.mm.default, c, w)  # may reuse a's memory unless a is recorded on 1
    s.wait(2)
    if join_exit:
        s.wait(3)
    s.keep(b, 0)
    out = s.op("out", aten.add.Tensor, d, b)
    return s.done(out)


def two_streams_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 4, generator=gen), torch.randn(4, 4, generator=gen), torch.zeros(4, 4)


def define_stream_ops(namespace: str) -> torch.library.Library:
    """Register msched's four stream ops under ``namespace`` (another engine's dialect), as
    no-ops; keep the returned library alive as long as the ops are used."""
    lib = torch.library.Library(namespace, "DEF")
    for schema in (
        "set_stream(int stream) -> ()",
        "record_event(int event) -> ()",
        "wait_event(int event) -> ()",
        "record_stream(Tensor t, int stream) -> ()",
    ):
        lib.define(schema)
        lib.impl(schema.split("(")[0], lambda *args: None, "CompositeExplicitAutograd")
    return lib

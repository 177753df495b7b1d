"""Small hand-built graphs shared by the scheduler tests."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType

import torch
from torch.fx import Graph, GraphModule, Node

import msched.models.reference_ops  # noqa: F401  (registers msched::inplace_slice_copy)

aten = torch.ops.aten
capture_op = torch.ops.msched.inplace_slice_copy.default


def module(graph: Graph) -> GraphModule:
    return GraphModule(torch.nn.Module(), graph)


def eagle3_graph(positional: bool = False) -> tuple[GraphModule, dict[str, Node]]:
    """x -> two matmul branches -> output; a capture of one branch into ``dest`` (no users)."""
    g = Graph()
    x, w, dest = g.placeholder("x"), g.placeholder("w"), g.placeholder("dest")
    h = g.call_function(aten.mm.default, (x, w))
    a = g.call_function(aten.relu.default, (h,))
    b = g.call_function(aten.mm.default, (h, w))
    if positional:
        cap = g.create_node("call_function", capture_op, (dest, a, 0, 4), name="capture")
    else:
        kwargs = {"dest": dest, "src": a, "start": 0, "end": 4}
        cap = g.create_node("call_function", capture_op, (), kwargs, name="capture")
    c = g.call_function(aten.mm.default, (b, w))
    out = g.call_function(aten.add.Tensor, (c, b))
    g.output(out)
    return module(g), {"h": h, "a": a, "b": b, "capture": cap, "out": out}


def cyclic_graph(self_loop: bool = False) -> GraphModule:
    """``cos = cos(x)``, ``matmul = cos @ cos``, then ``cos`` edited to use ``matmul`` (the
    cycle ``cos -> matmul -> cos``) or, with ``self_loop``, itself (``cos -> cos``)."""
    g = Graph()
    x = g.placeholder("x")
    cos = g.create_node("call_function", aten.cos.default, (x,), name="cos")
    matmul = g.create_node("call_function", aten.mm.default, (cos, cos), name="matmul")
    g.output(matmul)
    cos.args = (cos,) if self_loop else (matmul,)
    return module(g)


@contextlib.contextmanager
def within(seconds: float) -> Iterator[None]:
    """Raise `TimeoutError` in the block when it runs longer than ``seconds`` (a hang becomes
    a failure).  Uses SIGALRM, so only in the main thread (as pytest and its workers run)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def eagle3_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(4, 4, generator=gen), torch.randn(4, 4, generator=gen), torch.zeros(4, 8)


def hazard_graph(kind: str) -> tuple[GraphModule, dict[str, Node]]:
    """A hazard on the intermediate ``buf`` between two branches that land on two streams.

    - ``war``: ``first`` reads ``buf`` and starts a long chain; ``second`` overwrites ``buf``;
    - ``raw``: ``first`` writes ``buf``; ``second`` reads it together with a long chain;
    - ``waw``: ``first`` writes ``buf``; ``second`` writes it with a long chain's result.
    """
    g = Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    buf = g.call_function(aten.mm.default, (x, w))
    src = g.call_function(aten.relu.default, (x,))
    chain = g.call_function(aten.mm.default, (x, w))
    chain = g.call_function(aten.mm.default, (chain, w))
    nodes: dict[str, Node] = {"buf": buf}
    if kind == "war":
        nodes["first"] = g.call_function(aten.mm.default, (buf, w))
        tail = g.call_function(aten.mm.default, (nodes["first"], w))
        nodes["second"] = g.call_function(aten.copy_.default, (buf, src))
        result = g.call_function(aten.add.Tensor, (tail, chain))
    elif kind == "raw":
        nodes["first"] = g.call_function(aten.copy_.default, (buf, src))
        nodes["second"] = g.call_function(aten.mm.default, (buf, chain))
        result = nodes["second"]
    else:
        nodes["first"] = g.call_function(aten.copy_.default, (buf, src))
        nodes["second"] = g.call_function(aten.copy_.default, (buf, chain))
        result = g.call_function(aten.mul.Tensor, (buf, buf))
    g.output((result, buf))
    return module(g), nodes


class CountCalls(torch.nn.Module):
    """Adds its input's sum to a buffer on every call and draws a random number: module state
    and random state a run changes."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x.sum())
        return x * torch.rand(())

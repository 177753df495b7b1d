"""Hypothesis strategies for testing schedulers: random FX graphs with storage hazards.

Needs ``hypothesis`` (the ``test`` extra); ``import msched`` does not import this module::

    import msched.strategies as mst

    @given(mst.graphs(), mst.stream_counts())
    def test_my_scheduler(gm, num_streams):
        inputs = mst.example_inputs(gm)
        ...

Generated graphs work on ``[4, 4]`` float tensors and mix: matmuls and elementwise ops;
reads through views of inputs (``aten.slice`` / ``aten.select``); in-place writes into views
of inputs (``aten.copy_``), in-place updates of intermediates (``aten.add_`` / ``aten.mul_``)
and Eagle3-style captures into a ``dest`` input (``msched::inplace_slice_copy``), none of
which is returned; and later reads of what was written.  Placeholders carry
``meta["val"]`` (a ``meta``-device tensor of their shape), which `example_inputs` reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import Argument

import msched.decoder  # noqa: F401  (registers msched::inplace_slice_copy)

__all__ = ["OPS", "example_inputs", "graphs", "stream_counts"]

aten = torch.ops.aten
SIZE = 4
OPS = ("mm", "add", "mul", "tanh", "read_view", "copy_into_input", "update", "capture")


@dataclass
class _Builder:
    """The graph being drawn and the values its next node can use."""

    graph: Graph = field(default_factory=Graph)
    root: torch.nn.Module = field(default_factory=torch.nn.Module)
    inputs: list[Node] = field(default_factory=list)  # writable placeholders
    readable: list[Node] = field(default_factory=list)  # [SIZE, SIZE] inputs and results
    results: list[Node] = field(default_factory=list)  # [SIZE, SIZE] op outputs (not views)
    dest: Node | None = None
    slots: int = 0

    def placeholder(self, name: str, *shape: int) -> Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = torch.empty(*shape, device="meta")
        return node

    def call(self, target: object, *args: object) -> Node:
        return self.graph.call_function(target, args)  # type: ignore[arg-type]


def _view(
    draw: st.DrawFn, b: _Builder, base: Node, like: Node | None = None
) -> tuple[Node, Node | None]:
    """A column slice or a row of ``base``; the same view of ``like`` when given.

    Without ``like`` (a view to read) the slice is one column wide, so it broadcasts.
    """
    if draw(st.booleans()):
        lo = draw(st.integers(0, SIZE - 1))
        hi = draw(st.integers(lo + 1, SIZE)) if like is not None else lo + 1
        twin = b.call(aten.slice.Tensor, like, 1, lo, hi) if like is not None else None
        return b.call(aten.slice.Tensor, base, 1, lo, hi), twin
    row = draw(st.integers(0, SIZE - 1))
    twin = b.call(aten.select.int, like, 0, row) if like is not None else None
    return b.call(aten.select.int, base, 0, row), twin


def _add_result(b: _Builder, node: Node) -> None:
    b.readable.append(node)
    b.results.append(node)


def _draw_op(draw: st.DrawFn, b: _Builder, op: str) -> None:
    pick = st.sampled_from(b.readable)
    if op == "mm":
        _add_result(b, b.call(aten.mm.default, draw(pick), draw(pick)))
    elif op in ("add", "mul"):
        target = aten.add.Tensor if op == "add" else aten.mul.Tensor
        _add_result(b, b.call(target, draw(pick), draw(pick)))
    elif op == "tanh":
        _add_result(b, b.call(aten.tanh.default, draw(pick)))
    elif op == "read_view":
        view, _ = _view(draw, b, draw(pick))
        _add_result(b, b.call(aten.mul.Tensor, draw(pick), view))
    elif op == "copy_into_input" and b.inputs:
        view, src = _view(draw, b, draw(st.sampled_from(b.inputs)), like=draw(pick))
        b.call(aten.copy_.default, view, src)
    elif op == "update" and b.results:
        target = aten.add_.Tensor if draw(st.booleans()) else aten.mul_.Tensor
        b.call(target, draw(st.sampled_from(b.results)), draw(pick))
    elif op == "capture" and b.dest is not None:
        _capture(draw, b, draw(pick))
    else:
        _add_result(b, b.call(aten.sub.Tensor, draw(pick), draw(pick)))


def _capture(draw: st.DrawFn, b: _Builder, src: Node) -> None:
    j = draw(st.integers(0, b.slots - 1))
    start, end = j * SIZE, (j + 1) * SIZE
    op = torch.ops.msched.inplace_slice_copy.default
    if draw(st.booleans()):
        kwargs: dict[str, Argument] = {"dest": b.dest, "src": src, "start": start, "end": end}
        b.graph.create_node("call_function", op, (), kwargs, name="capture")
    else:
        b.graph.create_node("call_function", op, (b.dest, src, start, end), name="capture")


@st.composite
def graphs(
    draw: st.DrawFn,
    min_nodes: int = 1,
    max_nodes: int = 16,
    max_inputs: int = 3,
    ops: tuple[str, ...] = OPS,
) -> GraphModule:
    """A random `GraphModule` of ``min_nodes``..``max_nodes`` drawn ops (views not counted).

    ``ops`` restricts the kinds of nodes drawn (see `OPS`).  Inputs are ``x0``.. (written
    only through ``copy_`` into views), optionally ``dest`` (written only by captures) and
    a ``get_attr`` weight ``w`` (read only, so running the graph twice gives the same result).
    """
    b = _Builder()
    for i in range(draw(st.integers(1, max_inputs))):
        node = b.placeholder(f"x{i}", SIZE, SIZE)
        b.inputs.append(node)
        b.readable.append(node)
    if "capture" in ops and draw(st.booleans()):
        b.slots = draw(st.integers(1, 3))
        b.dest = b.placeholder("dest", SIZE, SIZE * b.slots)
    if draw(st.booleans()):
        b.root.register_buffer("w", torch.eye(SIZE) * 0.5 + 0.1)
        b.readable.append(b.graph.get_attr("w"))
    for op in draw(st.lists(st.sampled_from(ops), min_size=min_nodes, max_size=max_nodes)):
        _draw_op(draw, b, op)
    returned = (
        draw(st.lists(st.sampled_from(b.results), max_size=3, unique=True)) if b.results else []
    )
    b.graph.output(tuple(returned) if returned else b.call(aten.clone.default, b.readable[-1]))
    return GraphModule(b.root, b.graph, "Generated")


def stream_counts() -> st.SearchStrategy[int]:
    """Stream counts worth testing: 1 (no stream ops), a few, and more than the graph needs."""
    return st.sampled_from([1, 2, 3, 4, 8])


def example_inputs(gm: GraphModule, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Fresh random inputs for ``gm``, shaped by its placeholders' ``meta["val"]``."""
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta["val"]
            inputs.append(torch.randn(*val.shape, generator=gen, dtype=val.dtype) * 0.5)
    return tuple(inputs)

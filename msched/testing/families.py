"""Graph families for measuring schedules: layered DAGs, MoE layers, attention + MLP blocks.

Each builder returns a runnable `GraphModule` of aten ops on small float tensors, drawn from
a seed (same seed, same graph).  Under `msched.DefaultCostModel` a matmul costs 10, an
elementwise op 1 and a view 0, so the families differ in the shape of their DAG, which is
what a stream assignment has to get right:

- `layered_dag`: random layers of matmuls and elementwise ops, each reading one or two values
  of the layers before it, plus views;
- `moe_layer`: a router and 3..16 experts of unequal length (1 to 4 matmuls), a shared expert
  and the weighted sum, with a view of the input feeding a long expert;
- `attention_mlp`: blocks of attention (q / k / v projections in parallel, a view of the
  scores) and an MLP whose gate and up projections are independent branches.

The quality benchmark and the property tests of `msched.schedule` use them.
"""

from __future__ import annotations

import random

import torch
from torch.fx import Graph, GraphModule, Node

__all__ = ["attention_mlp", "layered_dag", "moe_layer"]

aten = torch.ops.aten
SIZE = 4


class _Graph:
    def __init__(self, name: str) -> None:
        self.graph = Graph()
        self.root = torch.nn.Module()
        self.name = name
        self.x = self.input("x")
        self.weights = 0

    def input(self, name: str) -> Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = torch.empty(SIZE, SIZE, device="meta")
        return node

    def weight(self) -> Node:
        name = f"w{self.weights}"
        self.weights += 1
        gen = torch.Generator().manual_seed(self.weights)
        self.root.register_buffer(name, torch.randn(SIZE, SIZE, generator=gen) * 0.3)
        return self.graph.get_attr(name)

    def mm(self, x: Node) -> Node:
        return self.graph.call_function(aten.mm.default, (x, self.weight()))

    def op(self, target: object, *args: object) -> Node:
        return self.graph.call_function(target, args)  # type: ignore[arg-type]

    def view(self, x: Node) -> Node:
        return self.op(aten.view.default, x, [SIZE, SIZE])

    def module(self, *outputs: Node) -> GraphModule:
        self.graph.output(outputs[0] if len(outputs) == 1 else tuple(outputs))
        return GraphModule(self.root, self.graph, self.name)


def layered_dag(seed: int, layers: int = 5, width: int = 4) -> GraphModule:
    """Random layers of up to ``width`` nodes; every node reads the layers before it."""
    rng = random.Random(seed)
    b = _Graph("LayeredDag")
    earlier: list[Node] = [b.x]
    for _ in range(layers):
        layer = []
        for _ in range(rng.randint(1, width)):
            src = rng.choice(earlier[-2 * width :])
            kind = rng.random()
            if kind < 0.45:
                node = b.mm(src)
            elif kind < 0.6:
                node = b.view(src)
            elif kind < 0.8:
                node = b.op(aten.add.Tensor, src, rng.choice(earlier))
            else:
                node = b.op(aten.tanh.default, src)
            layer.append(node)
        earlier.extend(layer)
    sinks = [n for n in earlier[1:] if not n.users]
    return b.module(*sinks)


def _chain(b: _Graph, x: Node, length: int) -> Node:
    for _ in range(length):
        x = b.op(aten.relu.default, b.mm(x))
    return x


def moe_layer(seed: int, experts: int | None = None) -> GraphModule:
    """A router, ``experts`` (3..16, drawn when None) experts of 1..4 matmuls each, a shared
    expert of 3, and the routed sum; one expert reads a view of the input."""
    rng = random.Random(seed)
    n = experts if experts is not None else rng.randint(3, 16)
    b = _Graph("MoeLayer")
    gate = b.op(aten.softmax.int, b.mm(b.x), -1)
    total = _chain(b, b.x, 3)  # the shared expert
    for i in range(n):
        src = b.view(b.x) if i == 0 else b.x
        out = _chain(b, src, rng.randint(1, 4))
        weighted = b.op(aten.mul.Tensor, out, b.op(aten.select.int, gate, 1, i % SIZE))
        total = b.op(aten.add.Tensor, total, weighted)
    return b.module(total)


def _attention(b: _Graph, x: Node) -> Node:
    q, k, v = b.mm(x), b.mm(x), b.mm(x)
    scores = b.op(aten.mm.default, q, b.op(aten.t.default, k))
    probs = b.op(aten.softmax.int, b.view(scores), -1)
    return b.mm(b.op(aten.mm.default, probs, v))


def _mlp(b: _Graph, x: Node, rng: random.Random) -> Node:
    gate = b.op(aten.silu.default, b.mm(x))
    up = _chain(b, x, rng.randint(1, 2))
    return b.mm(b.op(aten.mul.Tensor, gate, up))


def attention_mlp(seed: int, blocks: int = 2) -> GraphModule:
    """``blocks`` blocks of attention then MLP, each with its residual add; a side branch
    (a norm-like elementwise chain) runs beside each attention."""
    rng = random.Random(seed)
    b = _Graph("AttentionMlp")
    x = b.x
    for _ in range(blocks):
        side = _chain(b, x, rng.randint(0, 2))
        x = b.op(aten.add.Tensor, b.op(aten.add.Tensor, x, _attention(b, x)), side)
        x = b.op(aten.add.Tensor, x, _mlp(b, x, rng))
    return b.module(x)

"""Sharded graphs for the scheduler: tensor parallelism, expert parallelism, micro-batches.

Each builder returns a `GraphModule` of aten ops and PyTorch's functional collectives
(``torch.ops._c10d_functional``, as Dynamo traces them: the collective, then its
``wait_tensor``) on process group ``"0"``.  They are built by hand, so building and
scheduling them needs no process group (running them does).  Nodes are named after what they
stand for (``o_proj0``, ``all_reduce_o0``, ``wait_o0``), inputs and weights are placeholders.

- `two_microbatches`: per micro-batch ``linear -> all_reduce -> wait_tensor -> linear``;
- `tp_stack`: tensor-parallel decoder layers (all-reduce after the attention output and the
  MLP's down projection), for ``microbatches`` independent micro-batches (``a``, ``b``, ...)
  interleaved stage by stage -- every micro-batch's attention, then every one's MLP -- as
  two-batch overlap writes them, which is also the order of their collectives;
- `ep_moe`: an expert-parallel MoE layer: router, all-to-all dispatch, experts, all-to-all
  combine, and a shared expert that reads only the layer input.

The scheduling tests and ``benchmarks/bench_comm.py`` use them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

__all__ = ["ep_moe", "tp_stack", "two_microbatches"]

aten = torch.ops.aten
FC = torch.ops._c10d_functional
GROUP = "0"


class _Builder:
    def __init__(self) -> None:
        self.graph = Graph()

    def input(self, name: str) -> Node:
        return self.graph.placeholder(name)

    def call(self, name: str, target: Any, *args: Any) -> Node:
        return self.graph.create_node("call_function", target, args, name=name)

    def linear(self, name: str, x: Node, w: Node) -> Node:
        return self.call(name, aten.mm.default, x, w)

    def all_reduce(self, tag: str, x: Node) -> Node:
        issued = self.call(f"all_reduce_{tag}", FC.all_reduce, x, "sum", GROUP)
        return self.call(f"wait_{tag}", FC.wait_tensor, issued)

    def all_to_all(self, tag: str, x: Node) -> Node:
        issued = self.call(f"all_to_all_{tag}", FC.all_to_all_single, x, [2, 2], [2, 2], GROUP)
        return self.call(f"wait_{tag}", FC.wait_tensor, issued)

    def module(self, *outputs: Node) -> GraphModule:
        self.graph.output(outputs)
        return GraphModule(torch.nn.Module(), self.graph)


def two_microbatches() -> GraphModule:
    """Micro-batches ``a`` and ``b``, each ``lin1_* -> all_reduce_* -> wait_* -> lin2_*``."""
    b = _Builder()
    w = b.input("w")
    xs = [b.input(f"x_{tag}") for tag in "ab"]
    outs = []
    for tag, x in zip("ab", xs, strict=True):
        h = b.all_reduce(tag, b.linear(f"lin1_{tag}", x, w))
        outs.append(b.linear(f"lin2_{tag}", h, w))
    return b.module(*outs)


def tp_stack(layers: int = 2, microbatches: int = 1) -> GraphModule:
    """``layers`` tensor-parallel decoder layers per micro-batch: q/k/v projections, an
    attention op, the output projection and its all-reduce, the residual add; then gate and
    up projections, their product, the down projection and its all-reduce, the add.  Node
    names end in the layer, then (with several micro-batches) ``_a``, ``_b``, ..."""
    b = _Builder()
    ws = {name: b.input(f"w_{name}") for name in ("q", "k", "v", "o", "gate", "up", "down")}
    xs = [b.input(f"x{m}") for m in range(microbatches)]
    for i in range(layers):  # stage by stage, as two-batch overlap interleaves them
        for stage in (_attention, _mlp):
            for m in range(microbatches):
                xs[m] = stage(
                    b, f"{i}" if microbatches == 1 else f"{i}_{chr(ord('a') + m)}", xs[m], ws
                )
    return b.module(*xs)


def _attention(b: _Builder, tag: str, x: Node, ws: dict[str, Node]) -> Node:
    q, k, v = (b.linear(f"{n}_proj{tag}", x, ws[n]) for n in "qkv")
    out = b.call(f"attention{tag}", aten.scaled_dot_product_attention.default, q, k, v)
    o = b.all_reduce(f"o{tag}", b.linear(f"o_proj{tag}", out, ws["o"]))
    return b.call(f"residual_attn{tag}", aten.add.Tensor, x, o)


def _mlp(b: _Builder, tag: str, x: Node, ws: dict[str, Node]) -> Node:
    gate = b.linear(f"gate_proj{tag}", x, ws["gate"])
    up = b.linear(f"up_proj{tag}", x, ws["up"])
    act = b.call(f"act{tag}", aten.mul.Tensor, b.call(f"silu{tag}", aten.silu.default, gate), up)
    down = b.all_reduce(f"down{tag}", b.linear(f"down_proj{tag}", act, ws["down"]))
    return b.call(f"residual_mlp{tag}", aten.add.Tensor, x, down)


def ep_moe(experts: int = 2) -> GraphModule:
    """An expert-parallel MoE layer: ``router`` scores the tokens; ``all_to_all_dispatch``
    sends them to the ranks of their experts; ``experts`` local experts (two matmuls each)
    run on what arrives; ``all_to_all_combine`` brings their outputs back, weighted by the
    router; the shared expert (``shared_up``, ``shared_act``, ``shared_down``) reads only the
    layer input and is added at the end."""
    b = _Builder()
    x, w_router, w_shared_up, w_shared_down = (
        b.input(n) for n in ("x", "w_router", "w_shared_up", "w_shared_down")
    )
    scores = b.call("softmax", aten._softmax.default, b.linear("router", x, w_router), -1, False)
    routed = b.call("permute_tokens", aten.mul.Tensor, x, scores)
    arrived = b.all_to_all("dispatch", routed)
    outs = []
    for e in range(experts):
        up, down = b.input(f"w_up{e}"), b.input(f"w_down{e}")
        h = b.call(f"expert_act{e}", aten.silu.default, b.linear(f"expert_up{e}", arrived, up))
        outs.append(b.linear(f"expert_down{e}", h, down))
    total = outs[0]
    for e, out in enumerate(outs[1:], 1):
        total = b.call(f"expert_sum{e}", aten.add.Tensor, total, out)
    back = b.all_to_all("combine", total)
    shared = b.call("shared_act", aten.silu.default, b.linear("shared_up", x, w_shared_up))
    shared = b.linear("shared_down", shared, w_shared_down)
    return b.module(b.call("moe_out", aten.add.Tensor, back, shared))

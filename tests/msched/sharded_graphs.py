"""The two-micro-batch graph of issue 34, by hand: the smallest graph with communication to hide.

Micro-batches ``a`` and ``b``, each ``lin1_* -> ar_* (all_reduce) -> wait_* -> lin2_*``, on
process group ``"0"`` (or the groups given).  The sharded decoder stacks
(`msched.models.decoders.decoder_stack` with ``tp=``, ``ep=``, ``microbatches=``) are the
home of the larger sharded graphs; this one stays here because the overlap acceptance names
its exact nodes.  Building and scheduling it needs no process group.

Also the engine collective the tests declare with `msched.register_collective`:
``mschedtest::all_reduce(Tensor t, str group_name) -> Tensor`` (`ENGINE_ALL_REDUCE`, the op
packet Dynamo writes; `engine_all_reduce`, the ``custom_op`` object).
"""

from __future__ import annotations

import torch
from torch.fx import Graph, GraphModule

aten = torch.ops.aten
FC = torch.ops._c10d_functional


@torch.library.custom_op("mschedtest::all_reduce", mutates_args=())
def engine_all_reduce(t: torch.Tensor, group_name: str) -> torch.Tensor:
    return t.clone()


@engine_all_reduce.register_fake
def _(t: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(t)


ENGINE_ALL_REDUCE = torch.ops.mschedtest.all_reduce


def two_microbatches(groups: tuple[str, str] = ("0", "0")) -> GraphModule:
    """Micro-batches a and b, each ``linear -> all_reduce -> wait_tensor -> linear``."""
    g = Graph()
    xa, xb, w = g.placeholder("xa"), g.placeholder("xb"), g.placeholder("w")
    outs = []
    for tag, x, group in (("a", xa, groups[0]), ("b", xb, groups[1])):
        h = g.create_node("call_function", aten.mm.default, (x, w), name=f"lin1_{tag}")
        r = g.create_node("call_function", FC.all_reduce, (h, "sum", group), name=f"ar_{tag}")
        t = g.create_node("call_function", FC.wait_tensor, (r,), name=f"wait_{tag}")
        outs.append(g.create_node("call_function", aten.mm.default, (t, w), name=f"lin2_{tag}"))
    g.output(tuple(outs))
    return GraphModule(torch.nn.Module(), g)

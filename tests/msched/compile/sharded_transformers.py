"""What `test_sharded_transformers` runs on each rank (module level, so that the ranks import it).

A tiny random ``transformers`` decoder (`transformers_models`, seeded: one model on every
rank) with its Eagle3 capture, sharded over the ranks' default gloo group in one of two ways:

- ``"hand"``: the engines' way.  Each ``q/k/v/gate/up`` projection is replaced by a
  `ColumnLinear` holding this rank's rows of its weight (and bias), each ``o/down`` by a
  `RowLinear` holding this rank's columns that all-reduces its partial sum with
  ``torch.ops._c10d_functional.all_reduce`` and ``wait_tensor``.  Attention reshapes its
  projections by ``head_dim`` (``view(..., -1, head_dim)``), so each rank runs its share of the
  heads and of the key/value heads without another change.
- ``"dtensor"``: ``torch.distributed.tensor.parallel.parallelize_module`` with
  ``ColwiseParallel`` and ``RowwiseParallel`` for the same projections, on a 1-D CPU
  ``DeviceMesh`` of the default group.

Needs the ``transformers`` extra (imported by `transformers_models`).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

import msched
from msched.analysis.collectives import collectives_in
from tests.msched.compile import transformers_models as models

#: The projections each sharding splits: by output features (column), by input (row).
COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
          "mlp.up_proj")  # fmt: skip
ROW = ("self_attn.o_proj", "mlp.down_proj")
SHARDINGS = ("hand", "dtensor")


class ColumnLinear(nn.Module):
    """This rank's share of ``linear``'s output features (a block of rows of its weight)."""

    def __init__(self, linear: nn.Linear, rank: int, world_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, 0)[rank].clone())
        bias = linear.bias  # Qwen2's q/k/v have one
        self.bias = bias if bias is None else nn.Parameter(bias.detach().chunk(world_size)[rank])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)


class RowLinear(nn.Module):
    """This rank's share of ``linear``'s input features, its partial sums all-reduced (the
    bias added once, after the sum)."""

    def __init__(self, linear: nn.Linear, rank: int, world_size: int, group: str) -> None:
        super().__init__()
        self.weight = nn.Parameter(linear.weight.detach().chunk(world_size, 1)[rank].clone())
        self.bias = linear.bias
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = nn.functional.linear(x, self.weight)
        reduced = torch.ops._c10d_functional.all_reduce(partial, "sum", self.group)
        out = torch.ops._c10d_functional.wait_tensor(reduced)
        return out if self.bias is None else out + self.bias


def shard_by_hand(lm: nn.Module, rank: int, world_size: int) -> int:
    """Replace ``lm``'s projections in place with their shards; the all-reduces it adds."""
    group = torch.distributed.distributed_c10d._get_default_group().group_name
    reduces = 0
    for layer in lm.model.layers:
        for path in COLUMN:
            _replace(layer, path, ColumnLinear(layer.get_submodule(path), rank, world_size))
        for path in ROW:
            _replace(layer, path, RowLinear(layer.get_submodule(path), rank, world_size, group))
            reduces += 1
    return reduces


def _replace(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent), name, module)


def shard_with_dtensor(lm: nn.Module, world_size: int) -> int:
    """``parallelize_module`` of ``lm``'s projections on a 1-D CPU mesh; the all-reduces
    the plan implies (one per row-parallel projection)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world_size,))
    plan: dict[str, Any] = {}
    for i in range(len(lm.model.layers)):
        plan |= {f"model.layers.{i}.{p}": ColwiseParallel() for p in COLUMN}
        plan |= {f"model.layers.{i}.{p}": RowwiseParallel() for p in ROW}
    parallelize_module(lm, mesh, plan)
    return len(ROW) * len(lm.model.layers)


def sharded_run(
    rank: int, world_size: int, family: str, sharding: str, compiler: str, piecewise: bool,
    cache_dir: str,
) -> dict[str, Any]:  # fmt: skip
    """Model ``family`` sharded by ``sharding``, compiled with ``msched.backend(num_streams=2,
    compiler=compiler, piecewise=piecewise)`` on this rank (its own cold Inductor cache), run
    twice, against the unsharded model in eager: logits, capture buffers, the collectives the
    pieces issue in order, each piece's verdict."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir, f"rank{rank}")
    full, make_inputs = models.build(family)
    sharded, _ = models.build(family)
    if sharding == "hand":
        reduces = shard_by_hand(sharded.lm, rank, world_size)
    else:
        reduces = shard_with_dtensor(sharded.lm, world_size)
    backend = msched.backend(num_streams=2, compiler=compiler, piecewise=piecewise)
    torch._dynamo.reset()
    compiled = torch.compile(sharded, backend=backend)
    runs = []
    with torch.no_grad():
        for _ in range(2):
            ids, want_capture = make_inputs()
            got_capture = want_capture.clone()
            want = full(ids, want_capture)
            got = compiled(ids, got_capture)
            runs.append((got, want, got_capture, want_capture))
    return {
        "runs": runs,
        "reduces": reduces,
        "graphs": len(backend.graphs),
        "pieces": len(backend.pieces),
        "verified": [p.report is not None and p.report.ok for p in backend.pieces],
        "reports": [str(p.report) for p in backend.pieces if p.report is None or not p.report.ok],
        "collectives": [c for p in backend.pieces for c in issued(p)],
    }


def issued(piece: Any) -> list[tuple[str, str | None, str]]:
    """The collectives a piece issues, in its order: op, group and node name, of Inductor's
    final kernel order (by issue position) or of the scheduled graph (``compiler="fx"``)."""
    if piece.kernel_order is not None:
        found = collectives_in(piece.kernel_order.graph)
        found.sort(key=lambda c: c.node.meta.get("msched_issue", 0))
    else:
        found = collectives_in(piece.gm.graph)
    return [(c.op.removesuffix("_"), c.group, c.node.name) for c in found]

"""Sharded decoder stacks: tensor parallelism, expert parallelism, the collectives they issue.

`msched.models.decoders.decoder_stack` builds them (``tp=``, ``ep=``, ``microbatches=``) with
the helpers here; `TensorParallelDecoder` is the same tensor-parallel layers as an
``nn.Module`` calling `torch.distributed`'s functional collectives, for ``torch.compile``.

Collectives are written as Dynamo traces ``torch.distributed._functional_collectives`` on
torch 2.13: the op packet (``torch.ops._c10d_functional.all_reduce``, no ``.default``) with the
group's name as a string, then ``torch.ops._c10d_functional.wait_tensor`` of its result.  The
name of the default group of ``init_process_group`` is ``"0"``; building a graph needs no
process group (the name is only a string), running it needs the group.

How the weights are sharded (each rank holds its part; ``rank`` says which).  Every weight is
drawn in full from the stack's seed, exactly as the unsharded stack draws it, then cut:

- ``tp``: attention's ``wv`` and the MLP's ``wg``/``wu`` by columns (column-parallel),
  ``wo`` and ``wd`` by rows (row-parallel); ``wq``, ``wk``, the norms and the router stay
  whole.  Attention is linear in ``v``'s columns, so each rank's attention output is the
  full output's column block; each row-parallel product is a partial sum, and the
  all-reduce (sum) after it gives the unsharded product on every rank.
- ``ep``: the MoE's experts are split into ``ep`` contiguous blocks (rank ``r`` holds
  experts ``r * E/ep ..``).  Each rank routes its own tokens (top-1, as
  ``msched::moe_experts``), sends every rank ``s`` its tokens with the one-hot choice of
  ``s``'s experts (an ``all_to_all_single`` of equal splits, so shapes are static), runs its
  local experts weighted by that choice, and sends the results back (a second
  ``all_to_all_single``); the sum of what comes back is the routed output.  The shared
  expert depends only on the layer's input, so it can run under the dispatch.

So the sum over ranks (tp) or the union of experts (ep) is the unsharded stack with the same
seed: `msched.models.decoders.DecoderStack.unsharded_reference` computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn
from torch.fx import Node

from msched.errors import InvalidArgumentError
from msched.limits import positive_int

aten = torch.ops.aten
c10d = torch.ops._c10d_functional

#: The experts of a MoE layer (``msched::moe_experts``' ``E``).
EXPERTS = 4
#: The name of the default process group (``torch.distributed.group.WORLD.group_name``).
DEFAULT_GROUP_NAME = "0"


@dataclass(frozen=True)
class Sharding:
    """How one rank's stack is sharded: degrees, this rank, the group's name, the tokens of
    one micro-batch (the split sizes of the all-to-alls)."""

    tp: int = 1
    ep: int = 1
    rank: int = 0
    group_name: str = DEFAULT_GROUP_NAME
    tokens: int = 1

    @property
    def degree(self) -> int:
        """The ranks the group must have: ``tp`` or ``ep`` (at most one is above 1)."""
        return max(self.tp, self.ep)


def sharding(
    tp: int, ep: int, moe: bool, hidden: int, tokens: int, rank: int | None, group: str | None
) -> Sharding:
    """The checked `Sharding` of `decoder_stack`'s arguments; ``rank`` and ``group`` default
    to the default process group's (rank 0 and ``"0"`` when none is initialised; rank 0
    when nothing is sharded: every rank holds the whole stack)."""
    positive_int(tp, "tp")
    positive_int(ep, "ep")
    if tp > 1 and ep > 1:
        raise InvalidArgumentError(f"tp={tp} and ep={ep}: shard by one of them, not both")
    if hidden % tp:
        raise InvalidArgumentError(f"tp={tp} must divide hidden={hidden}")
    if ep > 1 and not moe:
        raise InvalidArgumentError(f"ep={ep} shards the experts of a MoE: pass moe=True")
    if EXPERTS % ep:
        raise InvalidArgumentError(f"ep={ep} must divide the {EXPERTS} experts")
    degree = max(tp, ep)
    rank, group = _default_rank_and_group(rank if rank is not None or degree > 1 else 0, group)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < degree:
        raise InvalidArgumentError(f"rank must be an int in 0..{degree - 1}, got {rank!r}")
    if not isinstance(group, str):
        raise InvalidArgumentError(f"group_name must be a str, got {group!r}")
    return Sharding(tp, ep, rank, group, tokens)


def _default_rank_and_group(rank: int | None, group: str | None) -> tuple[int, str]:
    import torch.distributed as dist

    initialized = dist.is_available() and dist.is_initialized()
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    if group is None:
        world = dist.group.WORLD if initialized else None
        group = world.group_name if world is not None else DEFAULT_GROUP_NAME
    return rank, group


def shard(value: Tensor, dim: int, parts: int, index: int) -> Tensor:
    """Block ``index`` of ``parts`` equal blocks of ``value`` along ``dim``, contiguous."""
    size = value.shape[dim] // parts
    return value.narrow(dim, index * size, size).contiguous()


class Appends(Protocol):
    """What the helpers need of the builder of `msched.models.decoders`."""

    hidden: int
    shards: Sharding

    def op(self, target: object, *args: object, **kwargs: object) -> Node: ...

    def weight(self, name: str, *shape: int, dim: int = 0, parts: int = 1) -> Node: ...


def all_reduce(b: Appends, t: Node) -> Node:
    """``t`` summed over the group: an all-reduce and its wait, as Dynamo traces them."""
    issued = b.op(c10d.all_reduce, t, "sum", b.shards.group_name)
    return b.op(c10d.wait_tensor, issued)


def all_to_all(b: Appends, t: Node) -> Node:
    """``t``'s ``ep`` equal row blocks exchanged across the group (block ``s`` to rank ``s``)."""
    splits = [b.shards.tokens] * b.shards.ep
    issued = b.op(c10d.all_to_all_single, t, splits, list(splits), b.shards.group_name)
    return b.op(c10d.wait_tensor, issued)


def expert_parallel_moe(b: Appends, hn: Node, i: int) -> Node:
    """The routed experts of layer ``i`` on normed input ``hn``, expert parallel (see the
    module docstring): route, dispatch, local experts, combine, sum."""
    ep, hidden, local = b.shards.ep, b.hidden, EXPERTS // b.shards.ep
    router = b.weight(f"l{i}_router", hidden, EXPERTS)
    w1 = b.weight(f"l{i}_w1", EXPERTS, hidden, 2 * hidden, dim=0, parts=ep)
    w2 = b.weight(f"l{i}_w2", EXPERTS, 2 * hidden, hidden, dim=0, parts=ep)
    choice = b.op(aten.argmax.default, b.op(aten.mm.default, hn, router), -1)
    onehot = b.op(
        aten._to_copy.default, b.op(aten.one_hot.default, choice, EXPERTS), dtype=torch.float32
    )
    parts = [
        b.op(
            aten.cat.default,
            [hn, b.op(aten.slice.Tensor, onehot, 1, s * local, (s + 1) * local)],
            1,
        )
        for s in range(ep)
    ]
    received = all_to_all(b, b.op(aten.cat.default, parts, 0))
    tokens = b.op(aten.slice.Tensor, received, 1, 0, hidden)
    gates = b.op(aten.slice.Tensor, received, 1, hidden, hidden + local)
    done = _local_experts(b, tokens, gates, w1, w2, local)
    back = all_to_all(b, done)
    stacked = b.op(aten.view.default, back, [ep, b.shards.tokens, hidden])
    return b.op(aten.sum.dim_IntList, stacked, [0])


def _local_experts(b: Appends, x: Node, gates: Node, w1: Node, w2: Node, local: int) -> Node:
    """``sum_j gates[:, j] * silu(x @ w1[j]) @ w2[j]`` over this rank's ``local`` experts."""
    total: Node | None = None
    for j in range(local):
        hidden = b.op(aten.silu.default, b.op(aten.mm.default, x, b.op(aten.select.int, w1, 0, j)))
        out = b.op(aten.mm.default, hidden, b.op(aten.select.int, w2, 0, j))
        term = b.op(aten.mul.Tensor, b.op(aten.slice.Tensor, gates, 1, j, j + 1), out)
        total = term if total is None else b.op(aten.add.Tensor, total, term)
    assert total is not None
    return total


class TensorParallelDecoder(nn.Module):
    """The tensor-parallel layers of a dense `msched.models.decoders.TinyDecoder`, one rank.

    Rank ``rank`` of ``tp`` takes its shards of ``model``'s weights (see the module
    docstring: ``wv``, ``wg``, ``wu`` by columns, ``wo``, ``wd`` by rows) and sums each
    row-parallel product over the group ``group_name`` with
    ``torch.distributed._functional_collectives.all_reduce``, which Dynamo traces into
    ``_c10d_functional.all_reduce`` and ``wait_tensor``.  ``forward(x, capture)`` equals
    ``model(x, capture)`` on every rank; running it needs the process group.
    """

    def __init__(self, model: Any, rank: int, tp: int, group_name: str = "0") -> None:
        super().__init__()
        self.capture_layers = tuple(model.capture_layers)
        self.hidden = int(model.hidden)
        self.layers = nn.ModuleList(
            _TensorParallelLayer(layer, rank, tp, group_name) for layer in model.layers
        )
        self.norm = model.norm

    def forward(self, x: Tensor, capture: Tensor) -> Tensor:
        h = x
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i in self.capture_layers:
                j = self.capture_layers.index(i)
                start, end = j * self.hidden, (j + 1) * self.hidden
                torch.ops.msched.inplace_slice_copy(capture, h, start, end)
        return self.norm(h)


class _TensorParallelLayer(nn.Module):
    """One dense decoder layer's shards on one rank, all-reducing after ``wo`` and ``wd``."""

    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    wg: Tensor
    wu: Tensor
    wd: Tensor

    def __init__(self, layer: Any, rank: int, tp: int, group_name: str) -> None:
        super().__init__()
        attn, mlp = layer.attn, layer.ffn
        if not hasattr(mlp, "wd"):
            raise InvalidArgumentError("TensorParallelDecoder shards dense layers: moe=False")
        self.group_name = group_name
        self.ln1, self.ln2 = layer.ln1, layer.ln2
        columns = {"wv": attn.wv, "wg": mlp.wg, "wu": mlp.wu}
        rows = {"wo": attn.wo, "wd": mlp.wd}
        for name, value in {"wq": attn.wq, "wk": attn.wk}.items():
            self.register_buffer(name, value.detach().clone())
        for name, value in columns.items():
            self.register_buffer(name, shard(value.detach(), 1, tp, rank))
        for name, value in rows.items():
            self.register_buffer(name, shard(value.detach(), 0, tp, rank))

    def _sum(self, t: Tensor) -> Tensor:
        from torch.distributed import _functional_collectives as funcol

        group: Any = self.group_name  # a group's name is what Dynamo writes into the graph
        return funcol.all_reduce(t, "sum", group)

    def forward(self, h: Tensor) -> Tensor:
        a = self.ln1(h)
        q, k, v = a @ self.wq, a @ self.wk, a @ self.wv
        out = torch.empty_like(v)
        torch.ops.msched.attention(q, k, v, out)
        h = h + self._sum(out @ self.wo)
        m = self.ln2(h)
        act = torch.nn.functional.silu(m @ self.wg) * (m @ self.wu)
        return h + self._sum(act @ self.wd)

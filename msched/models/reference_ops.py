"""The custom ops of the reference models: real ``torch.library`` ops with fake kernels.

The decoder stacks and `TinyDecoder` (`msched.models.decoders`) and the hypothesis
strategies (`msched.testing.strategies`) call them; importing this module registers them:

- ``msched::inplace_slice_copy(Tensor(a!) dest, Tensor src, int start, int end) -> ()`` —
  the Eagle3 capture: writes ``src`` into ``dest[..., start:end]`` and returns nothing, so it
  has no path to ``output`` (the reason msched exists);
- ``msched::attention(Tensor q, Tensor k, Tensor v, Tensor(a!) out) -> ()`` — causal
  single-head attention written into a preallocated buffer (where the piecewise backend splits
  by default: `msched.compile.compiler.DEFAULT_SPLIT_OPS` names it, without importing this);
- ``msched::moe_experts(Tensor x, Tensor router, Tensor w1, Tensor w2) -> Tensor`` — top-1
  routed experts (the shared expert is ordinary matmuls, so it can run in parallel).

They share the ``msched`` namespace with the stream ops (`msched.ops`) but are test models:
no module of the library outside `msched.models` and `msched.testing` imports them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["attention", "inplace_slice_copy", "moe_experts"]


@torch.library.custom_op("msched::inplace_slice_copy", mutates_args=("dest",))
def inplace_slice_copy(dest: Tensor, src: Tensor, start: int, end: int) -> None:
    """Copy ``src`` into ``dest[..., start:end]`` in place (the Eagle3 capture)."""
    dest.narrow(-1, start, end - start).copy_(src)


@inplace_slice_copy.register_fake
def _(dest: Tensor, src: Tensor, start: int, end: int) -> None:
    return None


@torch.library.custom_op("msched::attention", mutates_args=("out",))
def attention(q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> None:
    """Causal single-head attention of ``[tokens, dim]`` inputs, written into ``out``."""
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    n = scores.shape[-1]
    mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    out.copy_(probs @ v)


@attention.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, out: Tensor) -> None:
    return None


@torch.library.custom_op("msched::moe_experts", mutates_args=())
def moe_experts(x: Tensor, router: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    """Top-1 routed experts: ``w1`` is ``[E, H, F]``, ``w2`` is ``[E, F, H]``."""
    choice = (x @ router).argmax(dim=-1)
    out = torch.zeros_like(x)
    for e in range(w1.shape[0]):
        picked = (choice == e).unsqueeze(-1).to(x.dtype)
        out = out + picked * (torch.nn.functional.silu(x @ w1[e]) @ w2[e])
    return out


@moe_experts.register_fake
def _(x: Tensor, router: Tensor, w1: Tensor, w2: Tensor) -> Tensor:
    return torch.empty_like(x)

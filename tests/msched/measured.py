"""Tensor memory measured on a real CPU run: `measured_peak` and `one_pool_segments`.

The module runs in host order (its own generated code: stream ops are no-ops on CPU, values
are freed after their last use as FX frees them) under a dispatch mode that sees every
storage an op of the graph creates and, through a weak reference to the storage itself, when
the last tensor using it is gone.  The graph's inputs, parameters and buffers are left out.
What an op allocates and frees inside itself is not seen.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from msched.proof.memory import (
    LARGE_SEGMENT,
    MIN_LARGE_ALLOC,
    SMALL_SEGMENT,
    SMALL_SIZE,
    block_bytes,
    segment_bytes,
)


class _Storages(TorchDispatchMode):
    """Tracks the storages the ops create (not those of ``known``): the peak of their rounded
    bytes right after an op returns, and one pool's segments over the same trace (small,
    1-10 MiB and larger blocks apart, fungible within their class, never released)."""

    def __init__(self, known: list[torch.Tensor]) -> None:
        super().__init__()
        self.known = {StorageWeakRef(t.untyped_storage()).cdata for t in known}
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0
        self.small = self.large = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._see(t)
        self.live = {k: v for k, v in self.live.items() if not v[0].expired()}
        blocks = [nbytes for _, nbytes in self.live.values()]
        self.peak = max(self.peak, sum(blocks))
        small = sum(b for b in blocks if b <= SMALL_SIZE)
        middle = sum(b for b in blocks if SMALL_SIZE < b < MIN_LARGE_ALLOC)
        large = sum(segment_bytes(b) for b in blocks if b >= MIN_LARGE_ALLOC)
        self.small = max(self.small, -(-small // SMALL_SEGMENT) * SMALL_SEGMENT)
        self.large = max(self.large, -(-middle // LARGE_SEGMENT) * LARGE_SEGMENT + large)
        return out

    def _see(self, t: torch.Tensor) -> None:
        ref = StorageWeakRef(t.untyped_storage())
        if ref.cdata in self.known:
            return
        seen = self.live.get(ref.cdata)
        if seen is None or seen[0].expired():
            self.live[ref.cdata] = (ref, block_bytes(t.untyped_storage().nbytes()))


def _measure(gm: GraphModule, inputs: tuple[torch.Tensor, ...]) -> _Storages:
    known = [*inputs, *gm.parameters(), *gm.buffers()]
    known += [v for v in vars(gm).values() if isinstance(v, torch.Tensor)]
    tracker = _Storages([t for t in known if isinstance(t, torch.Tensor)])
    with torch.no_grad(), tracker:
        gm(*inputs)
    return tracker


def measured_peak(gm: GraphModule, *inputs: torch.Tensor) -> int:
    """The peak of live tensor bytes (each rounded to the allocator's blocks) when ``gm``
    runs on ``inputs`` on CPU."""
    return _measure(gm, inputs).peak


def one_pool_segments(gm: GraphModule, *inputs: torch.Tensor) -> tuple[int, int]:
    """The measured peak, and the segments one pool holds for the same run."""
    tracker = _measure(gm, inputs)
    return tracker.peak, tracker.small + tracker.large

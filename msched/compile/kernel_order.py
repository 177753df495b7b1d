"""Inductor's final kernel order as a stream program `msched.verify` reads (``torch`` dialect).

Why: Inductor fuses, reorders and reuses buffers after msched (or a user) decided the
streams, so a proof of the FX graph says nothing about the code that runs.  The program built
here is that code, kernel by kernel, in the order the wrapper calls them:

1. One placeholder per graph input, and per buffer read that no node makes (constants).
2. Per node of Inductor's final order (`msched.compile._inductor_internals.FinalOrder`):
   a stream op (``torch.ops.streams.record_event`` / ``wait_event`` / ``wait_stream`` /
   ...) with its table indices, or a call of ``msched::inductor_kernel(name, reads)`` (or
   ``msched::inductor_kernel_writes(name, reads, writes)``), which reads ``reads``, writes
   ``writes`` in place (buffers it mutates, and the memory it writes a reused buffer into)
   and returns one fresh tensor per new buffer (``getitem`` of it): each a storage of its
   own, also when the kernel writes (`register_fresh_results`; read as ``out=`` results,
   they were aliases of what it writes, and a write into one of them a race with a read
   of another).  A node on a user stream carries ``meta["custom"]["stream"]`` (its table
   index); none means the caller's.  A communication kernel (`ScheduledNode.comm_op`: a
   collective, its ``wait_tensor``, an element of a collective's list result) is a call of
   that op itself, with its buffers and constants, so `msched.verify` checks the collective
   order of the code that runs (one order on every rank) and its uses before the waits; a
   collective carries ``meta["msched_issue"]``, its position in the program handed to
   Inductor, which `verify` checks the kernel order against.
3. ``output`` returns the storages of the graph's outputs, then those of the buffers the
   output code allocates and never frees (`kept_until_return`): Inductor frees a buffer with
   ``del`` after its last use, except one it must never reuse (msched's guard keeps every
   buffer another stream reads), which lives until the call returns, after the final joins.
   Without the code (an empty ``FinalOrder.code``) every buffer counts as freed at its last
   use, the stricter reading.

``gm.meta["msched_caller_stream"]`` holds the caller's table indices.  ``meta["msched_kernel"]``
of each kernel node is its `ScheduledNode`.

Sizes, for `msched.peak_memory`: where the order has the buffers' layouts
(`FinalOrder.layouts`, read from Inductor's buffers when msched recorded the order), each
placeholder's ``meta["val"]`` is its layout (None when it has none: a symbolic size), each
kernel's the tuple of the layouts of its new buffers and each ``getitem``'s its buffer's.  A
reused buffer is written into the old buffer's storage, so it allocates nothing.  A kernel
with a new buffer of unknown layout gets no ``meta["val"]``: its memory is not known, and
``peak_memory`` says so rather than count it as nothing.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from msched.analysis._targets import register_fresh_results
from msched.compile._inductor_internals import (
    ISSUE_META,
    Buffer,
    FinalOrder,
    ScheduledNode,
    communication_op,
)
from msched.proof.dialects import mark_made
from msched.proof.torch_streams import CALLER_META

_lib = torch.library.Library("msched", "FRAGMENT")
_lib.define("inductor_kernel(str name, Tensor[] reads) -> Tensor[]")
_lib.define("inductor_kernel_writes(str name, Tensor[] reads, Tensor(a!)[] writes) -> Tensor[]")
#: The op a kernel or extern call of a kernel-order program calls (it never runs), and the
#: one of a call that writes buffers in place (a write-free call must not look mutating:
#: msched keeps mutating calls without writes in program order).
KERNEL = torch.ops.msched.inductor_kernel.default
KERNEL_WRITES = torch.ops.msched.inductor_kernel_writes.default
KERNELS = (KERNEL, KERNEL_WRITES)
# The new buffers of a kernel that also writes buffers (in place, or a reused buffer's
# memory) are storages of their own, not aliases of what it writes.
register_fresh_results(KERNEL_WRITES)
#: ``node.meta`` key of a kernel node: its `ScheduledNode`.
KERNEL_META = "msched_kernel"

_TENSOR_STREAM_OPS = {"record_stream": 0, "sync_dealloc": 2}  # op name -> tensor argument


class _Builder:
    """Builds the program node by node, keeping the storage node of every buffer name."""

    def __init__(self, order: FinalOrder) -> None:
        self.graph = Graph()
        self.storage: dict[str, Node] = {}
        self.reused_into = dict((new, old) for old, new in order.reuses)
        self.layouts = dict(order.layouts)
        for name in _unproduced_reads(order):
            self.storage[name] = self.graph.placeholder(_identifier(name))
            if self.layouts:
                self.storage[name].meta["val"] = self.layouts.get(name)

    def resolve(self, name: str) -> Node | None:
        return self.storage.get(name)

    def add(self, node: ScheduledNode) -> None:
        if node.kind == "stream":
            self._stream_op(node)
        elif node.comm_op:
            self._communication(node)
        elif node.kind == "alias":
            self._alias(node)
        else:
            self._kernel(node)

    def _alias(self, node: ScheduledNode) -> None:
        for buffer, target in node.mutates:
            if target in self.storage:
                self.storage[buffer] = self.storage[target]

    def _stream_op(self, node: ScheduledNode) -> None:
        op = node.stream_op
        args: list[Any] = list(node.stream_args)
        tensor_at = _TENSOR_STREAM_OPS.get(op._schema.name.split("::")[-1])
        if tensor_at is not None:
            tensor = self._storages(node.reads)
            args.insert(tensor_at, tensor[0] if tensor else None)
        made = self.graph.call_function(op, tuple(args))
        made.meta[KERNEL_META] = node
        self._alias(node)  # values passed through (control_deps)

    def _communication(self, node: ScheduledNode) -> None:
        """A collective, a ``wait_tensor`` or an element of a collective's list result: a call
        of the op itself (so `msched.analysis.collectives` reads its group, its waits and
        what it holds), its first new buffer the call's result, the buffers it writes in
        place those it mutates."""
        args = self._call_arguments(node.comm_args)
        kwargs = {k: self._call_arguments(v) for k, v in node.comm_kwargs}
        call = self.graph.call_function(communication_op(node.comm_op), tuple(args), kwargs)
        call.name = _identifier(node.name)
        call.meta[KERNEL_META] = node
        if node.issue is not None:
            call.meta[ISSUE_META] = node.issue
        _set_stream(call, node.stream)
        mutated = dict(node.mutates)
        fresh = [b for b in node.outputs if b not in mutated]
        if fresh:
            self.storage[fresh[0]] = call
        for buffer in node.outputs:
            if buffer in mutated and mutated[buffer] in self.storage:
                self.storage[buffer] = self._storage_of(mutated[buffer])

    def _call_arguments(self, value: Any) -> Any:
        if isinstance(value, Buffer):
            return self.storage.get(value.name)
        if isinstance(value, tuple):
            return [self._call_arguments(v) for v in value]
        return value

    def _kernel(self, node: ScheduledNode) -> None:
        mutated = dict(node.mutates)
        written = [mutated[b] for b in node.outputs if b in mutated]
        written += [self.reused_into[b] for b in node.outputs if b in self.reused_into]
        fresh = [b for b in node.outputs if b not in mutated and b not in self.reused_into]
        reads = self._storages(node.reads)
        writes = self._storages(written)
        args = (node.name, reads, writes) if writes else (node.name, reads)
        call = self.graph.call_function(KERNEL_WRITES if writes else KERNEL, args)
        call.name = _identifier(node.name)
        call.meta[KERNEL_META] = node
        _set_stream(call, node.stream)
        if self.layouts and all(b in self.layouts for b in fresh):
            call.meta["val"] = tuple(self.layouts[b] for b in fresh)
        for i, buffer in enumerate(fresh):
            item = self.graph.call_function(operator.getitem, (call, i))
            item.name = _identifier(buffer)
            _set_stream(item, node.stream)
            if buffer in self.layouts:
                item.meta["val"] = self.layouts[buffer]
            self.storage[buffer] = item
        for buffer in node.outputs:
            if buffer in mutated:
                self.storage[buffer] = self._storage_of(mutated[buffer])
            elif buffer in self.reused_into:
                self.storage[buffer] = self._storage_of(self.reused_into[buffer])

    def _storage_of(self, name: str) -> Node:
        return self.storage[name]

    def _storages(self, names: Iterable[str]) -> list[Node]:
        found = [self.storage[n] for n in names if n in self.storage]
        return list(dict.fromkeys(found))

    def finish(self, outputs: Iterable[str], kept: Iterable[str] = ()) -> GraphModule:
        names = (*outputs, *kept)
        values = tuple(dict.fromkeys(self.storage[n] for n in names if n in self.storage))
        self.graph.output(values)
        return GraphModule(torch.nn.Module(), self.graph)


def _set_stream(node: Node, stream: int | None) -> None:
    if stream is not None:
        node.meta["custom"] = {"stream": stream}


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() or c == "_" else "_" for c in name)


def _unproduced_reads(order: FinalOrder) -> list[str]:
    """Graph inputs, then buffers read (or mutated) before any node made them, in order."""
    names = list(order.inputs)
    made = set(names)
    for node in order.nodes:
        for name in (*node.reads, *(target for _, target in node.mutates)):
            if name not in made:
                made.add(name)
                names.append(name)
        made.update(node.outputs)
    return names


# A line of Inductor's Python wrapper that binds a buffer (an allocation, or a reuse
# ``buf7 = reinterpret_tensor(buf3, ...); del buf3  # reuse``), and a ``del`` that frees one.
_BOUND = re.compile(r"^\s*(buf\w*) = ", re.MULTILINE)
_FREED = re.compile(r"\bdel (\w+)")


def kept_until_return(order: FinalOrder) -> list[str]:
    """The buffers ``order``'s output code binds and never deletes, in order of binding:
    their memory is freed only when the call returns (empty without ``order.code``)."""
    freed = set(_FREED.findall(order.code))
    return [b for b in dict.fromkeys(_BOUND.findall(order.code)) if b not in freed]


def kernel_order_program(
    order: FinalOrder, caller_stream: tuple[int, ...] | None = None
) -> GraphModule:
    """The stream program of ``order`` (see the module docstring).  ``caller_stream`` are the
    table indices of the caller's stream, written to ``gm.meta["msched_caller_stream"]``; the
    program is marked as made by msched in the ``torch`` dialect (`mark_made`)."""
    builder = _Builder(order)
    for node in order.nodes:
        builder.add(node)
    gm = builder.finish(order.outputs, kept_until_return(order))
    gm.meta[CALLER_META] = caller_stream
    return mark_made(gm, "torch")


def kernel_names(gm: GraphModule) -> list[str]:
    """The kernels and extern calls of a kernel-order program, in order."""
    return [str(n.args[0]) for n in gm.graph.nodes if n.target in KERNELS]


__all__ = [
    "KERNEL",
    "KERNELS",
    "KERNEL_META",
    "KERNEL_WRITES",
    "kept_until_return",
    "kernel_names",
    "kernel_order_program",
]

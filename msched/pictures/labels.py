"""How every picture names things: numbers, ops, streams, counts.

Pictures colour a node by `msched.analysis.cost.op_category`, the classification the cost
table uses too.

Times are printed with `format_number` (integers without a decimal point, others with six
significant digits) and written to JSON with `json_number`, so cost sums such as
``0.1 + 0.2`` do not leak float noise; no object address is ever printed.
"""

from __future__ import annotations

import operator
import re

from torch.fx import Node

from msched._torch_internals import OpOverload, OpOverloadPacket
from msched.analysis.nodes import INPUT_OPS
from msched.pictures.view import View
from msched.proof.memory import format_bytes

__all__ = [
    "counts",
    "format_number",
    "json_number",
    "op_label",
    "stream_title",
    "target_name",
]

ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def format_number(x: float) -> str:
    """``x`` as deterministic text: ``12`` for integral values, else six significant digits."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return format(x, ".6g")


def json_number(x: float) -> float | int:
    """A JSON number without float noise (same rule as `format_number`)."""
    if x == int(x) and abs(x) < 1e15:
        return int(x)
    return float(format(x, ".6g"))


def target_name(node: Node) -> str:
    """The name of what ``node`` calls: ``aten.mm.default``, ``getitem``, ``torch.relu``."""
    target = node.target
    if isinstance(target, (OpOverload, OpOverloadPacket)):
        return str(target)
    if isinstance(target, str):
        return target
    if target is operator.getitem:
        return "getitem"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        return ADDRESS.sub("", repr(target))
    return f"{module.lstrip('_')}.{name}" if module not in ("builtins", "") else name


#: The ops of a kernel-order program (`msched.compile.kernel_order`): one per Inductor kernel.
KERNEL_OPS = frozenset({"msched.inductor_kernel.default", "msched.inductor_kernel_writes.default"})


def is_kernel(node: Node) -> bool:
    """Whether ``node`` is a kernel or extern call of a kernel-order program."""
    return node.op == "call_function" and target_name(node) in KERNEL_OPS


def op_label(node: Node) -> str:
    """The op of ``node`` as a picture labels it: its target, ``.method`` or its FX op
    (``kernel`` for a kernel of a kernel-order program)."""
    if node.op in (*INPUT_OPS, "output"):
        return node.op
    if is_kernel(node):
        return "kernel"
    if node.op == "call_method":
        return f".{node.target}"
    return target_name(node)


def stream_title(stream: int) -> str:
    """``stream 0 (caller)`` or ``stream N``: the name of a lane, track or cluster."""
    return "stream 0 (caller)" if stream == 0 else f"stream {stream}"


def counts(v: View) -> str:
    """``3 streams, 1 event, 4 waits``: the counts of a picture's title."""

    def n(count: int, what: str) -> str:
        return f"{count} {what}" + ("" if count == 1 else "s")

    return f"{n(v.num_streams, 'stream')}, {n(v.num_events, 'event')}, {n(v.num_waits, 'wait')}"


def peaks_text(allocated: int, reserved: int, bound: int) -> str:
    """Three memory peaks in bytes as the text header's memory line shows them (after
    ``# memory ``): ``allocated 3.5 KiB, reserved 4 MiB, bound 4 MiB``."""
    return (
        f"allocated {format_bytes(allocated)}, reserved {format_bytes(reserved)}, "
        f"bound {format_bytes(bound)}"
    )

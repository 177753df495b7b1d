"""What msched reads of Inductor's output, as plain data: the final order of one graph's
nodes (`FinalOrder`, `ScheduledNode`), kept beside Inductor's cache
(`msched.compile.order_records`) and read as a stream program
(`msched.compile.kernel_order`).  `msched.compile._inductor_internals` fills them from
Inductor's private classes; nothing here touches Inductor.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch

from msched.analysis.collectives import collectives_in
from msched.compile._inductor_buffers import BufferLayout
from msched.proof.collective_order import ISSUE_META as _ISSUE_META

__all__ = [
    "ISSUE_META",
    "Buffer",
    "FinalOrder",
    "ScheduledNode",
    "communication_op",
    "stamp_issue_order",
]


@dataclass(frozen=True)
class ScheduledNode:
    """One node of Inductor's final order: a kernel, an extern call or a stream op.

    ``stream`` is the Dynamo table index of its stream, None for Inductor's default stream
    (the caller's).  ``outputs`` are the buffers it makes, ``reads`` those it reads (its own
    outputs and `_fake` ones excluded), ``mutates`` those it writes in place (``(buffer, mutated)``
    pairs).
    ``kind`` is ``"kernel"``, ``"extern"``, ``"stream"`` or ``"alias"`` (no code: a new name
    for buffers another node wrote, ``mutates`` says which).
    ``name`` is Inductor's name of the node, or of a fused node's first node: which nodes
    Inductor fuses into a kernel's tail (so its joined name) can depend on what the process
    compiled before, which made a snapshot of a piece depend on the tests run before it.
    ``stream_op`` is the ``torch.ops.streams`` overload and ``stream_args`` its constant
    arguments when the node is a stream op.  ``origins`` names the post-grad FX nodes it
    computes.
    A communication kernel (a collective, its ``wait_tensor``, or the element of a
    collective's list result) names its op in ``comm_op`` (``"_c10d_functional.all_reduce_.
    default"``, ``"operator.getitem"``) and its arguments in ``comm_args`` / ``comm_kwargs``,
    a buffer as a `Buffer`; ``issue`` is a collective's position in the order of the program
    handed to Inductor (`ISSUE_META`).
    """

    name: str
    kind: str
    stream: int | None
    outputs: tuple[str, ...]
    reads: tuple[str, ...]
    mutates: tuple[tuple[str, str], ...]
    origins: tuple[str, ...]
    stream_op: Any = None
    stream_args: tuple[Any, ...] = ()
    comm_op: str = ""
    comm_args: tuple[Any, ...] = ()
    comm_kwargs: tuple[tuple[str, Any], ...] = ()
    issue: int | None = None


@dataclass(frozen=True)
class Buffer:
    """A buffer argument of a communication kernel (`ScheduledNode.comm_args`), by name."""

    name: str


#: ``node.meta`` key of a collective (`msched.proof.collective_order.ISSUE_META`): where the
#: program handed to Inductor issued it, among its collectives (0, 1, ...).  msched writes
#: it on the FX graph before it schedules (`stamp_issue_order`); `_final_order` carries it to
#: the collective's kernel (`ScheduledNode.issue`), and the kernel-order program to its node.
ISSUE_META = _ISSUE_META


def stamp_issue_order(gm: Any) -> None:
    """Write every collective's position among the collectives of ``gm`` (graph order) into
    its ``meta[ISSUE_META]``: the order the kernel order is checked against, read before a
    scheduler or Inductor could move one."""
    for i, found in enumerate(collectives_in(gm.graph)):
        found.node.meta[ISSUE_META] = i


@dataclass(frozen=True)
class FinalOrder:
    """What Inductor generated for one graph: the final node order, the graph's inputs and
    outputs (buffer names), the buffer reuses (``(old, new)``: ``new`` is written into
    ``old``'s memory), the output source code (empty until the module is built) and the
    ``layouts`` of the buffers (`msched.compile._inductor_buffers`)."""

    nodes: tuple[ScheduledNode, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    reuses: tuple[tuple[str, str], ...] = ()
    code: str = ""
    stream_names: tuple[tuple[str, int], ...] = ()
    module: Any = None
    layouts: tuple[tuple[str, BufferLayout], ...] = ()


def communication_op(name: str) -> Any:
    """The op a `ScheduledNode.comm_op` names: ``operator.getitem``, or the overload
    ``"namespace.packet.overload"`` of ``torch.ops``."""
    if name == "operator.getitem":
        return operator.getitem
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)

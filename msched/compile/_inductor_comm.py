"""Inductor's communication kernels read as plain data (interface 13 of
`msched.compile._inductor_internals`, where every interface read here is listed in
``INTERFACES`` and checked before msched touches Inductor).

Why: a collective Inductor lowers is an ``ir._CollectiveKernel`` (a ``FallbackKernel`` of a
``_c10d_functional`` op) and its wait an ``ir._WaitKernel``; read as plain kernels they said
nothing of the op or the group, so the kernel order's collective order went unchecked.  Here
each gets its op, its arguments (buffers by name) and the position at which the program
handed to Inductor issued it (`msched.compile.final_order.ISSUE_META`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from msched._torch_internals import OpOverload
from msched.analysis.collectives import collectives_in
from msched.compile.final_order import ISSUE_META, Buffer, ScheduledNode

__all__ = ["communication", "issue_positions"]


def issue_positions(graph: Any) -> dict[str, int]:
    """FX node name -> issue position (`ISSUE_META`) of every collective of the graph Inductor
    lowers that msched stamped; a graph nobody stamped takes its own order.  A collective a
    pass made (a bucket) has no position: it is not checked, but the stamped ones around it
    still are -- were the whole graph to take its own order, a pass that made one bucket
    and moved two other collectives would go unchecked."""
    module: Any = getattr(graph, "module", None)
    if module is None or not hasattr(module, "graph"):
        return {}
    found = [c.node for c in collectives_in(module.graph)]
    stamped = {n.name: n.meta[ISSUE_META] for n in found if isinstance(n.meta.get(ISSUE_META), int)}
    if stamped:
        return stamped
    return {n.name: i for i, n in enumerate(found)}


def communication(found: ScheduledNode, node: Any, issued: dict[str, int]) -> ScheduledNode:
    """``found`` with its communication op, arguments and issue position (`ScheduledNode`),
    when ``node`` is a collective kernel, a wait kernel or an element of a collective's list
    result (interface 13); else ``found`` as it is."""
    from torch._inductor import ir

    inner = list(node.get_nodes())
    kernel = inner[0].node if len(inner) == 1 else None
    if isinstance(kernel, ir.MultiOutput):
        parent = kernel.inputs[0] if kernel.inputs else None
        if isinstance(parent, ir._CollectiveKernel) and len(kernel.indices) == 1:
            index = kernel.indices[0][1]
            return replace(
                found, comm_op="operator.getitem", comm_args=(Buffer(parent.get_name()), index)
            )
        return found
    if not isinstance(kernel, ir._CollectiveKernel):
        return found
    op: Any = kernel.op_overload
    if not isinstance(op, OpOverload):
        return found
    args, kwargs = kernel.unflatten_args(kernel.inputs, kernel.constant_args)
    kwargs = {**(kwargs or {}), **(getattr(kernel, "kwargs", None) or {})}
    positions = [issued[o] for o in found.origins if o in issued]
    return replace(
        found,
        comm_op=f"{op.namespace}.{op.__name__}",
        comm_args=tuple(_argument(a) for a in args),
        comm_kwargs=tuple((k, _argument(v)) for k, v in sorted(kwargs.items())),
        issue=positions[0] if len(positions) == 1 else None,
    )


def _argument(value: Any) -> Any:
    """A kernel argument as plain data: a buffer as a `Buffer`, a list as a tuple."""
    from torch._inductor import ir

    if isinstance(value, (list, tuple)):
        return tuple(_argument(v) for v in value)
    if isinstance(value, ir.IRNode):
        return Buffer(value.get_name())
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    name = getattr(value, "group_name", None)  # a ProcessGroup (torch 2.13 types it Any)
    return name if isinstance(name, str) else str(value)

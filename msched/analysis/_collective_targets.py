"""Which call targets are collectives: the tables `msched.analysis.collectives` and the effect
facts of `msched.analysis._targets` share (here, so neither imports the other).

A target's *role* is ``"async"`` (a communication op of torch: the work may complete at a
``wait_tensor`` of its result), ``"wait"`` (``_c10d_functional.wait_tensor``), ``"sync"`` (an
engine's own collective, declared with `msched.register_collective`) or ``None``.

**Sound by default**: every op of the namespaces in `COMM_NAMESPACES` is a communication op,
save the few `NOT_COLLECTIVE` ones; those without a row in the tables take their group from an
argument named as in `GROUP_ARGUMENTS` (else one unknown group) and hold their inputs.
"""

from __future__ import annotations

import functools
from typing import Any

from msched._torch_internals import (
    OpOverload,
    OpOverloadPacket,
    custom_op_overload,
    qualified_name,
    schema_of,
)

#: A row: (position, name) of the group argument, or None, and whether the work reads its
#: input until it completes (False: the input is copied at issue).
Row = tuple[tuple[int, str] | None, bool]

#: functional collective name -> its row.
FUNCTIONAL: dict[str, Row] = {
    "all_reduce": ((2, "group_name"), False),
    "all_reduce_": ((2, "group_name"), True),
    "all_reduce_coalesced": ((2, "group_name"), False),
    "all_reduce_coalesced_": ((2, "group_name"), True),
    "all_gather_into_tensor": ((2, "group_name"), True),
    "all_gather_into_tensor_out": ((2, "group_name"), True),
    "all_gather_into_tensor_coalesced": ((2, "group_name"), True),
    "reduce_scatter_tensor": ((3, "group_name"), True),
    "reduce_scatter_tensor_out": ((3, "group_name"), True),
    "reduce_scatter_tensor_coalesced": ((3, "group_name"), True),
    "all_to_all_single": ((3, "group_name"), True),
    "broadcast": ((2, "group_name"), False),
    "broadcast_": ((2, "group_name"), True),
    # point-to-point (pipeline parallelism): every rank must issue them in one order too
    "isend": ((3, "group_name"), True),
    "irecv": ((3, "group_name"), True),
    "batch_p2p_ops": ((4, "group_name"), True),
}

NAMESPACE = "_c10d_functional"

#: other communication ops with a row: ``ns::name`` -> its row.  Those of
#: ``_c10d_functional_autograd`` are what Dynamo traces ``funcol.*_autograd`` into.
OTHER: dict[str, Row] = {
    "_c10d_functional_autograd::all_to_all_single": ((3, "group_name"), True),
    "_c10d_functional_autograd::all_gather_into_tensor": ((2, "group_name"), True),
    "_c10d_functional_autograd::reduce_scatter_tensor": ((3, "group_name"), True),
    "_dtensor::shard_dim_alltoall": ((3, "group_name"), True),
}

#: namespaces whose every op communicates (unless in `NOT_COLLECTIVE`).
COMM_NAMESPACES = frozenset({NAMESPACE, "_c10d_functional_autograd", "c10d"})

#: ops of those namespaces that do not communicate (``wait_tensor`` is a wait).
#: the functional waits: ``wait_tensor(t)`` and (torch 2.15) ``wait_tensors([t, ...])``.
WAITS = frozenset({"wait_tensor", "wait_tensors"})

NOT_COLLECTIVE = frozenset(
    {
        f"{NAMESPACE}::wait_tensor",
        f"{NAMESPACE}::wait_tensors",
        f"{NAMESPACE}::_wrap_tensor_autograd",
        "c10d::check_for_nan",
    }
)

#: argument names read as the group of a communication op without a row, in preference order.
GROUP_ARGUMENTS = ("group_name", "group", "process_group", "tag")

#: ``(group argument, holds_input, asynchronous)`` where an op is known to be asynchronous;
#: ``None`` in the third place: asynchronous iff a ``wait_tensor`` waits for its result.
Entry = tuple[str, tuple[int, str] | None, bool, bool | None]

#: engine collectives: op (packet or overload) -> name of its group argument, or None
REGISTERED: dict[Any, str | None] = {}


def op_name(target: Any) -> str | None:
    """``ns::name`` of an op packet or overload, else ``None``."""
    if isinstance(target, OpOverload):
        return qualified_name(target.overloadpacket)
    if isinstance(target, OpOverloadPacket):
        return qualified_name(target)
    return None


def functional_name(target: Any) -> str | None:
    """The functional collective's name for a ``_c10d_functional`` packet or overload."""
    namespace, _, name = (op_name(target) or "").partition("::")
    return name if namespace == NAMESPACE else None


def is_communication_namespace(target: Any) -> bool:
    """``target`` is an op of a namespace of torch's communication ops."""
    return (op_name(target) or "").partition("::")[0] in COMM_NAMESPACES | {"_dtensor"}


def _group_argument(target: Any) -> tuple[int, str] | None:
    """(position, name) of the first argument named as in `GROUP_ARGUMENTS`, by the schema of
    ``target`` (a packet: its ``default`` overload, else its first)."""
    overload = target
    if isinstance(target, OpOverloadPacket):
        names = target.overloads()
        if not names:
            return None
        overload = getattr(target, "default" if "default" in names else names[0])
    names = [a.name for a in schema_of(overload).arguments]
    for wanted in GROUP_ARGUMENTS:
        if wanted in names:
            return names.index(wanted), wanted
    return None


@functools.lru_cache(maxsize=4096)
def _cached_entry(target: Any) -> Entry | None:
    return _communication_entry(target)


def communication_entry(target: Any) -> Entry | None:
    """``(label, group argument, holds_input, asynchronous)`` of a communication op of torch
    (see `Entry`), else ``None``.  Every node of every graph asks, several times per
    `msched.verify`, and the answer depends on the target alone: kept per target (a bounded
    cache, since a graph's targets may be callables made per graph)."""
    try:
        return _cached_entry(target)
    except TypeError:  # an unhashable callable
        return _communication_entry(target)


def _communication_entry(target: Any) -> Entry | None:
    qualified = op_name(target)
    if qualified is None or qualified in NOT_COLLECTIVE:
        return None
    namespace, _, name = qualified.partition("::")
    if namespace == NAMESPACE and name in FUNCTIONAL:
        group, holds = FUNCTIONAL[name]
        return name, group, holds, True
    if qualified in OTHER:
        group, holds = OTHER[qualified]
        return qualified, group, holds, namespace != "_dtensor" or None
    if namespace not in COMM_NAMESPACES:
        return None
    label = name if namespace == NAMESPACE else qualified
    return label, _group_argument(target), True, None


def _registration_keys(target: Any) -> tuple[Any, ...]:
    """The keys a registration of ``target`` may be under: itself, its packet (an overload),
    or its overloads (a packet: Dynamo writes ``torch.ops.ns.op`` for ``ns.op.default``)."""
    if isinstance(target, OpOverload):
        return (target, target.overloadpacket)
    if isinstance(target, OpOverloadPacket):
        return (target, *(getattr(target, o) for o in target.overloads()))
    found = custom_op_overload(target)
    if found is not None:
        return (target, found, found.overloadpacket)
    return (target,)


def registered_group(target: Any) -> tuple[bool, str | None]:
    """(registered, group argument name) for ``target``: itself, else its packet or overloads."""
    if not REGISTERED:
        return False, None
    try:
        for key in _registration_keys(target):
            if key in REGISTERED:
                return True, REGISTERED[key]
    except TypeError:  # an unhashable callable
        pass
    return False, None


def collective_role(target: Any) -> str | None:
    """``"async"``, ``"wait"``, ``"sync"`` or ``None`` (see the module docstring)."""
    if functional_name(target) in WAITS:
        return "wait"
    if communication_entry(target) is not None:
        return "async"
    return "sync" if registered_group(target)[0] else None

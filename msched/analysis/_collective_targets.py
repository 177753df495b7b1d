"""Which call targets are collectives: the tables `msched.analysis.collectives` and the effect
facts of `msched.analysis._targets` share (here, so neither imports the other).

A target's *role* is ``"async"`` (a functional collective: the work completes at a
``wait_tensor`` of its result), ``"wait"`` (``_c10d_functional.wait_tensor``), ``"sync"`` (an
engine's own collective, declared with `msched.register_collective`) or ``None``.
"""

from __future__ import annotations

from typing import Any

from msched._torch_internals import OpOverload, OpOverloadPacket, qualified_name

#: functional collective name -> (position, name) of its group argument, and whether the work
#: reads its input until it completes (False: the input is copied at issue).
FUNCTIONAL: dict[str, tuple[tuple[int, str], bool]] = {
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
}

NAMESPACE = "_c10d_functional"

#: engine collectives: op (packet, overload or function) -> name of its group argument, or None
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


def registered_group(target: Any) -> tuple[bool, str | None]:
    """(registered, group argument name) for ``target``: the overload, else its packet."""
    for key in (target, getattr(target, "overloadpacket", None)):
        if key is None:
            continue
        try:
            if key in REGISTERED:
                return True, REGISTERED[key]
        except TypeError:
            return False, None
    return False, None


def collective_role(target: Any) -> str | None:
    """``"async"``, ``"wait"``, ``"sync"`` or ``None`` (see the module docstring)."""
    name = functional_name(target)
    if name is not None:
        if name == "wait_tensor":
            return "wait"
        return "async" if name in FUNCTIONAL else None
    return "sync" if registered_group(target)[0] else None

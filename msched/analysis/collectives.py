"""Which nodes of a graph are collectives, of which process group, and where each one is waited.

Two kinds are read:

- PyTorch's **functional collectives** (``torch.ops._c10d_functional.*``, as Dynamo traces
  ``torch.distributed._functional_collectives``): *asynchronous*.  The op issues the work and
  returns at once; ``_c10d_functional.wait_tensor`` on its result makes the waiting stream wait
  for the work.  Until that wait the result is not ready, and the ops that read their input
  while the work runs (`Collective.holds_input`) still read it.  The out-of-place
  ``all_reduce``, ``all_reduce_coalesced`` and ``broadcast`` copy their input when they are
  issued (c10d reduces the copy in place), so a later write to their input is no race.
- an **engine's own collective op**, declared with `register_collective` (vLLM's
  ``all_reduce(Tensor, str group_name)``, TensorRT-LLM's ``allreduce``): *synchronous* on the
  stream it is issued on, with the reads and writes its schema (or `msched.register_mutation`)
  gives.

The group of a collective is the value of its group argument: a process-group name such as
``"0"`` (torch 2.13 types ``group_name`` as ``Any``, so it may also be a ``ProcessGroup``,
read by its ``group_name``).  Every rank must issue the collectives in one order -- within a
group, and across groups too, since NCCL asks every rank to submit the operations of several
communicators in one order -- so the scheduler keeps their original order and the verifier
checks it.  Sources: pytorch#189454, pytorch#150074 and torchrec#4149 (a compiler pass or a
rank-divergent order that hung every rank).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch.fx import Graph, Node

from msched._torch_internals import OpOverload, OpOverloadPacket, schema_of
from msched.analysis._collective_targets import (
    REGISTERED,
    WAITS,
    communication_entry,
    functional_name,
    is_communication_namespace,
    op_name,
    registered_group,
)
from msched.analysis._targets import OP_INFO_CACHE, argument_names, check_target
from msched.errors import InvalidArgumentError

__all__ = [
    "Collective",
    "collective_of",
    "collectives_in",
    "is_wait",
    "register_collective",
    "waited",
    "waited_all",
    "waits_of",
]


@dataclass(frozen=True)
class Collective:
    """One collective node.

    ``op`` is its name (``"all_reduce"``, or the registered op's qualified name); ``group`` the
    process group it runs on (a name, or ``None`` for a registered op declared without a group
    argument: one group of its own); ``asynchronous`` says that the work completes at a
    ``wait_tensor`` of its result; ``holds_input`` that it reads its tensor inputs until then.
    """

    node: Node
    op: str
    group: str | None
    asynchronous: bool
    holds_input: bool


def register_collective(op: Any, group: str | None = None) -> None:
    """Declare an engine's own collective op, synchronous on the stream it is issued on.

    ``group`` names the argument that says which process group it runs on (for vLLM's
    ``all_reduce(Tensor tensor, str group_name)``: ``group="group_name"``); ``None`` puts every
    call of ``op`` in one group of its own.  msched keeps every collective in the original
    order and orders consecutive ones by happens-before, so every rank issues them alike.
    What it reads and writes comes from its schema, as for any op (`register_mutation` for a
    schema that does not mark a write).  Registering an ``OpOverloadPacket`` covers its
    overloads, and an overload covers the calls of its packet (as Dynamo writes them); a
    ``torch.library.custom_op`` result is read as its op.  torch's own communication ops are
    read without it, and an ``aten`` or ``prims`` op is no collective: both are refused.
    """
    op = check_target("register_collective", op)
    _refuse_non_engine(op)
    if group is not None:
        if not isinstance(group, str):
            raise InvalidArgumentError(
                f"register_collective: group must be an argument name (str) or None, got {group!r}"
            )
        names = argument_names(op)
        if names is not None and group not in names:
            raise InvalidArgumentError(
                f"register_collective: {op!r} has no argument named {group}; "
                f"its arguments are {', '.join(names) or 'none'}"
            )
    REGISTERED[op] = group
    OP_INFO_CACHE.clear()


def _refuse_non_engine(op: Any) -> None:
    """Refuse torch's own ops: its communication ops are read already (``wait_tensor`` is
    the wait of one), and ``aten``/``prims`` ops compute."""
    name = op_name(op)
    if name is None:
        return
    if is_communication_namespace(op):
        what = (
            "the wait of the functional collectives"
            if functional_name(op) in WAITS
            else "one of torch's communication ops"
        )
        raise InvalidArgumentError(
            f"register_collective: {name} is {what}, which msched reads without a "
            "registration; register_collective is for an engine's own collective op"
        )
    if name.partition("::")[0] in ("aten", "prims"):
        raise InvalidArgumentError(
            f"register_collective: {name} is not a collective (an aten/prims op computes); "
            "register_collective is for an engine's own collective op"
        )


def _argument(node: Node, position: int, name: str) -> Any:
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[position] if position < len(node.args) else None


def _group_key(value: Any) -> str | None:
    """A process group's name: a string as it is, a ``ProcessGroup`` by its ``group_name``."""
    if value is None or isinstance(value, str):
        return value
    name = getattr(value, "group_name", None)
    if isinstance(name, str):
        return name
    return repr(value)


def _registered_argument_position(op: Any, name: str) -> int:
    """Where the argument ``name`` is in a call of ``op`` (a packet: by its ``default``
    overload, else its first; `argument_names` of a packet is a sorted union)."""
    overload = _overload_of(op)
    names = [a.name for a in schema_of(overload).arguments] if overload else argument_names(op)
    names = names or []
    return names.index(name) if name in names else len(names) + 1_000_000


def collective_of(node: Node) -> Collective | None:
    """The collective ``node`` issues, or ``None`` (``wait_tensor`` is not one: see `is_wait`)."""
    if node.op != "call_function":
        return None
    target = node.target
    entry = communication_entry(target)
    if entry is not None:
        label, argument, holds, asynchronous = entry
        group = _group_key(_argument(node, *argument)) if argument is not None else None
        if asynchronous is None:
            asynchronous = _has_wait(node)
        return Collective(node, label, group, asynchronous=asynchronous, holds_input=holds)
    registered, arg_name = registered_group(target)
    if not registered:
        return None
    engine_group = None
    if arg_name is not None:
        position = _registered_argument_position(target, arg_name)
        engine_group = _group_key(_argument(node, position, arg_name))
    label = op_name(target) or getattr(target, "__qualname__", None) or str(target)
    return Collective(node, label, engine_group, asynchronous=False, holds_input=True)


def is_wait(node: Node) -> bool:
    """``node`` is a ``_c10d_functional.wait_tensor`` (or ``wait_tensors``, torch 2.15)."""
    return node.op == "call_function" and functional_name(node.target) in WAITS


def _has_wait(node: Node) -> bool:
    """A ``wait_tensor`` waits for ``node``'s result (or an element of its list result)."""
    return any(is_wait(u) for v in node.users for u in (v, *v.users))


def waited(wait: Node) -> Node | None:
    """The collective node a ``wait_tensor`` waits for: its argument, through ``getitem`` of a
    coalesced collective's list result; else the latest in-place collective before it (in
    graph order) that writes its argument (``all_reduce_(t); wait_tensor(t)``: the in-place
    forms return their input); ``None`` if there is no asynchronous collective there."""
    found = waited_all(wait)
    return found[0] if found else None


def waited_all(wait: Node) -> list[Node]:
    """Every collective node a wait waits for, in argument order: `waited` of the one tensor
    of a ``wait_tensor``, of each tensor of a ``wait_tensors`` (torch 2.15: one wait for a
    list, as Inductor lowers a coalesced collective's waits)."""
    if not is_wait(wait):
        return []
    argument = wait.args[0] if wait.args else wait.kwargs.get("tensor", wait.kwargs.get("tensors"))
    values = argument if isinstance(argument, (list, tuple)) else [argument]
    found = (_waited_one(wait, a) for a in values)
    return list(dict.fromkeys(n for n in found if n is not None))


def _waited_one(wait: Node, argument: Any) -> Node | None:
    value = argument
    while isinstance(value, Node):
        if value.op == "call_function" and value.target is operator.getitem:
            value = value.args[0]
            continue
        found = collective_of(value)
        if found is not None and found.asynchronous:
            return value
        break
    return _inplace_writer(wait, argument) if isinstance(argument, Node) else None


def _inplace_writer(wait: Node, tensor: Node) -> Node | None:
    """The latest asynchronous collective between ``tensor`` and ``wait`` that writes
    ``tensor`` in place (``all_reduce_``, ``broadcast_``, ``all_reduce_coalesced_``, ``out=``)."""
    node = wait.prev
    while node.op != "root" and node is not tensor:
        if node.op == "call_function" and tensor in node.all_input_nodes:
            if tensor in _written_arguments(node):
                found = collective_of(node)
                if found is not None and found.asynchronous:
                    return node
        node = node.prev
    return None


def _overload_of(op: Any) -> OpOverload | None:
    """``op`` itself (an overload), a packet's ``default`` overload (else its first), or None."""
    if isinstance(op, OpOverloadPacket):
        names = op.overloads()
        op = getattr(op, "default" if "default" in names else names[0]) if names else None
    return op if isinstance(op, OpOverload) else None


def _written_arguments(node: Node) -> list[Node]:
    """The nodes passed to the arguments ``node``'s schema marks written (``Tensor(a!)``)."""
    target = _overload_of(node.target)
    if target is None:
        return []
    found: list[Node] = []
    for i, a in enumerate(schema_of(target).arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = _argument(node, i, a.name) if not a.kwarg_only else node.kwargs.get(a.name)
        values = value if isinstance(value, (list, tuple)) else (value,)
        found += [v for v in values if isinstance(v, Node)]
    return found


def collectives_in(nodes: Graph | Iterable[Node]) -> list[Collective]:
    """The collectives among ``nodes`` (a graph: its nodes), in their order."""
    found = (collective_of(n) for n in (nodes.nodes if isinstance(nodes, Graph) else nodes))
    return [c for c in found if c is not None]


def waits_of(
    nodes: Graph | Iterable[Node], found: Iterable[Collective] | None = None
) -> dict[Node, list[Node]]:
    """Each asynchronous collective among ``nodes`` -> its ``wait_tensor`` nodes, in order (a
    coalesced collective has one per result; an unwaited one has none).  ``found``: the
    collectives among ``nodes`` (`collectives_in`), where the caller has them already."""
    order = list(nodes.nodes if isinstance(nodes, Graph) else nodes)
    found = collectives_in(order) if found is None else found
    result: dict[Node, list[Node]] = {c.node: [] for c in found if c.asynchronous}
    for node in order:
        for issued in waited_all(node):
            if issued in result:
                result[issued].append(node)
    return result

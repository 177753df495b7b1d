"""The collective checks of `msched.verify`: one issue order on every rank, and no use of a
collective's tensors while its communication runs.

Why: every rank must issue its collectives in one order -- within a process group, and across
groups too, since NCCL asks every rank to submit the operations of several communicators in
one order.  A schedule that puts two collectives on two streams with nothing ordering them,
or that issues them in another order than the program, can run them in a different order on
each rank: a hang, which no single-rank run shows.  And a functional collective is
asynchronous: from its issue to its ``wait_tensor`` the communication writes its result and
(`msched.analysis.collectives.Collective.holds_input`) reads its input.

Checks, on the scheduled program read with the happens-before engine (`Clocks`):

1. ``collective-order``: each collective happens after the collective issued before it in host
   order (one stream, or an event between them), whatever their groups;
2. ``collective-order``: with ``original``, the collectives are issued in the original's order
   (nodes paired by what they compute and read, as the rest of `verify` does:
   `msched.proof.matching`; never by name, which a renaming pass changes at will; equal
   collectives, one op on equal values, in either order).  Without
   one, a program whose collectives say where their source issued them (``meta[ISSUE_META]``:
   Inductor's kernel order, `msched.compile.kernel_order`, whose kernels no original graph
   pairs with) is checked against that order (`stated_order`);
3. ``race``: every node issued after an asynchronous collective that reads or writes its
   result, or writes an input the work holds, happens after one of its waits (``raw``,
   ``waw`` and ``war``).  The Dag of the original already orders such uses after the wait in
   the original's program order; this check also holds for a program whose own host order
   puts a use between the issue and the wait, which the Dag rules would read as ordered.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch.fx import Node

from msched.analysis.collectives import Collective, collectives_in, waits_of
from msched.analysis.effects import Effects
from msched.proof.clocks import Clocks

__all__ = [
    "COLLECTIVE_KINDS",
    "ISSUE_META",
    "CollectiveFault",
    "collective_faults",
    "stated_order",
]

COLLECTIVE_KINDS = ("collective-order",)
#: ``node.meta`` key of a collective: its position (0, 1, ...) in the order the program it
#: was compiled from issued the collectives.
ISSUE_META = "msched_issue"


def stated_order(nodes: Sequence[Node]) -> list[Node] | None:
    """The collectives among ``nodes`` that carry ``meta[ISSUE_META]``, in that order, or
    None when none does (nothing to check a program without an original against)."""
    stated = [c.node for c in collectives_in(nodes) if isinstance(c.node.meta.get(ISSUE_META), int)]
    if not stated:
        return None
    return sorted(stated, key=lambda n: int(n.meta[ISSUE_META]))


@dataclass(frozen=True)
class CollectiveFault:
    """One broken collective rule: its kind (``collective-order``, or ``race`` with its
    ``hazard``), the nodes (the earlier first), the message and the streams involved."""

    kind: str
    nodes: tuple[str, ...]
    message: str
    hazard: str | None = None
    streams: tuple[int, ...] = ()


def collective_faults(
    clocks: Clocks,
    original: Sequence[Node] | None,
    effects: Callable[[], Effects],
    reported: set[tuple[Node, Node]],
) -> list[CollectiveFault]:
    """The faults of the module docstring, in that order.

    ``original`` lists the original graph's collectives in its order, each as the scheduled
    node paired with it (None: no original); ``effects`` gives the scheduled graph's effects
    (called only when the program issues an asynchronous collective); ``reported`` holds the
    pairs `verify` has already reported (a race found here is skipped when its pair is in it,
    and added to it).
    """
    issued = collectives_in(clocks.order)
    if not issued:
        return []
    faults = _unordered(clocks, issued)
    if original is not None:
        faults += _reordered(clocks, issued, original)
    if any(c.asynchronous for c in issued):
        faults += _in_flight_uses(clocks, issued, effects(), reported)
    return faults


def _label(c: Collective) -> str:
    group = "its own group" if c.group is None else f"group {c.group}"
    return f"`{c.node.name}` ({c.op}, {group})"


def _unordered(clocks: Clocks, issued: list[Collective]) -> list[CollectiveFault]:
    """Rule 1: consecutive collectives (host order) ordered by happens-before."""
    faults = []
    stamp = clocks.stamp
    for a, b in zip(issued, issued[1:], strict=False):
        if clocks.happens_before(a.node, b.node):
            continue
        sa, sb = stamp[a.node].stream, stamp[b.node].stream
        faults.append(
            CollectiveFault(
                "collective-order",
                (a.node.name, b.node.name),
                f"{_label(b)} on stream {sb} is not ordered after {_label(a)} on stream {sa}: "
                "the GPU may run them in either order, and each rank in another one (a hang); "
                f"record an event after `{a.node.name}` and wait on it on stream {sb} before "
                f"`{b.node.name}`, or issue both on one stream",
                streams=(sa, sb),
            )
        )
    return faults


def _reordered(
    clocks: Clocks, issued: list[Collective], original: Sequence[Node]
) -> list[CollectiveFault]:
    """Rule 2: the host order of the collectives is the original's (the first difference)."""
    expected = set(original)
    scheduled = [c for c in issued if c.node in expected]
    for want, got in zip(original, scheduled, strict=False):
        if want is got.node:
            continue
        early = got.node
        s_early, s_want = clocks.stamp[early].stream, clocks.stamp[want].stream
        return [
            CollectiveFault(
                "collective-order",
                (want.name, early.name),
                f"{_label(got)} is issued before `{want.name}`, against the original order of "
                "the collectives: every rank must issue them in one order, and a schedule that "
                "reorders them by its own costs can differ across ranks (a hang); keep the "
                f"original order (issue `{want.name}` first)",
                streams=(s_want, s_early),
            )
        ]
    return []


def _in_flight_uses(
    clocks: Clocks,
    issued: list[Collective],
    effects: Effects,
    reported: set[tuple[Node, Node]],
) -> list[CollectiveFault]:
    """Rule 3: uses of a collective's tensors while its communication may still run."""
    position = {n: i for i, n in enumerate(clocks.order)}
    touching = _accesses(clocks.order, effects)
    waits = waits_of(clocks.order, issued)
    faults = []
    for c in issued:
        if not c.asynchronous:
            continue
        own = waits.get(c.node, [])
        result = set(effects.writes.get(c.node, ()))
        held = set(effects.reads.get(c.node, ())) if c.holds_input else set()
        for node, hazard in _uses(c.node, result, held, touching, position):
            if node in own or any(clocks.happens_before(w, node) for w in own):
                continue
            first = own[0] if own else c.node
            if (first, node) in reported:
                continue
            reported.add((first, node))
            faults.append(_in_flight(c, own, node, hazard, clocks))
    return faults


def _accesses(order: tuple[Node, ...], effects: Effects) -> dict[Node, list[tuple[Node, str]]]:
    """Storage -> the nodes that access it, each with ``"read"`` or ``"write"``, in host order.
    ``getitem`` only takes an element of a list result and accesses nothing."""
    found: dict[Node, list[tuple[Node, str]]] = {}
    for node in order:
        if node.op == "call_function" and node.target is operator.getitem:
            continue
        for storage in effects.reads.get(node, ()):
            found.setdefault(storage, []).append((node, "read"))
        for storage in effects.writes.get(node, ()):
            found.setdefault(storage, []).append((node, "write"))
    return found


def _uses(
    issue: Node,
    result: set[Node],
    held: set[Node],
    touching: dict[Node, list[tuple[Node, str]]],
    position: dict[Node, int],
) -> list[tuple[Node, str]]:
    """The nodes after ``issue`` in host order that read or write ``result`` or write
    ``held``, each once, with its hazard, in host order."""
    at = position[issue]
    found: dict[Node, str] = {}
    for storage in result:
        for node, access in touching.get(storage, ()):
            if position[node] > at and node is not issue:
                hazard = "raw" if access == "read" else "waw"
                found[node] = "waw" if found.get(node) == "waw" else hazard
    for storage in held - result:
        for node, access in touching.get(storage, ()):
            if access == "write" and position[node] > at and node not in found:
                found[node] = "war"
    return sorted(found.items(), key=lambda item: position[item[0]])


def _in_flight(
    c: Collective, waits: list[Node], node: Node, hazard: str, clocks: Clocks
) -> CollectiveFault:
    s_issue, s_node = clocks.stamp[c.node].stream, clocks.stamp[node].stream
    what = {
        "raw": "reads the result of",
        "waw": "writes the result of",
        "war": "writes an input held by",
    }[hazard]
    if not waits:
        fix = f"wait for it (wait_tensor of `{c.node.name}`) before `{node.name}`"
        first = c.node
    else:
        first = waits[0]
        s_wait = clocks.stamp[first].stream
        fix = (
            f"issue `{node.name}` after `{first.name}`"
            if s_wait == s_node
            else f"record an event after `{first.name}` (stream {s_wait}) and wait on it on "
            f"stream {s_node} before `{node.name}`"
        )
    return CollectiveFault(
        "race",
        (first.name, node.name),
        f"`{node.name}` on stream {s_node} {what} {_label(c)} (stream {s_issue}) before its "
        f"communication is waited for: {fix}",
        hazard=hazard,
        streams=(clocks.stamp[first].stream, s_node),
    )

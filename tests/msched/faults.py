"""Fault injectors for scheduled graphs: each breaks a correct schedule in one known way.

Every injector works on a copy of the scheduled module (node names are kept) and yields
`Fault`s; ``expect`` holds the violation kinds of which `msched.verify` must report at least
one.  `real_orderings_broken` is an independent re-check (the scheduler tests' own
happens-before reader, `tests.msched.hb`), used to tell a dropped wait that breaks an ordering
from one that was redundant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule, Node

import msched
from msched.analysis.collectives import collectives_in
from msched.analysis.dag import WAW, Dag, build_dag
from msched.analysis.nodes import node_named
from msched.proof.interpreter import interpret
from msched.scheduling.emit import relink
from msched.testing.checks import copy_module

from .hb import happens_before

FAULTS = (
    "drop-wait",
    "move-wait",
    "unrecorded-switch-wait",
    "drop-switch-record",
    "move-switch-record",
    "capture-after-output",
    "move-stream",
    "drop-record-stream",
    "unrecorded-wait",
    "swap-writes",
    "duplicate-node",
    "delete-node",
    "swap-collectives",
    "unorder-collectives",
)
_INPUT_OPS = ("placeholder", "get_attr")
_STREAM_OPS = set(msched.ops.STREAM_OPS)


@dataclass(frozen=True)
class Fault:
    kind: str
    site: str
    gm: GraphModule
    expect: frozenset[str]


def _node(gm: GraphModule, name: str) -> Node:
    return node_named(gm, name)


def _is_compute(node: Node) -> bool:
    return node.op not in (*_INPUT_OPS, "output") and node.target not in _STREAM_OPS


def _spread(items: list[str], limit: int | None) -> list[str]:
    """At most ``limit`` items, evenly spaced, always including the last one."""
    if limit is None or len(items) <= limit:
        return items
    step = len(items) / limit
    picked = [items[int(i * step)] for i in range(limit - 1)]
    return [*picked, items[-1]]


def _apply(gm: GraphModule, site: str, change: Callable[[GraphModule, Node], None]) -> GraphModule:
    faulty = copy_module(gm)
    change(faulty, _node(faulty, site))
    return faulty


def _drop(faulty: GraphModule, node: Node) -> None:
    faulty.graph.erase_node(node)


def wait_sites(gm: GraphModule) -> list[str]:
    """Every wait of ``gm``: ``wait_event_3`` (a node of its own) or ``set_stream_2[1]``
    (event 1 of a switch's list, `msched.ops`)."""
    sites = []
    for node in gm.graph.nodes:
        if node.target is msched.ops.wait_event:
            sites.append(node.name)
        elif node.target is msched.ops.set_stream:
            sites += [f"{node.name}[{i}]" for i in range(len(_switch_waits(node)))]
    return sites


def _switch_waits(node: Node) -> list[int]:
    return list(node.args[1]) if len(node.args) > 1 else []


def _site(gm: GraphModule, site: str) -> tuple[Node, int | None]:
    """The node of a wait site and, for a switch, the index in its list."""
    name, _, index = site.partition("[")
    return _node(gm, name), int(index[:-1]) if index else None


def _switch_records(node: Node) -> list[int]:
    return list(node.args[2]) if len(node.args) > 2 else []


def _set_switch(node: Node, waits: list[int], records: list[int]) -> None:
    """Write a switch's lists, in the shortest form `msched.ops` reads as them."""
    stream = node.args[0]
    node.args = (stream, waits, records) if records else (stream, waits) if waits else (stream,)


def _set_waits(node: Node, events: list[int]) -> None:
    _set_switch(node, events, _switch_records(node))


def record_sites(gm: GraphModule) -> list[str]:
    """Every record of a switch's list (`msched.ops`): ``set_stream_2[r0]``."""
    return [
        f"{node.name}[r{i}]"
        for node in gm.graph.nodes
        if node.target is msched.ops.set_stream
        for i in range(len(_switch_records(node)))
    ]


def _drop_switch_record(faulty: GraphModule, site: str) -> tuple[Node, int]:
    """Remove the record at ``site`` from its switch; return the switch and the event."""
    name, _, index = site.partition("[r")
    node = _node(faulty, name)
    records = _switch_records(node)
    event = records.pop(int(index[:-1]))
    _set_switch(node, _switch_waits(node), records)
    return node, event


def drop_switch_record(
    gm: GraphModule, original: GraphModule, limit: int | None
) -> Iterator[Fault]:
    """Drop one event out of a switch's record list: its waits bind to no record."""
    for site in _spread(record_sites(gm), limit):
        faulty = copy_module(gm)
        _drop_switch_record(faulty, site)
        expect = frozenset({"unrecorded-event", "race", "exit-not-joined"})
        yield Fault("drop-switch-record", site, faulty, expect)


def move_switch_record(
    gm: GraphModule, original: GraphModule, limit: int | None
) -> Iterator[Fault]:
    """Move one event out of a switch's record list: to a ``record_event`` before the node
    it marks (the last node of the old stream before the switch: the record is too early),
    and to one right after the switch (on the new stream: the wrong stream)."""
    for site in _spread(record_sites(gm), limit):
        switch = _node(gm, site.partition("[")[0])
        before = switch.prev
        if _is_compute(before):
            faulty = copy_module(gm)
            _, event = _drop_switch_record(faulty, site)
            with faulty.graph.inserting_before(_node(faulty, before.name)):
                faulty.graph.call_function(msched.ops.record_event, (event,))
            yield Fault(
                "move-switch-record", f"{site} -> before {before.name}", faulty, _MISSED_WAIT
            )
        faulty = copy_module(gm)
        node, event = _drop_switch_record(faulty, site)
        with faulty.graph.inserting_after(node):
            faulty.graph.call_function(msched.ops.record_event, (event,))
        yield Fault("move-switch-record", f"{site} -> after the switch", faulty, _MISSED_WAIT)


def _drop_wait(faulty: GraphModule, site: str) -> int:
    """Remove the wait at ``site``; return its event."""
    node, index = _site(faulty, site)
    if index is None:
        faulty.graph.erase_node(node)
        return int(node.args[0])  # type: ignore[arg-type]
    events = _switch_waits(node)
    event = events.pop(index)
    _set_waits(node, events)
    return event


def drop_wait_step(gm: GraphModule, index: int) -> str:
    """Remove the wait that is step ``index`` of ``interpret(gm)`` in place (its
    ``wait_event`` node, or its event out of a switch's list) and recompile; return its site."""
    step = interpret(gm).steps[index]
    assert step.kind == "wait_event", step
    node = step.node
    if node.target is msched.ops.wait_event:
        site = node.name
    else:
        steps = interpret(gm).steps  # the switch's records, the switch, then its waits
        before = sum(1 for st in steps[:index] if st.node is node and st.kind == "wait_event")
        site = f"{node.name}[{before}]"
    _drop_wait(gm, site)
    gm.recompile()
    return site


def drop_last_wait(gm: GraphModule) -> str:
    """Remove the last wait of ``gm`` in host order (`drop_wait_step`); return its site."""
    steps = interpret(gm).steps
    return drop_wait_step(gm, max(i for i, st in enumerate(steps) if st.kind == "wait_event"))


_MISSED_WAIT = frozenset({"race", "exit-not-joined"})


def drop_wait(gm: GraphModule, original: GraphModule, limit: int | None) -> Iterator[Fault]:
    for site in _spread(wait_sites(gm), limit):
        faulty = copy_module(gm)
        _drop_wait(faulty, site)
        yield Fault("drop-wait", site, faulty, _MISSED_WAIT)


def _next_on_stream(gm: GraphModule, node: Node) -> tuple[Node | None, Node | None]:
    """After stream-op ``node``: the next compute node of its stream (None: ``output`` or
    none) and the next switch to its stream after that node (None: none)."""
    program = interpret(gm)
    steps = program.steps
    at = max(i for i, st in enumerate(steps) if st.node is node)
    s = steps[at].stream
    user = next((st.node for st in steps[at + 1 :] if st.kind == "compute"), None)
    if user is None or user.op == "output" or program.stream_of[user] != s:
        return None, None
    later = steps[[st.node for st in steps].index(user) :]
    switch = next((st.node for st in later if st.kind == "set_stream" and st.stream == s), None)
    return user, switch


def move_wait(gm: GraphModule, original: GraphModule, limit: int | None) -> Iterator[Fault]:
    """Move an event out of a switch's list to a later point of its stream, past the node it
    was emitted for: into the next switch to that stream (another fused op) when there is
    one, and as a ``wait_event`` right after that node (another position)."""
    sites = [site for site in wait_sites(gm) if "[" in site]
    for site in _spread(sites, limit):
        node, _ = _site(gm, site)
        user, switch = _next_on_stream(gm, node)
        if user is None:
            continue
        if switch is not None:
            faulty = copy_module(gm)
            event = _drop_wait(faulty, site)
            later = _node(faulty, switch.name)
            _set_waits(later, [*_switch_waits(later), event])
            yield Fault("move-wait", f"{site} -> {switch.name}", faulty, _MISSED_WAIT)
        faulty = copy_module(gm)
        event = _drop_wait(faulty, site)
        with faulty.graph.inserting_after(_node(faulty, user.name)):
            faulty.graph.call_function(msched.ops.wait_event, (event,))
        yield Fault("move-wait", f"{site} -> after {user.name}", faulty, _MISSED_WAIT)


def unrecorded_switch_wait(
    gm: GraphModule, original: GraphModule, limit: int | None
) -> Iterator[Fault]:
    """Point one event of a switch's list at an event that is never recorded."""
    never = _never_recorded(gm)
    for site in _spread([site for site in wait_sites(gm) if "[" in site], limit):
        faulty = copy_module(gm)
        node, index = _site(faulty, site)
        events = _switch_waits(node)
        events[index or 0] = never
        _set_waits(node, events)
        yield Fault("unrecorded-switch-wait", site, faulty, frozenset({"unrecorded-event"}))


def _never_recorded(gm: GraphModule) -> int:
    events = [n.args[0] for n in gm.graph.nodes if n.target is msched.ops.record_event]
    events += [e for n in gm.graph.nodes if n.target is msched.ops.set_stream
               for e in _switch_records(n)]  # fmt: skip
    return max((e for e in events if isinstance(e, int)), default=0) + 100


def input_writers(original: GraphModule) -> list[str]:
    """Nodes of ``original`` without users that write a graph input (captures and the like)."""
    dag = build_dag(original)
    return [
        n.name
        for n in dag.nodes
        if not n.users and any(w.op in _INPUT_OPS for w in dag.effects.writes[n])
    ]


def capture_after_output(
    gm: GraphModule, original: GraphModule, limit: int | None
) -> Iterator[Fault]:
    def move(faulty: GraphModule, node: Node) -> None:
        out = next(n for n in faulty.graph.nodes if n.op == "output")
        out.append(node)

    for site in _spread(input_writers(original), limit):
        yield Fault(
            "capture-after-output", site, _apply(gm, site, move), frozenset({"after-output"})
        )


def _target_stream(gm: GraphModule, node: Node) -> int:
    """An auxiliary stream other than ``node``'s that records no event after it, so nothing
    joins ``node`` there (stream 0 would: ``output`` follows it in program order)."""
    program = interpret(gm)
    steps = list(program.steps)
    at = next(i for i, s in enumerate(steps) if s.node is node)
    mine = program.stream_of[node]
    recording_later = {s.stream for s in steps[at:] if s.kind == "record_event"}
    for t in range(1, program.num_streams):
        if t != mine and t not in recording_later:
            return t
    return program.num_streams


def move_stream(gm: GraphModule, original: GraphModule, limit: int | None) -> Iterator[Fault]:
    def move(faulty: GraphModule, node: Node) -> None:
        home = interpret(faulty).stream_of[node]
        target = _target_stream(faulty, node)
        graph = faulty.graph
        with graph.inserting_before(node):
            graph.call_function(msched.ops.set_stream, (target,))
        with graph.inserting_after(node):
            graph.call_function(msched.ops.set_stream, (home,))

    sites = [n.name for n in gm.graph.nodes if _is_compute(n)]
    expect = frozenset({"race", "exit-not-joined", "missing-record-stream"})
    for site in _spread(sites, limit):
        yield Fault("move-stream", site, _apply(gm, site, move), expect)


def record_streams_by_storage(gm: GraphModule, original: GraphModule) -> dict[str, list[str]]:
    """``record_stream`` node names grouped by the storage and stream they record."""
    root = build_dag(original).effects.root
    root_name = {n.name: root[n].name for n in root}
    groups: dict[str, list[str]] = {}
    for node in gm.graph.nodes:
        if node.target is msched.ops.record_stream:
            tensor, stream = node.args
            key = f"{root_name.get(tensor.name, tensor.name)}@{stream}"
            groups.setdefault(key, []).append(node.name)
    return groups


def drop_record_stream(
    gm: GraphModule, original: GraphModule, limit: int | None
) -> Iterator[Fault]:
    """Drop the only ``record_stream`` of a storage for a stream (a second record of another
    alias of the same storage would still protect it: see `redundant_record_streams`)."""
    groups = record_streams_by_storage(gm, original)
    sites = [names[0] for names in groups.values() if len(names) == 1]
    expect = frozenset({"missing-record-stream"})
    for site in _spread(sites, limit):
        yield Fault("drop-record-stream", site, _apply(gm, site, _drop), expect)


def redundant_record_streams(gm: GraphModule, original: GraphModule) -> list[str]:
    """``record_stream`` nodes whose storage and stream another one records already."""
    groups = record_streams_by_storage(gm, original)
    return [name for names in groups.values() for name in names[1:]]


def unrecorded_wait(gm: GraphModule, original: GraphModule, limit: int | None) -> Iterator[Fault]:
    never = _never_recorded(gm)

    def wait(faulty: GraphModule, node: Node) -> None:
        with faulty.graph.inserting_before(node):
            faulty.graph.call_function(msched.ops.wait_event, (never,))

    sites = [n.name for n in gm.graph.nodes if _is_compute(n)]
    for site in _spread(sites, limit):
        yield Fault(
            "unrecorded-wait", site, _apply(gm, site, wait), frozenset({"unrecorded-event"})
        )


def waw_pairs(original: GraphModule) -> list[tuple[str, str]]:
    """``(earlier, later)`` writes of one storage, ordered by a WAW edge of the original.
    Two equal writes (one op, the same arguments) are left out: swapped, they write the same
    thing in the same order, which `msched.verify` rightly accepts (it pairs nodes by what
    they compute, not by name)."""
    dag = build_dag(original)
    return [
        (dep.name, node.name)
        for node in dag.nodes
        for dep, mask in dag.preds[node].items()
        if mask & WAW and node.op != "output" and not _equal_calls(dep, node)
    ]


def _equal_calls(a: Node, b: Node) -> bool:
    return (a.op, a.target, a.args, a.kwargs) == (b.op, b.target, b.args, b.kwargs)


def swap_writes(gm: GraphModule, original: GraphModule, limit: int | None) -> Iterator[Fault]:
    pairs = waw_pairs(original)
    for key in _spread([f"{a}|{b}" for a, b in pairs], limit):
        a_name, b_name = key.split("|")
        faulty = copy_module(gm)
        order = list(faulty.graph.nodes)
        a, b = _node(faulty, a_name), _node(faulty, b_name)
        i, j = order.index(a), order.index(b)
        order[i], order[j] = b, a
        relink(faulty.graph, order)
        yield Fault("swap-writes", key, faulty, frozenset({"race"}))


def duplicate_node(gm: GraphModule, original: GraphModule, limit: int | None) -> Iterator[Fault]:
    def duplicate(faulty: GraphModule, node: Node) -> None:
        with faulty.graph.inserting_after(node):
            faulty.graph.node_copy(node)

    sites = [n.name for n in gm.graph.nodes if _is_compute(n)]
    for site in _spread(sites, limit):
        yield Fault(
            "duplicate-node", site, _apply(gm, site, duplicate), frozenset({"duplicate-node"})
        )


def delete_node(gm: GraphModule, original: GraphModule, limit: int | None) -> Iterator[Fault]:
    def delete(faulty: GraphModule, node: Node) -> None:
        for user in list(node.users):
            faulty.graph.erase_node(user)  # record_stream nodes only
        faulty.graph.erase_node(node)

    sites = [
        n.name
        for n in gm.graph.nodes
        if _is_compute(n) and all(u.target in _STREAM_OPS for u in n.users)
    ]
    for site in _spread(sites, limit):
        yield Fault("delete-node", site, _apply(gm, site, delete), frozenset({"missing-node"}))


# -- collectives ---------------------------------------------------------------------------


def independent_pairs(gm: GraphModule) -> list[tuple[Node, Node]]:
    """Consecutive collectives of ``gm`` (host order) where the second does not use the
    first's result: one per micro-batch, which a schedule could swap or run apart."""
    issued = [c.node for c in collectives_in(gm.graph)]
    return [(a, b) for a, b in zip(issued, issued[1:], strict=False) if a not in _ancestors(b)]


def _ancestors(node: Node) -> set[Node]:
    seen: set[Node] = set()
    todo = list(node.all_input_nodes)
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += n.all_input_nodes
    return seen


def _after(gm: GraphModule, anchor: Node, target: Any, *args: Any) -> Node:
    with gm.graph.inserting_after(anchor):
        return gm.graph.call_function(target, args)


def rename_every_node(gm: GraphModule, prefix: str = "renamed") -> None:
    """Give every node of ``gm`` a new name (``prefix_<position>``), as a pass that renames
    may: what the nodes compute and read stays as it was."""
    for i, node in enumerate(gm.graph.nodes):
        node.name = f"{prefix}_{i}"  # fx keeps names unique in a graph
    gm.recompile()


def swap_names(a: Node, b: Node) -> None:
    """Give ``a`` the name of ``b`` and ``b`` the name of ``a``."""
    first, second = a.name, b.name
    a.name = f"{first}_swap"
    b.name = first
    a.name = second


def issue_after(gm: GraphModule, node: Node, anchor: Node) -> None:
    """Move ``node`` right after ``anchor`` in host order, still on its own stream."""
    stream_of = interpret(gm).stream_of
    home, there = stream_of[node], stream_of[anchor]
    anchor.append(node)
    if home != there:
        with gm.graph.inserting_before(node):
            gm.graph.call_function(msched.ops.set_stream, (home,))
        _after(gm, node, msched.ops.set_stream, there)
    gm.recompile()


def on_another_stream(gm: GraphModule, node: Node, joined_after: Node, stream: int) -> None:
    """Issue ``node`` on ``stream``, which first waits for an event recorded right after
    ``joined_after``; ``node``'s stream waits for ``node`` right after it.  What ``node``
    allocates is recorded for every other stream (it now comes from ``stream``'s pool)."""
    program = interpret(gm)
    home = program.stream_of[node]
    assert home != stream
    start = _never_recorded(gm)
    back = start + 1
    _after(gm, joined_after, msched.ops.record_event, start)
    with gm.graph.inserting_before(node):
        gm.graph.call_function(msched.ops.set_stream, (stream,))
        gm.graph.call_function(msched.ops.wait_event, (start,))
    at = node
    for other in range(max(program.num_streams, stream + 1)):
        if other != stream:
            at = _after(gm, at, msched.ops.record_stream, node, other)
    at = _after(gm, at, msched.ops.record_event, back)
    at = _after(gm, at, msched.ops.set_stream, home)
    _after(gm, at, msched.ops.wait_event, back)
    gm.recompile()


def drop_waits_between(gm: GraphModule, a: Node, b: Node) -> list[int]:
    """Drop the waits of ``b``'s stream, between ``a`` and ``b`` in host order, for events
    recorded on ``a``'s stream after ``a``; return those events."""
    stream_of = interpret(gm).stream_of
    nodes = list(gm.graph.nodes)
    between = nodes[nodes.index(a) + 1 : nodes.index(b)]
    recorded = [
        int(n.args[0])  # type: ignore[call-overload]
        for n in between
        if n.target is msched.ops.record_event and stream_of[n] == stream_of[a]
    ]
    dropped = []
    for node in between:
        if node.target is msched.ops.set_stream and node.args[0] == stream_of[b]:
            waits = _switch_waits(node)
            dropped += [e for e in waits if e in recorded]
            _set_waits(node, [e for e in waits if e not in recorded])
    gm.recompile()
    return dropped


def previous_on_stream(gm: GraphModule, node: Node) -> Node:
    """The compute node issued last on ``node``'s stream before it."""
    stream_of = interpret(gm).stream_of
    order = [n for n in gm.graph.nodes if n.op == "call_function" and _is_compute(n)]
    before = order[: order.index(node)]
    return next(n for n in reversed(before) if stream_of[n] == stream_of[node])


def unorder(gm: GraphModule, a: Node, b: Node) -> bool:
    """Leave nothing ordering collective ``b`` after ``a``: on one stream, move ``b`` to
    another one that joined ``a``'s just before ``a``; on two, drop the waits between them
    for ``a``'s stream.  False when there is neither another stream nor such a wait."""
    program = interpret(gm)
    if program.stream_of[a] == program.stream_of[b]:
        stream = max(1, program.num_streams - 1)
        if stream == program.stream_of[a]:
            stream = 0
        on_another_stream(gm, b, previous_on_stream(gm, a), stream)
        return True
    return bool(drop_waits_between(gm, a, b))


def swap_collectives(gm: GraphModule, original: GraphModule, limit: int | None) -> Iterator[Fault]:
    """Issue the first of two independent consecutive collectives after the second."""
    for key in _spread([f"{a.name}|{b.name}" for a, b in independent_pairs(gm)], limit):
        a_name, b_name = key.split("|")
        faulty = copy_module(gm)
        issue_after(faulty, _node(faulty, a_name), _node(faulty, b_name))
        yield Fault("swap-collectives", key, faulty, frozenset({"collective-order"}))


def unorder_collectives(
    gm: GraphModule, original: GraphModule, limit: int | None
) -> Iterator[Fault]:
    """Leave nothing ordering the second of two independent consecutive collectives after
    the first (`unorder`)."""
    for key in _spread([f"{a.name}|{b.name}" for a, b in independent_pairs(gm)], limit):
        a_name, b_name = key.split("|")
        faulty = copy_module(gm)
        if unorder(faulty, _node(faulty, a_name), _node(faulty, b_name)):
            yield Fault("unorder-collectives", key, faulty, frozenset({"collective-order"}))


INJECTORS: dict[str, Callable[[GraphModule, GraphModule, int | None], Iterator[Fault]]] = {
    "drop-wait": drop_wait,
    "move-wait": move_wait,
    "unrecorded-switch-wait": unrecorded_switch_wait,
    "drop-switch-record": drop_switch_record,
    "move-switch-record": move_switch_record,
    "capture-after-output": capture_after_output,
    "move-stream": move_stream,
    "drop-record-stream": drop_record_stream,
    "unrecorded-wait": unrecorded_wait,
    "swap-writes": swap_writes,
    "duplicate-node": duplicate_node,
    "delete-node": delete_node,
    "swap-collectives": swap_collectives,
    "unorder-collectives": unorder_collectives,
}


def inject(
    kind: str, gm: GraphModule, original: GraphModule, limit: int | None = None
) -> Iterator[Fault]:
    """Every fault of ``kind`` (at most ``limit`` sites, evenly spread) on scheduled ``gm``."""
    return INJECTORS[kind](gm, original, limit)


def real_orderings_broken(
    gm: GraphModule, original: GraphModule, dag: Dag | None = None
) -> list[tuple[str, str]]:
    """Orderings of ``original`` (and aux-stream starts) that ``gm`` no longer guarantees.

    Uses `tests.msched.hb`, which shares no code with `msched.verify`.  ``dag``: the `Dag`
    of ``original``, where the caller checks many faults against it.
    """
    hb = happens_before(gm)
    dag = build_dag(original) if dag is None else dag
    broken = [
        (dep.name, node.name)
        for node in dag.nodes
        for dep in dag.preds[node]
        if dep.name in hb.position
        and node.name in hb.position
        and not hb.ordered(dep.name, node.name)
    ]
    first: dict[int, str] = {}
    for name in hb.host_order:
        stream, seq = hb.position.get(name, (0, 0))
        if seq == 1 and stream != 0 and stream not in first:
            first[stream] = name
            if hb.knows[name][0] < 0:
                broken.append(("<entry>", name))
    return broken

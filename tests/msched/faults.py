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

from torch.fx import Graph, GraphModule, Node

import msched
from msched.analysis.dag import WAW, build_dag
from msched.analysis.nodes import node_named
from msched.proof.dialects import interpret
from msched.scheduling.emit import relink

from .hb import happens_before

FAULTS = (
    "drop-wait",
    "capture-after-output",
    "move-stream",
    "drop-record-stream",
    "unrecorded-wait",
    "swap-writes",
    "duplicate-node",
    "delete-node",
)
_INPUT_OPS = ("placeholder", "get_attr")
_STREAM_OPS = set(msched.ops.STREAM_OPS)


@dataclass(frozen=True)
class Fault:
    kind: str
    site: str
    gm: GraphModule
    expect: frozenset[str]


def copy_module(gm: GraphModule) -> GraphModule:
    """A copy of ``gm`` with its own graph; node names are unchanged."""
    graph = Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return GraphModule(gm, graph, gm.__class__.__name__)


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


def drop_wait(gm: GraphModule, original: GraphModule, limit: int | None) -> Iterator[Fault]:
    waits = [n.name for n in gm.graph.nodes if n.target is msched.ops.wait_event]
    for site in _spread(waits, limit):
        yield Fault(
            "drop-wait", site, _apply(gm, site, _drop), frozenset({"race", "exit-not-joined"})
        )


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
    events = [n.args[0] for n in gm.graph.nodes if n.target in (msched.ops.record_event,)]
    never = max((e for e in events if isinstance(e, int)), default=0) + 100

    def wait(faulty: GraphModule, node: Node) -> None:
        with faulty.graph.inserting_before(node):
            faulty.graph.call_function(msched.ops.wait_event, (never,))

    sites = [n.name for n in gm.graph.nodes if _is_compute(n)]
    for site in _spread(sites, limit):
        yield Fault(
            "unrecorded-wait", site, _apply(gm, site, wait), frozenset({"unrecorded-event"})
        )


def waw_pairs(original: GraphModule) -> list[tuple[str, str]]:
    """``(earlier, later)`` writes of one storage, ordered by a WAW edge of the original."""
    dag = build_dag(original)
    return [
        (dep.name, node.name)
        for node in dag.nodes
        for dep, mask in dag.preds[node].items()
        if mask & WAW and node.op != "output"
    ]


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


INJECTORS: dict[str, Callable[[GraphModule, GraphModule, int | None], Iterator[Fault]]] = {
    "drop-wait": drop_wait,
    "capture-after-output": capture_after_output,
    "move-stream": move_stream,
    "drop-record-stream": drop_record_stream,
    "unrecorded-wait": unrecorded_wait,
    "swap-writes": swap_writes,
    "duplicate-node": duplicate_node,
    "delete-node": delete_node,
}


def inject(
    kind: str, gm: GraphModule, original: GraphModule, limit: int | None = None
) -> Iterator[Fault]:
    """Every fault of ``kind`` (at most ``limit`` sites, evenly spread) on scheduled ``gm``."""
    return INJECTORS[kind](gm, original, limit)


def real_orderings_broken(gm: GraphModule, original: GraphModule) -> list[tuple[str, str]]:
    """Orderings of ``original`` (and aux-stream starts) that ``gm`` no longer guarantees.

    Uses `tests.msched.hb`, which shares no code with `msched.verify`.
    """
    hb = happens_before(gm)
    dag = build_dag(original)
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

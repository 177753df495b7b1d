"""The dependency DAG of an FX graph: data edges plus storage hazards plus exit edges.

Program order of the input graph defines what a mutation means, so every hazard edge points
from an earlier node to a later one:

- ``data``: an FX input of the node;
- ``raw``: a read of a storage after its last write;
- ``war``: a write after the reads since the storage's previous write;
- ``waw``: a write after the previous write of the same storage;
- ``exit``: ``output`` after the last write of every written storage, after every
  side-effecting node without users, and after every other node without users (so that the
  caller's stream has joined all work the graph issued when it returns);
- ``collective``: every collective (`msched.analysis.collectives`) after the collective before
  it in program order.  One chain for all process groups, not one per group: every rank must
  issue the collectives of a group in one order, and NCCL also asks every rank to submit the
  operations of several communicators in one order (a rank-divergent order across two groups
  deadlocks as surely as one within a group).  So a scheduler that follows the Dag never
  reorders collectives, whatever its cost model says, and every rank issues them alike.

Side-effecting nodes that write no tensor of the graph (``print``, collectives registered with
`msched.register_side_effect`), random ops and calls msched knows nothing about keep their
relative order: each is a ``waw`` on a pseudo-storage standing for the world outside the graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from torch.fx import Graph, GraphModule, Node

from msched._torch_internals import node_inputs
from msched.analysis._graphcheck import check_acyclic
from msched.analysis.collectives import collectives_in
from msched.analysis.effects import Effects, compute_effects
from msched.analysis.nodes import INPUT_OPS, graph_of
from msched.errors import InvalidArgumentError, InvalidGraphError

DATA, RAW, WAR, WAW, EXIT, COLLECTIVE = 1, 2, 4, 8, 16, 32
REASONS: tuple[tuple[int, str], ...] = (
    (DATA, "data"),
    (RAW, "raw"),
    (WAR, "war"),
    (WAW, "waw"),
    (EXIT, "exit"),
    (COLLECTIVE, "collective"),
)


def reason_names(mask: int) -> set[str]:
    """The reason names in a bit mask of `DATA` | `RAW` | ..."""
    return {name for bit, name in REASONS if mask & bit}


@dataclass(frozen=True)
class Dag:
    """Dependencies of every node of one graph, in the graph's program order.

    ``preds[n]`` maps each node ``n`` must wait for to a bit mask of reasons; ``succs[n]``
    lists the nodes that wait for ``n``.  Use `dependencies` for the readable form.
    """

    nodes: tuple[Node, ...]
    index: dict[Node, int]
    preds: dict[Node, dict[Node, int]]
    succs: dict[Node, list[Node]]
    effects: Effects
    output: Node

    @cached_property
    def computed_dependency_counts(self) -> dict[Node, int]:
        """How many dependencies of each node are computed nodes (graph inputs are always
        ready).  Shared: take a copy before counting down."""
        waiting = {n: len(deps) for n, deps in self.preds.items()}
        succs = self.succs
        for node in self.nodes:
            if node.op in INPUT_OPS:
                for succ in succs[node]:
                    waiting[succ] -= 1
        return waiting

    def dependencies(self, node: Node) -> dict[Node, set[str]]:
        """What ``node`` must wait for: ``{dependency: {"data", "raw", ...}}``."""
        if node not in self.preds:
            raise InvalidArgumentError(f"node {node.name!r} is not in this graph")
        return {dep: reason_names(mask) for dep, mask in self.preds[node].items()}


def check_output(graph: Graph) -> Node:
    """The graph's single ``output`` node, which must be its last node."""
    outputs = graph.find_nodes(op="output")
    if len(outputs) > 1:
        outputs = [n for n in graph.nodes if n.op == "output"]  # in graph order, for the message
    if not outputs:
        raise InvalidGraphError("the graph has no output node; add one with graph.output(...)")
    if len(outputs) > 1:
        names = ", ".join(n.name for n in outputs)
        raise InvalidGraphError(
            f"the graph has {len(outputs)} output nodes ({names})",
            nodes=tuple(n.name for n in outputs),
        )
    out = outputs[0]
    after = []
    n = out.next
    while n.op != "root":
        after.append(n.name)
        n = n.next
    if after:
        raise InvalidGraphError(
            f"nodes after output: {', '.join(after)}; they would never run. "
            "Move them before output (or delete them)",
            nodes=tuple(after),
        )
    return out


def build_dag(gm: GraphModule | Graph, *, exit_edges: bool = True) -> Dag:
    """Build the `Dag` of ``gm``: data, RAW, WAR, WAW, exit and collective edges with their
    reasons.

    Raises `msched.InvalidGraphError` naming the cycle when a node depends on its own value.

    1. Compute every node's reads and writes (`msched.analysis.effects`).
    2. Walk the nodes in program order, keeping per storage its last write and the reads
       since; add data edges, then RAW for reads, then WAW and WAR for writes.
    3. Give ``output`` an exit edge from each storage's last write, each side-effecting node
       without users and each other node without users.
    4. Chain the collectives in program order (`collective_dependencies`).

    ``exit_edges=False`` skips step 3: an ablation for tests and benchmarks, which reproduces
    the bug msched exists to prevent (a capture nothing uses has no path to ``output``).
    """
    graph = graph_of(gm)
    check_acyclic(graph)
    out = check_output(graph)
    effects = compute_effects(graph)
    nodes = tuple(graph.nodes)
    preds = dependency_edges(nodes, effects, out)
    if exit_edges:
        for dep, mask in exit_dependencies(nodes, effects, out).items():
            preds[out][dep] = preds[out].get(dep, 0) | mask
    for node, dep in collective_dependencies(nodes):
        preds[node][dep] = preds[node].get(dep, 0) | COLLECTIVE
    succs: dict[Node, list[Node]] = {n: [] for n in nodes}
    for node in nodes:
        for dep in preds[node]:
            succs[dep].append(node)
    index = {n: i for i, n in enumerate(nodes)}
    return Dag(nodes, index, preds, succs, effects, out)


def dependency_edges(
    nodes: Sequence[Node], effects: Effects, output: Node
) -> dict[Node, dict[Node, int]]:
    """Data, RAW, WAR and WAW edges of ``nodes``, taken in the given order as program order.

    Side effects that write no tensor of the graph are chained with WAW edges.  Exit edges
    are separate (`exit_dependencies`), so a verifier can choose which users count.
    """
    preds: dict[Node, dict[Node, int]] = {}
    hazards = _Hazards()
    read_hazards, write_hazards = hazards.read, hazards.write
    reads, writes, side_effects = effects.reads, effects.writes, effects.side_effects
    world_nodes = effects.world
    # Only storages that something writes can take part in a hazard.
    written = {s for w in map(writes.get, nodes) if w for s in w}
    world: Node | None = None  # the last side effect that writes no tensor of the graph
    for node in nodes:
        deps = dict.fromkeys(node_inputs(node), DATA)  # torch.fx's dict of the node's inputs
        read = reads[node]
        if read and not written.isdisjoint(read):
            hazardous = [s for s in read if s in written]
            read_hazards(node, hazardous, deps)
        write = writes[node]
        if write:
            write_hazards(node, write, deps)
            ordered = node in world_nodes
        else:
            ordered = node in side_effects and node is not output
        if ordered:
            if world is not None:
                deps[world] = deps.get(world, 0) | WAW
            world = node
        preds[node] = deps
    return preds


def collective_dependencies(nodes: Sequence[Node]) -> list[tuple[Node, Node]]:
    """``(collective, the collective before it)`` for each collective among ``nodes`` but the
    first, in their order: the ``collective`` chain."""
    chain = [c.node for c in collectives_in(nodes)]
    return list(zip(chain[1:], chain[:-1], strict=True))


def exit_dependencies(
    nodes: Iterable[Node],
    effects: Effects,
    output: Node,
    present: Mapping[Node, object] | None = None,
) -> dict[Node, int]:
    """What ``output`` must happen after: the last write of every storage, and every node
    whose value nobody uses (captures and other side effects among them).

    Users not in ``present`` (when given) do not count: stream ops, nodes that never run.
    """
    deps: dict[Node, int] = {}
    last_write: dict[Node, Node] = {}
    for node in nodes:
        if node is output or node.op in INPUT_OPS:
            continue
        for storage in effects.writes.get(node, ()):
            last_write[storage] = node
        users = node.users if present is None else [u for u in node.users if u in present]
        if not users:
            deps[node] = EXIT
    for writer in last_write.values():
        deps[writer] = deps.get(writer, 0) | EXIT
    return deps


def host_order_dependencies(
    order: Iterable[Node],
    effects: Effects,
    output: Node,
    forwarding: Mapping[Node, object] | None = None,
) -> dict[Node, dict[Node, int]]:
    """The `Dag` rules applied to ``order`` (compute nodes in host order).

    Returns ``{node: {dependency: reason bits}}`` with data, RAW, WAR, WAW and exit edges,
    where program order is the given order; stream ops must not be in ``order``.  Nodes in
    ``forwarding`` (stream ops that pass a value on to users) count as users of their inputs
    for the exit rule.
    """
    order = tuple(order)
    preds = dependency_edges(order, effects, output)
    if output in preds:
        exits = preds[output]
        present: Mapping[Node, object] = preds
        if forwarding:
            present = {**preds, **forwarding}
        for dep, mask in exit_dependencies(order, effects, output, present).items():
            exits[dep] = exits.get(dep, 0) | mask
    return preds


class _Hazards:
    """Per storage, its last write and the reads since, while walking in program order."""

    __slots__ = ("last_write", "reads_since")

    def __init__(self) -> None:
        self.last_write: dict[Node, Node] = {}
        self.reads_since: dict[Node, list[Node]] = {}

    def read(self, node: Node, storages: Sequence[Node], deps: dict[Node, int]) -> None:
        """``node`` reads ``storages``: RAW edges from their last writes into ``deps``."""
        last_write, reads_since = self.last_write, self.reads_since
        for storage in storages:
            writer = last_write.get(storage)
            if writer is not None and writer is not node:
                deps[writer] = deps.get(writer, 0) | RAW
            reads_since.setdefault(storage, []).append(node)

    def write(self, node: Node, storages: Sequence[Node], deps: dict[Node, int]) -> None:
        """``node`` writes ``storages``: WAW edges from their last writes and WAR edges from
        the reads since into ``deps``; ``node`` becomes their last write."""
        last_write, reads_since = self.last_write, self.reads_since
        for storage in storages:
            writer = last_write.get(storage)
            if writer is not None and writer is not node:
                deps[writer] = deps.get(writer, 0) | WAW
            for reader in reads_since.get(storage, ()):
                if reader is not node:
                    deps[reader] = deps.get(reader, 0) | WAR
            last_write[storage] = node
            reads_since[storage] = []

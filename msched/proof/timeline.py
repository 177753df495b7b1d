"""`msched.simulate`: when every node of a scheduled graph runs, under a cost model.

Why: a schedule's value is its makespan, and the scheduler's own estimate is not evidence; the
timeline replays the stream ops of the rebuilt graph as a GPU would (each stream issues its
work as soon as happens-before allows) so the pictures and the tests can compare the two.

The graph is read with `msched.proof.interpreter.interpret` and ordered by
`msched.proof.clocks`; nodes after ``output`` never run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch.fx import Graph, GraphModule, Node

from msched.analysis._graphcheck import check_acyclic
from msched.analysis.bounds import makespan_lower_bound
from msched.analysis.communication import Channels, Communication, split_communication
from msched.analysis.cost import CostModel, DefaultCostModel, check_cost_model, checked_cost
from msched.analysis.dag import host_order_dependencies
from msched.analysis.effects import compute_effects
from msched.analysis.nodes import INPUT_OPS, graph_of
from msched.proof.clocks import Clocks, clocks_of
from msched.proof.dialects import Dialect
from msched.proof.interpreter import interpret
from msched.proof.summary import Summarized, Summary


@dataclass(frozen=True)
class Timeline(Summarized[float]):
    """When every compute node runs when each stream issues its work as soon as it may.

    ``nodes`` are the compute nodes that run, in host order (graph inputs and ``output``
    excluded); ``stream``, ``start`` and ``end`` are keyed by them.  ``summary``
    (`msched.proof.summary.Summary`, its fields also attributes of the Timeline) holds the
    streams, events and waits of the graph's stream program; the ``makespan``, the end of the
    last node or the time ``output`` is reached, whichever is later; and the ``lower_bound``,
    `msched.analysis.bounds.makespan_lower_bound` (critical path, total / streams, and the
    work before and after each node) over the dependencies of the host order
    (`msched.analysis.dag.host_order_dependencies`).

    An asynchronous collective starts and ends at its issue; ``communication`` holds
    ``(start, end)`` of its communication (`msched.analysis.communication`), and
    ``total_cost`` counts what holds a stream, not the communication.
    """

    nodes: tuple[Node, ...]
    stream: dict[Node, int]
    start: dict[Node, float]
    end: dict[Node, float]
    summary: Summary[float]
    critical_path: float
    total_cost: float
    communication: Mapping[Node, tuple[float, float]] = field(default_factory=dict)

    def intervals(self) -> list[tuple[Node, int, float, float]]:
        """``(node, stream, start, end)`` for every node, sorted by start, then stream."""
        rows = [(n, self.stream[n], self.start[n], self.end[n]) for n in self.nodes]
        return sorted(rows, key=lambda r: (r[2], r[1]))


def simulate(
    gm: GraphModule | Graph,
    cost_model: CostModel | None = None,
    dialect: Dialect | str | None = None,
) -> Timeline:
    """The `Timeline` of the scheduled ``gm`` under ``cost_model`` (`msched.DefaultCostModel`).

    A compute node starts when everything it directly happens after has ended
    (`msched.proof.clocks.Clocks.predecessors`: the previous node of its stream and what its
    waits observe; a wait on an unrecorded event waits for nothing) and ends ``cost`` later.
    ``output`` is reached when its own predecessors have ended.  Communication runs as
    `msched.analysis.communication` says: an asynchronous collective holds its stream for
    nothing and starts its communication at its issue, after the communication its process
    group has issued before; a ``wait_tensor`` starts once the communication it waits for
    has ended.

    Raises `msched.InvalidGraphError` for a cyclic graph and `msched.InvalidArgumentError`
    for a cost model without ``cost(node)`` or one that gives a bad cost.
    """
    graph = graph_of(gm)
    check_cost_model(cost_model)
    check_acyclic(graph)
    return timeline_of(graph, clocks_of(interpret(graph, dialect)), cost_model)


def timeline_of(graph: Graph, clocks: Clocks, cost_model: CostModel | None = None) -> Timeline:
    """`simulate` over a graph already read (``clocks`` of its program), for the readers
    that read it anyway (`msched.proof.memory`); the arguments are not checked again."""
    model = cost_model or DefaultCostModel()
    output = clocks.output
    order = [n for n in clocks.predecessors if n is not output]
    cost, comm = split_communication(order, {n: _cost(model, n) for n in order})
    channels = Channels(comm) if comm is not None else None
    start: dict[Node, float] = {}
    end: dict[Node, float] = {}
    reached = 0.0
    for node, preds in clocks.predecessors.items():
        ready = max((end[p] for p in preds), default=0.0)
        if node is output:
            reached = ready
            continue
        if channels is not None:
            ready = max(ready, channels.release(node))
            if node in channels.comm.time:
                channels.issue(node, ready)
        start[node], end[node] = ready, ready + cost[node]
    nodes = tuple(end)
    stream = {n: clocks.stamp[n].stream for n in nodes}
    makespan = max([reached, *end.values()])
    critical, total, bound = _bounds(graph, clocks, nodes, cost, comm, makespan)
    program = clocks.program
    summary = Summary(clocks.num_streams, program.num_events, program.num_waits, makespan, bound)
    spans = channels.spans if channels is not None else {}
    return Timeline(nodes, stream, start, end, summary, critical, total, spans)


def _cost(model: CostModel, node: Node) -> float:
    return checked_cost(model, node, model.cost(node))


def _bounds(
    graph: Graph,
    clocks: Clocks,
    nodes: tuple[Node, ...],
    node_cost: dict[Node, float],
    comm: Communication | None,
    makespan: float,
) -> tuple[float, float, float]:
    """Longest cost path over the host-order dependencies, the total cost and the lower
    bound on the makespan over those dependencies (``makespan``, the timeline's, is one
    schedule of them); ``node_cost`` holds what each node holds its stream for."""
    output = clocks.output
    order = [n for n in clocks.order if n.op in INPUT_OPS]
    order += [*nodes, output]
    deps = host_order_dependencies(order, compute_effects(graph), output)
    preds = {n: {d: 1 for d in deps[n] if d in deps} for n in order}
    finish: dict[Node, float] = {}
    cost: dict[Node, float] = {}
    for node in order:
        c = 0.0 if node.op in INPUT_OPS or node is output else node_cost[node]
        cost[node] = c
        ready = max((finish[d] for d in preds[node]), default=0.0)
        lag = comm.lag(node) if comm is not None else None
        if lag is not None and lag[0] in finish:
            ready = max(ready, finish[lag[0]] + lag[1])
        finish[node] = c + ready
    bound = makespan_lower_bound(order, preds, cost, clocks.num_streams, makespan, comm=comm)
    return max(finish.values(), default=0.0), sum(cost.values()), bound

"""`msched.simulate`: when every node of a scheduled graph runs, under a cost model.

Why: a schedule's value is its makespan, and the scheduler's own estimate is not evidence; the
timeline replays the stream ops of the rebuilt graph as a GPU would (each stream issues its
work as soon as happens-before allows) so the pictures and the tests can compare the two.

The graph is read with `msched.proof.dialects.interpret` and ordered by
`msched.proof.clocks`; nodes after ``output`` never run.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import Graph, GraphModule, Node

from msched.analysis._graphcheck import check_acyclic
from msched.analysis.cost import (
    CostModel,
    DefaultCostModel,
    check_cost_model,
    checked_cost,
    lower_bound,
)
from msched.analysis.dag import host_order_dependencies
from msched.analysis.effects import compute_effects
from msched.analysis.nodes import INPUT_OPS, graph_of
from msched.proof.clocks import Clocks, clocks_of
from msched.proof.dialects import Dialect, interpret


@dataclass(frozen=True)
class Timeline:
    """When every compute node runs when each stream issues its work as soon as it may.

    ``nodes`` are the compute nodes that run, in host order (graph inputs and ``output``
    excluded); ``stream``, ``start`` and ``end`` are keyed by them.  ``makespan`` is the end
    of the last node or the time ``output`` is reached, whichever is later.  The lower bound
    is ``max(critical_path, total_cost / num_streams)``, the critical path taken over the
    dependencies of the host order (`msched.analysis.dag.host_order_dependencies`).
    """

    nodes: tuple[Node, ...]
    stream: dict[Node, int]
    start: dict[Node, float]
    end: dict[Node, float]
    num_streams: int
    makespan: float
    critical_path: float
    total_cost: float

    @property
    def lower_bound(self) -> float:
        return lower_bound(self.critical_path, self.total_cost, self.num_streams)

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
    ``output`` is reached when its own predecessors have ended.

    Raises `msched.InvalidGraphError` for a cyclic graph and `msched.InvalidArgumentError`
    for a cost model without ``cost(node)`` or one that gives a bad cost.
    """
    graph = graph_of(gm)
    check_cost_model(cost_model)
    check_acyclic(graph)
    model = cost_model or DefaultCostModel()
    clocks = clocks_of(interpret(graph, dialect))
    output = clocks.output
    start: dict[Node, float] = {}
    end: dict[Node, float] = {}
    reached = 0.0
    for node, preds in clocks.predecessors.items():
        ready = max((end[p] for p in preds), default=0.0)
        if node is output:
            reached = ready
        else:
            start[node], end[node] = ready, ready + _cost(model, node)
    nodes = tuple(end)
    stream = {n: clocks.stamp[n].stream for n in nodes}
    critical, total = _critical_path(graph, clocks, nodes, model)
    makespan = max([reached, *end.values()])
    return Timeline(nodes, stream, start, end, clocks.num_streams, makespan, critical, total)


def _cost(model: CostModel, node: Node) -> float:
    return checked_cost(model, node, model.cost(node))


def _critical_path(
    graph: Graph, clocks: Clocks, nodes: tuple[Node, ...], model: CostModel
) -> tuple[float, float]:
    """Longest cost path over the host-order dependencies, and the total cost."""
    output = clocks.output
    order = [n for n in clocks.order if n.op in INPUT_OPS]
    order += [*nodes, output]
    preds = host_order_dependencies(order, compute_effects(graph), output)
    finish: dict[Node, float] = {}
    total = 0.0
    for node in order:
        c = 0.0 if node.op in INPUT_OPS or node is output else _cost(model, node)
        total += c
        finish[node] = c + max((finish[d] for d in preds[node] if d in finish), default=0.0)
    return max(finish.values(), default=0.0), total

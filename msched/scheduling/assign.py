"""Stream assignment: critical-path list scheduling with insertion and stream affinity.

Why insertion: a capture or other side effect whose only successor is the exit has the lowest
priority in the graph, so plain list scheduling pops it last and appends it to the end of a
stream, keeping its input alive for the whole graph.  Placing each node in the earliest idle
gap of a stream that fits it (as HEFT does) puts it right after its producer instead, without
delaying anything placed before it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass

from torch.fx import Node

from msched.analysis.cost import CostModel, checked_cost
from msched.analysis.dag import Dag

_INPUT_OPS = ("placeholder", "get_attr")


@dataclass(frozen=True)
class Assignment:
    """Where and when every node runs under the cost model.

    ``order`` lists the compute nodes (not placeholders, ``get_attr`` or ``output``) sorted
    by ``(start, pick order)``, which is a topological order of the `Dag`.
    """

    num_streams: int
    stream: dict[Node, int]
    start: dict[Node, float]
    finish: dict[Node, float]
    order: tuple[Node, ...]
    makespan: float
    critical_path: float
    total_cost: float

    @property
    def lower_bound(self) -> float:
        return lower_bound(self.critical_path, self.total_cost, self.num_streams)


def lower_bound(critical_path: float, total_cost: float, num_streams: int) -> float:
    """No schedule beats ``max(critical path, total cost / streams)``."""
    return max(critical_path, total_cost / num_streams)


class _Lane:
    """The busy blocks of one stream: maximal intervals, kept merged and sorted."""

    __slots__ = ("starts", "ends")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def earliest(self, est: float, cost: float) -> float:
        """Earliest start >= ``est`` of an idle gap at least ``cost`` long."""
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, est)
        t = est
        while i < len(starts):
            if starts[i] - t >= cost and starts[i] > t:
                return t
            t = max(t, ends[i])
            i += 1
        return t

    def occupy(self, start: float, end: float) -> None:
        if end <= start:
            return
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, start)
        merge_left = i > 0 and ends[i - 1] == start
        merge_right = i < len(starts) and starts[i] == end
        if merge_left and merge_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i]
        elif merge_left:
            ends[i - 1] = end
        elif merge_right:
            starts[i] = start
        else:
            starts.insert(i, start)
            ends.insert(i, end)


def bottom_levels(dag: Dag, cost: dict[Node, float]) -> dict[Node, float]:
    """Longest cost path from each node to the exit, the node itself included."""
    level: dict[Node, float] = {}
    succs = dag.succs
    get = level.__getitem__
    for node in reversed(dag.nodes):
        below = succs[node]
        if not below:
            level[node] = cost[node]
        elif len(below) == 1:
            level[node] = cost[node] + level[below[0]]
        else:
            level[node] = cost[node] + max(map(get, below))
    return level


def assign_streams(dag: Dag, num_streams: int, cost_model: CostModel) -> Assignment:
    """Assign every node of ``dag`` to one of ``num_streams`` streams.

    1. Cost every node; priority = bottom level (longest path to the exit).
    2. Pop ready nodes by ``(-priority, index in the input graph)`` from a heap.
    3. Earliest start = latest finish of the node's dependencies.  Zero-cost nodes follow
       the dependency that finishes last (their producer).  Other nodes take the stream of
       that dependency when it has an idle gap at the earliest start, else the lowest stream
       with one, else the stream whose gap opens first.
    4. Graph inputs are ready at time 0 on stream 0; ``output`` runs on stream 0 last.
    """
    cost = _costs(dag, cost_model)
    level = bottom_levels(dag, cost)
    stream: dict[Node, int] = {}
    start: dict[Node, float] = {}
    finish: dict[Node, float] = {}
    for node in dag.nodes:
        if node.op in _INPUT_OPS:
            stream[node], start[node], finish[node] = 0, 0.0, 0.0
    picked = _list_schedule(dag, num_streams, cost, level, stream, start, finish)
    out = dag.output
    stream[out] = 0
    start[out] = finish[out] = max((finish[d] for d in dag.preds[out]), default=0.0)
    order = tuple(sorted(picked, key=start.__getitem__))  # stable: ties keep the pick order
    return Assignment(
        num_streams=num_streams,
        stream=stream,
        start=start,
        finish=finish,
        order=order,
        makespan=finish[out],
        critical_path=max(level.values(), default=0.0),
        total_cost=sum(cost.values()),
    )


def serial_assignment(dag: Dag, cost_model: CostModel) -> Assignment:
    """One stream, the input order kept: every node starts when the previous one finishes."""
    cost = _costs(dag, cost_model)
    level = bottom_levels(dag, cost)
    stream = dict.fromkeys(dag.nodes, 0)
    start: dict[Node, float] = {}
    finish: dict[Node, float] = {}
    t = 0.0
    for node in dag.nodes:
        start[node] = t
        t += cost[node]
        finish[node] = t
    compute = tuple(n for n in dag.nodes if n.op not in _INPUT_OPS and n is not dag.output)
    return Assignment(
        num_streams=1,
        stream=stream,
        start=start,
        finish=finish,
        order=compute,
        makespan=t,
        critical_path=max(level.values(), default=0.0),
        total_cost=t,
    )


def _costs(dag: Dag, model: CostModel) -> dict[Node, float]:
    """Every node's cost (`msched.analysis.cost.checked_cost`); graph inputs and ``output`` cost
    nothing."""
    cost: dict[Node, float] = {}
    out, cost_of = dag.output, model.cost
    for node in dag.nodes:
        if node.op in _INPUT_OPS or node is out:
            cost[node] = 0.0
        else:
            cost[node] = checked_cost(model, node, cost_of(node))
    return cost


def _list_schedule(
    dag: Dag,
    num_streams: int,
    cost: dict[Node, float],
    level: dict[Node, float],
    stream: dict[Node, int],
    start: dict[Node, float],
    finish: dict[Node, float],
) -> list[Node]:
    index, preds, succs, out = dag.index, dag.preds, dag.succs, dag.output
    waiting = dict(dag.computed_dependency_counts)
    ready = [
        (-level[n], index[n], n) for n in dag.nodes if n.op not in _INPUT_OPS and not waiting[n]
    ]
    heapq.heapify(ready)
    heappop, heappush = heapq.heappop, heapq.heappush
    lanes = [_Lane() for _ in range(num_streams)]
    picked: list[Node] = []
    while ready:
        node = heappop(ready)[2]
        if node is out:
            continue
        c = cost[node]
        s, t = _place(node, preds[node], c, lanes, stream, finish)
        stream[node], start[node], finish[node] = s, t, t + c
        if c:
            lanes[s].occupy(t, t + c)
        picked.append(node)
        for succ in succs[node]:
            left = waiting[succ] - 1
            waiting[succ] = left
            if not left:
                heappush(ready, (-level[succ], index[succ], succ))
    return picked


def _place(
    node: Node,
    deps: dict[Node, int],
    cost: float,
    lanes: list[_Lane],
    stream: dict[Node, int],
    finish: dict[Node, float],
) -> tuple[int, float]:
    est, affinity, from_input = 0.0, 0, True
    for dep in deps:  # ties go to the first computed dependency (usually the main chain)
        f = finish[dep]
        if f > est or (f == est and from_input and dep.op not in _INPUT_OPS):
            est, affinity, from_input = f, stream[dep], dep.op in _INPUT_OPS
    if cost == 0.0:
        return affinity, est
    ends = lanes[affinity].ends
    if not ends or ends[-1] <= est or lanes[affinity].earliest(est, cost) == est:
        return affinity, est
    best_stream, best_start = affinity, lanes[affinity].earliest(est, cost)
    for s, lane in enumerate(lanes):
        t = lane.earliest(est, cost)
        if t < best_start:
            best_stream, best_start = s, t
            if t == est:
                break
    return best_stream, best_start

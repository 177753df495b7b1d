"""A lower bound on the makespan of any schedule of a Dag on a number of streams.

Why: ``max(critical path, total / streams)`` is as low as 0.8 of the optimum on graphs whose
work is parallel in places and serial in others (MoE layers, attention blocks), so a schedule
at the optimum looked 20% off.  The bound here adds what every single node forces: before it
starts, all of its ancestors have run; after it ends, all of its descendants must run.

For a node ``v`` with cost ``c(v)``, on ``k`` streams:

- ``head(v)``: the longest cost path ending right before ``v``; ``tail(v)``: the longest
  cost path starting right after it;
- ``before(v)``: the total cost of ``v``'s ancestors; ``after(v)``: of its descendants.

``v`` cannot start before ``max(head(v), before(v) / k)`` (its ancestors need that much time
on ``k`` streams) and the schedule cannot end before ``max(tail(v), after(v) / k)`` after ``v``
ends, so every schedule's makespan is at least::

    max(critical path, total / k,
        max over v of  max(head(v), before(v) / k) + c(v) + max(tail(v), after(v) / k))

Ancestor and descendant sets are computed with one bit per node, for Dags of up to
`EXACT_LIMIT` nodes; larger Dags get ``max(critical path, total / k)`` only (the sets would
cost more time than scheduling).  Their sums are exact when the costs take at most `LEVELS`
values (the table model's do); otherwise each cost is rounded down to one of `LEVELS` levels
first, which keeps the sums at or below the true ones.  The bound never exceeds the optimum:
each term is a time some part of the work needs in every schedule.

With communication (`msched.analysis.communication`) the costs are what each node holds its
stream for (an asynchronous collective's issue holds it for nothing), so the totals count
compute only; the paths count a collective's communication time between it and its waits (a
latency, not work); and each process group adds a term of its own: its waited communications
run one after another, after the first of them is issued and before a wait of the last ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch.fx import Node

from msched.analysis.communication import Communication
from msched.analysis.cost import CostModel, checked_cost
from msched.analysis.dag import Dag
from msched.analysis.nodes import INPUT_OPS

#: The largest Dag whose per-node bound is computed (see the module docstring).
EXACT_LIMIT = 2048
#: How many cost levels the ancestor and descendant sums use (see `_levels_below`).
LEVELS = 16


def makespan_lower_bound(
    nodes: Sequence[Node],
    preds: dict[Node, dict[Node, int]],
    cost: dict[Node, float],
    num_streams: int,
    reached: float = math.inf,
    critical: float | None = None,
    comm: Communication | None = None,
) -> float:
    """The lower bound of the module docstring for ``nodes`` (a topological order) whose
    dependencies are ``preds`` and whose costs are ``cost``, on ``num_streams`` streams.

    ``reached`` is the makespan of a schedule of these nodes, if one is known: when the
    critical path or total / streams already reaches it, that is the bound (the per-node
    term lies between it and the schedule's makespan) and the per-node term is skipped.
    ``critical`` is the critical path when the caller has it (the longest bottom level):
    then the longest paths through each node are computed only for the per-node term.
    ``comm`` is the graph's communication, whose times the paths count (``cost`` then holds
    what each node holds its stream for: see the module docstring).
    """
    total = sum(cost[n] for n in nodes)
    paths = None
    if critical is None or comm is not None:
        paths = _paths(nodes, preds, cost, comm)
        head, tail = paths
        if critical is None:
            critical = max((head[n] + cost[n] + tail[n] for n in nodes), default=0.0)
    bound = max(critical, total / num_streams)
    if comm is not None and paths is not None:
        bound = max(bound, _channel_bound(comm, cost, *paths))
    # On one stream without communication the per-node term is at most the total; with it,
    # a path counts communication the total does not, and skipping the term on one stream
    # made the bound lower on 1 stream than on 2 (277 against 283.5 on a TP stack).
    one = num_streams == 1 and comm is None
    if one or len(nodes) > EXACT_LIMIT or bound >= reached:
        return bound
    head, tail = paths or _paths(nodes, preds, cost, comm)
    before, after = _work_around(nodes, preds, cost)
    k = float(num_streams)
    for n in nodes:
        here = max(head[n], before[n] / k) + cost[n] + max(tail[n], after[n] / k)
        if here > bound:
            bound = here
    return bound


def _paths(
    nodes: Sequence[Node],
    preds: dict[Node, dict[Node, int]],
    cost: dict[Node, float],
    comm: Communication | None = None,
) -> tuple[dict[Node, float], dict[Node, float]]:
    """``head`` and ``tail`` of every node (longest paths before and after it; from a
    collective to its waits, its communication time too)."""
    head: dict[Node, float] = {}
    tail = dict.fromkeys(nodes, 0.0)
    lag = comm.lag if comm is not None else _no_lag
    for n in nodes:
        head[n] = max((head[p] + cost[p] for p in preds[n]), default=0.0)
        waits = lag(n)
        if waits is not None and waits[0] in head:
            issued, time = waits
            head[n] = max(head[n], head[issued] + cost[issued] + time)
    for n in reversed(nodes):
        after = tail[n] + cost[n]
        for p in preds[n]:
            if after > tail[p]:
                tail[p] = after
        waits = lag(n)
        if waits is not None and waits[0] in tail:
            issued, time = waits
            tail[issued] = max(tail[issued], after + time)
    return head, tail


def _no_lag(node: Node) -> None:
    return None


def _channel_bound(
    comm: Communication, cost: dict[Node, float], head: dict[Node, float], tail: dict[Node, float]
) -> float:
    """Per process group, the earliest issue of a waited collective, plus their communication
    times (one channel runs them one at a time), plus the shortest rest after a wait of
    one of them; the largest over the groups."""
    after: dict[Node, float] = {}
    for wait, issued in comm.waits.items():
        if wait in tail and issued in head:
            rest = cost[wait] + tail[wait]
            after[issued] = min(after.get(issued, rest), rest)
    groups: dict[object, list[Node]] = {}
    for issued in after:
        groups.setdefault(comm.channel[issued], []).append(issued)
    bound = 0.0
    for members in groups.values():
        first = min(head[c] + cost[c] for c in members)
        last = min(after[c] for c in members)
        bound = max(bound, first + sum(comm.time[c] for c in members) + last)
    return bound


def _work_around(
    nodes: Sequence[Node], preds: dict[Node, dict[Node, int]], cost: dict[Node, float]
) -> tuple[dict[Node, float], dict[Node, float]]:
    """Total cost of the ancestors and of the descendants of every node.

    Sets of nodes are ints with one bit per node; a sum is taken per cost level as that
    level times the number of set bits under the mask of the nodes at that level
    (`_levels_below`: a sum of levels is at most the sum of costs, so the bound stays one).
    """
    index = {n: i for i, n in enumerate(nodes)}
    up: dict[Node, int] = {}
    for n in nodes:
        bits = 0
        for p in preds[n]:
            bits |= up[p] | (1 << index[p])
        up[n] = bits
    down = dict.fromkeys(nodes, 0)
    for n in reversed(nodes):
        bits = down[n] | (1 << index[n])
        for p in preds[n]:
            down[p] |= bits
    masks: dict[float, int] = {}
    level = _levels_below(cost)
    for n in nodes:
        if cost[n]:
            c = level[cost[n]]
            masks[c] = masks.get(c, 0) | (1 << index[n])
    groups = sorted(masks.items())

    def work(bits: int) -> float:
        return sum(c * (bits & mask).bit_count() for c, mask in groups)

    return {n: work(up[n]) for n in nodes}, {n: work(down[n]) for n in nodes}


def _levels_below(cost: dict[Node, float]) -> dict[float, float]:
    """Every positive cost value mapped to one of at most `LEVELS` levels at or below it: the
    values themselves when there are few (the table model has four), else evenly spaced
    quantiles of them, each value rounded down to the nearest."""
    values = sorted({c for c in cost.values() if c > 0.0})
    if len(values) <= LEVELS:
        return {c: c for c in values}
    step = (len(values) - 1) / (LEVELS - 1)
    levels = [values[round(i * step)] for i in range(LEVELS)]
    out: dict[float, float] = {}
    j = 0
    for c in values:
        while j + 1 < LEVELS and levels[j + 1] <= c:
            j += 1
        out[c] = levels[j]
    return out


def node_costs(dag: Dag, model: CostModel) -> dict[Node, float]:
    """Every node's cost (`msched.analysis.cost.checked_cost`); graph inputs and ``output`` cost
    nothing."""
    cost: dict[Node, float] = {}
    out, cost_of = dag.output, model.cost
    for node in dag.nodes:
        if node.op in INPUT_OPS or node is out:
            cost[node] = 0.0
        else:
            cost[node] = checked_cost(model, node, cost_of(node))
    return cost

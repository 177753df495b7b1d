"""The priorities of list scheduling: the longest cost path from each node to the exit
(`bottom_levels`; `issue_levels` with the collectives' issue order and channels too) and from
the start to each node's end (`top_levels`).

`msched.scheduling.assign` pops ready nodes by bottom level (later passes, in a graph with
collectives by issue level, and by reversed top level).
"""

from __future__ import annotations

from torch.fx import Node

from msched.analysis.communication import Communication
from msched.analysis.dag import Dag


def bottom_levels(
    dag: Dag, cost: dict[Node, float], comm: Communication | None = None
) -> dict[Node, float]:
    """Longest cost path from each node to the exit, the node itself included (from a
    collective to its waits, its communication time too: ``comm``)."""
    if comm is not None:
        return _lagged_bottom_levels(dag, cost, comm)
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


def _lagged_bottom_levels(
    dag: Dag, cost: dict[Node, float], comm: Communication
) -> dict[Node, float]:
    level: dict[Node, float] = {}
    for node in reversed(dag.nodes):
        level[node] = cost[node] + _below(dag, node, level, comm)
    return level


def _below(dag: Dag, node: Node, level: dict[Node, float], comm: Communication) -> float:
    """The longest level among ``node``'s successors, a wait's with the communication it
    waits for when that is ``node``'s."""
    below = 0.0
    lag = comm.waits
    for succ in dag.succs[node]:
        here = level[succ] + (comm.time[node] if lag.get(succ) is node else 0.0)
        below = max(below, here)
    return below


def issue_levels(dag: Dag, cost: dict[Node, float], comm: Communication) -> dict[Node, float]:
    """`bottom_levels` (with ``comm``'s communication times) that also follow the order
    collectives are issued in and their channels.

    Why: collectives are issued in the original order, and a group's channel runs one
    communication at a time in that order, so the work that issues a collective holds back
    every later collective of its group and their waits.  By bottom levels alone, the compute
    that leads to an early collective (a micro-batch's MLP before its all-reduce) can lose to
    longer independent compute (the other micro-batch's attention): the collective is then
    issued late, and the channel, not the stream, makes the makespan.  So a collective's
    level is also at least the next collective's (issued no earlier) and, when asynchronous,
    its communication time plus the level of the next communication of its group from that
    one's start (both start no earlier than this communication ends).
    """
    waits: dict[Node, list[Node]] = {}
    for wait, issued in comm.waits.items():
        waits.setdefault(issued, []).append(wait)
    collectives = set(comm.collectives)
    level: dict[Node, float] = {}
    chain: dict[Node, float] = {}  # from the start of its communication to the exit
    later: dict[object, Node] = {}  # group -> its next collective
    following: Node | None = None  # the next collective issued
    for node in reversed(dag.nodes):
        below = _below(dag, node, level, comm)
        if node in collectives:
            if following is not None:
                below = max(below, level[following])
            following = node
            if node in comm.time:
                after = max((level[w] for w in waits.get(node, ())), default=0.0)
                group = comm.channel[node]
                if group in later:
                    after = max(after, chain[later[group]])
                chain[node] = comm.time[node] + after
                later[group] = node
                below = max(below, chain[node])
        level[node] = cost[node] + below
    return level


def top_levels(dag: Dag, cost: dict[Node, float]) -> dict[Node, float]:
    """Longest cost path from the graph's start to the end of each node, the node included."""
    level: dict[Node, float] = {}
    get = level.__getitem__
    for node in dag.nodes:
        above = dag.preds[node]
        level[node] = cost[node] + max(map(get, above), default=0.0)
    return level


__all__ = ["bottom_levels", "issue_levels", "top_levels"]

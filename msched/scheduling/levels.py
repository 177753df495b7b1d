"""The priorities of list scheduling: the longest cost path from each node to the exit
(`bottom_levels`) and from the start to each node's end (`top_levels`).

`msched.scheduling.assign` pops ready nodes by bottom level (a later pass by reversed top
level).
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
    lag = comm.waits
    for node in reversed(dag.nodes):
        below = 0.0
        for succ in dag.succs[node]:
            here = level[succ] + (comm.time[node] if lag.get(succ) is node else 0.0)
            below = max(below, here)
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


__all__ = ["bottom_levels", "top_levels"]

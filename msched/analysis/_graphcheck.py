"""Refusing cyclic graphs before any pass walks them.

Why: every pass of msched follows the inputs of nodes (topological sorts, bottom levels,
happens-before), and on a graph where a node uses its own value, directly or through others
(``cos.args = (matmul,)`` after ``matmul`` used ``cos``), such a walk never ends or fails
far from the cause.  torch.fx itself accepts such edits; `check_acyclic` turns them into one
`msched.InvalidGraphError` naming the cycle, before anything else runs.

A node used before its definition is not a cycle: a broken schedule may issue a node before
its input, and `msched.verify` must report that as a race, so only real cycles are refused.
Inputs that are nodes of another graph are left to the callers (they report them by name).

Cost: one pass over the nodes when every node comes after its inputs (the normal case);
otherwise a depth-first search, O(nodes + edges) either way.
"""

from __future__ import annotations

from collections.abc import Iterator

from torch.fx import Graph, Node

from msched._torch_internals import node_inputs
from msched.errors import InvalidGraphError


def check_acyclic(graph: Graph, what: str = "the graph") -> None:
    """Raise `InvalidGraphError` naming a cycle of ``graph`` if it has one.

    ``what`` names the graph in the message (``"the original graph"``, ...).
    """
    if _inputs_come_first(graph):
        return
    cycle = find_cycle(graph)
    if cycle is not None:
        path = " -> ".join(n.name for n in [*cycle, cycle[0]])
        raise InvalidGraphError(
            f"{what} has a cycle: {path} (each node's value is used by the next), so no "
            "order can run it; change the arguments of one of these nodes so that none "
            "depends on its own value",
            nodes=tuple(n.name for n in cycle),
        )


def _inputs_come_first(graph: Graph) -> bool:
    """Whether every node comes after each of its inputs that is a node of ``graph``."""
    seen: set[Node] = set()
    for node in graph.nodes:
        for arg in node_inputs(node):  # torch.fx's dict of the node's inputs
            if arg not in seen and arg.graph is graph:
                return False
        seen.add(node)
    return True


def find_cycle(graph: Graph) -> list[Node] | None:
    """A cycle of ``graph`` in data-flow order (each node's value is used by the next),
    starting at its first node in graph order; ``None`` when the graph is acyclic."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    done: set[Node] = set()
    for start in graph.nodes:
        if start not in done:
            uses = _cycle_from(start, position, done)
            if uses is not None:
                flow = uses[::-1]
                first = min(range(len(flow)), key=lambda i: position[flow[i]])
                return flow[first:] + flow[:first]
    return None


def _cycle_from(start: Node, position: dict[Node, int], done: set[Node]) -> list[Node] | None:
    """Depth-first search along inputs from ``start``; a cycle in use order if one is met.

    ``done`` holds the nodes whose inputs are fully explored (no cycle through them).
    """
    path: list[Node] = [start]
    on_path: dict[Node, int] = {start: 0}
    pending: list[Iterator[Node]] = [iter(node_inputs(start))]
    while pending:
        for arg in pending[-1]:
            if arg in done or arg not in position:
                continue
            if arg in on_path:
                return path[on_path[arg] :]
            on_path[arg] = len(path)
            path.append(arg)
            pending.append(iter(node_inputs(arg)))
            break
        else:
            pending.pop()
            node = path.pop()
            del on_path[node]
            done.add(node)
    return None

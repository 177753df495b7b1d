"""How communication takes time: what the scheduler, the simulator and the bound share.

Why: an asynchronous collective (`msched.analysis.collectives`) is not compute on the stream
that issues it.  Its issue is free for that stream; its communication runs from the issue on
a channel of its own, one per process group, where NCCL runs one group's work in issue
order; the ``wait_tensor`` of its result makes the waiting stream wait until it is done.
The cost model's cost of the collective is how long the communication runs.  A synchronous
collective (`msched.register_collective`) is a kernel on its stream like any other node.

Every one of them keeps one model, so ``msched.simulate(gm).makespan == sched.makespan``:

1. ``occupancy``: the time a node holds its stream -- its cost, 0 for an asynchronous
   collective;
2. a collective's communication starts at ``max(issue, end of the group's previous
   communication)`` and runs its cost (`Channels.issue`);
3. a wait starts no earlier than the end of the communication it waits for.

A collective that nothing waits for does not delay the makespan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from torch.fx import Node

from msched.analysis.collectives import Collective, collective_of, is_wait, waited

__all__ = ["Channels", "Communication", "split_communication"]


@dataclass(frozen=True)
class Communication:
    """The communication of one graph.

    ``time`` maps each asynchronous collective to how long its communication runs and
    ``channel`` to its process group; ``waits`` maps each ``wait_tensor`` to the
    asynchronous collective it waits for; ``collectives`` lists every collective,
    synchronous ones included, in graph order (the order every rank issues them in).
    """

    time: Mapping[Node, float]
    channel: Mapping[Node, Any]
    waits: Mapping[Node, Node]
    collectives: tuple[Node, ...]

    def lag(self, node: Node) -> tuple[Node, float] | None:
        """``(collective, its communication time)`` when ``node`` waits for one."""
        issued = self.waits.get(node)
        return None if issued is None else (issued, self.time[issued])


def split_communication(
    nodes: Iterable[Node], cost: dict[Node, float]
) -> tuple[dict[Node, float], Communication | None]:
    """The time each of ``nodes`` (in graph order) holds its stream under the costs
    ``cost``, and their `Communication`; ``(cost, None)`` (the same dict) when no node is a
    collective."""
    nodes = tuple(nodes)
    found = _collectives(nodes)
    if not found:
        return cost, None
    occupancy = dict(cost)
    time: dict[Node, float] = {}
    channel: dict[Node, Any] = {}
    for c in found:
        if c.asynchronous:
            time[c.node] = cost[c.node]
            channel[c.node] = c.group
            occupancy[c.node] = 0.0
    waits = {}
    for node in nodes:  # a wait of its result, an element of it, or an in-place one's input
        issued = waited(node) if is_wait(node) else None
        if issued is not None and issued in time:
            waits[node] = issued
    return occupancy, Communication(time, channel, waits, tuple(c.node for c in found))


def _collectives(nodes: tuple[Node, ...]) -> list[Collective]:
    """The collectives among ``nodes``; each target is looked at once (whether a call is a
    collective depends on its target only, and most targets are not)."""
    seen: dict[Any, bool] = {}
    found = []
    for node in nodes:
        if node.op != "call_function":
            continue
        target = node.target
        try:
            maybe = seen.get(target)
        except TypeError:  # an unhashable callable
            maybe = None
        if maybe is False:
            continue
        c = collective_of(node)
        if maybe is None:
            try:
                seen[target] = c is not None
            except TypeError:
                pass
        if c is not None:
            found.append(c)
    return found


class Channels:
    """The communication channels while a schedule is built or replayed in issue order.

    `issue` starts a collective's communication; `done` says when it ends; `spans` holds
    ``(start, end)`` of every communication started.
    """

    __slots__ = ("comm", "free", "spans")

    def __init__(self, comm: Communication) -> None:
        self.comm = comm
        self.free: dict[Any, float] = {}
        self.spans: dict[Node, tuple[float, float]] = {}

    def issue(self, node: Node, at: float) -> None:
        """``node`` (an asynchronous collective) is issued at ``at``."""
        group = self.comm.channel[node]
        start = max(at, self.free.get(group, 0.0))
        end = start + self.comm.time[node]
        self.free[group] = end
        self.spans[node] = (start, end)

    def release(self, node: Node) -> float:
        """The earliest start of ``node``: the end of the communication it waits for (0 for
        any other node, or for a collective not issued)."""
        issued = self.comm.waits.get(node)
        if issued is None:
            return 0.0
        span = self.spans.get(issued)
        return 0.0 if span is None else span[1]

"""The exact mode's timetable as an `msched.scheduling.assign.Assignment`.

Why apart from `msched.scheduling.assign`: the list scheduler decides when nodes start; here
the CP-SAT solver has decided (`msched.scheduling.exact`), and its start times are replayed
on streams with the list scheduler's placement rules and communication model.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch.fx import Node

from msched.analysis.bounds import makespan_lower_bound, node_costs
from msched.analysis.communication import Channels, Communication, split_communication
from msched.analysis.cost import CostModel
from msched.analysis.dag import Dag
from msched.analysis.nodes import INPUT_OPS
from msched.scheduling.assign import (
    INPUT,
    TIMETABLE,
    Assignment,
    Placement,
    _assignment,
    _place,
    _place_output,
    _Placed,
)
from msched.scheduling.levels import bottom_levels

__all__ = ["timetable_assignment"]


def timetable_assignment(
    dag: Dag, num_streams: int, cost_model: CostModel, times: Mapping[Node, float]
) -> Assignment:
    """The assignment that runs the compute nodes in the order of the start ``times`` of a
    timetable with at most ``num_streams`` nodes running at once (the exact mode's).

    Nodes are taken by ``(time, costs something, index in the input graph)``; each starts
    when its dependencies and its stream allow, no later than its time (so the makespan is at
    most the timetable's): a zero-cost node on its producer's stream, any other on its
    producer's stream when that is free then, else on the stream that frees up first.  Every
    compute node's `Placement` has the rule `TIMETABLE` (or `ZERO_COST`).  With
    communication (`msched.analysis.communication`), a collective is issued no earlier than
    the one before it (the original order), a wait starts no earlier than the communication
    it waits for ends and holds its stream until then, as in `assign_streams`.
    """
    cost, comm = split_communication(dag.nodes, node_costs(dag, cost_model))
    level = bottom_levels(dag, cost, comm)
    placed = _Placed({}, {}, {}, {}, [], {})
    issue = _TimetableIssue(comm, placed) if comm is not None else None
    for node in dag.nodes:
        if node.op in INPUT_OPS:
            placed.stream[node], placed.start[node], placed.finish[node] = 0, 0.0, 0.0
            placed.reasons[node] = Placement(INPUT, priority=level[node])
    index = dag.index
    compute = [n for n in dag.nodes if n.op not in INPUT_OPS and n is not dag.output]
    compute.sort(key=lambda n: (times[n], cost[n] > 0.0, index[n]))
    ends = [0.0] * num_streams
    for node in compute:
        release = issue.release(node) if issue is not None else 0.0
        _append(dag, node, cost[node], level[node], ends, placed, release)
        if issue is not None:
            issue.record(node, ends)
    _place_output(dag, level, placed)
    bound = makespan_lower_bound(
        dag.nodes, dag.preds, cost, num_streams, placed.makespan, comm=comm
    )
    collectives = comm.collectives if comm is not None else ()
    return _assignment(dag, num_streams, cost, level, placed, bound, collectives)


class _TimetableIssue:
    """`timetable_assignment`'s collectives (in the original order, each on its channel) and
    waits (after the communication they wait for)."""

    __slots__ = ("channels", "comm", "last", "listed", "placed")

    def __init__(self, comm: Communication, placed: _Placed) -> None:
        self.comm, self.placed, self.channels = comm, placed, Channels(comm)
        self.listed, self.last = set(comm.collectives), 0.0  # last: the last issue's start

    def release(self, node: Node) -> float:
        """The earliest start of ``node`` besides its dependencies."""
        if node in self.comm.waits:
            return self.channels.release(node)
        return self.last if node in self.listed else 0.0

    def record(self, node: Node, ends: list[float]) -> None:
        at, stream = self.placed.start[node], self.placed.stream[node]
        if node in self.comm.waits:
            ends[stream] = max(ends[stream], at)  # its stream waits until the data is there
        elif node in self.listed:
            self.last = at
            if node in self.comm.time:
                self.channels.issue(node, at)
                self.placed.communication[node] = self.channels.spans[node]


def _append(
    dag: Dag,
    node: Node,
    c: float,
    priority: float,
    ends: list[float],
    placed: _Placed,
    release: float = 0.0,
) -> None:
    """Place ``node`` at the end of a stream, no earlier than ``release``."""
    affinity, est, rule, producer, _, tied = _place(
        dag.preds[node], 0.0, [], placed.stream, placed.finish
    )
    est = max(est, release)
    s = affinity
    if c > 0.0:
        rule = TIMETABLE
        if ends[affinity] > est:
            s = min(range(len(ends)), key=ends.__getitem__)
        est = max(est, ends[s])
        ends[s] = est + c
    ready = placed.finish[producer] if producer is not None else 0.0
    placed.reasons[node] = Placement(rule, producer, ready, priority, tied)
    placed.stream[node], placed.start[node], placed.finish[node] = s, est, est + c
    placed.picked.append(node)

"""Stream assignment: critical-path list scheduling with insertion and stream affinity.

Why insertion: a capture or other side effect whose only successor is the exit has the lowest
priority in the graph, so plain list scheduling pops it last and appends it to the end of a
stream, keeping its input alive for the whole graph.  Placing each node in the earliest idle
gap of a stream that fits it (as HEFT does) puts it right after its producer instead, without
delaying anything placed before it.

Every decision is recorded as a `Placement` in ``Assignment.reasons``, so whoever explains a
schedule (``msched explain``) reads the rule that fired instead of guessing it again.
"""

from __future__ import annotations

import heapq
import operator
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import compress, repeat
from typing import NamedTuple

from torch.fx import Node

from msched.analysis.bounds import makespan_lower_bound, node_costs
from msched.analysis.communication import Channels, Communication, split_communication
from msched.analysis.cost import CostModel
from msched.analysis.dag import Dag
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError
from msched.scheduling.levels import bottom_levels, issue_levels, top_levels

# The rules of `Placement.rule`, in the order `assign_streams` tries them (see step 3 there).
INPUT = "input"  # a graph input or weight: ready at 0 on stream 0
OUTPUT = "output"  # ``output``: on stream 0 once every dependency has finished
IN_ORDER = "in-order"  # one stream: the input order is kept (`serial_assignment`)
ZERO_COST = "zero-cost"  # costs nothing: follows its producer, on its stream, at its finish
AFFINITY = "affinity"  # the producer's stream is idle at ``ready``: stay there (fewer events)
FIRST_FREE = "first-free"  # the producer's stream is busy then: the lowest stream idle then
EARLIEST_GAP = "earliest-gap"  # no stream is idle then: the stream whose idle gap opens first
TIMETABLE = "timetable"  # the exact mode's solver chose when it starts (`timetable_assignment`)
RULES = (INPUT, OUTPUT, IN_ORDER, ZERO_COST, AFFINITY, FIRST_FREE, EARLIEST_GAP, TIMETABLE)


class Placement(NamedTuple):
    """Why a node got its stream and start: the rule of `assign_streams` that placed it.

    ``rule`` is one of `RULES`.  ``producer`` is the dependency that finishes last, whose
    stream is the node's affinity (None without dependencies); among dependencies finishing
    together the first computed one in input order wins, and ``tied`` says whether there was
    such a tie.  ``ready`` is the earliest start (the producer's finish).  ``priority`` is the
    key of the pass that made the schedule: ready nodes were placed by highest priority first,
    ties by index in the input graph.  It is the node's critical path to the exit (its bottom
    level) in the first pass, its issue level in the issue-level pass, and its finish in a
    list schedule of the reversed Dag in the others (`PASSES`).  ``inserted`` says whether
    the node went into an idle gap before work already placed on its stream (HEFT-style
    insertion).
    """

    rule: str
    producer: Node | None = None
    ready: float = 0.0
    priority: float = 0.0
    tied: bool = False
    inserted: bool = False


# ``Placement(...)`` runs NamedTuple's Python-level __new__; the list schedule makes one per node
# and tuple.__new__ builds the same object for less.
_new_placement = tuple.__new__


@dataclass(frozen=True)
class Assignment:
    """Where and when every node runs under the cost model, and why.

    ``order`` lists the compute nodes (not placeholders, ``get_attr`` or ``output``) sorted
    by `emission_order`, a topological order of the `Dag` in which every stream's nodes run
    back to back as assigned.  ``reasons`` holds the `Placement` of every node of the Dag.
    With collectives (`msched.analysis.communication`), an asynchronous collective starts
    and finishes at its issue, ``communication`` holds when its communication runs, and
    ``total_cost`` counts what holds a stream (not the communication).
    """

    num_streams: int
    stream: dict[Node, int]
    start: dict[Node, float]
    finish: dict[Node, float]
    order: tuple[Node, ...]
    makespan: float
    critical_path: float
    total_cost: float
    reasons: Mapping[Node, Placement]
    lower_bound: float  # no schedule of the Dag beats it (`msched.analysis.bounds`)
    #: asynchronous collective -> (start, end) of its communication
    communication: Mapping[Node, tuple[float, float]] = field(default_factory=dict)
    #: every collective, in the order they are issued (the original's)
    collectives: tuple[Node, ...] = ()


class _Lane:
    """The busy blocks of one stream: maximal intervals, kept merged and sorted.

    ``gaps[i]`` is the idle time between block ``i - 1`` and block ``i`` (``gaps[0]`` is
    unused): `earliest` looks for the first gap that fits with C-level iteration over it, so
    that a node ready long before a stream's end skips the small gaps left there cheaply.
    """

    __slots__ = ("starts", "ends", "gaps")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.gaps: list[float] = []

    def earliest(self, est: float, cost: float) -> float:
        """Earliest start >= ``est`` of an idle gap at least ``cost`` (>= 0) long; for 0,
        ``est`` or the end of the block running at ``est``."""
        starts, ends = self.starts, self.ends
        i = bisect_right(ends, est)
        n = len(starts)
        if i == n or starts[i] - est >= cost:
            return est
        # The first gap after block i that is at least ``cost`` long starts at the end of
        # the block before it; none: the stream's end.
        fits = map(operator.ge, self.gaps[i + 1 :], repeat(cost))
        return ends[next(compress(range(i, n), fits), n - 1)]

    def mark(self, at: float) -> None:
        """Keep ``at`` out of every later block: a zero-length block there, unless a block
        already starts or ends at ``at``.  A wait that is not issued at the end of a block
        needs it, or a node inserted later could run across it (and so before it)."""
        starts, ends, gaps = self.starts, self.ends, self.gaps
        i = bisect_right(starts, at)
        if (i and ends[i - 1] >= at) or (i < len(starts) and starts[i] == at):
            return
        starts.insert(i, at)
        ends.insert(i, at)
        gaps.insert(i, at - ends[i - 1] if i else 0.0)
        if i + 1 < len(starts):
            gaps[i + 1] = starts[i + 1] - at

    def occupy(self, start: float, end: float) -> None:
        if end <= start:
            return
        starts, ends, gaps = self.starts, self.ends, self.gaps
        i = bisect_right(starts, start)
        merge_left = i > 0 and ends[i - 1] == start
        merge_right = i < len(starts) and starts[i] == end
        if merge_left and merge_right:
            ends[i - 1] = ends[i]
            del starts[i], ends[i], gaps[i]
        elif merge_left:
            ends[i - 1] = end
            if i < len(starts):
                gaps[i] = starts[i] - end
        elif merge_right:
            starts[i] = start
            gaps[i] = start - ends[i - 1] if i else 0.0
        else:
            starts.insert(i, start)
            ends.insert(i, end)
            gaps.insert(i, start - ends[i - 1] if i else 0.0)
            if i + 1 < len(starts):
                gaps[i + 1] = starts[i + 1] - end


def _latency_costs(cost: dict[Node, float], comm: Communication | None) -> dict[Node, float]:
    """Costs with each asynchronous collective's communication time as its cost: the
    priorities of the later passes see communication as a latency."""
    return cost if comm is None else {**cost, **comm.time}


#: The pass of `assign_streams` by issue level (`msched.scheduling.levels.issue_levels`).
ISSUE_LEVEL = "issue level"
#: The priorities of the passes of `assign_streams` after the first, in the order tried.
PASSES = (ISSUE_LEVEL, "reversed top level", "reversed first-pass finish")


def assign_streams(
    dag: Dag,
    num_streams: int,
    cost_model: CostModel,
    passes: tuple[str, ...] = PASSES,
    pinned: frozenset[Node] = frozenset(),
) -> Assignment:
    """Assign every node of ``dag`` to one of ``num_streams`` streams.

    1. Cost every node; priority = bottom level (longest path to the exit).
    2. Pop ready nodes by ``(-priority, index in the input graph)`` from a heap.
    3. Earliest start = latest finish of the node's dependencies.  Zero-cost nodes follow
       the dependency that finishes last (their producer).  Other nodes take the stream of
       that dependency when it has an idle gap at the earliest start, else the lowest stream
       with one, else the stream whose gap opens first.
    4. Graph inputs are ready at time 0 on stream 0; ``output`` runs on stream 0 last.
    5. Until a schedule meets the lower bound, run steps 2-4 again with the priorities of
       ``passes`` (`PASSES`: in a graph with collectives, their issue level, a bottom level
       whose paths also run through the issue order and each group's channel
       (`msched.scheduling.levels.issue_levels`), so the work that issues an early
       collective is not put off behind independent compute; the finish times of a list
       schedule of the reversed Dag, popped by top level or by the first schedule's finish
       times) and keep the shortest schedule (the earlier pass on a tie).  Every pass places
       nodes by the rules of step 3, so captures still go into the first gap after their
       producer.  ``passes=()`` runs the first pass only (benchmarks compare them).

    The rule that placed each node is its `Placement` in ``reasons``.  The nodes of
    ``pinned`` that cost something run on stream 0 only (a memory budget keeps the large
    allocations in stream 0's pool: `msched.scheduling.budget`).
    """
    unknown = [p for p in passes if p not in PASSES]
    if unknown:
        raise InvalidArgumentError(
            f"unknown pass {unknown[0]!r}; passes are {', '.join(map(repr, PASSES))}"
        )
    cost, comm = split_communication(dag.nodes, node_costs(dag, cost_model))
    level = bottom_levels(dag, cost, comm)
    best = _forward_pass(dag, num_streams, cost, level, comm, pinned)
    critical = max(level.values(), default=0.0)
    bound = makespan_lower_bound(
        dag.nodes, dag.preds, cost, num_streams, best.makespan, critical=critical, comm=comm
    )
    first = best.finish
    latency = _latency_costs(cost, comm)
    for name in passes:
        if best.makespan <= bound:
            break
        if name == ISSUE_LEVEL:
            if comm is None:  # the same levels as the first pass
                continue
            priority = issue_levels(dag, cost, comm)
        else:
            priority = top_levels(dag, latency) if name == PASSES[1] else first
            priority = _reversed_finish(dag, num_streams, latency, priority)
        candidate = _forward_pass(dag, num_streams, cost, priority, comm, pinned)
        if candidate.makespan < best.makespan:
            best = candidate
    collectives = comm.collectives if comm is not None else ()
    return _assignment(dag, num_streams, cost, level, best, bound, collectives)


def _forward_pass(
    dag: Dag,
    num_streams: int,
    cost: dict[Node, float],
    priority: dict[Node, float],
    comm: Communication | None = None,
    pinned: frozenset[Node] = frozenset(),
) -> _Placed:
    placed = _Placed({}, {}, {}, {}, [], {})
    stream, start, finish, reasons = placed.stream, placed.start, placed.finish, placed.reasons
    for node in dag.nodes:
        if node.op in INPUT_OPS:
            stream[node], start[node], finish[node] = 0, 0.0, 0.0
            reasons[node] = Placement(INPUT, priority=priority[node])
    _list_schedule(dag, num_streams, cost, priority, placed, comm, pinned)
    _place_output(dag, priority, placed)
    return placed


def _place_output(dag: Dag, priority: dict[Node, float], placed: _Placed) -> None:
    """``output`` on stream 0 when its last dependency finishes (`OUTPUT`)."""
    out, stream, start, finish = dag.output, placed.stream, placed.start, placed.finish
    # Placed as a zero-cost node would be (which reads no lane), then moved to stream 0.
    _, ready, _, producer, _, tied = _place(dag.preds[out], 0.0, [], stream, finish)
    stream[out], start[out], finish[out] = 0, ready, ready
    placed.reasons[out] = Placement(OUTPUT, producer, ready, priority[out], tied)


def _assignment(
    dag: Dag,
    num_streams: int,
    cost: dict[Node, float],
    level: dict[Node, float],
    placed: _Placed,
    bound: float,
    collectives: tuple[Node, ...] = (),
) -> Assignment:
    return Assignment(
        num_streams=num_streams,
        stream=placed.stream,
        start=placed.start,
        finish=placed.finish,
        order=emission_order(placed.picked, placed.start, placed.finish),
        makespan=placed.makespan,
        critical_path=max(level.values(), default=0.0),
        total_cost=sum(cost.values()),
        reasons=placed.reasons,
        lower_bound=bound,
        communication=placed.communication,
        collectives=collectives,
    )


def _reversed_finish(
    dag: Dag, num_streams: int, cost: dict[Node, float], priority: dict[Node, float]
) -> dict[Node, float]:
    """Finish times of a list schedule of the reversed Dag (successors run first), ready
    nodes popped by highest ``priority``: a node that finishes late there must start early."""
    index, preds, succs = dag.index, dag.preds, dag.succs
    waiting = {n: len(succs[n]) for n in dag.nodes}
    stream: dict[Node, int] = {}
    finish: dict[Node, float] = {}
    ready = [(-priority[n], -index[n], n) for n in dag.nodes if not waiting[n]]
    heapq.heapify(ready)
    lanes = [_Lane() for _ in range(num_streams)]
    while ready:
        node = heapq.heappop(ready)[2]
        c = cost[node]
        s, t = _place(dict.fromkeys(succs[node], 0), c, lanes, stream, finish)[:2]
        stream[node], finish[node] = s, t + c
        lanes[s].occupy(t, t + c)
        for pred in preds[node]:
            waiting[pred] -= 1
            if not waiting[pred]:
                heapq.heappush(ready, (-priority[pred], -index[pred], pred))
    return finish


def emission_order(
    nodes: list[Node], start: dict[Node, float], finish: dict[Node, float]
) -> tuple[Node, ...]:
    """``nodes`` sorted by ``(start, costs something, position in nodes)``.

    Why zero-cost nodes first among equal starts: a view that starts together with a kernel
    on its stream ends when it starts, so emitted after the kernel its event would be recorded
    after the kernel and its consumer on another stream would wait for the kernel too.  The
    order stays topological when ``nodes`` is: a node that costs something ends after it
    starts, so nothing starting with it depends on it.
    """
    return tuple(sorted(nodes, key=lambda n: (start[n], finish[n] > start[n])))


def serial_assignment(dag: Dag, cost_model: CostModel) -> Assignment:
    """One stream, the input order kept: every node starts when the previous one finishes
    (a wait, once the communication it waits for has ended too)."""
    cost, comm = split_communication(dag.nodes, node_costs(dag, cost_model))
    level = bottom_levels(dag, cost, comm)
    channels = Channels(comm) if comm is not None else None
    stream = dict.fromkeys(dag.nodes, 0)
    start: dict[Node, float] = {}
    finish: dict[Node, float] = {}
    reasons: dict[Node, Placement] = {}
    t = 0.0
    for node in dag.nodes:
        if channels is not None:
            t = max(t, channels.release(node))
        rule = INPUT if node.op in INPUT_OPS else OUTPUT if node is dag.output else IN_ORDER
        reasons[node] = Placement(rule, ready=t, priority=level[node])
        start[node] = t
        if channels is not None and node in channels.comm.time:
            channels.issue(node, t)
        t += cost[node]
        finish[node] = t
    compute = tuple(n for n in dag.nodes if n.op not in INPUT_OPS and n is not dag.output)
    total = t if comm is None else sum(cost.values())
    bound = t
    if comm is not None:  # other orders on one stream may overlap communication
        bound = makespan_lower_bound(dag.nodes, dag.preds, cost, 1, t, comm=comm)
    return Assignment(
        num_streams=1,
        stream=stream,
        start=start,
        finish=finish,
        order=compute,
        makespan=t,
        critical_path=max(level.values(), default=0.0),
        total_cost=total,
        reasons=reasons,
        lower_bound=bound,
        communication=channels.spans if channels is not None else {},
        collectives=comm.collectives if comm is not None else (),
    )


@dataclass(frozen=True)
class _Placed:
    """What one pass fills in: stream, start, finish and reason of every node, the
    compute nodes in the order they were placed, and when each communication runs."""

    stream: dict[Node, int]
    start: dict[Node, float]
    finish: dict[Node, float]
    reasons: dict[Node, Placement]
    picked: list[Node]
    communication: dict[Node, tuple[float, float]]

    @property
    def makespan(self) -> float:
        return max(self.finish.values(), default=0.0)


# Over ruff's statement limit (PLR0915, 34 > 30) and complexity limit (C901, 11 > 10): to
# split, the issuer's branches into _Issuer.
def _list_schedule(  # noqa: PLR0915, C901
    dag: Dag,
    num_streams: int,
    cost: dict[Node, float],
    level: dict[Node, float],
    placed: _Placed,
    comm: Communication | None = None,
    pinned: frozenset[Node] = frozenset(),
) -> None:
    """Place every compute node (step 2-3 of `assign_streams`), appending to
    ``placed.picked``; with ``comm``, collectives and waits by `_Issuer`."""
    index, preds, succs, out = dag.index, dag.preds, dag.succs, dag.output
    stream, start, finish, reasons = placed.stream, placed.start, placed.finish, placed.reasons
    waiting = dict(dag.computed_dependency_counts)
    lanes = [_Lane() for _ in range(num_streams)]
    issuer = _Issuer(comm, lanes, placed) if comm is not None else None
    ready = [
        (-level[n], index[n], n)
        for n in dag.nodes
        if n.op not in INPUT_OPS and not waiting[n] and (issuer is None or issuer.may_issue(n))
    ]
    heapq.heapify(ready)
    heappop, heappush = heapq.heappop, heapq.heappush
    picked = placed.picked
    while ready:
        node = heappop(ready)[2]
        if node is out:
            continue
        c = cost[node]
        if issuer is not None and node in issuer.special:
            s, t, rule, producer, est, tied = issuer.place(node, preds[node], c)
        elif pinned and c and node in pinned:
            s, t, rule, producer, est, tied = _place_on_first(preds[node], c, lanes, stream, finish)
        else:
            s, t, rule, producer, est, tied = _place(preds[node], c, lanes, stream, finish)
        ends = lanes[s].ends
        inserted = c > 0.0 and bool(ends) and ends[-1] > t
        reasons[node] = _new_placement(
            Placement, (rule, producer, est, level[node], tied, inserted)
        )
        stream[node], start[node], finish[node] = s, t, t + c
        if c:
            lanes[s].occupy(t, t + c)
        picked.append(node)
        if issuer is not None and node in issuer.special:
            released = issuer.record(node, t, c)
            if released is not None:
                heappush(ready, (-level[released], index[released], released))
        for succ in succs[node]:
            left = waiting[succ] - 1
            waiting[succ] = left
            if not left and (issuer is None or issuer.may_issue(succ)):
                heappush(ready, (-level[succ], index[succ], succ))


class _Issuer:
    """How `_list_schedule` places collectives and waits (`msched.analysis.communication`).

    The collectives are issued in their original order: one that is ready before the
    collective before it is issued is held back, and a collective starts no earlier than
    the one before it (its placement counts that one as a dependency), so host order, issue
    order and the order of each channel all stay the original's.  An asynchronous
    collective costs nothing on its stream; its communication starts on its channel.  A
    wait starts no earlier than the communication it waits for ends, on a stream that is
    idle then, and that instant is kept out of later blocks (`_Lane.mark`).
    """

    __slots__ = ("comm", "lanes", "placed", "channels", "position", "next", "held", "special")

    def __init__(self, comm: Communication, lanes: list[_Lane], placed: _Placed) -> None:
        self.comm, self.lanes, self.placed = comm, lanes, placed
        self.channels = Channels(comm)
        self.position = {n: i for i, n in enumerate(comm.collectives)}
        self.next = 0  # position of the next collective to issue
        self.held: set[Node] = set()
        self.special = set(self.position) | set(comm.waits)

    def may_issue(self, node: Node) -> bool:
        """Whether a ready ``node`` may go on the heap now (else it is held back)."""
        at = self.position.get(node)
        if at is None or at == self.next:
            return True
        self.held.add(node)
        return False

    def place(
        self, node: Node, deps: dict[Node, int], cost: float
    ) -> tuple[int, float, str, Node | None, float, bool]:
        """`_place` for a collective or a wait."""
        placed = self.placed
        if node in self.position:
            if self.next:
                deps = dict(deps)
                deps.setdefault(self.comm.collectives[self.next - 1], 0)
            return _place(deps, cost, self.lanes, placed.stream, placed.finish)
        release = self.channels.release(node)
        return _place_after(deps, cost, release, self.lanes, placed.stream, placed.finish)

    def record(self, node: Node, at: float, cost: float) -> Node | None:
        """``node``, a collective or a wait, starts at ``at``; returns the held collective
        that may go on the heap now, if any."""
        if node not in self.position:  # a wait
            if cost == 0.0:
                self.lanes[self.placed.stream[node]].mark(at)
            return None
        if node in self.comm.time:
            self.channels.issue(node, at)
            self.placed.communication[node] = self.channels.spans[node]
        self.next += 1
        if self.next < len(self.comm.collectives):
            following = self.comm.collectives[self.next]
            if following in self.held:
                self.held.discard(following)
                return following
        return None


# Over ruff's complexity limit (C901, 11 > 10): to split, the producer loop into a helper.
def _place(  # noqa: C901
    deps: dict[Node, int],
    cost: float,
    lanes: list[_Lane],
    stream: dict[Node, int],
    finish: dict[Node, float],
) -> tuple[int, float, str, Node | None, float, bool]:
    """Stream, start and rule (see `RULES`) of a node with dependencies ``deps`` and cost
    ``cost``; then its producer (the dependency that finishes last), the producer's finish and
    whether another dependency finishes then too."""
    producer: Node | None = None
    est, tied, from_input = 0.0, False, True
    for dep in deps:  # ties go to the first computed dependency (usually the main chain)
        f = finish[dep]
        if f > est or producer is None:
            producer, est, tied, from_input = dep, f, False, dep.op in INPUT_OPS
        elif f == est:
            tied = True
            if from_input and dep.op not in INPUT_OPS:
                producer, from_input = dep, False
    affinity = stream[producer] if producer is not None else 0
    if cost == 0.0:
        return affinity, est, ZERO_COST, producer, est, tied
    ends = lanes[affinity].ends
    here = est if not ends or ends[-1] <= est else lanes[affinity].earliest(est, cost)
    return _best_lane(lanes, affinity, here, est, cost, producer, tied)


def _place_on_first(
    deps: dict[Node, int],
    cost: float,
    lanes: list[_Lane],
    stream: dict[Node, int],
    finish: dict[Node, float],
) -> tuple[int, float, str, Node | None, float, bool]:
    """`_place` for a node pinned to stream 0: its earliest gap there."""
    affinity, est, _, producer, _, tied = _place(deps, 0.0, lanes, stream, finish)
    t = lanes[0].earliest(est, cost)
    rule = AFFINITY if affinity == 0 and t == est else FIRST_FREE if t == est else EARLIEST_GAP
    return 0, t, rule, producer, est, tied


def _place_after(
    deps: dict[Node, int],
    cost: float,
    release: float,
    lanes: list[_Lane],
    stream: dict[Node, int],
    finish: dict[Node, float],
) -> tuple[int, float, str, Node | None, float, bool]:
    """`_place` for a wait: it starts no earlier than ``release`` (the end of the
    communication it waits for) and, even when it costs nothing, at an instant when its
    stream runs nothing (it must be issued between that stream's kernels)."""
    affinity, est, _, producer, _, tied = _place(deps, 0.0, lanes, stream, finish)
    est = max(est, release)
    here = lanes[affinity].earliest(est, cost)
    return _best_lane(lanes, affinity, here, est, cost, producer, tied)


def _best_lane(
    lanes: list[_Lane],
    affinity: int,
    here: float,
    est: float,
    cost: float,
    producer: Node | None,
    tied: bool,
) -> tuple[int, float, str, Node | None, float, bool]:
    """The placement `_place` and `_place_after` return: the affinity stream if it can start
    there at ``est`` (``here``, its earliest start), else the first stream free at ``est``,
    else the one with the earliest gap."""
    if here == est:
        return affinity, est, AFFINITY, producer, est, tied
    best_stream, best_start = affinity, here
    for s, lane in enumerate(lanes):
        if s == affinity:
            continue
        t = lane.earliest(est, cost)
        if t < best_start:
            best_stream, best_start = s, t
            if t == est:
                return s, t, FIRST_FREE, producer, est, tied
    return best_stream, best_start, EARLIEST_GAP, producer, est, tied

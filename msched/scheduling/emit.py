"""Emission: rewrite a graph in place in the assigned order, with the stream ops.

Rules (docs/design.md, "Emission"):

- placeholders and ``get_attr`` first, then zero-cost nodes that only touch graph inputs
  (the preamble), all on stream 0;
- an auxiliary stream has joined stream 0 before its first node, because graph inputs are
  ready only on stream 0: it waits on the entry event (recorded on stream 0 after the
  preamble) unless a wait for a dependency on stream 0 already joined it;
- a cross-stream dependency gets a ``record_event`` right after the producer and a wait
  before the consumer, unless the consumer's stream already happens-after the producer
  (vector clocks are tracked while emitting, so no redundant wait is emitted);
- a switch and the waits right after it are one node, ``set_stream(s, [e1, e2])``; a wait
  where no switch happens (the stream continues) is a ``wait_event`` node of its own;
- a record right before a switch (after the last node the old stream issues before the host
  switches away) is in that switch too, ``set_stream(s, [e1], [e3])``; a record followed by
  another node of its stream is a ``record_event`` node of its own;
- a tensor used on another stream than the one that allocated it is protected from the
  allocator only where it could otherwise reuse its block too early
  (`msched.analysis.lifetimes`): kept alive until its own stream has waited for the use, by a
  ``record_stream`` for its own stream (which the allocator ignores) right before the first
  node of that stream that has joined the use, when one exists (``keep_alive``, the
  default: a block recorded for another stream is pinned until the allocator finds that
  stream's work done, under ``reserved_bound`` for the whole graph); else by
  ``record_stream`` for the using stream before its first use there;
- ``output`` is last, on stream 0, after stream 0 has joined every dependency of ``output``;
- the collectives are issued in the assignment's order (`Assignment.collectives`, the
  original's), whatever the streams they are on.

Nodes are emitted stream by stream: the current stream continues while its next node is ready,
otherwise emission switches to the stream whose next node comes first in the assignment order
(that node is always ready, so emission never deadlocks).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.fx import Graph, Node

from msched import ops
from msched.analysis.dag import Dag
from msched.analysis.effects import produces_tensor
from msched.analysis.lifetimes import UnsafeUse, allocates, unsafe_cross_stream_uses
from msched.analysis.nodes import INPUT_OPS
from msched.scheduling.assign import Assignment


@dataclass(frozen=True)
class Emission:
    """The rewritten node order and what was added to it."""

    order: tuple[Node, ...]
    stream: dict[Node, int]
    added: tuple[Node, ...]
    num_events: int
    num_waits: int


class _Emitter:
    """Builds the new node order; creates stream-op nodes, but does not relink the graph.

    Positions count the nodes of each stream from 1 (the graph inputs are position 0 of
    stream 0) and the preamble is positions 1..P of stream 0, so the entry event (recorded
    after the preamble) stands for position P of stream 0.  A vector clock of stream ``s``
    holds, for every stream ``t``, the last position of ``t`` that ``s`` has joined (-1:
    none).
    """

    def __init__(self, graph: Graph, dag: Dag, assignment: Assignment, preamble: list[Node]):
        self.graph, self.dag, self.assignment = graph, dag, assignment
        self.preds = dag.preds  # node -> what it must wait for (the Dag's edges)
        n = assignment.num_streams
        self.clock = [[-1] * n for _ in range(n)]  # per stream, its vector clock now
        self.length = [0] * n  # per stream, how many nodes it has issued
        self.position: dict[Node, int] = {}  # node -> its position on its stream
        self.clock_after: dict[Node, tuple[int, ...]] = {}  # node -> its stream's clock after it
        self.event_after: dict[Node, int] = {}  # producer -> the event recorded after it
        self.record_after: dict[Node, Node] = {}  # producer -> its record_event node
        self.records_before: dict[Node, list[Node]] = {}  # user -> record_stream nodes before it
        self.started = [True] + [False] * (n - 1)  # per stream, whether it joined the entry
        self.issued: list[Node] = []  # after the preamble: nodes and the stream ops between
        self.computed: list[Node] = []  # the preamble and the emitted nodes, in host order
        self.stream_ops: list[Node] = []  # every stream-op node created
        self.switch_waits: dict[Node, list[int]] = {}  # set_stream node -> the events it waits
        self.switch_records: dict[Node, list[int]] = {}  # set_stream node -> events it records
        self.switch_after: dict[Node, Node] = {}  # issued node -> the switch right after it
        self.stream_of: dict[Node, int] = {}  # every node (stream ops included) -> its stream
        self.current = 0  # the stream later nodes are issued on
        self.num_waits = 0
        self.entry_record: Node | None = None  # the record node of the entry event, if any
        self.entry_recorded = False  # whether the entry event is recorded (maybe in a switch)
        self.preamble = preamble
        for node in preamble:
            self._count(node, 0)
        self.clock[0][0] = self.entry_position = len(preamble)
        self.entry_clock = tuple([self.entry_position] + [-1] * (n - 1))

    def _new(
        self, op: Callable[..., Any], args: tuple[Any, ...] | None, name: str, stream: int
    ) -> Node:
        """A new stream-op node on ``stream`` (not yet in its place in the graph).

        The arguments are set after creation (``args`` None: later, by the caller):
        `Graph.create_node` scans them for raw symbolic values, which our literal ints and
        tensor nodes never are, and that scan is the larger part of its cost for thousands
        of stream ops.
        """
        node = self.graph.create_node("call_function", op, None, None, name=name)
        if args is not None:
            node.args = args
        self.stream_ops.append(node)
        self.stream_of[node] = stream
        return node

    def _put(self, op: Callable[..., Any], args: tuple[Any, ...], name: str) -> None:
        self.issued.append(self._new(op, args, name, self.current))

    def _count(self, node: Node, s: int) -> None:
        """Stamp ``node`` as the next node of stream ``s``; keep its host order."""
        self.stream_of[node] = s
        k = self.length[s] + 1
        self.length[s] = self.position[node] = k
        clock = self.clock[s]
        clock[s] = k
        self.clock_after[node] = tuple(clock)
        self.computed.append(node)

    def _switch(self, s: int) -> None:
        if s != self.current:
            self.current = s
            node = self._new(ops.set_stream, None, "set_stream", s)
            self.switch_waits[node] = []
            if self.issued:
                self.switch_after[self.issued[-1]] = node
            self.issued.append(node)

    def _wait(self, event: int) -> None:
        """The current stream waits for ``event``: in the switch right before, if there is
        one (`finish_switches` writes its arguments), else a ``wait_event`` of its own."""
        self.num_waits += 1
        waits = self.switch_waits.get(self.issued[-1]) if self.issued else None
        if waits is not None:
            waits.append(event)
        else:
            self._put(ops.wait_event, (event,), "wait_event")

    def _record(self, after: Node | None, event: int, stream: int) -> Node | None:
        """Record ``event`` on ``stream`` right after ``after`` (None: after the preamble): in
        the switch that follows it, if one does (None returned), else a new node."""
        switch = self.switch_after.get(after) if after is not None else self._first_switch()
        if switch is not None:
            self.switch_records.setdefault(switch, []).append(event)
            return None
        return self._new(ops.record_event, (event,), "record_event", stream)

    def _first_switch(self) -> Node | None:
        """The switch right after the preamble (and so after the entry record), if any."""
        first = self.issued[0] if self.issued else None
        return first if first in self.switch_waits else None

    def finish_switches(self) -> None:
        """Write the arguments of every switch: ``(s,)``, ``(s, waits)`` when it waits, and
        ``(s, waits, records)`` when it records."""
        stream_of, records = self.stream_of, self.switch_records
        for node, events in self.switch_waits.items():
            recorded = records.get(node)
            if recorded is not None:
                node.args = (stream_of[node], events, recorded)
            else:
                node.args = (stream_of[node], events) if events else (stream_of[node],)

    def _join(self, s: int, other: tuple[int, ...]) -> None:
        """Stream ``s`` has waited for a point whose clock is ``other``."""
        clock = self.clock[s]
        for t, v in enumerate(other):
            if v > clock[t]:
                clock[t] = v

    def _start_stream(self, s: int) -> None:
        """Join stream 0's entry point, unless a wait on stream 0 already did."""
        self.started[s] = True
        if self.clock[s][0] >= self.entry_position:
            return
        if not self.entry_recorded:
            self.entry_recorded = True
            self.entry_record = self._record(None, 0, 0)
        self._wait(0)
        self._join(s, self.entry_clock)

    def _event_for(self, producer: Node) -> int:
        """The event recorded right after ``producer`` (created on first use)."""
        event = self.event_after.get(producer)
        if event is None:
            event = len(self.event_after) + 1
            self.event_after[producer] = event
            record = self._record(producer, event, self.assignment.stream[producer])
            if record is not None:
                self.record_after[producer] = record
        return event

    def _wait_for(self, s: int, deps: dict[Node, int]) -> None:
        """Wait on the dependencies ``s`` does not know yet, skipping any a chosen wait covers.

        Per other stream only the latest uncovered dependency matters; of those, one whose
        position another one's clock already includes needs no wait of its own.  Preamble
        dependencies are left to the entry wait.
        """
        stream, position, clock_after = self.assignment.stream, self.position, self.clock_after
        clock, entry = self.clock[s], self.entry_position
        latest: dict[int, Node] | None = None  # per other stream; None (no dict) is common
        for dep in deps:
            t = stream[dep]
            if t == s:
                continue
            k = position.get(dep)
            if k is None or clock[t] >= k or (t == 0 and k <= entry):
                continue
            if latest is None:
                latest = {t: dep}
            elif t not in latest or k > position[latest[t]]:
                latest[t] = dep
        if latest is None:
            return
        needed = [
            dep
            for t, dep in sorted(latest.items())
            if not any(clock_after[o][t] >= position[dep] for u, o in latest.items() if u != t)
        ]
        for dep in needed:
            self._wait(self._event_for(dep))
            self._join(s, clock_after[dep])

    def emit(self, node: Node, s: int) -> None:
        """Issue ``node`` on stream ``s``, after the switch and the waits it needs."""
        if s != self.current:
            self._switch(s)
        self._wait_for(s, self.preds[node])
        if not self.started[s]:
            self._start_stream(s)
        self.issued.append(node)
        self._count(node, s)

    def finish(self, output: Node, keep_alive: bool = True) -> None:
        """Join everything ``output`` depends on, on stream 0; add the ``record_stream``s (or,
        with ``keep_alive``, the references that keep a storage alive until its join)."""
        self._switch(0)
        self._wait_for(0, self.preds[output])
        self.stream_of[output] = 0
        self._record_unsafe_uses(output, keep_alive)

    def _record_unsafe_uses(self, output: Node, keep_alive: bool) -> None:
        """Add ``record_stream`` before the first use of each storage that needs one; with
        ``keep_alive``, where a later node of the storage's own stream joins the use, a
        ``record_stream`` of the storage for its own stream before that node instead."""
        effects = self.dag.effects
        unsafe = unsafe_cross_stream_uses(
            self.computed,
            output,
            self.stream_of,
            self.position,
            self.clock_after,
            effects.root,
            produces_tensor,
            lambda node: allocates(node, effects),
        )
        by_root: dict[Node, list[UnsafeUse]] = {}
        for use in unsafe:
            by_root.setdefault(use.root, []).append(use)
        joins = _Joins(self.computed, self.stream_of, self.clock_after) if keep_alive else None
        for root, uses in by_root.items():
            join = joins.last_of(self.stream_of[root], uses) if joins is not None else None
            if join is not None:  # one reference after every join: the latest
                home = self.stream_of[root]
                record = self._new(ops.record_stream, (uses[0].tensor, home), "record_stream", home)
                self.records_before.setdefault(join, []).append(record)
                continue
            for use in uses:  # a record pins the block anyway: no keep-alive beside it
                args = (use.tensor, use.stream)
                record = self._new(ops.record_stream, args, "record_stream", use.stream)
                self.records_before.setdefault(use.user, []).append(record)


class _Joins:
    """Per stream, its nodes in host order, to find the first that happens-after a position
    of another stream (clocks only grow along a stream, so a binary search finds it)."""

    def __init__(
        self,
        computed: list[Node],
        stream_of: dict[Node, int],
        clock_after: dict[Node, tuple[int, ...]],
    ) -> None:
        self.clock_after = clock_after
        self.nodes: dict[int, list[Node]] = {}
        for node in computed:
            self.nodes.setdefault(stream_of[node], []).append(node)

    def last_of(self, stream: int, uses: list[UnsafeUse]) -> Node | None:
        """The first node of ``stream`` that happens after every one of ``uses`` (None: no
        node of it does)."""
        nodes = self.nodes.get(stream, [])
        clock_after = self.clock_after
        latest = 0
        for use in uses:
            i = bisect_left(nodes, use.last_seq, key=lambda n: clock_after[n][use.stream])
            if i == len(nodes):
                return None
            latest = max(latest, i)
        return nodes[latest]


def _preamble(dag: Dag, a: Assignment) -> list[Node]:
    """Zero-cost stream-0 nodes at time 0 whose dependencies are all inputs or preamble."""
    pre: list[Node] = []
    inside: set[Node] = set()
    for node in a.order:
        if a.start[node] > 0.0:
            break
        if (
            a.stream[node] == 0
            and a.finish[node] == 0.0
            and all(d.op in INPUT_OPS or d in inside for d in dag.preds[node])
        ):
            pre.append(node)
            inside.add(node)
    return pre


def _stream_queues(a: Assignment, skip: set[Node]) -> list[list[Node]]:
    queues: list[list[Node]] = [[] for _ in range(a.num_streams)]
    for node in a.order:
        if node not in skip:
            queues[a.stream[node]].append(node)
    for q in queues:
        q.reverse()  # pop() from the end is O(1)
    return queues


def plan_emission(graph: Graph, dag: Dag, a: Assignment, keep_alive: bool = True) -> Emission:
    """Compute the emitted order and create the stream-op nodes it needs (not yet linked).

    ``keep_alive``: a cross-stream use that needs protection from the allocator keeps its
    storage alive until the storage's stream joins the use, where a later node of that stream
    does; otherwise (and for every such use when False) it gets ``record_stream``."""
    inputs = [n for n in dag.nodes if n.op == "placeholder"]
    inputs += [n for n in dag.nodes if n.op == "get_attr"]
    pre = _preamble(dag, a)
    em = _Emitter(graph, dag, a, pre)
    for node in inputs:
        em.stream_of[node] = 0
    pending = dict(dag.computed_dependency_counts)
    rank = {n: i for i, n in enumerate(a.order)}
    succs, stream = dag.succs, a.stream
    # Each collective waits, besides its dependencies, for the one issued before it: the
    # host issues them in the assignment's order, which every rank shares (no event is
    # added for it; the Dag's edges between collectives, if any, add those).
    following = dict(zip(a.collectives, a.collectives[1:], strict=False))
    for node in following.values():
        pending[node] += 1
    for node in pre:
        for succ in succs[node]:
            pending[succ] -= 1
        if node in following:
            pending[following[node]] -= 1
    queues = _stream_queues(a, set(pre))
    emit = em.emit
    for _ in range(sum(len(q) for q in queues)):
        q = queues[em.current]
        if not q or pending[q[-1]]:
            q = min((q for q in queues if q), key=lambda q: rank[q[-1]])
        node = q.pop()
        emit(node, stream[node])
        for succ in succs[node]:
            pending[succ] -= 1
        if following and node in following:
            pending[following[node]] -= 1
    em.finish(dag.output, keep_alive)
    em.finish_switches()
    order = _link_order(em, inputs, pre, dag.output)
    return Emission(
        order=tuple(order),
        stream=em.stream_of,
        added=tuple(em.stream_ops),
        num_events=len(em.event_after) + (1 if em.entry_recorded else 0),
        num_waits=em.num_waits,
    )


def _link_order(em: _Emitter, inputs: list[Node], pre: list[Node], output: Node) -> list[Node]:
    order = inputs + pre
    if em.entry_record is not None:
        order.append(em.entry_record)
    after, before = em.record_after, em.records_before
    for node in em.issued:
        order.extend(before.get(node, ()))
        order.append(node)
        record = after.get(node)
        if record is not None:
            order.append(record)
    order.append(output)
    return order


def relink(graph: Graph, order: list[Node] | tuple[Node, ...]) -> None:
    """Put the nodes of ``graph`` in ``order`` (which must hold every node, output last)."""
    output = order[-1]
    for node in order[:-1]:
        output.prepend(node)

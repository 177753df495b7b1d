"""Emission: rewrite a graph in place in the assigned order, with the stream ops.

Rules (DESIGN.md, Emit):

- placeholders and ``get_attr`` first, then zero-cost nodes that only touch graph inputs
  (the preamble), all on stream 0;
- an auxiliary stream has joined stream 0 before its first node, because graph inputs are
  ready only on stream 0: it waits on the entry event (recorded on stream 0 after the
  preamble) unless a wait for a dependency on stream 0 already joined it;
- a cross-stream dependency gets a ``record_event`` right after the producer and a
  ``wait_event`` before the consumer, unless the consumer's stream already happens-after the
  producer (vector clocks are tracked while emitting, so no redundant wait is emitted);
- a tensor used on another stream than the one that allocated it gets ``record_stream`` for
  that stream only where the allocator could otherwise reuse its block too early
  (`msched.lifetimes`);
- ``output`` is last, on stream 0, after stream 0 has joined every dependency of ``output``.

Nodes are emitted stream by stream: the current stream continues while its next node is ready,
otherwise emission switches to the stream whose next node comes first in the assignment order
(that node is always ready, so emission never deadlocks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.fx import Graph, Node

from msched import ops
from msched.analysis.dag import Dag
from msched.analysis.effects import produces_tensor
from msched.analysis.lifetimes import unsafe_cross_stream_uses
from msched.scheduling.assign import Assignment

_INPUT_OPS = ("placeholder", "get_attr")


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

    Positions: graph inputs are at position 0 of stream 0 and the preamble at 1..P, so the
    entry event (recorded after the preamble) stands for position P of stream 0.
    """

    def __init__(self, graph: Graph, dag: Dag, assignment: Assignment, preamble: list[Node]):
        self.graph, self.dag, self.a = graph, dag, assignment
        self.preds = dag.preds
        n = assignment.num_streams
        self.vc = [[-1] * n for _ in range(n)]
        self.seq_count = [0] * n
        self.seq: dict[Node, int] = {}
        self.snap: dict[Node, tuple[int, ...]] = {}
        self.event_of: dict[Node, int] = {}
        self.after: dict[Node, Node] = {}
        self.before: dict[Node, list[Node]] = {}
        self.started = [True] + [False] * (n - 1)
        self.body: list[Node] = []
        self.computed: list[Node] = []  # the preamble and the emitted nodes, in host order
        self.added: list[Node] = []
        self.stream: dict[Node, int] = {}
        self.current = 0
        self.num_waits = 0
        self.entry: Node | None = None
        self.preamble = preamble
        for node in preamble:
            self._count(node, 0)
        self.vc[0][0] = self.entry_point = len(preamble)
        self.entry_snap = tuple([self.entry_point] + [-1] * (n - 1))

    def _new(self, op: Callable[..., Any], args: tuple[Any, ...], name: str, stream: int) -> Node:
        """A new stream-op node on ``stream`` (not yet in its place in the graph).

        The arguments are set after creation: `Graph.create_node` scans them for raw symbolic
        values, which our literal ints and tensor nodes never are, and that scan is the
        larger part of its cost for thousands of stream ops.
        """
        node = self.graph.create_node("call_function", op, None, None, name=name)
        node.args = args
        self.added.append(node)
        self.stream[node] = stream
        return node

    def _put(self, op: Callable[..., Any], args: tuple[Any, ...], name: str) -> None:
        self.body.append(self._new(op, args, name, self.current))

    def _count(self, node: Node, s: int) -> None:
        """Stamp ``node`` as the next node of stream ``s``; keep its host order."""
        self.stream[node] = s
        k = self.seq_count[s] + 1
        self.seq_count[s] = self.seq[node] = k
        vc = self.vc[s]
        vc[s] = k
        self.snap[node] = tuple(vc)
        self.computed.append(node)

    def _switch(self, s: int) -> None:
        if s != self.current:
            self.current = s
            self._put(ops.set_stream, (s,), "set_stream")

    def _join(self, s: int, snap: tuple[int, ...]) -> None:
        vc = self.vc[s]
        for t, v in enumerate(snap):
            if v > vc[t]:
                vc[t] = v

    def _start_stream(self, s: int) -> None:
        """Join stream 0's entry point, unless a wait on stream 0 already did."""
        self.started[s] = True
        if self.vc[s][0] >= self.entry_point:
            return
        if self.entry is None:
            self.entry = self._new(ops.record_event, (0,), "record_event", 0)
        self._put(ops.wait_event, (0,), "wait_event")
        self.num_waits += 1
        self._join(s, self.entry_snap)

    def _event_for(self, producer: Node) -> int:
        event = self.event_of.get(producer)
        if event is None:
            event = len(self.event_of) + 1
            self.event_of[producer] = event
            stream = self.a.stream[producer]
            self.after[producer] = self._new(ops.record_event, (event,), "record_event", stream)
        return event

    def _wait_for(self, s: int, deps: dict[Node, int]) -> None:
        """Wait on the dependencies ``s`` does not know yet, skipping any a chosen wait covers.

        Per other stream only the latest uncovered dependency matters; of those, one whose
        position another one's snapshot already includes needs no wait of its own.  Preamble
        dependencies are left to the entry wait.
        """
        stream, seq, snap, vc = self.a.stream, self.seq, self.snap, self.vc[s]
        entry = self.entry_point
        latest: dict[int, Node] | None = None
        for dep in deps:
            t = stream[dep]
            if t == s:
                continue
            k = seq.get(dep)
            if k is None or vc[t] >= k or (t == 0 and k <= entry):
                continue
            if latest is None:
                latest = {t: dep}
            elif t not in latest or k > seq[latest[t]]:
                latest[t] = dep
        if latest is None:
            return
        needed = [
            latest[t]
            for t in sorted(latest)
            if not any(snap[other][t] >= seq[latest[t]] for u, other in latest.items() if u != t)
        ]
        for dep in needed:
            self._put(ops.wait_event, (self._event_for(dep),), "wait_event")
            self.num_waits += 1
            self._join(s, snap[dep])

    def emit(self, node: Node, s: int) -> None:
        if s != self.current:
            self._switch(s)
        self._wait_for(s, self.preds[node])
        if not self.started[s]:
            self._start_stream(s)
        self.body.append(node)
        self._count(node, s)

    def finish(self, output: Node) -> None:
        self._switch(0)
        self._wait_for(0, self.preds[output])
        self.stream[output] = 0
        self._record_unsafe_uses(output)

    def _record_unsafe_uses(self, output: Node) -> None:
        """Add ``record_stream`` before the first use of each storage that needs one."""
        unsafe = unsafe_cross_stream_uses(
            self.computed,
            output,
            self.stream,
            self.seq,
            self.snap,
            self.dag.effects.root,
            produces_tensor,
        )
        for use in unsafe:
            args = (use.tensor, use.stream)
            record = self._new(ops.record_stream, args, "record_stream", use.stream)
            self.before.setdefault(use.user, []).append(record)


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
            and all(d.op in _INPUT_OPS or d in inside for d in dag.preds[node])
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


def plan_emission(graph: Graph, dag: Dag, a: Assignment) -> Emission:
    """Compute the emitted order and create the stream-op nodes it needs (not yet linked)."""
    inputs = [n for n in dag.nodes if n.op == "placeholder"]
    inputs += [n for n in dag.nodes if n.op == "get_attr"]
    pre = _preamble(dag, a)
    em = _Emitter(graph, dag, a, pre)
    for node in inputs:
        em.stream[node] = 0
    pending = dict(dag.computed_dependency_counts)
    rank = {n: i for i, n in enumerate(a.order)}
    succs, stream = dag.succs, a.stream
    for node in pre:
        for succ in succs[node]:
            pending[succ] -= 1
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
    em.finish(dag.output)
    order = _link_order(em, inputs, pre, dag.output)
    return Emission(
        order=tuple(order),
        stream=em.stream,
        added=tuple(em.added),
        num_events=len(em.event_of) + (1 if em.entry is not None else 0),
        num_waits=em.num_waits,
    )


def _link_order(em: _Emitter, inputs: list[Node], pre: list[Node], output: Node) -> list[Node]:
    order = inputs + pre
    if em.entry is not None:
        order.append(em.entry)
    after, before = em.after, em.before
    for node in em.body:
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

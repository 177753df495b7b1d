"""The toy engine's multi-stream pass: run independent branches of a graph on several streams.

``schedule(gm, num_streams)`` returns a new ``GraphModule`` whose graph issues every node on
one of ``num_streams`` CUDA streams through the `toyengine.ops` stream ops:

1. **dependencies**: the values a node consumes, plus the in-place writes it sees: a node
   reading a buffer depends on the last op that wrote it (attention writes its output buffer,
   the o-projection reads it), and a write waits for the earlier readers and writer;
2. **assignment**: greedy list scheduling in graph order; each node goes to the stream where
   it can start first (a cross-stream input costs `SYNC_COST`), ties to the stream of its
   latest input, then to the lowest stream.  Side outputs (an op nobody reads from that
   writes a graph input in place, such as a capture) are off the critical path: they go to
   the auxiliary stream that is free first;
3. **rebuild**: nodes in order of their start time with ``set_stream`` where the stream
   changes; an auxiliary stream first waits for the entry event (graph inputs are ready on
   stream 0 only); a node waits for the event recorded after each input made on another
   stream and ``record_stream``s the tensors it uses there; ``output`` is issued on stream 0
   after joining the last node of every auxiliary stream.

Two historical bugs can be switched back on, to show what the tests catch
(``TOYENG_BUG=1`` or ``2`` in the environment, or `BUG`):

- **bug 1** (the Eagle3 capture bug): the rebuild emits only what ``output`` depends on;
  nodes nobody reads from (the hidden-state captures into a preallocated buffer) are appended
  after ``output``, so in the recompiled module they follow ``return`` and never run;
- **bug 2**: the exit waits only for the streams that made the returned values, never for an
  auxiliary stream that ran a capture after its last such value: the caller may read the
  capture buffer before the capture ran.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch.fx import Graph, GraphModule, Node

from toyengine import ops

BUG_ENV = "TOYENG_BUG"
BUG: int | None = None
"""The historical bug to reproduce (1 or 2), or 0 for none; None reads ``TOYENG_BUG``."""

SYNC_COST = 1.0
_INPUT_OPS = ("placeholder", "get_attr")
_ENTRY_EVENT = 0


def active_bug() -> int:
    """The bug the pass reproduces: `BUG` if set, else ``TOYENG_BUG`` (0 when unset)."""
    value: object = BUG if BUG is not None else os.environ.get(BUG_ENV, "0") or "0"
    if str(value) not in ("0", "1", "2"):
        raise ValueError(f"{BUG_ENV} must be 0, 1 or 2, got {value!r}")
    return int(str(value))


def node_cost(node: Node) -> float:
    """A rough cost of one node: matmuls and attention dominate a decoder layer."""
    name = str(getattr(node.target, "__name__", node.target))
    if "attention" in name:
        return 6.0
    if "moe" in name:
        return 8.0
    if name.split(".")[0] in ("mm", "bmm", "addmm", "matmul", "linear"):
        return 4.0
    return 1.0


# --- 1. dependencies ------------------------------------------------------------------------


def _bound_args(node: Node) -> dict[str, object]:
    schema = node.target._schema  # type: ignore[union-attr]
    bound = dict(zip((a.name for a in schema.arguments), node.args, strict=False))
    bound.update(node.kwargs)
    return bound


def _written(node: Node) -> list[Node]:
    """The arguments ``node`` writes in place, from its op schema (``Tensor(a!)``)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return []
    bound = _bound_args(node)
    return [
        value
        for a in schema.arguments
        if a.alias_info is not None
        and a.alias_info.is_write
        and isinstance(value := bound.get(a.name), Node)
    ]


def _view_base(node: Node) -> Node | None:
    """The argument whose storage ``node``'s result aliases (a view), if its schema says so."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.returns or schema.returns[0].alias_info is None:
        return None
    sets = schema.returns[0].alias_info.before_set
    bound = _bound_args(node)
    for a in schema.arguments:
        value = bound.get(a.name)
        if a.alias_info is not None and a.alias_info.before_set & sets and isinstance(value, Node):
            return value
    return None


@dataclass
class _Deps:
    body: list[Node]  # compute nodes in graph order
    preds: dict[Node, set[Node]]  # what each node (and output) must run after
    root: dict[Node, Node] = field(default_factory=dict)  # node -> the storage it aliases


def _dependencies(gm: GraphModule) -> _Deps:
    graph = gm.graph
    output = graph.output_node()
    body = [n for n in graph.nodes if n.op not in (*_INPUT_OPS, "output")]
    deps = _Deps(body, {})
    last_writer: dict[Node, Node] = {}
    readers: dict[Node, list[Node]] = {}
    for node in [*body, output]:
        preds = {d for d in node.all_input_nodes if d.op not in _INPUT_OPS}
        base = _view_base(node) if node.op == "call_function" else None
        deps.root[node] = deps.root.get(base, base) if base is not None else node
        read = {deps.root.get(d, d) for d in node.all_input_nodes}
        for r in read:
            if r in last_writer and last_writer[r] is not node:
                preds.add(last_writer[r])
        for w in _written(node):
            r = deps.root.get(w, w)
            preds.update(x for x in readers.get(r, ()) if x is not node)
            if r in last_writer:
                preds.add(last_writer[r])
        for r in read:
            readers.setdefault(r, []).append(node)
        for w in _written(node):
            r = deps.root.get(w, w)
            last_writer[r], readers[r] = node, []
        deps.preds[node] = preds
    return deps


def _ancestors(node: Node, preds: dict[Node, set[Node]]) -> set[Node]:
    seen: set[Node] = set()
    todo = list(preds[node])
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(preds[n])
    return seen


# --- 2. assignment --------------------------------------------------------------------------


@dataclass
class _Assignment:
    stream: dict[Node, int]
    start: dict[Node, float]
    finish: dict[Node, float]


def _is_side_output(node: Node) -> bool:
    """A node nobody reads from that writes a graph input in place (an Eagle3 capture)."""
    return not node.users and any(
        w.op == "placeholder" for w in _written(node) if isinstance(w, Node)
    )


def _assign(nodes: list[Node], preds: dict[Node, set[Node]], num_streams: int) -> _Assignment:
    a = _Assignment({}, {}, {})
    free = [0.0] * num_streams
    index = {n: i for i, n in enumerate(nodes)}
    for node in nodes:
        inputs = [d for d in preds[node] if d in a.stream]
        home = max(inputs, key=lambda d: (a.finish[d], -index[d]), default=None)
        home_stream = a.stream[home] if home is not None else 0

        def start_on(s: int, inputs: list[Node] = inputs) -> float:
            entry = SYNC_COST if s else 0.0
            ready = max(
                (a.finish[d] + (SYNC_COST if a.stream[d] != s else 0.0) for d in inputs),
                default=entry,
            )
            return max(free[s], ready)

        candidates = range(num_streams)
        if num_streams > 1 and _is_side_output(node):
            candidates = range(1, num_streams)
        s = min(candidates, key=lambda s: (start_on(s), s != home_stream, s))
        a.stream[node], a.start[node] = s, start_on(s)
        a.finish[node] = a.start[node] + node_cost(node)
        free[s] = a.finish[node]
    return a


# --- 3. rebuild -----------------------------------------------------------------------------


class _Emitter:
    """Builds the scheduled graph, tracking the current stream and the events and waits."""

    def __init__(self, assignment: _Assignment, root: dict[Node, Node]) -> None:
        self.graph = Graph()
        self.env: dict[Node, Node] = {}
        self.assignment = assignment
        self.root = root
        self.current = 0
        self.next_event = _ENTRY_EVENT + 1
        self.event_after: dict[Node, int] = {}
        self.waited: set[tuple[int, int]] = set()
        self.recorded: set[tuple[Node, int]] = set()

    def stream_op(self, op: torch._ops.OpOverload, *args: object) -> None:
        self.graph.call_function(op, args)  # type: ignore[arg-type]

    def switch(self, stream: int) -> None:
        if stream != self.current:
            self.stream_op(ops.set_stream, stream)
            self.current = stream

    def wait(self, event: int) -> None:
        if (self.current, event) not in self.waited:
            self.waited.add((self.current, event))
            self.stream_op(ops.wait_event, event)

    def record(self) -> int:
        event, self.next_event = self.next_event, self.next_event + 1
        self.stream_op(ops.record_event, event)
        return event

    def copy(self, node: Node) -> Node:
        self.env[node] = self.graph.node_copy(node, self.env.__getitem__)
        return self.env[node]

    def wait_for(self, producers: Iterable[Node]) -> None:
        for d in sorted(producers, key=lambda d: self.event_after.get(d, -1)):
            if self.assignment.stream.get(d, self.current) != self.current:
                self.wait(self.event_after[d])

    def record_uses(self, node: Node) -> None:
        """``record_stream`` each tensor made on another stream that ``node`` uses."""
        s = self.current
        for d in node.all_input_nodes:
            home = self.assignment.stream.get(self.root.get(d, d))
            if home is None or home == s or (self.root.get(d, d), s) in self.recorded:
                continue
            self.recorded.add((self.root.get(d, d), s))
            self.stream_op(ops.record_stream, self.env[d], s)


def _needs_event(
    order: list[Node], preds: dict[Node, set[Node]], assignment: _Assignment, exit_preds: set[Node]
) -> set[Node]:
    stream = assignment.stream
    wanted = {d for n in order for d in preds[n] if stream[d] != stream[n]}
    return wanted | {d for d in exit_preds if stream[d] != 0}


def _body(deps: _Deps, output: Node, bug: int) -> tuple[list[Node], list[Node]]:
    """The nodes to schedule, and the leftovers copied after ``output`` (none unless bug 1)."""
    if bug != 1:
        return deps.body, []
    # Bug 1: "what does output need?": captures are not needed by anything.
    needed = _ancestors(output, deps.preds)
    body = [n for n in deps.body if n in needed]
    return body, [n for n in deps.body if n not in needed]


def _emit_body(
    emit: _Emitter, order: list[Node], preds: dict[Node, set[Node]], needs_event: set[Node]
) -> None:
    """Copy ``order`` onto its streams: each stream waits for the entry event once, each node
    for its producers on other streams; an event after each node in ``needs_event``."""
    started = {0}
    for node in order:
        s = emit.assignment.stream[node]
        emit.switch(s)
        if s not in started:
            started.add(s)
            emit.wait(_ENTRY_EVENT)
        emit.wait_for(preds[node])
        emit.record_uses(node)
        emit.copy(node)
        if node in needs_event:
            emit.event_after[node] = emit.record()


def schedule(gm: GraphModule, num_streams: int) -> GraphModule:
    """Schedule ``gm`` on ``num_streams`` streams; returns a new module (``gm`` is unchanged).

    Node names are kept, so nodes of ``gm`` and of the result can be matched by name.
    """
    if isinstance(num_streams, bool) or not isinstance(num_streams, int) or num_streams < 1:
        raise ValueError(f"num_streams must be a positive int, got {num_streams!r}")
    bug = active_bug()
    deps = _dependencies(gm)
    output = gm.graph.output_node()
    body, leftovers = _body(deps, output, bug)
    assignment = _assign(body, deps.preds, num_streams)
    index = {n: i for i, n in enumerate(body)}
    order = sorted(body, key=lambda n: (assignment.start[n], index[n]))

    last_on: dict[int, Node] = {assignment.stream[n]: n for n in order}
    if bug == 2:
        # Bug 2: the exit waits for what it returns, like any other consumer.
        exit_preds = set(deps.preds[output])
    else:
        exit_preds = set(deps.preds[output]) | {n for s, n in last_on.items() if s != 0}
    needs_event = _needs_event(order, deps.preds, assignment, exit_preds)

    emit = _Emitter(assignment, deps.root)
    for node in gm.graph.nodes:
        if node.op in _INPUT_OPS:
            emit.copy(node)
    if any(s != 0 for s in last_on):
        emit.stream_op(ops.record_event, _ENTRY_EVENT)
    _emit_body(emit, order, deps.preds, needs_event)
    emit.switch(0)
    emit.wait_for(exit_preds)
    emit.copy(output)
    for node in leftovers:  # bug 1: after output
        emit.copy(node)
    return GraphModule(gm, emit.graph, gm.__class__.__name__)

"""The host-order interpreter: a graph read in a dialect as a `StreamProgram`.

`interpret` walks a graph in host order and returns, for every node, the stream it is issued
on and its actions (`msched.proof.actions`) as `Step`s; with no dialect given it reads
msched's ops and detects another dialect's (`msched.proof.dialects`).  No reader looks at a
stream op itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from torch.fx import Graph, GraphModule, Node

from msched.analysis.nodes import INPUT_OPS, graph_of
from msched.errors import InvalidGraphError, MschedError
from msched.limits import MAX_STREAMS
from msched.proof import actions, dialects
from msched.proof.actions import Action, Reader
from msched.proof.dialects import (
    FOUR_OP_READERS,
    FOUR_OPS,
    Dialect,
    is_hashable,
    qualified_op_name,
    target_key,
)
from msched.proof.lookalikes import UnreadStreamOps
from msched.proof.program import Step, StreamProgram, new_step


# Over the complexity limit (ruff C901) on purpose: the fast path of `_interpret`'s loop,
# taken per stream op of every verify, where a call per check costs more than the check.
def _direct_four_op(kind: str) -> Callable[..., int | None]:  # noqa: C901
    """The steps of a four-op node appended straight away (what its reader and `_append`
    give, without building actions: `interpret` runs once per node of every verify).
    Returns the current stream after the node, or None for arguments that are not plain
    literals, which then take the reader's path (and its error messages)."""

    def direct(  # noqa: C901
        node: Node, current: int, steps: list[Step], streams: _Keys, events: _Keys
    ) -> int | None:
        args = node.args
        if node.kwargs or not args:
            return None
        first = args[0]
        if kind == "record_stream":
            if len(args) != 2 or type(args[1]) is not int or not 0 <= args[1] < MAX_STREAMS:
                return None
            tensor = first if isinstance(first, Node) else None
            streams.highest = max(streams.highest, args[1])
            steps.append(new_step(Step, (node, kind, current, None, args[1], tensor)))
            return current
        if type(first) is not int or first < 0:
            return None
        if kind != "set_stream":
            if len(args) != 1:
                return None
            events.highest = max(events.highest, first)
            steps.append(new_step(Step, (node, kind, current, first, None, None)))
            return current
        if first >= MAX_STREAMS or len(args) > 3:
            return None
        waits: Any = args[1] if len(args) > 1 else ()
        records: Any = args[2] if len(args) > 2 else ()
        for events_of in (waits, records):
            if not isinstance(events_of, (list, tuple)):  # fx keeps lists as immutable_list
                return None
            for e in events_of:
                if type(e) is not int or e < 0:
                    return None
                if e > events.highest:
                    events.highest = e
        streams.highest = max(streams.highest, first)
        for e in records:
            steps.append(new_step(Step, (node, "record_event", current, e, None, None)))
        steps.append(new_step(Step, (node, kind, first, None, first, None)))
        for e in waits:
            steps.append(new_step(Step, (node, "wait_event", first, e, None, None)))
        return first

    return direct


_DIRECT = {FOUR_OP_READERS[kind]: _direct_four_op(kind) for kind in FOUR_OPS}


class _Classifier:
    def __init__(self, dialect: Dialect, detecting: bool = False) -> None:
        # With ``detecting``, another dialect's stream op is noted in ``foreign`` (the graph is
        # then read again in the detected dialect) instead of being an error.
        self.detecting = detecting
        self.foreign: str | None = None
        self.table = dialect._table()
        self.label = dialect.label
        self.annotated = False  # a compute node with meta["custom"]["stream"] was seen
        self.unread = UnreadStreamOps()  # ops the dialect leaves compute that look like stream ops
        # id(target) -> (target, reader): hashing an OpOverload runs Python code, id() does not.
        self._by_id: dict[int, tuple[Any, Reader | None]] = {}

    def reader(self, node: Node) -> Reader | None:
        if node.op != "call_function":
            return None
        target = node.target
        cached = self._by_id.get(id(target))
        if cached is not None and cached[0] is target:
            return cached[1]
        reader = self._reader(node, target)
        self._by_id[id(target)] = (target, reader)
        return reader

    def _reader(self, node: Node, target: Any) -> Reader | None:
        reader = self.table.get(target) if is_hashable(target) else None
        if reader is not None:
            return reader
        name = target_key(target)
        if name is not None and name in self.table:
            return self.table[name]
        foreign = dialects.foreign_stream_op(target)
        if foreign is None:
            self.unread.note(target)
            return None
        if self.detecting:
            self.foreign = foreign[0]
            return None
        shown = name or getattr(target, "__name__", repr(target))
        raise InvalidGraphError(
            f"node {node.name!r} is the stream op {shown} of the {foreign[0]} dialect but the "
            f"graph is read in the {self.label} dialect: stream ops of two dialects are mixed "
            f"(pass dialect=msched.Dialect.named({foreign[0]!r}), or dialect=None to detect, "
            "if that is intended)",
            nodes=(node.name,),
        )


def interpret(gm: GraphModule | Graph, dialect: Dialect | str | None = None) -> StreamProgram:
    """Read ``gm`` in host order: the stream of every node and what every stream op does.

    ``dialect`` is anything `msched.proof.dialects.as_dialect` accepts; None reads msched's
    stream ops, or the dialect of the graph's stream ops when they are another's
    (`Dialect.detect`).  A reader that returns None for a node leaves it compute.  Raises
    `InvalidGraphError` for graphs that cannot be read: no output or several, a stream or
    event id that is not a non-negative int literal, a stream id of `msched.MAX_STREAMS` or
    more, stream ops of two four-op dialects; its subclass `msched.UnreadStreamOpsError` for
    ops that look like stream ops but that the dialect does not read
    (`msched.proof.lookalikes`: read as compute they would order nothing).
    """
    graph = graph_of(gm)
    if dialect is None:
        classify = _Classifier(Dialect(), detecting=True)
        program = _interpret(graph, classify, None, 0)
        if (
            classify.foreign is None
            and not classify.annotated
            and not dialects.marked_by_module(graph)
        ):
            classify.unread.check(graph, "msched (detected)")
            return program
        dialect = dialects.detect_dialect(graph)
    chosen = dialects.as_dialect(dialect)
    caller = chosen.caller_stream
    if callable(caller):  # a dialect that reads its caller's stream from the graph
        caller = caller(graph)
    classify = _Classifier(chosen)
    program = _interpret(graph, classify, chosen.node_stream, caller)
    classify.unread.check(graph, chosen.label)
    return program


class _Keys:
    """Stream or event keys -> ids: an int is its own id; other keys get provisional ids
    (-1, -2, ... in order of first appearance) that `final` moves after the int ids."""

    def __init__(self, caller: Hashable | None = None) -> None:
        # The caller's stream may have several keys (one object under several table indices).
        self.callers = caller if isinstance(caller, frozenset) else frozenset((caller,))
        self.other: dict[Hashable, int] = {}
        self.highest = 0

    def id(self, key: Hashable, node: Node, what: str) -> int:
        if type(key) is int:
            if key >= MAX_STREAMS and what == "stream":
                raise InvalidGraphError(
                    f"{_op_label(node)} node {node.name!r} names stream {key}, but stream ids "
                    f"are 0..{MAX_STREAMS - 1} (msched.MAX_STREAMS = {MAX_STREAMS}, see "
                    "msched.limits)",
                    nodes=(node.name,),
                )
            if key < 0:
                raise InvalidGraphError(
                    f"node {node.name!r} has a negative {what} id {key}", nodes=(node.name,)
                )
            if key > self.highest:
                self.highest = key
            return key
        if isinstance(key, bool) or not is_hashable(key):
            raise InvalidGraphError(
                f"node {node.name!r} names the {what} {key!r}: a stream or event is an int or "
                "another hashable key",
                nodes=(node.name,),
            )
        if key in self.callers:
            return 0
        found = self.other.get(key)
        if found is None:
            found = self.other[key] = -1 - len(self.other)
        return found

    def final(self, provisional: int | None) -> int | None:
        if provisional is None or provisional >= 0:
            return provisional
        return self.highest + (-provisional)


def _read(reader: Callable[[Node], Any], node: Node, label: str) -> Any:
    """``reader(node)``, with a reader's own failure said as the node it could not read."""
    try:
        return reader(node)
    except MschedError:
        raise
    except Exception as error:
        raise _unreadable(node, label, error) from error


def _unreadable(node: Node, label: str, error: Exception) -> InvalidGraphError:
    return InvalidGraphError(
        f"the {label} dialect cannot read node {node.name!r}: {type(error).__name__}: {error}",
        nodes=(node.name,),
    )


def _op_label(node: Node) -> str:
    name = qualified_op_name(node.target)
    return name.split("::")[-1] if name else str(node.target)


# Over the length and complexity limits (ruff C901, PLR0915) on purpose: the loop runs
# once per node of every verify, with the classifier's cache and the four ops inlined.
def _interpret(  # noqa: C901, PLR0915
    graph: Graph,
    classify: _Classifier,
    node_stream: Callable[[Node], Hashable | None] | None,
    caller: Hashable,
) -> StreamProgram:
    outputs = [n for n in graph.nodes if n.op == "output"]
    if len(outputs) != 1:
        raise InvalidGraphError(
            f"the graph has {len(outputs)} output nodes"
            + (f" ({', '.join(n.name for n in outputs)})" if outputs else "")
            + "; a scheduled graph has exactly one"
        )
    streams, events = _Keys(caller), _Keys()
    steps: list[Step] = []
    append = steps.append
    stream_of: dict[Node, int] = {}
    passthrough: dict[Node, Node] = {}
    current = 0
    by_id = classify._by_id
    metadata = dialects.stream_metadata() if classify.detecting else ()
    for node in graph.nodes:
        # The classifier's cache, inlined: this loop runs once per node of every verify.
        if node.op != "call_function":
            reader = None
        else:
            target = node.target
            cached = by_id.get(id(target))
            reader = (
                cached[1] if cached is not None and cached[0] is target else classify.reader(node)
            )
        if reader is None:
            done = None
            if metadata and not classify.annotated:
                for meta in metadata:  # a node annotated with its stream (PyTorch's way)
                    if meta.key in node.meta and meta.annotated(node):
                        classify.annotated = True
        else:
            direct = _DIRECT.get(reader)
            if direct is not None:
                after = direct(node, current, steps, streams, events)
                if after is not None:
                    current = stream_of[node] = after
                    continue
            try:
                done = reader(node)
            except MschedError:
                raise
            except Exception as error:
                raise _unreadable(node, classify.label, error) from error
        if done is None:
            s = current
            if node_stream is not None and node.op not in INPUT_OPS:
                key = _read(node_stream, node, classify.label)
                if key is not None:
                    s = streams.id(key, node, "stream")
            append(new_step(Step, (node, "compute", s, None, None, None)))
            stream_of[node] = s
            continue
        acted = False
        for action in done:
            if isinstance(action, Action) and action.kind == "alias":
                if action.tensor is None:
                    raise InvalidGraphError(
                        f"node {node.name!r} passes through no node", nodes=(node.name,)
                    )
                passthrough[node] = passthrough.get(action.tensor, action.tensor)
                continue
            current = _append(steps, node, action, current, streams, events)
            acted = True
        if not acted:
            steps.append(Step(node, "host", current))
        stream_of[node] = current
    if streams.other or events.other:
        steps, stream_of = _renumbered(steps, stream_of, streams, events)
    highest = streams.highest + len(streams.other)
    stream_keys = {streams.highest - p: key for key, p in streams.other.items()}
    event_keys = {events.highest - p: key for key, p in events.other.items()}
    return StreamProgram(
        tuple(steps), stream_of, highest + 1, outputs[0], passthrough, stream_keys, event_keys
    )


def _append(
    steps: list[Step], node: Node, action: Action, current: int, streams: _Keys, events: _Keys
) -> int:
    """Append the step of ``action`` and return the current stream after it."""
    kind = action.kind if isinstance(action, Action) else None
    if kind not in actions.ACTION_KINDS:
        raise InvalidGraphError(
            f"the dialect read node {node.name!r} as {action!r}, which is no action "
            "(build actions with msched.proof.actions)",
            nodes=(node.name,),
        )
    _, stream, event_key, to_key, tensor = action
    s = current if stream is None else streams.id(stream, node, "stream")
    to = None if to_key is None else streams.id(to_key, node, "stream")
    event = None if event_key is None else events.id(event_key, node, "event")
    if kind == "set_stream":
        if to is None:
            raise InvalidGraphError(f"node {node.name!r} switches to no stream", nodes=(node.name,))
        steps.append(new_step(Step, (node, kind, to, None, to, None)))
        return to
    if kind in ("record_event", "wait_event") and event is None:
        raise InvalidGraphError(
            f"node {node.name!r} reads as a {kind} of no event", nodes=(node.name,)
        )
    if kind in ("wait_stream", "record_stream") and to is None:
        raise InvalidGraphError(
            f"node {node.name!r} reads as a {kind} of no stream", nodes=(node.name,)
        )
    steps.append(new_step(Step, (node, kind, s, event, to, tensor)))
    return current


def _renumbered(
    steps: list[Step], stream_of: dict[Node, int], streams: _Keys, events: _Keys
) -> tuple[list[Step], dict[Node, int]]:
    """The steps with provisional ids moved after the int ids (see `_Keys`)."""
    fs, fe = streams.final, events.final
    out = [
        new_step(Step, (st.node, st.kind, fs(st.stream), fe(st.event), fs(st.to_stream), st.tensor))
        for st in steps
    ]
    return out, {node: streams.highest - s if s < 0 else s for node, s in stream_of.items()}


__all__ = ["interpret"]

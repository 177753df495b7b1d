"""Reading the stream ops of a scheduled graph: dialects and the host-order interpreter.

A `Dialect` maps each node of a graph to actions on the host timeline
(`msched.proof.actions`: switch the current stream, record an event on a stream, wait for an
event, a stream waits for another, record_stream, a host barrier) and may say which stream a
node runs on from its metadata.  `interpret` walks a graph in host order and returns, for every
node, the stream it is issued on and its actions as `Step`s (a `StreamProgram`);
`msched.proof.clocks` turns that program into happens-before, which `msched.verify`, the
executor, the timeline and the pictures read.  No reader looks at a stream op itself.

Built-in dialects (`Dialect.named`): ``msched`` (the default), ``trtllm``, ``torch``
(PyTorch's ``torch.ops.streams``) and ``autodeploy``; `Dialect.from_namespace` reads msched's
four-op shape in any op namespace and `Dialect.define` builds a new one from readers.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch.fx import Graph, GraphModule, Node

from msched import ops
from msched._torch_internals import OpOverload, OpOverloadPacket, qualified_name, schema_of
from msched.analysis.nodes import graph_of
from msched.errors import InvalidArgumentError, InvalidGraphError, MschedError
from msched.limits import MAX_STREAMS
from msched.proof import actions
from msched.proof.actions import Action, Reader
from msched.proof.lookalikes import UnreadStreamOps

FOUR_OPS = ("set_stream", "record_event", "wait_event", "record_stream")
KINDS = FOUR_OPS  # the four-op shape's ops, by name (kept for older imports)


def _qualified_name(target: Any) -> str | None:
    if isinstance(target, OpOverload):
        return str(schema_of(target).name)
    if isinstance(target, OpOverloadPacket):
        return str(qualified_name(target))
    return None


def target_key(target: Any) -> str | None:
    """The name a dialect matches ``target`` by: the qualified name (``ns::op``) of an op,
    the ``__name__`` of a Python function or higher-order op."""
    name = _qualified_name(target)
    if name is not None:
        return name
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) else None


def _read_switch(node: Node) -> tuple[Action, ...]:
    """``set_stream(s)``, or msched's ``set_stream(s, wait_events, record_events)``: a record
    on the current (old) stream for each of ``record_events``, a switch to ``s``, and a wait
    on ``s`` for each of ``wait_events``, each list in order."""
    switch = actions.switch(actions.int_argument(node, 0, "set_stream", "stream"))
    args, kwargs = node.args, node.kwargs
    if len(args) < 2 and not kwargs:
        return (switch,)
    waits = _int_list(node, 1, "wait_events") if len(args) > 1 or "wait_events" in kwargs else []
    if len(args) < 3 and "record_events" not in kwargs:
        return (switch, *map(actions.wait, waits))
    records = _int_list(node, 2, "record_events")
    return (*map(actions.record, records), switch, *map(actions.wait, waits))


def _int_list(node: Node, index: int, name: str) -> list[int]:
    """Argument ``index`` (or keyword ``name``) of ``node``: a list of literal non-negative
    ints (`msched.proof.actions.int_argument` for each)."""
    value = node.args[index] if len(node.args) > index else node.kwargs[name]
    if not isinstance(value, (list, tuple)):
        raise InvalidGraphError(
            f"set_stream node {node.name!r} takes a list of event ids as {name}, got "
            f"{value!r}; event ids must be constants in the graph"
        )
    for event in value:
        if isinstance(event, bool) or not isinstance(event, int) or event < 0:
            raise InvalidGraphError(
                f"set_stream node {node.name!r} {'records' if index == 2 else 'waits for'} "
                f"{event!r}, which is no event id (a literal non-negative int)"
            )
    return list(value)


def _four_op_reader(kind: str) -> Reader:
    if kind == "set_stream":
        return _read_switch
    if kind == "record_event":
        return lambda node: (actions.record(actions.int_argument(node, 0, kind, "event")),)
    if kind == "wait_event":
        return lambda node: (actions.wait(actions.int_argument(node, 0, kind, "event")),)
    return lambda node: (
        actions.record_stream(
            actions.tensor_argument(node), actions.int_argument(node, 1, kind, "stream")
        ),
    )


_FOUR_OP_READERS = {kind: _four_op_reader(kind) for kind in FOUR_OPS}


def _direct_four_op(kind: str) -> Callable[..., int | None]:
    """The steps of a four-op node appended straight away (what its reader and `_append`
    give, without building actions: `interpret` runs once per node of every verify).
    Returns the current stream after the node, or None for arguments that are not plain
    literals, which then take the reader's path (and its error messages)."""

    def direct(
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
            steps.append(_new_step(Step, (node, kind, current, None, args[1], tensor)))
            return current
        if type(first) is not int or first < 0:
            return None
        if kind != "set_stream":
            if len(args) != 1:
                return None
            events.highest = max(events.highest, first)
            steps.append(_new_step(Step, (node, kind, current, first, None, None)))
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
            steps.append(_new_step(Step, (node, "record_event", current, e, None, None)))
        steps.append(_new_step(Step, (node, kind, first, None, first, None)))
        for e in waits:
            steps.append(_new_step(Step, (node, "wait_event", first, e, None, None)))
        return first

    return direct


_DIRECT = {_FOUR_OP_READERS[kind]: _direct_four_op(kind) for kind in FOUR_OPS}


@dataclass(frozen=True)
class Dialect:
    """How one engine encodes stream code.  The default is msched's own four ops.

    The four fields ``set_stream``, ``record_event``, ``wait_event``, ``record_stream`` are
    the four-op shape (each an ``OpOverload``, ``OpOverloadPacket``, callable or ``"ns::op"``
    name; None when the dialect has no such op); an op matches a node whose target is it, or
    an overload of the same qualified name.  ``readers`` are further ops, each with the
    `msched.proof.actions.Reader` that turns one of its nodes into actions; ``node_stream``
    gives the stream key a compute node runs on from its metadata (None: the current
    stream); ``caller_stream`` is the key of the caller's stream (stream 0), a frozenset
    of its keys, or a function of the graph that returns either.  Build new dialects with
    `Dialect.define`; combine two with ``a | b``.
    """

    set_stream: Any = ops.set_stream
    record_event: Any = ops.record_event
    wait_event: Any = ops.wait_event
    record_stream: Any = ops.record_stream
    namespace: str | None = field(default=None, compare=False)
    readers: tuple[tuple[Any, Reader], ...] = ()
    node_stream: Callable[[Node], Hashable | None] | None = None
    caller_stream: Hashable = 0
    name: str | None = field(default=None, compare=False)

    @classmethod
    def from_namespace(cls, namespace: str) -> Dialect:
        """The four-op dialect of ``torch.ops.<namespace>`` (ops matched by name)."""
        if not namespace or not namespace.isidentifier():
            raise InvalidArgumentError(f"not an op namespace: {namespace!r}")
        s, r, w, rs = (f"{namespace}::{k}" for k in FOUR_OPS)
        return cls(
            set_stream=s, record_event=r, wait_event=w, record_stream=rs, namespace=namespace
        )

    @classmethod
    def define(
        cls,
        name: str,
        readers: Mapping[Any, Reader],
        *,
        node_stream: Callable[[Node], Hashable | None] | None = None,
        caller_stream: Hashable = 0,
    ) -> Dialect:
        """A dialect of the given ops: ``readers`` maps each op (an ``OpOverload``,
        ``OpOverloadPacket``, callable or ``"ns::op"`` name) to the function that reads one
        of its nodes as actions (`msched.proof.actions`; a reader that returns None leaves
        that node compute, an empty sequence makes it host-only).  A node whose op is not in
        ``readers`` is compute, on ``node_stream(node)`` when that gives a key, else on the
        current stream.  See README "Checking other engines' graphs".
        """
        if not readers:
            raise InvalidArgumentError(f"dialect {name!r} needs at least one op in readers")
        for op, reader in readers.items():
            if not callable(reader):
                raise InvalidArgumentError(f"the reader of {op!r} is not callable: {reader!r}")
        return cls(
            None,
            None,
            None,
            None,
            readers=tuple(readers.items()),
            node_stream=node_stream,
            caller_stream=caller_stream,
            name=name,
        )

    @classmethod
    def named(cls, name: str, **options: Any) -> Dialect:
        """A built-in dialect: ``"msched"``, ``"trtllm"``, ``"torch"`` (options:
        ``caller_stream=<table index>``) or ``"autodeploy"``.  Raises
        `msched.InvalidArgumentError` for other names, listing the known ones."""
        from msched.proof import engines

        return engines.named(name, **options)

    @classmethod
    def detect(cls, gm: GraphModule | Graph) -> Dialect:
        """The dialect whose stream ops ``gm`` contains (msched's when it has none).

        Built-in dialects are recognised by their ops; other namespaces by four-op names
        (``ns::set_stream``, ``ns::record_event``, ``ns::wait_event``, ``ns::record_stream``;
        ``aten`` is no dialect).  PyTorch's or AutoDeploy's ops in one graph with a four-op
        dialect's are read as one program; two four-op dialects in one graph are an
        `msched.InvalidGraphError` naming both.
        """
        return detect_dialect(gm)

    def __or__(self, other: Dialect) -> Dialect:
        """One dialect reading the ops of both (PyTorch's streams ops mixed with a four-op
        dialect's, as TensorRT-LLM graphs do).  ``node_stream`` and ``caller_stream`` are
        ``self``'s unless only ``other`` defines a ``node_stream``."""
        if not isinstance(other, Dialect):
            return NotImplemented
        four = self if self.set_stream is not None else other
        meta = self if self.node_stream is not None or other.node_stream is None else other
        return Dialect(
            four.set_stream,
            four.record_event,
            four.wait_event,
            four.record_stream,
            namespace=four.namespace,
            readers=self.readers + other.readers,
            node_stream=meta.node_stream,
            caller_stream=meta.caller_stream,
            name="+".join(n for n in (self.label, other.label) if n),
        )

    @property
    def label(self) -> str:
        """The dialect's name for messages (its namespace for a four-op dialect)."""
        return self.name or self.own_namespace() or "given"

    def _table(self) -> dict[Any, Reader]:
        table: dict[Any, Reader] = {}
        entries = [(getattr(self, k), _FOUR_OP_READERS[k]) for k in FOUR_OPS]
        for op, reader in [*entries, *self.readers]:
            if op is None:
                continue
            if _hashable(op):
                table[op] = reader
            name = op if isinstance(op, str) else _qualified_name(op)
            if name is not None:
                table[name] = reader
        return table

    def own_namespace(self) -> str | None:
        if self.namespace is not None:
            return self.namespace
        name = _qualified_name(self.set_stream)
        return name.split("::")[0] if name else None


def builtin_dialects() -> dict[str, Dialect]:
    """The dialects known by name, with default options (`Dialect.named`)."""
    from msched.proof import engines

    return engines.builtin()


def as_dialect(dialect: object) -> Dialect:
    """The `Dialect` that ``dialect`` names: a Dialect, None (msched's), a built-in name
    (`Dialect.named`) or the name of a registered op namespace that defines
    ``set_stream`` and ``wait_event`` (`Dialect.from_namespace`).

    Raises `msched.InvalidArgumentError` for an unknown name, listing the known ones, and
    for any other type.
    """
    if dialect is None:
        return Dialect()
    if isinstance(dialect, Dialect):
        return dialect
    if not isinstance(dialect, str):
        raise InvalidArgumentError(
            f"dialect must be a msched.Dialect, a dialect name or None, got "
            f"{type(dialect).__name__}"
        )
    known = builtin_dialects()
    if dialect in known:
        return known[dialect]
    if _defines_stream_ops(dialect):
        return Dialect.from_namespace(dialect)
    raise InvalidArgumentError(
        f"unknown dialect {dialect!r}: known dialects are {', '.join(map(repr, known))}, or "
        "the name of an op namespace that defines set_stream and wait_event; pass "
        "msched.Dialect(...) for stream ops named otherwise"
    )


# Namespaces whose ops named like stream ops are not a scheduler's (``aten::record_stream`` is
# PyTorch's ``Tensor.record_stream``).
_NOT_DIALECTS = frozenset({"aten", "prim", "prims"})


def _foreign_namespace(target: Any) -> tuple[str, str] | None:
    """``(dialect or namespace, op name)`` when ``target`` is a stream op of some dialect:
    a built-in dialect's op, or an op named like a four-op stream op in another namespace."""
    from msched.proof import engines

    builtin = engines.builtin_op(target)
    if builtin is not None:
        return builtin
    namespace, _, name = (_qualified_name(target) or "").partition("::")
    if name in FOUR_OPS and namespace not in _NOT_DIALECTS:
        return namespace, name
    return None


def detect_dialect(gm: GraphModule | Graph) -> Dialect:
    """`Dialect.detect`: one pass over the graph's call targets."""
    from msched.proof import engines

    graph = graph_of(gm)
    found: dict[str, list[str]] = {}
    seen: set[int] = set()
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or id(target) in seen:
            continue
        seen.add(id(target))
        hit = _foreign_namespace(target)
        if hit is not None:
            found.setdefault(hit[0], []).append(hit[1])
    four = {ns: k for ns, k in found.items() if not engines.is_action_dialect(ns)}
    if len(four) > 1:
        shown = "; ".join(f"{ns} ({', '.join(sorted(set(k)))})" for ns, k in sorted(four.items()))
        raise InvalidGraphError(
            f"the graph mixes the stream ops of {len(four)} dialects: {shown}; a scheduled "
            "graph uses one (pass dialect=... to read it in one of them)"
        )
    if "torch" not in found and streams_in_metadata(graph):
        found["torch"] = ["meta['custom']['stream']"]
    known = builtin_dialects()
    order = sorted(found, key=_action_first)
    chosen = [known.get(ns) or Dialect.from_namespace(ns) for ns in order]
    if not chosen:
        return Dialect()
    result = chosen[0]
    for more in chosen[1:]:
        result = result | more
    return result


CALLER_META = "msched_caller_stream"  # GraphModule.meta: the caller stream's table indices


def describe_key(key: Hashable, what: str) -> str:
    """How a report names the dialect key behind stream or event ``what`` (``"stream"``)."""
    if isinstance(key, tuple) and len(key) == 2 and key[0] == "torch":
        return f"PyTorch {what} table index {key[1]}"
    if isinstance(key, tuple) and len(key) == 2 and key[0] == "autodeploy":
        return f"AutoDeploy {what} {key[1]!r}"
    return repr(key)


def streams_in_metadata(graph: Graph) -> bool:
    """Whether ``graph`` says where its nodes run in PyTorch's way (a graph from
    `msched.trace_streams`, or a node with ``meta["custom"]["stream"]``): then it is read in
    the ``torch`` dialect even without a stream op (an AOT graph whose side stream never
    waits has none)."""
    return _traced(graph) or any(_annotated(node) for node in graph.nodes)


def _traced(graph: Graph) -> bool:
    """Whether ``graph`` is of a module `msched.trace_streams` returned."""
    module = graph.owning_module
    return module is not None and CALLER_META in getattr(module, "meta", {})


def _annotated(node: Node) -> bool:
    """Whether ``node`` runs on a stream PyTorch's annotations name."""
    custom = node.meta.get("custom")
    return (
        bool(custom) and isinstance(custom, dict) and "stream" in custom and node.op not in _INPUTS
    )


def _action_first(namespace: str) -> tuple[bool, str]:
    from msched.proof import engines

    return (not engines.is_action_dialect(namespace), namespace)


def _defines_stream_ops(namespace: str) -> bool:
    """Whether ``torch.ops.<namespace>`` defines ``set_stream`` and ``wait_event`` (the least
    a scheduler's stream ops need; ``aten`` has a ``record_stream`` but is no dialect)."""
    if not namespace.isidentifier() or namespace.startswith("_"):
        return False
    ops_of = getattr(torch.ops, namespace)
    return all(hasattr(ops_of, kind) for kind in ("set_stream", "wait_event"))


class Step(NamedTuple):
    """One action in host order: its kind (one of `msched.proof.actions.KINDS`,
    ``"compute"`` for a node that runs work, ``"host"`` for a stream op that does nothing
    on a stream), the stream it acts on, and what it names.

    ``event`` is the event of a ``record_event`` / ``wait_event`` / ``synchronize``;
    ``to_stream`` the stream a ``set_stream`` switches to (equal to ``stream``), a
    ``wait_stream`` waits for, a ``record_stream`` marks ``tensor`` as used on, or a
    ``synchronize`` waits for.  Fields a kind does not use are None.  A node has one step per
    action (a stream op that switches and waits has two or more), compute nodes one.

    Immutable; a named tuple rather than a dataclass because a graph has one per node and
    `msched.verify` must stay cheaper than copying the graph.
    """

    node: Node
    kind: str
    stream: int
    event: int | None = None
    to_stream: int | None = None
    tensor: Node | None = None


# ``Step(...)`` runs NamedTuple's Python-level __new__; `interpret` makes one step per node and
# tuple.__new__ builds the same object at half the cost (verify must stay cheap).
_new_step = tuple.__new__


@dataclass(frozen=True)
class StreamProgram:
    """A graph read in host order: its steps, the stream of every node (a stream op's: the
    current stream after it), the number of streams, the output node, and the stream ops
    whose value is one of their inputs (``passthrough[node]``, `msched.proof.actions.passes`).
    ``stream_keys`` / ``event_keys`` say which dialect key each numbered stream or event
    stands for, where it is not the int id itself (a PyTorch table index, a name).
    """

    steps: tuple[Step, ...]
    stream_of: dict[Node, int]
    num_streams: int
    output: Node
    passthrough: dict[Node, Node] = field(default_factory=dict)
    stream_keys: dict[int, Hashable] = field(default_factory=dict)
    event_keys: dict[int, Hashable] = field(default_factory=dict)

    @property
    def compute_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.kind == "compute")

    @property
    def num_waits(self) -> int:
        """Wait actions (``wait_event`` and ``wait_stream``), wherever they sit."""
        return sum(1 for s in self.steps if s.kind in ("wait_event", "wait_stream"))


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
        reader = self.table.get(target) if _hashable(target) else None
        if reader is not None:
            return reader
        name = target_key(target)
        if name is not None and name in self.table:
            return self.table[name]
        foreign = _foreign_namespace(target)
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
            "if that is intended)"
        )


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def interpret(gm: GraphModule | Graph, dialect: Dialect | str | None = None) -> StreamProgram:
    """Read ``gm`` in host order: the stream of every node and what every stream op does.

    ``dialect`` is anything `as_dialect` accepts; None reads msched's stream ops, or the
    dialect of the graph's stream ops when they are another's (`Dialect.detect`).  A reader
    that returns None for a node leaves it compute.  Raises
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
        if classify.foreign is None and not classify.annotated and not _traced(graph):
            classify.unread.check(graph, "msched (detected)")
            return program
        dialect = detect_dialect(graph)
    chosen = as_dialect(dialect)
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
                    "msched.limits)"
                )
            if key < 0:
                raise InvalidGraphError(f"node {node.name!r} has a negative {what} id {key}")
            if key > self.highest:
                self.highest = key
            return key
        if isinstance(key, bool) or not _hashable(key):
            raise InvalidGraphError(
                f"node {node.name!r} names the {what} {key!r}: a stream or event is an int or "
                "another hashable key"
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
        f"the {label} dialect cannot read node {node.name!r}: {type(error).__name__}: {error}"
    )


def _op_label(node: Node) -> str:
    name = _qualified_name(node.target)
    return name.split("::")[-1] if name else str(node.target)


def _interpret(
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
    detecting = classify.detecting
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
            if detecting and "custom" in node.meta and not classify.annotated:
                classify.annotated = _annotated(node)
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
            if node_stream is not None and node.op not in _INPUTS:
                key = _read(node_stream, node, classify.label)
                if key is not None:
                    s = streams.id(key, node, "stream")
            append(_new_step(Step, (node, "compute", s, None, None, None)))
            stream_of[node] = s
            continue
        acted = False
        for action in done:
            if isinstance(action, Action) and action.kind == "alias":
                if action.tensor is None:
                    raise InvalidGraphError(f"node {node.name!r} passes through no node")
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


_INPUTS = frozenset({"placeholder", "get_attr"})


def _append(
    steps: list[Step], node: Node, action: Action, current: int, streams: _Keys, events: _Keys
) -> int:
    """Append the step of ``action`` and return the current stream after it."""
    kind = action.kind if isinstance(action, Action) else None
    if kind not in actions.KINDS:
        raise InvalidGraphError(
            f"the dialect read node {node.name!r} as {action!r}, which is no action "
            "(build actions with msched.proof.actions)"
        )
    _, stream, event_key, to_key, tensor = action
    s = current if stream is None else streams.id(stream, node, "stream")
    to = None if to_key is None else streams.id(to_key, node, "stream")
    event = None if event_key is None else events.id(event_key, node, "event")
    if kind == "set_stream":
        if to is None:
            raise InvalidGraphError(f"node {node.name!r} switches to no stream")
        steps.append(_new_step(Step, (node, kind, to, None, to, None)))
        return to
    if kind in ("record_event", "wait_event") and event is None:
        raise InvalidGraphError(f"node {node.name!r} reads as a {kind} of no event")
    if kind in ("wait_stream", "record_stream") and to is None:
        raise InvalidGraphError(f"node {node.name!r} reads as a {kind} of no stream")
    steps.append(_new_step(Step, (node, kind, s, event, to, tensor)))
    return current


def _renumbered(
    steps: list[Step], stream_of: dict[Node, int], streams: _Keys, events: _Keys
) -> tuple[list[Step], dict[Node, int]]:
    """The steps with provisional ids moved after the int ids (see `_Keys`)."""
    fs, fe = streams.final, events.final
    out = [
        _new_step(
            Step, (st.node, st.kind, fs(st.stream), fe(st.event), fs(st.to_stream), st.tensor)
        )
        for st in steps
    ]
    return out, {node: streams.highest - s if s < 0 else s for node, s in stream_of.items()}

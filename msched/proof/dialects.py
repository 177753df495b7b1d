"""Reading the stream ops of a scheduled graph: dialects and the host-order interpreter.

A `Dialect` says which ops mean set_stream / record_event / wait_event / record_stream, so
graphs rebuilt by another engine's scheduler can be read too.  `interpret` walks a scheduled
graph in host order and returns, for every node, the stream it is issued on and what each
stream op does (a `StreamProgram` of `Step`s).  `msched.proof.clocks` turns that program into
happens-before, which `msched.verify`, the executor, the timeline and the pictures read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch.fx import Graph, GraphModule, Node

from msched import ops
from msched.analysis.nodes import graph_of
from msched.errors import InvalidArgumentError, InvalidGraphError
from msched.limits import MAX_STREAMS

KINDS = ("set_stream", "record_event", "wait_event", "record_stream")


def _qualified_name(target: Any) -> str | None:
    if isinstance(target, torch._ops.OpOverload):
        return str(target._schema.name)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return str(target._qualified_op_name)
    return None


@dataclass(frozen=True)
class Dialect:
    """The four stream ops of one scheduler.  The default is msched's own ops.

    Ops may be ``OpOverload``s, ``OpOverloadPacket``s or any callables; an op matches a node
    whose target is it, or whose target is an overload of the same qualified op name.
    """

    set_stream: Any = ops.set_stream
    record_event: Any = ops.record_event
    wait_event: Any = ops.wait_event
    record_stream: Any = ops.record_stream
    namespace: str | None = field(default=None, compare=False)

    @classmethod
    def from_namespace(cls, namespace: str) -> Dialect:
        """The dialect of ``torch.ops.<namespace>``; its ops are looked up on first use."""
        if not namespace or not namespace.isidentifier():
            raise InvalidArgumentError(f"not an op namespace: {namespace!r}")
        s, r, w, rs = (f"{namespace}::{k}" for k in KINDS)
        return cls(
            set_stream=s, record_event=r, wait_event=w, record_stream=rs, namespace=namespace
        )

    @classmethod
    def detect(cls, gm: GraphModule | Graph) -> Dialect:
        """The dialect whose stream ops ``gm`` contains (msched's when it has none).

        Stream ops are recognised by name (``ns::set_stream``, ``ns::record_event``,
        ``ns::wait_event``, ``ns::record_stream``); ``aten`` is no dialect.  Stream ops of two
        namespaces in one graph are an `msched.InvalidGraphError` naming both.
        """
        return detect_dialect(gm)

    def _table(self) -> dict[Any, str]:
        table: dict[Any, str] = {}
        for kind in KINDS:
            op = getattr(self, kind)
            table[op] = kind
            name = op if isinstance(op, str) else _qualified_name(op)
            if name is not None:
                table[name] = kind
        return table

    def own_namespace(self) -> str | None:
        if self.namespace is not None:
            return self.namespace
        name = _qualified_name(self.set_stream)
        return name.split("::")[0] if name else None


def builtin_dialects() -> dict[str, Dialect]:
    """The dialects known by name: ``msched`` (``torch.ops.msched.*``, the default) and
    ``trtllm`` (``torch.ops.trtllm.{set_stream, record_event, wait_event, record_stream}``,
    matched by name, so the ops need not be registered to read a graph without them)."""
    return {"msched": Dialect(), "trtllm": Dialect.from_namespace("trtllm")}


def as_dialect(dialect: object) -> Dialect:
    """The `Dialect` that ``dialect`` names: a Dialect, None (msched's), a built-in name
    (`builtin_dialects`) or the name of a registered op namespace that defines
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


def detect_dialect(gm: GraphModule | Graph) -> Dialect:
    """`Dialect.detect`: one pass over the graph's call targets."""
    graph = graph_of(gm)
    found: dict[str, list[str]] = {}
    seen: set[int] = set()
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or id(target) in seen:
            continue
        seen.add(id(target))
        namespace, _, name = (_qualified_name(target) or "").partition("::")
        if name in KINDS and namespace not in _NOT_DIALECTS:
            found.setdefault(namespace, []).append(name)
    if len(found) > 1:
        shown = "; ".join(f"{ns} ({', '.join(sorted(set(k)))})" for ns, k in sorted(found.items()))
        raise InvalidGraphError(
            f"the graph mixes the stream ops of {len(found)} dialects: {shown}; a scheduled "
            "graph uses one (pass dialect=... to read it in one of them)"
        )
    if not found:
        return Dialect()
    namespace = next(iter(found))
    return builtin_dialects().get(namespace) or Dialect.from_namespace(namespace)


def _defines_stream_ops(namespace: str) -> bool:
    """Whether ``torch.ops.<namespace>`` defines ``set_stream`` and ``wait_event`` (the least
    a scheduler's stream ops need; ``aten`` has a ``record_stream`` but is no dialect)."""
    if not namespace.isidentifier() or namespace.startswith("_"):
        return False
    ops_of = getattr(torch.ops, namespace)
    return all(hasattr(ops_of, kind) for kind in ("set_stream", "wait_event"))


class Step(NamedTuple):
    """One node in host order: its stream-op kind (one of `KINDS`, or ``"compute"``), the
    stream it is issued on, and what the stream op names.

    ``event`` is the event of a ``record_event`` / ``wait_event``; ``to_stream`` the stream a
    ``set_stream`` switches to (equal to ``stream``) or the stream a ``record_stream`` marks
    ``tensor`` as used on.  Fields a kind does not use are None.

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
    """A scheduled graph read in host order."""

    steps: tuple[Step, ...]
    stream_of: dict[Node, int]
    num_streams: int
    output: Node

    @property
    def compute_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.kind == "compute")


class _Classifier:
    def __init__(self, dialect: Dialect, detecting: bool = False) -> None:
        # With ``detecting``, another dialect's stream op is noted in ``foreign`` (the graph is
        # then read again in the detected dialect) instead of being an error.
        self.detecting = detecting
        self.foreign: str | None = None
        self.table = dialect._table()
        self.namespace = dialect.own_namespace()
        # id(target) -> (target, kind): hashing an OpOverload runs Python code, id() does not.
        self._by_id: dict[int, tuple[Any, str | None]] = {}

    def kind(self, node: Node) -> str | None:
        if node.op != "call_function":
            return None
        target = node.target
        cached = self._by_id.get(id(target))
        if cached is not None and cached[0] is target:
            return cached[1]
        kind = self._kind(node, target)
        self._by_id[id(target)] = (target, kind)
        return kind

    def _kind(self, node: Node, target: Any) -> str | None:
        kind = self.table.get(target) if _hashable(target) else None
        if kind is not None:
            return kind
        name = _qualified_name(target)
        if name is None:
            return None
        kind = self.table.get(name)
        if kind is None and name.split("::")[-1] in KINDS:
            theirs = name.split("::")[0]
            if self.detecting and theirs not in _NOT_DIALECTS:
                self.foreign = theirs
                return None
            raise InvalidGraphError(
                f"node {node.name!r} is the stream op {name} but the graph is read in the "
                f"{self.namespace or 'given'} dialect: stream ops of two dialects are mixed "
                f"(pass dialect=msched.Dialect.from_namespace({theirs!r}) if that is intended)"
            )
        return kind


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def _int_arg(node: Node, kind: str, index: int = 0) -> int:
    args = node.args
    if node.kwargs:
        args = tuple(args) + tuple(node.kwargs.values())
    if len(args) <= index:
        raise InvalidGraphError(f"{kind} node {node.name!r} has no argument {index}")
    value = args[index]
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidGraphError(
            f"{kind} node {node.name!r} takes a literal int, got {value!r}; stream and event "
            "ids must be constants in the graph"
        )
    if value < 0:
        raise InvalidGraphError(f"{kind} node {node.name!r} has a negative id {value}")
    return value


def _stream_arg(node: Node, kind: str, index: int = 0) -> int:
    """A stream id argument: a literal int below `msched.MAX_STREAMS`."""
    stream = _int_arg(node, kind, index)
    if stream >= MAX_STREAMS:
        raise InvalidGraphError(
            f"{kind} node {node.name!r} names stream {stream}, but stream ids are "
            f"0..{MAX_STREAMS - 1} (msched.MAX_STREAMS = {MAX_STREAMS}, see msched.limits)"
        )
    return stream


def _tensor_arg(node: Node) -> Node | None:
    """The tensor a ``record_stream`` node marks (None when it is not a node of the graph)."""
    tensor = node.args[0] if node.args else node.kwargs.get("t")
    return tensor if isinstance(tensor, Node) else None


def interpret(gm: GraphModule | Graph, dialect: Dialect | str | None = None) -> StreamProgram:
    """Read ``gm`` in host order: the stream of every node and what every stream op does.

    ``dialect`` is anything `as_dialect` accepts; None reads msched's stream ops, or the
    dialect of the graph's stream ops when they are another's (`Dialect.detect`).  Raises
    `InvalidGraphError` for graphs that cannot be read: no output or several, a stream or
    event id that is not a non-negative int literal, a stream id of `msched.MAX_STREAMS` or
    more, stream ops of two dialects.
    """
    graph = graph_of(gm)
    if dialect is None:
        classify = _Classifier(Dialect(), detecting=True)
        program = _interpret(graph, classify)
        if classify.foreign is None:
            return program
        dialect = detect_dialect(graph)
    return _interpret(graph, _Classifier(as_dialect(dialect)))


def _interpret(graph: Graph, classify: _Classifier) -> StreamProgram:
    outputs = [n for n in graph.nodes if n.op == "output"]
    if len(outputs) != 1:
        raise InvalidGraphError(
            f"the graph has {len(outputs)} output nodes"
            + (f" ({', '.join(n.name for n in outputs)})" if outputs else "")
            + "; a scheduled graph has exactly one"
        )
    steps: list[Step] = []
    stream_of: dict[Node, int] = {}
    current, highest = 0, 0
    for node in graph.nodes:
        kind = classify.kind(node)
        if kind is None:
            steps.append(_new_step(Step, (node, "compute", current, None, None, None)))
        elif kind == "set_stream":
            current = _stream_arg(node, kind)
            highest = max(highest, current)
            steps.append(Step(node, kind, current, to_stream=current))
        elif kind == "record_stream":
            to_stream = _stream_arg(node, kind, 1)
            highest = max(highest, to_stream)
            steps.append(Step(node, kind, current, to_stream=to_stream, tensor=_tensor_arg(node)))
        else:  # record_event, wait_event
            steps.append(Step(node, kind, current, event=_int_arg(node, kind)))
        stream_of[node] = current
    return StreamProgram(tuple(steps), stream_of, highest + 1, outputs[0])

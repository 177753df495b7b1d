"""Ops that look like stream ops but that the dialect a graph is read in does not read.

A graph read in the wrong dialect is worse than unreadable: its stream ops become compute
nodes that order nothing, so the graph reads as one stream without a race and `msched.verify`
would say "ok".  `interpret` therefore asks `stream_look` about every op its dialect does not
read, and `UnreadStreamOps` gathers the ones that look like stream ops into
`msched.errors.UnreadStreamOpsError`, which names them and says how to give the dialect (in
the words of the tool that reads the graph: `msched.errors.dialect_hint`).

An op looks like a stream op (`stream_look`) when it is a torch op outside ``aten``/``prim``
and

1. **by itself**: a word of its name is ``stream(s)`` or ``event(s)`` (``set_stream``,
   ``record_event``), its name is ``synchronize``/``sync``/``fork``/``join``/``barrier``
   (or starts with ``synchronize_``), or one of its schema's arguments is named like a
   stream or event (``int stream``, ``str event_name``) or has the type ``Stream``/``Event``;
2. **by its namespace**: a word of its name is one of `WEAK_WORDS` (``record``, ``wait``,
   ``switch``, ``join``, ...) and its namespace has an op of kind 1 (in the graph, or
   registered with the dispatcher): ``myeng::wait(str name)`` next to
   ``myeng::join(int stream)``.

An op that is no stream op is read as compute by a dialect that maps it to a reader
returning None: ``msched.Dialect() | msched.Dialect.define("mine", {op: lambda node: None})``.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

import torch
from torch.fx import Graph, Node

from msched._torch_internals import (
    OpOverload,
    OpOverloadPacket,
    qualified_name,
    registered_op_names,
    schema_of,
)
from msched.errors import UnreadStreamOpsError, current_dialect_hint

STRONG_WORDS = frozenset({"stream", "streams", "event", "events"})
STRONG_NAMES = frozenset({"synchronize", "sync", "fork", "join", "barrier"})
WEAK_WORDS = frozenset(
    {"record", "wait", "switch", "signal", "sync", "join", "fork", "barrier", "fence", "notify"}
)
_TYPES = ("Stream", "Event")
# Namespaces whose stream-like ops are PyTorch's own tensor ops, not a scheduler's
# (``aten::record_stream`` is ``Tensor.record_stream``).
NOT_SCHEDULERS = frozenset({"aten", "prim", "prims"})
_SHOWN_NODES = 3  # node names listed per op in the error


def _op_name(target: Any) -> str | None:
    if isinstance(target, OpOverload):
        return str(schema_of(target).name)
    if isinstance(target, OpOverloadPacket):
        return qualified_name(target)
    return None


def _words(name: str) -> list[str]:
    return [w for w in name.lower().split("_") if w]


def _schema_looks(target: Any) -> bool:
    """Whether an argument of the op's schema is named or typed like a stream or event."""
    schema = schema_of(target) if isinstance(target, OpOverload) else None
    if schema is None and isinstance(target, OpOverloadPacket):
        overloads = [getattr(target, o) for o in target.overloads()]
        return any(_schema_looks(o) for o in overloads)
    if schema is None:
        return False
    for argument in schema.arguments:
        if STRONG_WORDS.intersection(_words(argument.name)):
            return True
        if any(t in str(argument.type) for t in _TYPES):
            return True
    return False


def _strong(name: str, target: Any) -> bool:
    words = _words(name)
    bare = name.strip("_").lower()
    if STRONG_WORDS.intersection(words) or bare in STRONG_NAMES:
        return True
    return bare.startswith("synchronize_") or _schema_looks(target)


def stream_look(target: Any) -> tuple[str, bool] | None:
    """``(qualified name, strong)`` when ``target`` is a torch op that may be a stream op:
    ``strong`` when it looks like one by itself (kind 1 of the module docstring), not
    strong when only its namespace can tell (kind 2); None for any other target."""
    qualified = _op_name(target)
    if qualified is None:
        return None
    namespace, _, name = qualified.partition("::")
    if namespace in NOT_SCHEDULERS:
        return None
    if _strong(name, target):
        return qualified, True
    if WEAK_WORDS.intersection(_words(name)):
        return qualified, False
    return None


@cache
def _registered_strong(namespace: str) -> bool:
    """Whether the dispatcher knows an op of ``namespace`` that looks like a stream op by
    itself (cached: an engine registers its ops when it is imported, before its graphs)."""
    prefix = f"{namespace}::"
    for full in registered_op_names():
        if not full.startswith(prefix):
            continue
        op_name, _, overload = full[len(prefix) :].partition(".")
        packet = getattr(getattr(torch.ops, namespace), op_name, None)
        target = getattr(packet, overload or "default", packet)
        if _strong(op_name, target):
            return True
    return False


class UnreadStreamOps:
    """The stream-looking ops a dialect left unread while a graph was interpreted."""

    def __init__(self) -> None:
        self.ops: dict[str, bool] = {}  # qualified name -> strong

    def note(self, target: Any) -> None:
        """Called with every op target the dialect does not read (once per target)."""
        look = stream_look(target)
        if look is not None:
            self.ops[look[0]] = self.ops.get(look[0], False) or look[1]

    def check(self, graph: Graph, dialect_label: str) -> None:
        """Raise `UnreadStreamOpsError` when a noted op is a stream op by the rules above."""
        if not self.ops:
            return
        strong_spaces = {name.partition("::")[0] for name, strong in self.ops.items() if strong}
        found = sorted(
            name
            for name, strong in self.ops.items()
            if strong or _namespace_has_stream_ops(name.partition("::")[0], strong_spaces)
        )
        if found:
            raise unread_error(graph, found, dialect_label)


def _namespace_has_stream_ops(namespace: str, in_graph: set[str]) -> bool:
    return namespace in in_graph or _registered_strong(namespace)


def _nodes_of(graph: Graph, op: str) -> list[Node]:
    return [n for n in graph.nodes if n.op == "call_function" and _op_name(n.target) == op]


def _listed(nodes: Iterable[Node]) -> str:
    names = [n.name for n in nodes]
    more = len(names) - _SHOWN_NODES
    shown = ", ".join(names[:_SHOWN_NODES])
    return shown + (f", +{more} more" if more > 0 else "")


def unread_error(graph: Graph, ops: list[str], dialect_label: str) -> UnreadStreamOpsError:
    """The error for stream-looking ``ops`` of ``graph`` that ``dialect_label`` leaves unread."""
    by_op = {op: _nodes_of(graph, op) for op in ops}
    nodes = tuple(n.name for op in ops for n in by_op[op])
    shown = "; ".join(f"{op} ({_listed(by_op[op])})" for op in ops)
    namespaces = sorted({op.partition("::")[0] for op in ops})
    hint = current_dialect_hint()
    message = (
        f"the graph has ops that look like stream ops but the {dialect_label} dialect does not "
        f"read them: {shown}. Read as compute they order nothing, and any verdict on the "
        f"graph would be wrong. Give the dialect of these ops: {hint} "
        f"(msched.Dialect.from_namespace({namespaces[0]!r}) reads msched's four-op shape, "
        "msched.Dialect.define(name, {op: reader, ...}) any other; docs/dialects.md). An op "
        "that is no stream op: read it as compute with a reader that returns None."
    )
    return UnreadStreamOpsError(message, nodes=nodes, ops=tuple(ops), hint=hint)


__all__ = ["STRONG_WORDS", "WEAK_WORDS", "UnreadStreamOps", "stream_look", "unread_error"]

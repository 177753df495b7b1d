"""Dialects: how one engine encodes stream code, the built-in ones by name, and detection.

A `Dialect` maps each node of a graph to actions on the host timeline
(`msched.proof.actions`: switch the current stream, record an event on a stream, wait for an
event, a stream waits for another, record_stream, a host barrier) and may say which stream a
node runs on from its metadata.  Its four fields ``set_stream``, ``record_event``,
``wait_event``, ``record_stream`` are the four-op shape (msched's own ops by default, any
namespace's with `Dialect.from_namespace`), read by the readers of this module; further ops
come with their own readers (`Dialect.define`).

Each built-in dialect registers itself here when its module loads (`register`): msched's and
TensorRT-LLM's four-op dialects at the end of this module, ``torch`` in
`msched.proof.torch_streams`, ``autodeploy`` in `msched.proof.autodeploy_streams`
(`msched.proof` imports both).  A registration says how to make the dialect (`Dialect.named`),
whether its ops may share a graph with a four-op dialect's, how a report names its stream and
event keys, and, for a dialect that says where nodes run in their metadata, how to see that
(`StreamMetadata`).  `detect_dialect` (`Dialect.detect`) and `as_dialect` read the
registrations.  The built-in dialects:

- ``msched``: ``msched::set_stream(int, int[] wait_events=[], int[] record_events=[])`` (the
  records on the old stream, the switch, then the waits), ``record_event(int)``,
  ``wait_event(int)``, ``record_stream(Tensor, int)``; stream ids as written, 0 the caller's;
  records and waits on the current stream.
- ``trtllm``: the same four ops in the ``trtllm`` namespace.
- ``torch``: ``streams::fork/join/record_event/wait_event/wait_stream/record_stream/
  sync_dealloc/synchronize_*`` with indices into Dynamo's table of streams and events; a node
  runs on ``meta["custom"]["stream"]``, else on the caller's stream
  (`msched.proof.torch_streams`).
- ``autodeploy``: ``auto_deploy::record_event(int device, str name)``,
  ``wait_event(device, name)`` and the passthrough functions ``record_event_passthrough``,
  ``begin_aux_stream_passthrough``, ``end_aux_stream_passthrough``,
  ``wait_aux_stream_passthrough``; one event per name, re-recorded; ``begin`` switches to
  the ``aux`` stream, ``end`` back to the caller's.

Ops are matched by qualified name (``ns::op``) and Python functions by ``__name__``, so a graph
can be read without the engine installed.  The mark of a graph msched made (`mark_made`,
`made_in`, `MADE_META`) lives here too; `msched.proof.interpreter.interpret` reads a graph in
a dialect.

The type and its registry share this module so that ``Dialect.named`` and ``Dialect.detect``
reach the registry without an import cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from msched import ops
from msched._torch_internals import OpOverload, OpOverloadPacket, qualified_name, schema_of
from msched.analysis.nodes import graph_of
from msched.errors import InvalidArgumentError, InvalidGraphError
from msched.proof import actions
from msched.proof.actions import Action, Reader

FOUR_OPS = ("set_stream", "record_event", "wait_event", "record_stream")


def qualified_op_name(target: Any) -> str | None:
    """``ns::op`` for an ``OpOverload`` or ``OpOverloadPacket``; None for anything else."""
    if isinstance(target, OpOverload):
        return str(schema_of(target).name)
    if isinstance(target, OpOverloadPacket):
        return str(qualified_name(target))
    return None


def target_key(target: Any) -> str | None:
    """The name a dialect matches ``target`` by: the qualified name (``ns::op``) of an op,
    the ``__name__`` of a Python function or higher-order op."""
    name = qualified_op_name(target)
    if name is not None:
        return name
    name = getattr(target, "__name__", None)
    return name if isinstance(name, str) else None


def is_hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


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
            f"{value!r}; event ids must be constants in the graph",
            nodes=(node.name,),
        )
    for event in value:
        if not actions.is_literal_id(event):
            raise InvalidGraphError(
                f"set_stream node {node.name!r} {'records' if index == 2 else 'waits for'} "
                f"{event!r}, which is no event id (a literal non-negative int)",
                nodes=(node.name,),
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


FOUR_OP_READERS = {kind: _four_op_reader(kind) for kind in FOUR_OPS}
"""The reader of each op of the four-op shape, by field name."""


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
        current stream.  See docs/dialects.md.
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
        return named(name, **options)

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
        entries = [(getattr(self, k), FOUR_OP_READERS[k]) for k in FOUR_OPS]
        for op, reader in [*entries, *self.readers]:
            if op is None:
                continue
            if is_hashable(op):
                table[op] = reader
            name = op if isinstance(op, str) else qualified_op_name(op)
            if name is not None:
                table[name] = reader
        return table

    def own_namespace(self) -> str | None:
        if self.namespace is not None:
            return self.namespace
        name = qualified_op_name(self.set_stream)
        return name.split("::")[0] if name else None


@dataclass(frozen=True)
class StreamMetadata:
    """How a dialect says where nodes run without a stream op: a node whose ``meta`` has
    ``key`` may name its stream (``annotated(node)`` says whether it does), and ``marked(graph)``
    says whether the graph's module declares itself the dialect's; ``shown`` names the
    annotation in messages."""

    key: str
    annotated: Callable[[Node], bool]
    marked: Callable[[Graph], bool]
    shown: str


@dataclass(frozen=True)
class _Registration:
    make: Callable[..., Dialect]
    takes_options: bool
    mixes: bool
    describe_key: Callable[[Hashable, str], str | None] | None
    metadata: StreamMetadata | None


#: ``GraphModule.meta`` key: the dialect msched made the graph in (`mark_made`).
MADE_META = "msched_dialect"

_REGISTERED: dict[str, _Registration] = {}
_OPS: dict[str, tuple[str, str]] | None = None  # `_builtin_ops`, rebuilt after a registration


def register(
    name: str,
    make: Callable[..., Dialect],
    *,
    takes_options: bool = False,
    mixes: bool = False,
    describe_key: Callable[[Hashable, str], str | None] | None = None,
    metadata: StreamMetadata | None = None,
) -> None:
    """Make ``name`` a built-in dialect: ``make(**options)`` builds it (options only when
    ``takes_options``); ``mixes``: its ops may share a graph with a four-op dialect's (read
    as one program, as TensorRT-LLM graphs mix PyTorch's ops with their own);
    ``describe_key(key, "stream" | "event")`` names one of its keys in a report (None: not
    its key).  A module that registers a built-in dialect when it is imported must be listed
    in `msched.proof.BUILTIN_DIALECT_MODULES`, which imports it."""
    global _OPS
    _REGISTERED[name] = _Registration(make, takes_options, mixes, describe_key, metadata)
    _OPS = None


def named(name: str, **options: Any) -> Dialect:
    """`msched.Dialect.named`."""
    found = _REGISTERED.get(name)
    if found is None:
        raise InvalidArgumentError(
            f"unknown dialect {name!r}: the built-in dialects are "
            f"{', '.join(map(repr, _REGISTERED))}"
        )
    if options and not found.takes_options:
        raise InvalidArgumentError(
            f"the {name} dialect takes no options, got {', '.join(sorted(options))}"
        )
    return found.make(**options)


def builtin_dialects() -> dict[str, Dialect]:
    """The dialects known by name, with default options (`Dialect.named`)."""
    return {name: named(name) for name in _REGISTERED}


def is_action_dialect(name: str) -> bool:
    """Whether dialect ``name`` may share a graph with a four-op dialect (PyTorch's and
    AutoDeploy's ops do, in TensorRT-LLM graphs)."""
    found = _REGISTERED.get(name)
    return found is not None and found.mixes


def describe_key(key: Hashable, what: str) -> str:
    """How a report names the dialect key behind stream or event ``what`` (``"stream"``)."""
    for registration in _REGISTERED.values():
        if registration.describe_key is not None:
            shown = registration.describe_key(key, what)
            if shown is not None:
                return shown
    return repr(key)


def stream_metadata() -> tuple[StreamMetadata, ...]:
    """The registered ways of saying where nodes run in metadata."""
    return tuple(r.metadata for r in _REGISTERED.values() if r.metadata is not None)


def marked_by_module(graph: Graph) -> bool:
    """Whether ``graph``'s module declares itself a metadata dialect's (`StreamMetadata`)."""
    return any(m.marked(graph) for m in stream_metadata())


def _metadata_dialects(graph: Graph) -> dict[str, str]:
    """Dialect name -> annotation shown, for each dialect whose metadata ``graph`` has: a
    graph of such a module, or a node so annotated (then it is read in that dialect even
    without a stream op: an AOT graph whose side stream never waits has none)."""
    found = {}
    for name, registration in _REGISTERED.items():
        meta = registration.metadata
        if meta is not None and (
            meta.marked(graph) or any(meta.annotated(node) for node in graph.nodes)
        ):
            found[name] = meta.shown
    return found


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


def foreign_stream_op(target: Any) -> tuple[str, str] | None:
    """``(dialect or namespace, op name)`` when ``target`` is a stream op of some dialect:
    a built-in dialect's op, or an op named like a four-op stream op in another namespace."""
    builtin = builtin_op(target)
    if builtin is not None:
        return builtin
    namespace, _, name = (qualified_op_name(target) or "").partition("::")
    if name in FOUR_OPS and namespace not in _NOT_DIALECTS:
        return namespace, name
    return None


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
        hit = foreign_stream_op(target)
        if hit is not None:
            found.setdefault(hit[0], []).append(hit[1])
    four = {ns: k for ns, k in found.items() if not is_action_dialect(ns)}
    if len(four) > 1:
        shown = "; ".join(f"{ns} ({', '.join(sorted(set(k)))})" for ns, k in sorted(four.items()))
        raise InvalidGraphError(
            f"the graph mixes the stream ops of {len(four)} dialects: {shown}; a scheduled "
            "graph uses one (pass dialect=... to read it in one of them)"
        )
    for name, shown_meta in _metadata_dialects(graph).items():
        found.setdefault(name, [shown_meta])
    known = builtin_dialects()
    order = sorted(found, key=_action_first)
    chosen = [known.get(ns) or Dialect.from_namespace(ns) for ns in order]
    if not chosen:
        return Dialect()
    result = chosen[0]
    for more in chosen[1:]:
        result = result | more
    return result


def mark_made(gm: GraphModule, dialect: str) -> GraphModule:
    """Record that msched made ``gm`` with the stream ops of built-in ``dialect``
    (``gm.meta["msched_dialect"]``); returns ``gm``.

    `trace_streams` (every stage), Inductor kernel-order programs and `msched.schedule` mark
    what they make, so that a test reads such a graph in its own dialect, not in the one
    configured for the engine under test (`made_in`)."""
    gm.meta[MADE_META] = dialect
    return gm


def made_in(gm: GraphModule | Graph) -> str | None:
    """The built-in dialect msched made ``gm`` in (`mark_made`), None for a graph msched did
    not make (or a bare ``Graph`` without a module)."""
    module = gm if isinstance(gm, GraphModule) else gm.owning_module
    meta = getattr(module, "meta", None) or {}
    made = meta.get(MADE_META)
    return made if isinstance(made, str) else None


def uses_ops_of(gm: GraphModule | Graph, dialect: Dialect) -> bool:
    """Whether some node of ``gm`` is a stream op of ``dialect``: an op it reads as actions
    (or as host-only bookkeeping), not one its reader leaves compute (PyTorch's ``getitem``
    of anything but ``control_deps``).  A node its reader cannot read counts too."""
    table = dialect._table()
    for node in graph_of(gm).nodes:
        if node.op != "call_function":
            continue
        target = node.target
        reader = table.get(target) if is_hashable(target) else None
        reader = reader or table.get(target_key(target))
        if reader is None:
            continue
        try:
            if reader(node) is not None:
                return True
        except InvalidGraphError:
            return True
    return False


def _action_first(namespace: str) -> tuple[bool, str]:
    return (not is_action_dialect(namespace), namespace)


def _defines_stream_ops(namespace: str) -> bool:
    """Whether ``torch.ops.<namespace>`` defines ``set_stream`` and ``wait_event`` (the least
    a scheduler's stream ops need; ``aten`` has a ``record_stream`` but is no dialect)."""
    if not namespace.isidentifier() or namespace.startswith("_"):
        return False
    ops_of = getattr(torch.ops, namespace)
    return all(hasattr(ops_of, kind) for kind in ("set_stream", "wait_event"))


def _builtin_ops() -> dict[str, tuple[str, str]]:
    """Qualified op name or function name -> (dialect, op) over the built-in dialects."""
    global _OPS
    if _OPS is None:
        table: dict[str, tuple[str, str]] = {}
        for dialect_name, dialect in builtin_dialects().items():
            for key in dialect._table():
                if isinstance(key, str):
                    table[key] = (dialect_name, key.split("::")[-1])
        _OPS = table
    return _OPS


def builtin_op(target: Any) -> tuple[str, str] | None:
    """``(dialect, op)`` when ``target`` is a stream op of a built-in dialect."""
    key = target_key(target)
    return None if key is None else _builtin_ops().get(key)


# The four-op dialects: msched's own ops (the default) and the same four in ``trtllm``.
register("msched", Dialect)
register("trtllm", lambda: Dialect.from_namespace("trtllm"))

__all__ = [
    "FOUR_OPS",
    "FOUR_OP_READERS",
    "MADE_META",
    "Dialect",
    "StreamMetadata",
    "as_dialect",
    "builtin_dialects",
    "builtin_op",
    "describe_key",
    "detect_dialect",
    "foreign_stream_op",
    "is_action_dialect",
    "is_hashable",
    "made_in",
    "mark_made",
    "marked_by_module",
    "named",
    "qualified_op_name",
    "register",
    "stream_metadata",
    "target_key",
    "uses_ops_of",
]

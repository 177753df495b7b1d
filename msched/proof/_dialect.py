"""The `Dialect` type: how one engine encodes stream code, and msched's four-op shape.

A `Dialect` maps each node of a graph to actions on the host timeline
(`msched.proof.actions`: switch the current stream, record an event on a stream, wait for an
event, a stream waits for another, record_stream, a host barrier) and may say which stream a
node runs on from its metadata.  Its four fields ``set_stream``, ``record_event``,
``wait_event``, ``record_stream`` are the four-op shape (msched's own ops by default, any
namespace's with `Dialect.from_namespace`), read by the readers of this module; further ops
come with their own readers (`Dialect.define`).

The built-in dialects and detection live in `msched.proof._registry` (`Dialect.named` and
`Dialect.detect` reach it); `msched.proof._interpreter` reads a graph in a dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from torch.fx import Graph, GraphModule, Node

from msched import ops
from msched._torch_internals import OpOverload, OpOverloadPacket, qualified_name, schema_of
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
        return _the_registry().named(name, **options)

    @classmethod
    def detect(cls, gm: GraphModule | Graph) -> Dialect:
        """The dialect whose stream ops ``gm`` contains (msched's when it has none).

        Built-in dialects are recognised by their ops; other namespaces by four-op names
        (``ns::set_stream``, ``ns::record_event``, ``ns::wait_event``, ``ns::record_stream``;
        ``aten`` is no dialect).  PyTorch's or AutoDeploy's ops in one graph with a four-op
        dialect's are read as one program; two four-op dialects in one graph are an
        `msched.InvalidGraphError` naming both.
        """
        return _the_registry().detect_dialect(gm)

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


def _the_registry() -> ModuleType:
    """`msched.proof._registry`, imported when first needed: the one deferred import of
    `msched.proof`.  The registry is built from this type (each dialect module makes its
    `Dialect` and registers it there), so the type cannot import it when it loads; yet
    ``Dialect.named`` and ``Dialect.detect`` are the documented spelling of its lookups."""
    from msched.proof import _registry as registry

    return registry


__all__ = [
    "FOUR_OPS",
    "FOUR_OP_READERS",
    "Dialect",
    "is_hashable",
    "qualified_op_name",
    "target_key",
]

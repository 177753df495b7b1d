"""The dialects known by name, and detection: which dialect a graph's stream ops are in.

Each dialect module registers its dialect here when it loads (`register`): msched's and
TensorRT-LLM's four-op dialects below, ``torch`` in `msched.proof.torch_streams`,
``autodeploy`` in `msched.proof.engines` (`msched.proof` imports both).  A registration says
how to make the dialect (`Dialect.named`), whether its ops may share a graph with a four-op
dialect's, how a report names its stream and event keys, and, for a dialect that says where
nodes run in their metadata, how to see that (`StreamMetadata`).  `detect_dialect`
(`Dialect.detect`) and `as_dialect` read the registrations; nothing here names a dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from msched.analysis.nodes import graph_of
from msched.errors import InvalidArgumentError, InvalidGraphError
from msched.proof._dialect import FOUR_OPS, Dialect, is_hashable, qualified_op_name, target_key


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
    its key)."""
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
    "MADE_META",
    "StreamMetadata",
    "as_dialect",
    "builtin_dialects",
    "builtin_op",
    "describe_key",
    "detect_dialect",
    "foreign_stream_op",
    "is_action_dialect",
    "made_in",
    "mark_made",
    "marked_by_module",
    "named",
    "register",
    "stream_metadata",
    "uses_ops_of",
]

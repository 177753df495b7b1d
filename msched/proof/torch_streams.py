"""The ``torch`` dialect: the stream graphs PyTorch itself builds (``torch.ops.streams``).

Code written with ``torch.Stream`` / ``with stream:`` / ``s.wait_stream(t)`` /
``torch.Event.record/wait`` / ``tensor.record_stream(s)`` compiles under ``torch.compile``
into graphs with ``torch.ops.streams.*`` ops whose stream and event arguments are indices into
Dynamo's table of external objects (in order of first reference).  ``with stream:`` emits no
op: every node issued inside it carries ``node.meta["custom"]["stream"] = index`` and nodes
without it run on the stream that was current when the graph was traced (the caller's).
What each op does (torch 2.13, ``torch/_dynamo/variables/streams.py``):

| op | actions |
|---|---|
| ``fork(from, to)``, ``join(from, to)`` | switch to ``to`` (no wait; Dynamo 2.13 emits neither) |
| ``record_event(e, s)`` | record ``e`` on ``s`` |
| ``wait_event(e, s)``, ``sync_dealloc(e, s, t)`` | ``s`` waits for ``e`` |
| ``wait_stream(s, t)`` | ``s`` waits for all work issued on ``t`` |
| ``record_stream(x, s)`` | ``x`` is used on ``s`` |
| ``synchronize_event/stream/device`` | a host barrier on the event, stream or device |
| ``get_external_object_by_index(i)`` | nothing (the table lookup) |
| ``control_deps(deps, subgraph, *values)`` | the actions of the stream op in ``subgraph`` |
| ``getitem(control_deps, k)``, k >= 1 | passes ``values[k - 1]`` through |

(``control_deps`` wraps a stream op after AOT autograd.)

The caller's stream: on CUDA, Dynamo puts the stream current at trace time at index 0; a graph
from `msched.trace_streams` records its index in ``gm.meta["msched_caller_stream"]``.  The
dialect reads that, else assumes index 0; ``Dialect.named("torch", caller_stream=i)`` says it
(None: no index is the caller's, for a CPU graph traced without `msched.trace_streams`).
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Sequence
from typing import Any

from torch.fx import Graph, GraphModule, Node

from msched._text import counted
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError, InvalidGraphError
from msched.proof import actions, dialects
from msched.proof.actions import Action
from msched.proof.dialects import Dialect, target_key

_TORCH = "torch"
CALLER_META = "msched_caller_stream"  # GraphModule.meta: the caller stream's table indices


def _index(node: Node, index: int, op: str) -> tuple[str, int]:
    """The key of the stream or event table index in argument ``index``."""
    return (_TORCH, actions.int_argument(node, index, op))


def _switch(node: Node) -> Sequence[Action]:
    return (actions.switch(_index(node, 1, "streams::fork/join")),)


def _record(node: Node) -> Sequence[Action]:
    op = "streams::record_event"
    return (actions.record(_index(node, 0, op), _index(node, 1, op)),)


def _wait(node: Node) -> Sequence[Action]:
    op = "streams::wait_event"
    return (actions.wait(_index(node, 0, op), _index(node, 1, op)),)


def _wait_stream(node: Node) -> Sequence[Action]:
    op = "streams::wait_stream"
    return (actions.wait_stream(_index(node, 0, op), _index(node, 1, op)),)


def _record_stream(node: Node) -> Sequence[Action]:
    return (
        actions.record_stream(
            actions.tensor_argument(node), _index(node, 1, "streams::record_stream")
        ),
    )


def _sync_event(node: Node) -> Sequence[Action]:
    return (actions.synchronize(event=_index(node, 0, "streams::synchronize_event")),)


def _sync_stream(node: Node) -> Sequence[Action]:
    return (actions.synchronize(stream=_index(node, 0, "streams::synchronize_stream")),)


def _sync_device(node: Node) -> Sequence[Action]:
    return (actions.synchronize(),)


def _nothing(node: Node) -> Sequence[Action]:
    return ()


_OP_READERS = {
    "streams::fork": _switch,
    "streams::join": _switch,
    "streams::record_event": _record,
    "streams::wait_event": _wait,
    "streams::sync_dealloc": _wait,
    "streams::wait_stream": _wait_stream,
    "streams::record_stream": _record_stream,
    "streams::synchronize_event": _sync_event,
    "streams::synchronize_stream": _sync_stream,
    "streams::synchronize_device": _sync_device,
    "get_external_object_by_index": _nothing,
}


def _control_deps(node: Node) -> Sequence[Action]:
    """The actions of the stream ops in a ``control_deps`` node's subgraph."""
    subgraph = _subgraph(node)
    found: list[Action] = []
    for inner in subgraph.nodes:
        if inner.op != "call_function":
            continue
        key = target_key(inner.target)
        reader = _OP_READERS.get(key) if key is not None else None
        if reader is not None:
            found.extend(reader(inner))
    return found


def _subgraph(node: Node) -> Graph:
    where = node.args[1] if len(node.args) > 1 else None
    module = node.graph.owning_module
    if isinstance(where, Node) and where.op == "get_attr" and module is not None:
        sub: Any = module
        for part in str(where.target).split("."):
            sub = getattr(sub, part, None)
        if isinstance(sub, GraphModule):
            return sub.graph
    raise InvalidGraphError(
        f"control_deps node {node.name!r} has no subgraph module to read (argument 1 is "
        f"{where!r}); read the GraphModule, not a bare Graph",
        nodes=(node.name,),
    )


def _getitem(node: Node) -> Sequence[Action] | None:
    """``getitem(control_deps, k)``: item 0 is the stream op's (empty) result, item k >= 1 is
    the k-th passthrough value.  Any other getitem is compute (None)."""
    source = node.args[0] if node.args else None
    if not (isinstance(source, Node) and target_key(source.target) == "control_deps"):
        return None
    index = node.args[1] if len(node.args) > 1 else None
    if not isinstance(index, int) or isinstance(index, bool):
        raise InvalidGraphError(
            f"{node.name!r} takes a literal index of control_deps", nodes=(node.name,)
        )
    passed = source.args[2:]
    if index == 0:
        return ()
    if index > len(passed) or not isinstance(passed[index - 1], Node):
        raise InvalidGraphError(
            f"{node.name!r} takes item {index} of {source.name!r}, which passes through "
            f"{counted(len(passed), 'value')}",
            nodes=(node.name, source.name),
        )
    value = passed[index - 1]
    assert isinstance(value, Node)
    return (actions.passes(value),)


def _node_stream(node: Node) -> Hashable | None:
    custom = node.meta.get("custom")
    if not custom:
        return None
    index = custom.get("stream") if isinstance(custom, dict) else None
    if index is None:
        return None
    if not actions.is_literal_id(index):
        raise InvalidGraphError(
            f"node {node.name!r} has meta['custom']['stream'] = {index!r}; PyTorch writes a "
            "stream table index there",
            nodes=(node.name,),
        )
    return (_TORCH, index)


def _caller_from_graph(graph: Graph) -> Hashable:
    module = graph.owning_module
    meta = getattr(module, "meta", None) or {}
    return _caller_keys(meta.get(CALLER_META, 0))


def _caller_keys(indices: object) -> frozenset[Hashable]:
    if indices is None:
        return frozenset((_NO_CALLER,))
    if isinstance(indices, int):
        indices = (indices,)
    if not isinstance(indices, (tuple, list)):
        raise InvalidArgumentError(
            f"caller_stream must be stream table indices (ints >= 0), got {indices!r}"
        )
    for index in indices:
        if not actions.is_literal_id(index):
            raise InvalidArgumentError(
                f"caller_stream must be stream table indices (ints >= 0), got {index!r}"
            )
    return frozenset((_TORCH, i) for i in indices)


_NO_CALLER = ("torch", "no caller stream")  # a key no index maps to


def torch_dialect(caller_stream: int | Sequence[int] | None | str = "graph") -> Dialect:
    """``Dialect.named("torch")``: ``caller_stream`` is the table index of the caller's
    stream (or the indices: one stream may be in the table twice, as the current stream and
    as the variable the code names), None when no index is (nodes without a stream
    annotation still run on it), or ``"graph"`` (the default):
    ``gm.meta["msched_caller_stream"]`` if the graph has it (`msched.trace_streams` writes
    it), else 0 (PyTorch's index of the current stream on CUDA)."""
    caller: Any
    if isinstance(caller_stream, str):
        if caller_stream != "graph":
            raise InvalidArgumentError(
                "caller_stream must be stream table indices, None or 'graph', got "
                f"{caller_stream!r}"
            )
        caller = _caller_from_graph
    else:
        caller = _caller_keys(caller_stream)
    readers: dict[Any, Any] = dict(_OP_READERS)
    readers["control_deps"] = _control_deps
    readers[operator.getitem] = _getitem
    return Dialect.define(_TORCH, readers, node_stream=_node_stream, caller_stream=caller)


def describe_key(key: Hashable, what: str) -> str | None:
    """A report's name for a stream or event table index of this dialect."""
    if isinstance(key, tuple) and len(key) == 2 and key[0] == _TORCH:
        return f"PyTorch {what} table index {key[1]}"
    return None


# Where nodes run without a stream op: a graph from `msched.trace_streams`, or a node with
# ``meta["custom"]["stream"]``; then the graph is read in this dialect even without a stream op
# (an AOT graph whose side stream never waits has none).


def _traced(graph: Graph) -> bool:
    """Whether ``graph`` is of a module `msched.trace_streams` returned."""
    module = graph.owning_module
    return module is not None and CALLER_META in getattr(module, "meta", {})


def _annotated(node: Node) -> bool:
    """Whether ``node`` runs on a stream PyTorch's annotations name."""
    custom = node.meta.get("custom")
    return (
        bool(custom)
        and isinstance(custom, dict)
        and "stream" in custom
        and node.op not in INPUT_OPS
    )


dialects.register(
    _TORCH,
    torch_dialect,
    takes_options=True,
    mixes=True,
    describe_key=describe_key,
    metadata=dialects.StreamMetadata("custom", _annotated, _traced, "meta['custom']['stream']"),
)

__all__ = ["CALLER_META", "describe_key", "torch_dialect"]

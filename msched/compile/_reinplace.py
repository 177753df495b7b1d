"""Turn ``auto_functionalized`` / ``auto_functionalized_v2`` nodes back into in-place calls.

Why: AOT autograd functionalizes every custom op that mutates an argument into a higher-order
op that clones the argument, runs the op on the clone and returns the new value; a graph input
then gets the new value through a ``copy_`` at the end of the graph.  Scheduled that way, an
Eagle3 capture is no longer a write into the capture buffer but a clone plus a copy, and a
preallocated attention buffer is cloned per layer.  msched schedules the program the user
wrote, so the backend re-inplaces first.  Everything comes from the op's schema and the
node's own arguments: there is no per-op table, so a custom op nobody registered works too.

Algorithm (`reinplace`):

1. Decode every functionalized node: the op, its arguments by schema name, the view of its
   base that each mutated argument is (v2: ``_all_bases`` plus ``_<arg>_base_index``,
   ``_<arg>_alias``, ``_<arg>_slice_*``, ``_<arg>_size/_stride/_storage_offset``), and
   where its outputs go.  Anything not understood raises `msched.ReinplaceError` naming the op.
2. Compute, for every node of the functional graph, the *version* it sees and the *storage*
   it will live in once re-inplaced (`_Storages`): an output of a functionalized node that
   stands for the new value of a mutated argument is a new version of that argument's
   storage; an output that is a returned value is a fresh storage.
   (`msched.analysis.effects` sees a functionalized node as one opaque value, so all of its
   outputs would share one root.)
3. Check that no node after it reads an older version of a storage it mutates, which the
   in-place call would change under it.  A ``copy_`` into the base (the write-back of a
   graph input) and size queries do not read the data.
4. In program order: insert the in-place call (and ``slice`` / ``as_strided`` / ``alias``
   nodes that regenerate view arguments from their base) where the node was; the op's
   results replace the node's results and each base replaces its "new value" output.
5. Erase the functionalized nodes and the ``copy_(x, x)`` write-backs step 4 made trivial.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from msched._torch_internals import OpOverload, is_tensorlist_like, schema_of
from msched.analysis.effects import compute_effects
from msched.errors import ReinplaceError

aten = torch.ops.aten
_V1 = torch.ops.higher_order.auto_functionalized
_V2 = torch.ops.higher_order.auto_functionalized_v2
_METADATA_OPS = frozenset(
    {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default,
     aten.sym_storage_offset.default}
)  # fmt: skip


@dataclass(frozen=True)
class _View:
    """A mutated argument that is a view of a base: ``op(base, *args)`` regenerates it."""

    op: Any
    base: Node
    args: tuple[Any, ...]


@dataclass(frozen=True)
class _Fresh:
    """A write-only ``out=`` argument: a new buffer of this layout (``empty_strided``)."""

    size: Any
    stride: Any
    dtype: Any
    device: Any


@dataclass(frozen=True)
class _Call:
    """What one functionalized node means.

    ``arguments`` maps every schema argument name to its value (a node, a constant, a
    `_View`, a `_Fresh`, or a list of those).  The node's outputs are the op's
    ``num_results`` results, then the new value of each ``bases[i]`` (the node that holds it
    once mutated in place).  With ``whole``, the node's value is the op's single result
    itself (v2 of an ``out=`` op), not a tuple.
    """

    node: Node
    op: OpOverload
    arguments: dict[str, Any]
    bases: tuple[Any, ...]
    num_results: int
    whole: bool = False


def is_functionalized(node: Node) -> bool:
    """Whether ``node`` is an ``auto_functionalized`` or ``auto_functionalized_v2`` call."""
    return node.op == "call_function" and node.target in (_V1, _V2)


def reinplace(gm: GraphModule) -> int:
    """Re-inplace every functionalized node of ``gm`` (see the module docstring).

    Rewrites ``gm.graph`` in place and recompiles ``gm``; returns how many nodes were
    re-inplaced.  Raises `ReinplaceError` naming the op and the node when one cannot be;
    every check runs before the first rewrite, so the graph is then left unchanged.
    """
    graph = gm.graph
    nodes = [n for n in graph.nodes if is_functionalized(n)]
    if not nodes:
        return 0
    calls = [_decode(node) for node in nodes]
    for call in calls:
        _check_uses(call)
    storages = _storages(graph, calls)
    for call in calls:
        _check_old_values_unread(call, storages)
    for node in nodes:  # decoded again: the rewrites before it replaced some of its inputs
        _rewrite(graph, _decode(node))
    _erase_trivial_copies(graph)
    graph.lint()
    gm.recompile()
    return len(nodes)


def _describe(node: Node) -> str:
    op = node.args[0] if node.args else None
    name = str(schema_of(op).name) if isinstance(op, OpOverload) else repr(op)
    return f"{name} (node {node.name!r}, {node.target})"


def _fail(node: Node, why: str) -> ReinplaceError:
    return ReinplaceError(f"cannot re-inplace {_describe(node)}: {why}")


def _decode(node: Node) -> _Call:
    op = node.args[0] if node.args else node.kwargs.get("_mutable_op")
    if not isinstance(op, OpOverload):
        raise _fail(node, "the mutated callable is not an operator overload")
    returns = schema_of(op).returns
    if node.target is _V2 and torch.Tag.out in op.tags:
        return _Call(node, op, _decode_v2_out(node, op), (), len(returns), len(returns) == 1)
    num_results = len(returns) if len(returns) > 1 else 1
    if node.target is _V2:
        arguments, bases = _decode_v2(node, op)
    else:
        arguments, bases = _decode_v1(node, op)
    return _Call(node, op, arguments, bases, num_results)


def _mutable(arg: Any) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def _is_tensor_list(arg: Any) -> bool:
    return bool(is_tensorlist_like(arg.type))


def _plain_argument(node: Node, arg: Any, kwargs: dict[str, Any]) -> Any:
    if arg.name in kwargs:
        return kwargs.pop(arg.name)
    if arg.has_default_value():
        return arg.default_value
    raise _fail(node, f"argument {arg.name!r} is missing")


def _decode_v2(node: Node, op: Any) -> tuple[dict[str, Any], tuple[Any, ...]]:
    kwargs: dict[str, Any] = dict(node.kwargs)
    bases: tuple[Any, ...] = tuple(kwargs.pop("_all_bases", None) or ())
    kwargs.pop("_only_clone_these_bases", None)
    arguments: dict[str, Any] = {}
    for arg in schema_of(op).arguments:
        if not _mutable(arg):
            arguments[arg.name] = _plain_argument(node, arg, kwargs)
        elif _is_tensor_list(arg):
            length = _pop(node, kwargs, f"_{arg.name}_length")
            arguments[arg.name] = (
                None
                if length is None
                else [_read_view(node, kwargs, f"_{arg.name}_{i}", bases) for i in range(length)]
            )
        else:
            arguments[arg.name] = _read_view(node, kwargs, f"_{arg.name}", bases)
    if kwargs:
        raise _fail(
            node,
            f"unknown keyword arguments {sorted(kwargs)} (view metadata "
            "this version of msched does not understand)",
        )
    return arguments, bases


def _decode_v2_out(node: Node, op: Any) -> dict[str, Any]:
    """v2 of an ``out=`` op passes no buffer, only the layout of a fresh one to write."""
    kwargs: dict[str, Any] = dict(node.kwargs)
    if kwargs.pop("_all_bases", None):
        raise _fail(node, "an out= operator with _all_bases")
    arguments: dict[str, Any] = {}
    for arg in schema_of(op).arguments:
        if _mutable(arg):
            keys = ("size", "stride", "dtype", "device")
            arguments[arg.name] = _Fresh(*(_pop(node, kwargs, f"_{arg.name}_{k}") for k in keys))
        else:
            arguments[arg.name] = _plain_argument(node, arg, kwargs)
    if kwargs:
        raise _fail(node, f"unknown keyword arguments {sorted(kwargs)}")
    return arguments


def _pop(node: Node, kwargs: dict[str, Any], key: str) -> Any:
    if key not in kwargs:
        raise _fail(node, f"view metadata {key!r} is missing")
    return kwargs.pop(key)


def _read_view(node: Node, kwargs: dict[str, Any], prefix: str, bases: tuple[Any, ...]) -> Any:
    """The mutated argument described by the ``prefix`` keys: a base, or a `_View` of one."""
    index = _pop(node, kwargs, f"{prefix}_base_index")
    if index is None:
        return None
    if not isinstance(index, int) or not 0 <= index < len(bases):
        raise _fail(node, f"{prefix}_base_index={index!r} is not an index into _all_bases")
    base = bases[index]
    if kwargs.pop(f"{prefix}_alias", False):
        return _View(aten.alias.default, base, ())
    if f"{prefix}_storage_offset" in kwargs:
        keys = ("size", "stride", "storage_offset")
        return _View(
            aten.as_strided.default, base, tuple(_pop(node, kwargs, f"{prefix}_{k}") for k in keys)
        )
    if f"{prefix}_slice_dim" in kwargs:
        keys = ("slice_dim", "slice_start", "slice_end")
        return _View(
            aten.slice.Tensor, base, tuple(_pop(node, kwargs, f"{prefix}_{k}") for k in keys)
        )
    return base


def _decode_v1(node: Node, op: Any) -> tuple[dict[str, Any], tuple[Any, ...]]:
    kwargs = dict(node.kwargs)
    kwargs.pop("_only_clone_these_tensors", None)
    arguments = {arg.name: _plain_argument(node, arg, kwargs) for arg in schema_of(op).arguments}
    if kwargs:
        raise _fail(node, f"unknown keyword arguments {sorted(kwargs)}")
    mutated = [a for a in schema_of(op).arguments if _mutable(a)]
    if any(_is_tensor_list(a) for a in mutated):
        raise _fail(
            node,
            "auto_functionalized (v1) with a mutated tensor list is not "
            "supported; enable torch._inductor.config.enable_auto_functionalized_v2",
        )
    return arguments, tuple(arguments[a.name] for a in mutated)


def _mutated_nodes(call: _Call) -> Iterable[Node]:
    for base in call.bases:
        if isinstance(base, Node):
            yield base


@dataclass(frozen=True)
class _Storages:
    """What every node of a functional graph holds, in terms of the re-inplaced graph.

    ``version[n]`` is the node that made the contents ``n`` sees: a placeholder, a
    ``get_attr``, a fresh op, or an output of a functionalized node (the new value of a
    mutated argument, or a returned value); views share their input's version.
    ``storage[n]`` is the storage ``n`` lives in once re-inplaced: the new value of a mutated
    argument lives in that argument's storage, every other version in its own.
    ``writes[n]`` are the versions ``n`` writes; ``index`` is each node's program position.
    """

    version: dict[Node, Node]
    storage: dict[Node, Node]
    writes: dict[Node, tuple[Node, ...]]
    index: dict[Node, int]


def _storages(graph: Graph, calls: list[_Call]) -> _Storages:
    """`_Storages` of ``graph``, whose functionalized nodes are ``calls`` (in program order)."""
    base_of: dict[Node, Any] = {}  # output of a functionalized node -> the base it updates
    for call in calls:
        if call.whole:  # the node's value is the op's result: a fresh value, no outputs
            continue
        for user in call.node.users:
            k = user.args[1]
            assert isinstance(k, int)  # _check_uses
            base_of[user] = call.bases[k - call.num_results] if k >= call.num_results else None
    version, writes = _versions(graph, set(base_of))
    storage: dict[Node, Node] = {}
    for node in graph.nodes:
        first = version[node]
        if first not in storage:  # a version of its own: where does it live?
            base = base_of.get(first)
            storage[first] = storage[base] if isinstance(base, Node) else first
        storage[node] = storage[first]
    index = {n: i for i, n in enumerate(graph.nodes)}
    return _Storages(version, storage, writes, index)


def _versions(
    graph: Graph, outputs: set[Node]
) -> tuple[dict[Node, Node], dict[Node, tuple[Node, ...]]]:
    """The storage roots and writes of `compute_effects`, with each of ``outputs`` a root.

    `compute_effects` runs on a copy of ``graph`` in which every output of a functionalized
    node is a fresh value (a ``clone`` of the node); its roots and writes are mapped back.
    """
    shadow = Graph()
    copy: dict[Node, Node] = {}
    value = shadow.graph_copy(graph, copy)
    copy[graph.output_node()] = shadow.output(value)
    for node in outputs:
        fresh = copy[node]
        fresh.target, fresh.args, fresh.kwargs = aten.clone.default, (fresh.args[0],), {}
    effects = compute_effects(shadow)
    back = {v: k for k, v in copy.items()}
    root = {n: back[effects.root[c]] for n, c in copy.items()}
    writes = {n: tuple(back[w] for w in effects.writes[c]) for n, c in copy.items()}
    return root, writes


def _check_old_values_unread(call: _Call, storages: _Storages) -> None:
    """Raise if a node after ``call`` reads an older version of a storage it mutates."""
    index = storages.index
    position = index[call.node]
    storage, version = storages.storage, storages.version
    written = {storage[b] for b in _mutated_nodes(call)}
    for node in index:
        if storage[node] not in written or index[version[node]] > position:
            continue  # another storage, or a version made by this call or a later one
        for user in node.users:
            if index[user] > position and _reads_old_value(user, node, storages):
                raise _fail(
                    call.node,
                    f"node {user.name!r} reads {node.name!r} after the call, and the "
                    "in-place call would change what it reads",
                )


def _reads_old_value(user: Node, value: Node, storages: _Storages) -> bool:
    if user.op == "call_function" and user.target in _METADATA_OPS:
        return False
    if user.op == "call_function" and user.target is aten.copy_.default:
        # The write-back of a mutated graph input overwrites, it does not read.
        return user.args[1] is value
    # A view is no read of its own; its users are checked as aliases of the same storage.
    version = storages.version
    is_view = not storages.writes[user] and version[user] is version[value]
    return not is_view


def _materialize(graph: Graph, value: Any) -> Any:
    if isinstance(value, _View):
        return graph.call_function(value.op, (value.base, *value.args))
    if isinstance(value, _Fresh):
        layout = {"dtype": value.dtype, "device": value.device}
        return graph.call_function(aten.empty_strided.default, (value.size, value.stride), layout)
    if isinstance(value, list):
        return [_materialize(graph, v) for v in value]
    return value


def _call_arguments(graph: Graph, call: _Call) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for arg in schema_of(call.op).arguments:
        value = _materialize(graph, call.arguments[arg.name])
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    return tuple(args), kwargs


def _check_uses(call: _Call) -> None:
    """Every use of the node must be one `_rewrite` can redirect."""
    if call.whole:
        return
    for user in call.node.users:
        k = user.args[1] if user.target is operator.getitem else None
        if user.op != "call_function" or not isinstance(k, int):
            raise _fail(call.node, f"{user.name!r} uses its result other than by index")
        if not 0 <= k < call.num_results + len(call.bases):
            raise _fail(call.node, f"{user.name!r} reads output {k}, which it does not have")
        if k < call.num_results and not schema_of(call.op).returns and user.users:
            raise _fail(call.node, f"{user.name!r} uses the result of an op returning ()")


def _rewrite(graph: Graph, call: _Call) -> None:
    node = call.node
    with graph.inserting_before(node):
        args, kwargs = _call_arguments(graph, call)
        name = str(schema_of(call.op).name).split("::")[-1]
        inplace = graph.create_node("call_function", call.op, args, kwargs, name=name)
    inplace.meta.update({k: v for k, v in node.meta.items() if k != "val"})
    val = node.meta.get("val")
    if call.whole:
        inplace.meta["val"] = val
        node.replace_all_uses_with(inplace)
    elif isinstance(val, (tuple, list)) and call.num_results == 1:
        inplace.meta["val"] = val[0]
    for user in list(node.users):
        _replace_output(graph, call, inplace, user)
    graph.erase_node(node)


def _replace_output(graph: Graph, call: _Call, inplace: Node, user: Node) -> None:
    k = user.args[1]
    assert isinstance(k, int)  # _check_uses
    if k >= call.num_results:
        replacement: Any = call.bases[k - call.num_results]
    elif call.num_results == 1:
        replacement = inplace
    else:
        with graph.inserting_before(user):
            replacement = graph.call_function(operator.getitem, (inplace, k))
    user.replace_all_uses_with(replacement)
    graph.erase_node(user)


def _erase_trivial_copies(graph: Graph) -> None:
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target is aten.copy_.default:
            if node.args[0] is node.args[1]:
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)

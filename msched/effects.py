"""Reads, writes and side effects of every node of an FX graph.

A *storage* is named by its root node: a placeholder, a ``get_attr``, or the output of an op
that is not a view.  View ops map their result to the root of their input, so a write through
``aten.slice(dest, ...)`` is a write to ``dest``.

Where the facts come from:

1. ``OpOverload`` targets: the schema.  Argument ``i`` is written when its ``alias_info`` is set
   and ``is_write``; positional and keyword arguments are both looked up (by schema name).  A
   return annotated ``Tensor(a)`` aliases the argument annotated with the same set, so its
   root is that argument's root (views, and in-place ops that return ``self``).
2. ``call_method`` nodes whose method name ends in ``_`` (``copy_``, ``add_``) write ``self``;
   ``operator.setitem`` and the in-place operators (``operator.iadd``, ...) write their target.
   Well-known view methods and functions (``view``, ``t``, ``split``, ...) alias their input.
3. `register_mutation` and `register_side_effect` for ops whose schema says nothing.

Everything unknown is treated as reading all of its tensor inputs and writing nothing; a node
that ``torch.fx`` considers impure is a side effect.  Results are plain dicts keyed by node.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Graph, Node

from msched.errors import InvalidArgumentError, InvalidGraphError

_OpOverload = torch._ops.OpOverload
_OpOverloadPacket = torch._ops.OpOverloadPacket

# op -> argument names that it writes, for ops whose schema does not say so.
_REGISTERED_MUTATIONS: dict[Any, tuple[str, ...]] = {}
# ops with effects outside the graph's tensors (I/O, RNG state, collectives, ...).
_REGISTERED_SIDE_EFFECTS: set[Any] = set()

_INPLACE_OPERATORS = frozenset(
    {
        operator.setitem,
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        operator.ifloordiv,
        operator.imod,
        operator.ipow,
        operator.iand,
        operator.ior,
        operator.ixor,
        operator.ilshift,
        operator.irshift,
        operator.imatmul,
    }
)

_VIEW_NAMES = frozenset(
    {
        "view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute", "expand",
        "expand_as", "narrow", "select", "unsqueeze", "squeeze", "flatten", "unflatten",
        "as_strided", "unfold", "diagonal", "split", "split_with_sizes", "chunk", "unbind",
        "detach", "contiguous", "movedim", "swapaxes", "swapdims", "alias", "real", "imag",
        "view_as_real", "view_as_complex", "__getitem__", "tensor_split",
    }
)  # fmt: skip


def register_mutation(op: Any, *arg_names: str) -> None:
    """Declare that ``op`` writes the arguments named ``arg_names``.

    For ops whose schema does not mark the mutation (``Tensor(a!)``), for example Python
    functions called through ``call_function`` or custom ops defined without ``mutates_args``.
    Registering an ``OpOverloadPacket`` covers all of its overloads.
    """
    if not arg_names:
        raise InvalidArgumentError(f"register_mutation({op!r}) needs at least one argument name")
    names = _argument_names(op)
    unknown = [n for n in arg_names if names is not None and n not in names]
    if unknown:
        raise InvalidArgumentError(
            f"register_mutation: {op!r} has no argument named {', '.join(unknown)}; "
            f"its arguments are {', '.join(names or ())}"
        )
    _REGISTERED_MUTATIONS[op] = tuple(arg_names)
    _OP_INFO_CACHE.clear()


def register_side_effect(op: Any) -> None:
    """Declare that ``op`` has an effect outside the graph's tensors: never reordered away."""
    _REGISTERED_SIDE_EFFECTS.add(op)
    _OP_INFO_CACHE.clear()


def _argument_names(op: Any) -> list[str] | None:
    if isinstance(op, _OpOverload):
        return [a.name for a in op._schema.arguments]
    if isinstance(op, _OpOverloadPacket):
        return sorted({a.name for o in op.overloads() for a in getattr(op, o)._schema.arguments})
    try:
        return list(inspect.signature(op).parameters)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class _OpInfo:
    """What a call target does, independent of the node: computed once per target."""

    # (position, name) of written arguments
    writes: tuple[tuple[int, str], ...] = ()
    # return index -> (position, name) of the argument it aliases; None: fresh storage
    return_alias: tuple[tuple[int, str] | None, ...] = ()
    multi_output: bool = False
    view_of_first: bool = False
    side_effect: bool = False
    # derived: fresh storage, no writes, no side effect (reads its inputs and nothing more)
    plain: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        single_alias = len(self.return_alias) == 1 and self.return_alias[0] is not None
        plain = not (self.writes or self.view_of_first or self.side_effect or single_alias)
        object.__setattr__(self, "plain", plain)


_OP_INFO_CACHE: dict[Any, _OpInfo] = {}


def _overload_info(op: Any) -> _OpInfo:
    schema = op._schema
    args = schema.arguments
    writes = tuple(
        (i, a.name)
        for i, a in enumerate(args)
        if a.alias_info is not None and a.alias_info.is_write
    )
    registered = _REGISTERED_MUTATIONS.get(op) or _REGISTERED_MUTATIONS.get(op.overloadpacket)
    if registered:
        writes += tuple((i, a.name) for i, a in enumerate(args) if a.name in registered)
    return_alias: list[tuple[int, str] | None] = []
    for ret in schema.returns:
        alias = None
        if ret.alias_info is not None:
            alias = _aliased_argument(args, set(ret.alias_info.before_set))
        return_alias.append(alias)
    multi = len(schema.returns) > 1 or (
        len(schema.returns) == 1 and str(schema.returns[0].type).endswith("[]")
    )
    is_view = (
        len(schema.returns) >= 1
        and not writes
        and return_alias
        and all(r is not None for r in return_alias)
    )
    side = (
        bool(writes)
        or schema.is_mutable
        or op in _REGISTERED_SIDE_EFFECTS
        or op.overloadpacket in _REGISTERED_SIDE_EFFECTS
        or op in torch.fx.node._side_effectful_functions
        or _torch_says_impure(op)
    )
    return _OpInfo(
        writes=writes,
        return_alias=tuple(return_alias),
        multi_output=multi and not is_view,
        view_of_first=bool(is_view),
        side_effect=side,
    )


def _aliased_argument(args: Any, sets: set[str]) -> tuple[int, str] | None:
    """The argument a return aliases.  ``Tensor(a)[]`` returns carry their alias set on the
    element type, which the schema object does not expose: they alias the annotated input."""
    annotated = [(i, a) for i, a in enumerate(args) if a.alias_info is not None]
    for i, a in annotated:
        if sets & set(a.alias_info.before_set):
            return (i, a.name)
    if not sets and annotated:
        return (annotated[0][0], annotated[0][1].name)
    return None


def _callable_info(fn: Any) -> _OpInfo:
    name = getattr(fn, "__name__", "")
    writes: tuple[tuple[int, str], ...] = ()
    registered = _REGISTERED_MUTATIONS.get(fn)
    if registered:
        params = _argument_names(fn) or []
        writes = tuple((params.index(n), n) for n in registered if n in params)
    elif fn in _INPLACE_OPERATORS or (
        name.endswith("_") and not name.startswith("_") and hasattr(torch.Tensor, name)
    ):
        writes = ((0, "self"),)
    view = (
        not writes
        and name in _VIEW_NAMES
        and (
            getattr(fn, "__module__", None) in ("torch", "torch.functional")
            or getattr(torch.Tensor, name, None) is fn
        )
    )
    side = (
        bool(writes)
        or fn in _REGISTERED_SIDE_EFFECTS
        or fn in torch.fx.node._side_effectful_functions
        or _torch_says_impure(fn)
    )
    return _OpInfo(writes=writes, view_of_first=view, side_effect=side)


def _torch_says_impure(target: Any) -> bool:
    """torch.fx's own purity rule (mutable schema, effectful or random ops), per target."""
    try:
        return bool(torch._library.utils.is_impure(target))
    except Exception:  # a target torch cannot classify: rely on our own rules
        return False


def _method_info(name: str) -> _OpInfo:
    inplace = name.endswith("_") and not name.startswith("_")
    return _OpInfo(
        writes=((0, "self"),) if inplace else (),
        view_of_first=name in _VIEW_NAMES,
        side_effect=inplace,
    )


def _op_info(node: Node) -> _OpInfo | None:
    if node.op == "call_function":
        return _OP_INFO_CACHE.get(node.target) or _function_info(node.target)
    if node.op != "call_method":
        return None
    key = ("method", node.target)
    info = _OP_INFO_CACHE.get(key)
    if info is None:
        info = _OP_INFO_CACHE[key] = _method_info(str(node.target))
    return info


def _function_info(target: Any) -> _OpInfo:
    """What a ``call_function`` target does (cached per target)."""
    info = _OP_INFO_CACHE.get(target)
    if info is None:
        if isinstance(target, _OpOverload):
            info = _overload_info(target)
        elif isinstance(target, _OpOverloadPacket):
            info = _overload_info(_resolve_packet(target))
        else:
            info = _callable_info(target)
        _OP_INFO_CACHE[target] = info
    return info


def _resolve_packet(packet: Any) -> Any:
    names = packet.overloads()
    return getattr(packet, "default" if "default" in names else names[0])


def _argument(node: Node, position: int, name: str) -> Any:
    if position < len(node.args):
        return node.args[position]
    return node.kwargs.get(name)


def _nodes_in(value: Any) -> Iterable[Node]:
    if isinstance(value, Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _nodes_in(v)


@dataclass(frozen=True)
class Effects:
    """Per-node storage effects of one graph.

    ``root[n]`` is the storage ``n``'s value lives in; ``reads[n]`` / ``writes[n]`` are the
    storages ``n`` reads / writes (roots, deduplicated, in argument order); ``side_effects``
    holds the nodes that must run even if nothing uses their value.
    """

    root: dict[Node, Node]
    reads: dict[Node, tuple[Node, ...]]
    writes: dict[Node, tuple[Node, ...]]
    side_effects: frozenset[Node]


def compute_effects(graph: Graph) -> Effects:
    """Compute `Effects` for every node of ``graph`` in one pass in program order."""
    root: dict[Node, Node] = {}
    reads: dict[Node, tuple[Node, ...]] = {}
    writes: dict[Node, tuple[Node, ...]] = {}
    side: list[Node] = []
    cache, getitem = _OP_INFO_CACHE, operator.getitem
    try:
        for node in graph.nodes:
            op = node.op
            info: _OpInfo | None
            if op == "call_function" and node.target is not getitem:
                info = cache.get(node.target) or _function_info(node.target)
                if info.plain:  # the common case: fresh storage, reads its inputs
                    root[node] = node
                    reads[node] = _input_roots(node, root)
                    writes[node] = ()
                    continue
            elif op in _INPUT_OPS:
                root[node], reads[node], writes[node] = node, (), ()
                continue
            else:
                info = _op_info(node)
            root[node] = _root_of(node, info, root)
            reads[node] = _reads(node, info, root)
            written = _writes(node, info, root) if info is not None and info.writes else ()
            writes[node] = written
            if written or (info is not None and info.side_effect) or _is_impure(node):
                side.append(node)
    except KeyError as missing:  # an input not seen yet: say which, or it is our own bug
        problem = _undefined_input(graph)
        if problem is None:
            raise
        raise InvalidGraphError(problem) from missing
    return Effects(root, reads, writes, frozenset(side))


def _undefined_input(graph: Graph) -> str | None:
    """Why some node of ``graph`` uses a value that is not defined before it, if one does."""
    position = {n: i for i, n in enumerate(graph.nodes)}
    for node in graph.nodes:
        for arg in node.all_input_nodes:
            where = position.get(arg)
            if where is None:
                return (
                    f"node {node.name!r} uses {arg.name!r}, which is not a node of this graph; "
                    "build the graph with its own nodes (Graph.graph_copy copies them)"
                )
            if where >= position[node]:
                return (
                    f"node {node.name!r} uses {arg.name!r}, which comes after it in the graph; "
                    "put the graph in topological order (every node after its inputs) first"
                )
    return None


_INPUT_OPS = ("placeholder", "get_attr")


def _reads(node: Node, info: _OpInfo | None, root: dict[Node, Node]) -> tuple[Node, ...]:
    if info is not None and info.view_of_first:
        return ()
    return _input_roots(node, root)


def _input_roots(node: Node, root: dict[Node, Node]) -> tuple[Node, ...]:
    """The storages of ``node``'s inputs, deduplicated, in argument order."""
    inputs = node._input_nodes  # torch.fx's own dict of a node's inputs
    if len(inputs) == 1:
        return (root[next(iter(inputs))],)
    return tuple(dict.fromkeys([root[i] for i in inputs]))


def _writes(node: Node, info: _OpInfo, root: dict[Node, Node]) -> tuple[Node, ...]:
    targets = [root[n] for pos, name in info.writes for n in _nodes_in(_argument(node, pos, name))]
    return tuple(dict.fromkeys(targets))


def _is_impure(node: Node) -> bool:
    if node.op != "call_module":
        return False
    try:
        return bool(node.is_impure())
    except Exception:  # a submodule fx cannot inspect: assume it is pure, like DCE does
        return False


def _root_of(node: Node, info: _OpInfo | None, root: dict[Node, Node]) -> Node:
    if node.op == "call_function" and node.target is operator.getitem:
        return _getitem_root(node, root)
    if info is None or not node.args:
        return node
    first = node.args[0]
    if info.view_of_first and isinstance(first, Node):
        return root[first]
    if len(info.return_alias) == 1 and info.return_alias[0] is not None:
        pos, name = info.return_alias[0]
        value = _argument(node, pos, name)
        if isinstance(value, Node):
            return root[value]
    return node


def _getitem_root(node: Node, root: dict[Node, Node]) -> Node:
    parent, index = node.args[0], node.args[1]
    if not isinstance(parent, Node):
        return node
    info = _op_info(parent)
    if info is not None and info.multi_output:
        if isinstance(index, int) and 0 <= index < len(info.return_alias):
            alias = info.return_alias[index]
            if alias is not None:
                value = _argument(parent, *alias)
                if isinstance(value, Node):
                    return root[value]
        return node
    # An element of a tuple of views, or an index/slice of a tensor: same storage as parent.
    return root[parent]


def produces_tensor(node: Node) -> bool:
    """Whether ``node``'s value is a single tensor (so ``record_stream`` can be applied)."""
    val = node.meta.get("val", node.meta.get("example_value"))
    if val is not None:
        return isinstance(val, torch.Tensor)
    if node.op == "call_function":
        target = node.target
        if isinstance(target, _OpOverloadPacket):
            target = _resolve_packet(target)
        if isinstance(target, _OpOverload):
            rets = target._schema.returns
            return len(rets) == 1 and str(rets[0].type) == "Tensor"
        if target is operator.getitem:
            return _getitem_is_tensor(node)
        return _is_torch_callable(target)
    if node.op == "call_method":
        return str(node.target) not in _NON_TENSOR_METHODS
    return False


_NON_TENSOR_METHODS = frozenset(
    {"size", "dim", "numel", "item", "tolist", "stride", "split", "chunk", "unbind",
     "tensor_split", "split_with_sizes", "__len__", "data_ptr", "element_size"}
)  # fmt: skip


def _getitem_is_tensor(node: Node) -> bool:
    parent = node.args[0]
    if not isinstance(parent, Node) or parent.op != "call_function":
        return False
    target = parent.target
    if isinstance(target, _OpOverload):
        rets = target._schema.returns
        if len(rets) == 1:
            return str(rets[0].type) in ("List[Tensor]", "Tensor[]")
        index = node.args[1]
        return isinstance(index, int) and str(rets[index].type) == "Tensor"
    return False


def _is_torch_callable(target: Callable[..., Any] | Any) -> bool:
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", "")
    if name in _NON_TENSOR_METHODS or name in ("sym_size", "sym_numel", "sym_stride"):
        return False
    return module == "torch" or module.startswith("torch.nn.functional")

"""Reads, writes and side effects of every node of an FX graph.

A *storage* is named by its root node: a placeholder, a ``get_attr``, or the output of an op
that is not a view.  View ops map their result to the root of their input, so a write through
``aten.slice(dest, ...)`` is a write to ``dest``.  Where a result only *may* share memory with
its inputs (``x.float()``, an unknown function's result), it is a storage of its own that
*aliases* those of its inputs: every access to it also counts as an access to them.

What each call target does comes from `msched.analysis._targets` (schemas, torch-level functions,
``torch.Tensor`` methods, allowlisted ``torch.nn`` modules and functional calls, and the
registrations).  **Sound by default**: a target of unknown effect reads and writes every tensor
it receives and its result may alias them; it also keeps its order with the other calls that
touch state outside the graph (random ops, unknown code).

Storages of graph inputs (placeholders, ``get_attr`` and module state) are told apart in
`msched.analysis.input_storages`.

Collectives (`msched.analysis.collectives`) are read as what they do on the GPU:

- a functional collective (``_c10d_functional.all_reduce``, ...) is *asynchronous*.  Its issue
  reads its input, writes what its schema says it writes (the in-place forms: their input;
  the ``_out`` forms: ``out``) and writes its own result, a storage of its own (a coalesced
  collective's list result is one storage).  Each ``wait_tensor`` of it *writes* every storage
  the issue wrote (the communication completes there) and its result is that same storage, so
  a reader of the value is ordered after a wait.  When the work reads its input until it
  completes (`Collective.holds_input`: ``all_to_all_single``, ``all_gather_into_tensor``,
  ``reduce_scatter_tensor``, the in-place forms) the wait also *reads* the inputs, so a later
  write to them is ordered after the wait.  The out-of-place ``all_reduce`` and ``broadcast``
  copy their input at issue and are read *exactly*: a write to their input needs only the
  issue before it.
- an engine's collective (`msched.register_collective`) is synchronous on its stream: the
  effects its schema gives, and it writes its own result.

Every collective and every wait is a side effect; none of them joins the chain of calls that
touch the world (collectives keep their order through the Dag's ``collective`` chain instead,
and waits may move as late as their users allow).

Results are plain dicts keyed by node.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Graph, Node

from msched._torch_internals import (
    OpOverload,
    OpOverloadPacket,
    node_inputs,
    schema_of,
)
from msched.analysis._targets import (
    OP_INFO_CACHE,
    UNKNOWN,
    OpInfo,
    function_info,
    getattr_info,
    inplace_variant,
    method_info,
    module_info,
)
from msched.analysis.collectives import collective_of, waited_all
from msched.analysis.input_storages import InputStorages
from msched.analysis.nodes import INPUT_OPS, NodeList
from msched.errors import InvalidGraphError

__all__ = ["Effects", "compute_effects", "produces_tensor"]


def op_info(node: Node) -> OpInfo | None:
    """The facts of ``node``'s target, before node-specific refinements (``inplace=``)."""
    if node.op == "call_function":
        if node.target is builtins.getattr and len(node.args) > 1:
            return getattr_info(node.args[1])
        return OP_INFO_CACHE.get(node.target) or function_info(node.target)
    if node.op == "call_method":
        return method_info(str(node.target))
    if node.op == "call_module":
        owner = node.graph.owning_module
        try:
            module = owner.get_submodule(str(node.target)) if owner is not None else None
        except AttributeError:
            module = None
        return module_info(module) if module is not None else UNKNOWN
    return None


def node_info(node: Node, info: OpInfo) -> OpInfo:
    """``info`` refined by the node's arguments: ``inplace=True`` makes a call write."""
    param = info.inplace_param
    if param is None:
        return info
    value = _argument(node, *param)
    if value is None or value is False:
        return info
    return inplace_variant(info)  # True, or a value only known at run time: assume in place


def _argument(node: Node, position: int, name: str) -> Any:
    """The value of an argument, passed by position or by name.  torch's Python functions
    call the first tensor ``input`` where the aten schema calls it ``self``."""
    if 0 <= position < len(node.args):
        return node.args[position]
    kwargs = node.kwargs
    if name in kwargs:
        return kwargs[name]
    return kwargs.get("input") if name == "self" else None


def _first_argument(node: Node) -> Any:
    """The first argument of a call, passed by position or as ``self=`` / ``input=``."""
    if node.args:
        return node.args[0]
    return _argument(node, 0, "self")


def _nodes_in(value: Any) -> Iterable[Node]:
    if isinstance(value, Node):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _nodes_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _nodes_in(v)


@dataclass(frozen=True)
class Effects:
    """Per-node storage effects of one graph.

    ``root[n]`` is the storage ``n``'s value lives in; ``reads[n]`` / ``writes[n]`` are the
    storages ``n`` reads / writes (roots, deduplicated, in argument order, with the storages
    they may alias); ``side_effects`` holds the nodes that must run even if nothing uses their
    value; ``world`` the nodes that touch state outside the graph's tensors (random numbers,
    code msched knows nothing about), which keep their relative order; ``aliases`` maps the
    roots that may share memory with other storages to all of them (itself first).
    """

    root: dict[Node, Node]
    reads: dict[Node, tuple[Node, ...]]
    writes: dict[Node, tuple[Node, ...]]
    side_effects: frozenset[Node]
    world: frozenset[Node] = field(default_factory=frozenset)
    aliases: dict[Node, tuple[Node, ...]] = field(default_factory=dict)


class _Walk:
    """The state of one pass over a graph in program order."""

    def __init__(self, graph: NodeList, by_storage: bool) -> None:
        self.root: dict[Node, Node] = {}
        self.reads: dict[Node, tuple[Node, ...]] = {}
        self.writes: dict[Node, tuple[Node, ...]] = {}
        self.side: list[Node] = []
        self.world: list[Node] = []
        # storage root -> every storage an access to it touches (itself first); only for the
        # storages that may alias others
        self.aliases: dict[Node, tuple[Node, ...]] = {}
        self.inputs = InputStorages(graph, by_storage)
        self.input_root = self.inputs.root

    def expand(self, roots: Iterable[Node]) -> tuple[Node, ...]:
        aliases = self.aliases
        if not aliases:
            return tuple(dict.fromkeys(roots))
        return tuple(dict.fromkeys(s for r in roots for s in aliases.get(r, (r,))))

    def input_roots(self, node: Node) -> tuple[Node, ...]:
        """The storages of ``node``'s inputs, deduplicated, in argument order."""
        inputs = node_inputs(node)  # torch.fx's own dict of a node's inputs
        root = self.root
        if self.aliases:
            return self.expand([root[i] for i in inputs])
        if len(inputs) == 1:
            return (root[next(iter(inputs))],)
        return tuple(dict.fromkeys([root[i] for i in inputs]))

    def visit(self, node: Node, info: OpInfo) -> None:
        """Record the effects of one call node."""
        info = node_info(node, info)
        if info.unknown:
            self._unknown(node, info)
        else:
            self.root[node] = self._root_of(node, info)
            self.reads[node] = () if info.view_of_first else self.input_roots(node)
            if node.op == "call_module":
                self.reads[node] += self.expand(self.inputs.module_state(node))
            written = self._written(node, info) if info.writes else ()
            self.writes[node] = written
            if info.maybe_alias:
                first = _first_argument(node)
                if isinstance(first, Node):
                    self._alias(node, (self.root[first],))
            if written and info.multi_output and not info.fresh_results:
                self._alias(node, written)  # out= tensors come back through getitem
            if info.swaps_storage:
                self._swap(node)
        if info.collective:
            self._collective(node, info.collective)
        if self.writes[node] or info.side_effect or _is_impure(node):
            self.side.append(node)
        if info.world:
            self.world.append(node)

    def side_effect(self, node: Node, info: OpInfo) -> None:
        """Record that ``node`` must run (and keep its order when it touches the world)."""
        self.side.append(node)
        if info.world:
            self.world.append(node)

    def _unknown(self, node: Node, info: OpInfo) -> None:
        """Reads and writes all it receives (and its module's state, or with ``any_state``
        all of the model's); may return an alias."""
        state = self.inputs.model_state(node) if info.any_state else self._module_state(node)
        touched = self.input_roots(node) + state
        self.root[node] = node
        self.reads[node] = touched
        self.writes[node] = touched
        self._alias(node, touched)

    def _collective(self, node: Node, role: str) -> None:
        """An issue also writes its own result; a wait completes what its collective wrote
        (and reads the inputs the work holds), its result living in that storage."""
        if role != "wait":
            if self.root[node] is node and node not in self.writes[node]:
                self.writes[node] += (node,)
            return
        value = _first_argument(node)
        own = self.root[value] if isinstance(value, Node) else node
        self.root[node] = own
        issued = [i for i in waited_all(node) if i in self.writes]
        if not issued:  # a wait of something unknown
            self.writes[node] = self.expand((own,))
            return
        written: list[Node] = []
        held: list[Node] = []
        for one in issued:  # one for wait_tensor; each collective of a wait_tensors list
            found = collective_of(one)
            written += self.writes[one]
            held += self.reads[one] if found is not None and found.holds_input else ()
        self.writes[node] = self.expand((*written, own))
        self.reads[node] = tuple(dict.fromkeys((*self.reads[node], *held)))

    def _module_state(self, node: Node) -> tuple[Node, ...]:
        if node.op != "call_module":
            return ()
        return self.expand(self.inputs.module_state(node))

    def _alias(self, node: Node, storages: Iterable[Node]) -> None:
        own = self.root[node]
        self.aliases[own] = self.expand((own, *storages))

    def _swap(self, node: Node) -> None:
        """``a.set_(b)``: from here on an access to ``a`` is an access to ``b`` too."""
        targets = [self.root[n] for n in node.all_input_nodes]
        if len(targets) > 1:
            self.aliases[targets[0]] = self.expand(targets)

    def _written(self, node: Node, info: OpInfo) -> tuple[Node, ...]:
        root = self.root
        targets = [
            root[n] for pos, name in info.writes for n in _nodes_in(_argument(node, pos, name))
        ]
        return self.expand(targets)

    def _root_of(self, node: Node, info: OpInfo) -> Node:
        root = self.root
        if node.op == "call_function" and node.target is operator.getitem:
            return self._getitem_root(node)
        if not node.args and not node.kwargs:
            return node
        if info.returns_written:
            for pos, name in info.writes:
                for value in _nodes_in(_argument(node, pos, name)):
                    return root[value]
        first = _first_argument(node)
        if info.view_of_first and isinstance(first, Node):
            return root[first]
        if len(info.return_alias) == 1 and info.return_alias[0] is not None:
            value = _argument(node, *info.return_alias[0])
            if isinstance(value, Node):
                return root[value]
        return node

    def _getitem_root(self, node: Node) -> Node:
        parent, index = node.args[0], node.args[1]
        if not isinstance(parent, Node):
            return node
        info = op_info(parent)
        if (
            info is not None
            and info.multi_output
            and (info.fresh_results or not self.writes.get(parent))
        ):
            if isinstance(index, int) and 0 <= index < len(info.return_alias):
                alias = info.return_alias[index]
                if alias is not None:
                    value = _argument(parent, *alias)
                    if isinstance(value, Node):
                        return self.root[value]
            return node
        # An element of a tuple of views, or an index/slice of a tensor: same storage as parent.
        return self.root[parent]


def compute_effects(graph: NodeList, views: Mapping[Node, Node] | None = None) -> Effects:
    """Compute `Effects` for every node of ``graph`` in one pass in program order.

    Attributes are told apart by name first; where some node writes an attribute or calls a
    module (so tied attributes could matter), they are told apart by tensor storage instead.
    ``views`` maps nodes whose value is exactly another node's (stream ops that pass a
    tensor through, `msched.proof.actions.passes`) to that node: they read and write
    nothing and live in its storage.
    """
    if isinstance(graph, Graph):
        by_storage = bool(graph.find_nodes(op="call_module"))
    else:
        by_storage = any(n.op == "call_module" for n in graph.nodes)
    effects = _compute(graph, by_storage, views or {})
    writes = effects.writes
    if not by_storage and any(s.op == "get_attr" for n in effects.side_effects for s in writes[n]):
        effects = _compute(graph, True, views or {})
    return effects


# Over the length and complexity limits (ruff C901, PLR0915) on purpose: one pass over
# the graph, the common ops (plain ops, inputs, output) inlined; every analysis runs it.
def _compute(  # noqa: C901, PLR0915
    graph: NodeList, by_storage: bool, views: Mapping[Node, Node]
) -> Effects:
    walk = _Walk(graph, by_storage)
    root, reads, writes, aliases = walk.root, walk.reads, walk.writes, walk.aliases
    cache, getitem, input_root = OP_INFO_CACHE, operator.getitem, walk.input_root
    try:
        for node in graph.nodes:
            op = node.op
            if views and node in views:
                root[node], reads[node], writes[node] = root[views[node]], (), ()
                continue
            if op == "call_function" and node.target is not getitem:
                info = cache.get(node.target) or op_info(node)  # getattr: per attribute
                assert info is not None
                if info.plain or info.plain_side_effect:  # fresh storage, reads its inputs
                    if info.plain_side_effect:  # stream ops, prints: they must run
                        walk.side_effect(node, info)
                    root[node] = node
                    inputs = node_inputs(node)  # torch.fx's own dict of a node's inputs
                    if aliases:
                        reads[node] = walk.input_roots(node)
                    elif len(inputs) == 1:
                        reads[node] = (root[next(iter(inputs))],)
                    else:
                        reads[node] = tuple(dict.fromkeys([root[i] for i in inputs]))
                    writes[node] = ()
                    continue
            elif op in INPUT_OPS:
                root[node], reads[node], writes[node] = input_root[node], (), ()
                continue
            elif op == "output":
                root[node], reads[node], writes[node] = node, walk.input_roots(node), ()
                continue
            else:
                info = op_info(node)
            assert info is not None
            walk.visit(node, info)
    except KeyError as missing:  # an input not seen yet: say which, or it is our own bug
        problem = _undefined_input(graph)
        if problem is None:
            raise
        raise InvalidGraphError(problem) from missing
    side, world = frozenset(walk.side), frozenset(walk.world)
    return Effects(root, reads, writes, side, world, walk.aliases)


def _undefined_input(graph: NodeList) -> str | None:
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


def _is_impure(node: Node) -> bool:
    if node.op != "call_module":
        return False
    try:
        return bool(node.is_impure())
    except Exception:  # a submodule fx cannot inspect: assume it is pure, like DCE does
        return False


def produces_tensor(node: Node) -> bool:
    """Whether ``node``'s value is a single tensor (so ``record_stream`` can be applied).

    Without metadata, a Python operator (``x + y`` in a symbolically traced graph) gives a
    tensor when one of its operands, through other such operators, is a tensor, and a
    ``torch.nn`` submodule other than a container gives a tensor.
    """
    if node.op == "call_function" and node.target in _TENSOR_OPERATORS and _no_meta(node):
        return _operator_of_tensor(node)
    return _produces_tensor_directly(node)


def _no_meta(node: Node) -> bool:
    return node.meta.get("val", node.meta.get("example_value")) is None


def _operator_of_tensor(node: Node) -> bool:
    """Whether an operand of the operator ``node``, through other operators without
    metadata, is a tensor (an explicit walk: residual chains are thousands of nodes deep)."""
    seen: set[Node] = {node}
    todo = [node]
    while todo:
        for arg in todo.pop().all_input_nodes:
            if arg in seen:
                continue
            seen.add(arg)
            if arg.op == "call_function" and arg.target in _TENSOR_OPERATORS and _no_meta(arg):
                todo.append(arg)
            elif _produces_tensor_directly(arg):
                return True
    return False


# Python operators whose result is a tensor when an operand is one.
_TENSOR_OPERATORS = frozenset(
    {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
     operator.mod, operator.pow, operator.matmul, operator.neg, operator.pos, operator.abs,
     operator.and_, operator.or_, operator.xor, operator.invert, operator.lshift,
     operator.rshift, operator.eq, operator.ne, operator.lt, operator.le, operator.gt,
     operator.ge}
)  # fmt: skip


def _module_gives_tensor(node: Node) -> bool:
    """A ``torch.nn`` submodule (not a container) called by ``node`` returns a tensor."""
    owner = node.graph.owning_module
    try:
        module = owner.get_submodule(str(node.target)) if owner is not None else None
    except AttributeError:
        return False
    kind = type(module)
    containers = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential)
    is_nn = kind.__module__.startswith("torch.nn.modules.")
    return module is not None and is_nn and not isinstance(module, containers + _MULTI_OUT)


# torch.nn modules whose call returns a tuple.
_MULTI_OUT = (torch.nn.MultiheadAttention, torch.nn.RNNBase, torch.nn.Transformer)


def _produces_tensor_directly(node: Node) -> bool:
    val = node.meta.get("val", node.meta.get("example_value"))
    if val is not None:
        return isinstance(val, torch.Tensor)
    if node.op == "call_module":
        return _module_gives_tensor(node)
    if node.op == "call_function":
        target = node.target
        if isinstance(target, OpOverloadPacket):
            target = _default_overload(target)
        if isinstance(target, OpOverload):
            rets = schema_of(target).returns
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


def _default_overload(packet: Any) -> Any:
    names = packet.overloads()
    return getattr(packet, "default" if "default" in names else names[0])


def _getitem_is_tensor(node: Node) -> bool:
    parent = node.args[0]
    if not isinstance(parent, Node) or parent.op != "call_function":
        return False
    target = parent.target
    if isinstance(target, OpOverload):
        rets = schema_of(target).returns
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

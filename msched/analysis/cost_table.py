"""Pricing particular ops and nodes: `TableCostModel`, a table of costs over another model.

A key names either one node (its name, ``"mm_3"``: no dot) or an op.  An op is given as
the object a node calls -- an ``OpOverload`` (``torch.ops.aten.mm.default``), an
``OpOverloadPacket`` (``torch.ops.aten.mm``: every overload), another function
(``torch.matmul``, ``operator.add``) or an ``nn.Module`` class (``nn.Linear``, for the
``call_module`` nodes of its instances) -- or as that object's qualified name, which always
has a dot: ``"aten.mm.default"`` or ``"aten::mm.default"``, ``"aten.mm"``,
``"myeng::fused_moe"``, ``"torch.matmul"``, ``"operator.add"``, ``"torch.Tensor.add"`` for a
``call_method`` node.  `op_keys` lists the names of the op a node runs, most specific first.

A node's cost is the first of: its name's entry; its op overload's; its op packet's (for
other functions and module classes there is one op entry); the base model's cost.
"""

from __future__ import annotations

import difflib
import reprlib
from collections.abc import Iterable, Mapping
from typing import Any

from torch.fx import Graph, GraphModule, Node

from msched._text import agreeing, counted
from msched._torch_internals import OpOverload, OpOverloadPacket
from msched.analysis._modules import called_module
from msched.analysis.cost import CostModel, DefaultCostModel, _setting, check_cost_model
from msched.analysis.nodes import graph_of
from msched.errors import InvalidArgumentError


def _dotted(name: str) -> str:
    """One spelling of an op's name: ``aten::mm.default`` is ``aten.mm.default``."""
    return name.replace("::", ".")


def _callable_name(target: Any) -> str | None:
    """``module.name`` of a function or class, None for objects that have neither."""
    module, name = getattr(target, "__module__", None), getattr(target, "__name__", None)
    if not isinstance(module, str) or not isinstance(name, str):
        return None
    if module == "_operator":  # operator.add is _operator.add
        module = "operator"
    return f"{module}.{name}"


def op_key(op: object) -> str:
    """The table key of an op given as an object or a name (see the module docstring), or
    `msched.InvalidArgumentError` for anything else."""
    if isinstance(op, str):
        if not op or op != op.strip():
            raise InvalidArgumentError(f"a cost key must be a non-empty name, got {op!r}")
        return _dotted(op)
    if isinstance(op, (OpOverload, OpOverloadPacket)):
        return str(op)
    name = _callable_name(op) if callable(op) else None
    if name is None:
        raise InvalidArgumentError(
            f"a cost key must be a node name, an op or an op's name, got {reprlib.repr(op)} "
            f"({type(op).__name__})"
        )
    return name


def op_keys(node: Node) -> tuple[str, ...]:
    """The names of the op ``node`` runs, most specific first: ``("aten.mm.default",
    "aten.mm")`` for an ``OpOverload``, and for a call of a packet with one overload (as
    ``symbolic_trace`` records ``torch.ops.myeng.fused_moe(x)``); one name for another
    function, a ``call_method`` (``torch.Tensor.<method>``) or a ``call_module`` (its
    module's class); none for graph inputs and ``output``."""
    target = node.target
    if node.op == "call_function":
        if isinstance(target, OpOverload):
            return str(target), str(target.overloadpacket)
        if isinstance(target, OpOverloadPacket):
            # A call of the packet runs the overload its arguments select: with one overload
            # (every ``torch.library.custom_op``), that one, as a traced call of it would.
            overloads = target.overloads()
            if len(overloads) == 1:
                return str(getattr(target, overloads[0])), str(target)
            return (str(target),)
        name = _callable_name(target)
        return () if name is None else (name,)
    if node.op == "call_method":
        return (f"torch.Tensor.{target}",)
    if node.op == "call_module":
        module = called_module(node)
        name = None if module is None else _callable_name(type(module))
        return () if name is None else (name,)
    return ()


def _is_op(key: str) -> bool:
    """Op names have a dot (``aten.mm``); node names never do."""
    return "." in key


class TableCostModel:
    """Costs from a table of node names and ops, everything else from ``base``.

    ``TableCostModel({"aten.mm.default": 12.0, "my_node": 3.0}, base=None)``: the keys are
    node names and ops (the module docstring lists the spellings), the values finite,
    non-negative numbers in ``base``'s units (`msched.DefaultCostModel`'s by default, where
    a matmul is 10; `msched.RooflineCostModel`'s are microseconds).  A node's cost is, in this
    order, its name's entry, its op overload's, its op packet's, and otherwise what ``base``
    says.  A key, value or base of the wrong kind is an `msched.InvalidArgumentError`; two
    keys that name one op (``"aten::mm"`` and ``torch.ops.aten.mm``) are one too.

    A key that matches no node of a graph is not an error while scheduling (a table may
    price several models); `unmatched` lists them and `check` raises for them, so a typo in
    an op's name does not go unnoticed.
    """

    def __init__(self, costs: Mapping[Any, float], base: CostModel | None = None) -> None:
        if not isinstance(costs, Mapping):
            raise InvalidArgumentError(
                f"costs must be a mapping of node names and ops to costs, got "
                f"{type(costs).__name__}"
            )
        check_cost_model(base)
        self.base: CostModel = base if base is not None else DefaultCostModel()
        table: dict[str, float] = {}
        for key, value in costs.items():
            name = op_key(key)
            if name in table:
                raise InvalidArgumentError(f"cost key {key!r} names {name!r} a second time")
            table[name] = _setting(f"the cost of {name!r}", value)
        self._table = table
        self._ops = {k: v for k, v in table.items() if _is_op(k)}
        self._by_target: dict[tuple[str, Any], float | None] = {}

    @property
    def costs(self) -> dict[str, float]:
        """The table, keys as `op_key` spells them (``aten::mm`` is ``aten.mm``), in the
        order given."""
        return dict(self._table)

    def cost(self, node: Node) -> float:
        value = self._entry(node)
        return self.base.cost(node) if value is None else value

    def _entry(self, node: Node) -> float | None:
        """The table's cost of ``node`` (its name's entry, else its op's), None without one."""
        value = self._table.get(node.name)  # a node's name has no dot: never an op's
        if value is None and self._ops:
            value = self._op_cost(node)
        return value

    def _op_cost(self, node: Node) -> float | None:
        """The entry of the op ``node`` runs, None when there is none; remembered by target
        (a ``call_module`` node's module depends on its graph: never remembered)."""
        remembered = node.op != "call_module"
        key = (node.op, node.target)
        if remembered and key in self._by_target:
            return self._by_target[key]
        found = next((self._ops[k] for k in op_keys(node) if k in self._ops), None)
        if remembered:
            self._by_target[key] = found
        return found

    def unmatched(self, gm: GraphModule | Graph) -> list[str]:
        """The keys (spelled as in `costs`) that match no node of ``gm``, in table order."""
        found = _names_in(graph_of(gm).nodes)
        return [key for key in self._table if key not in found]

    def check(self, gm: GraphModule | Graph) -> None:
        """Raise `msched.InvalidArgumentError` naming every key that matches no node of
        ``gm`` (with the graph's closest names, to catch a typo); return None otherwise."""
        missing = self.unmatched(gm)
        if not missing:
            return
        found = sorted(_names_in(graph_of(gm).nodes))
        lines = []
        for key in missing:
            close = difflib.get_close_matches(key, found, n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            lines.append(f"  {key!r}{hint}")
        raise InvalidArgumentError(
            f"{counted(len(missing), 'cost key')} "
            f"{agreeing(len(missing), 'matches', 'match')} no node of the graph:\n"
            + "\n".join(lines)
        )


def _names_in(nodes: Iterable[Node]) -> set[str]:
    """Every node name and op name (`op_keys`) of ``nodes``."""
    found: set[str] = set()
    for node in nodes:
        found.add(node.name)
        found.update(op_keys(node))
    return found

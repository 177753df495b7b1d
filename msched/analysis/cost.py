"""Cost models: how long a node runs, in arbitrary but consistent units.

`op_category` says what kind of op a node runs (matmul, attention, MoE, capture / in-place,
other); the cost table and the pictures both classify by it.  `DefaultCostModel` is a table
that needs nothing but the op: matmul-like ops (attention included) 10, MoE-like ops 20,
views / ``getitem`` / symbolic-int nodes 0, everything else 1.  `RooflineCostModel`
estimates microseconds from ``node.meta["val"]`` (FLOPs against bytes moved) and falls back to
the table where shapes are missing.  Any object with ``cost(node) -> float`` is a cost model;
whoever calls it passes each value through `checked_cost`, so a cost that is not a finite,
non-negative real number is an `msched.InvalidArgumentError` naming the node, the value and
the model, not a ``ValueError`` (or a NaN schedule) deep inside a pass.
"""

from __future__ import annotations

import math
import numbers
import operator
import reprlib
from typing import Any, Protocol, runtime_checkable

import torch
from torch.fx import Node

from msched._torch_internals import OpOverload, OpOverloadPacket, qualified_name, schema_of
from msched.analysis.effects import _VIEW_NAMES, _node_info, _op_info
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError


@runtime_checkable
class CostModel(Protocol):
    """Anything that estimates the run time of one node (non-negative, finite)."""

    def cost(self, node: Node) -> float: ...


_INF = math.inf


def checked_cost(model: object, node: Node, value: object) -> float:
    """``value``, the cost ``model`` gave for ``node``, as a float; or raise
    `msched.InvalidArgumentError` naming them when it is not a finite, non-negative real
    number (``bool``, ``None``, strings, tensors, NaN, infinities and negatives are refused).

    Called once per node on the scheduling hot path: a float in range costs one type test
    and one comparison.
    """
    kind = value.__class__
    if kind is float:
        if 0.0 <= value < _INF:  # type: ignore[operator]
            return value  # type: ignore[return-value]
    elif isinstance(value, numbers.Real) and kind is not bool:  # int, numpy scalars, ...
        try:
            number = float(value)
        except OverflowError:
            number = _INF
        if 0.0 <= number < _INF:
            return number
    raise InvalidArgumentError(
        f"cost model {type(model).__name__} gave {reprlib.repr(value)} ({kind.__name__}) for node "
        f"{node.name!r}; costs must be finite and non-negative real numbers (int or float)"
    )


def lower_bound(critical_path: float, total_cost: float, num_streams: int) -> float:
    """No schedule beats ``max(critical path, total cost / streams)``."""
    return max(critical_path, total_cost / num_streams)


def check_cost_model(cost_model: object) -> None:
    """Raise `msched.InvalidArgumentError` unless ``cost_model`` is None or has ``cost(node)``."""
    if cost_model is not None and not callable(getattr(cost_model, "cost", None)):
        raise InvalidArgumentError(
            f"cost_model must have a cost(node) method, got {type(cost_model).__name__}"
        )


#: What `op_category` returns, in the order pictures list the kinds.
OP_CATEGORIES = ("matmul", "attention", "moe", "capture / in-place", "other")
# The words of an op's name that make it one of the kinds, tested in this order.
_NAME_WORDS = (
    ("moe", ("moe", "expert")),
    ("attention", ("attention", "attn")),
    ("matmul", ("mm", "matmul", "linear", "gemm", "conv", "einsum")),
)
_FREE_OPS = (*INPUT_OPS, "output")


def _op_name(node: Node) -> str:
    target = node.target
    if isinstance(target, str):
        return target.lower()
    if isinstance(target, OpOverload):
        return schema_of(target).name.split("::")[-1].lower()
    if isinstance(target, OpOverloadPacket):
        return qualified_name(target).split("::")[-1].lower()
    return str(getattr(target, "__name__", target)).lower()


def _name_category(name: str) -> str | None:
    """The kind an op's (lower-case) name says, or None when it says none."""
    for kind, words in _NAME_WORDS:
        if any(w in name for w in words):
            return kind
    return None


def op_category(node: Node) -> str:
    """The kind of op ``node`` runs: one of `OP_CATEGORIES`.

    Graph inputs and ``output`` are ``"other"``.  Otherwise the op's name (without namespace
    and overload, lower case) decides: ``moe`` / ``expert`` is ``"moe"``; ``attention`` /
    ``attn`` is ``"attention"``; ``mm``, ``matmul``, ``linear``, ``gemm``, ``conv``, ``einsum``
    is ``"matmul"``.  A node whose name says none of these but that declares a write (its
    schema, an in-place method, ``inplace=True``, `msched.register_mutation`) is
    ``"capture / in-place"``; anything else, calls of unknown effect included, ``"other"``.
    """
    if node.op in _FREE_OPS:
        return "other"
    kind = _name_category(_op_name(node))
    if kind is not None:
        return kind
    info = _op_info(node)
    if info is not None and not info.unknown and _node_info(node, info).writes:
        return "capture / in-place"
    return "other"


def _free_target(node: Node) -> bool:
    """Whether every call of this node's target is free (views, getitem, symbolic ints)."""
    if node.op in _FREE_OPS or node.target is operator.getitem:
        return True
    info = _op_info(node)
    if info is not None and info.view_of_first:
        return True
    name = _op_name(node)
    return name.startswith("sym_") or name in _VIEW_NAMES


def _symbolic_value(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def _is_free(node: Node) -> bool:
    return _free_target(node) or _symbolic_value(node)


class DefaultCostModel:
    """The table model by `op_category`: matmul-like and attention 10, MoE-like 20,
    views/getitem/symint 0, else 1."""

    TABLE = {
        "moe": 20.0,
        "attention": 10.0,
        "matmul": 10.0,
        "capture / in-place": 1.0,
        "other": 1.0,
    }

    def __init__(self) -> None:
        self._by_target: dict[Any, float] = {}

    def cost(self, node: Node) -> float:
        key = (node.op, node.target)
        value = self._by_target.get(key)
        if value is None:
            free = _free_target(node)
            value = 0.0 if free else self.TABLE[op_category(node)]
            self._by_target[key] = value
        if value and node.meta and _symbolic_value(node):
            return 0.0
        return value


class RooflineCostModel:
    """Microseconds from shapes: ``max(flops / peak_flops, bytes / bandwidth) + launch``.

    FLOPs are counted for matmul-like ops (``2 * M * N * K`` over the output and the
    contracted dimension); bytes are the sizes of the tensor inputs and the output.  The
    defaults are roughly one H100 in bf16; pass your own peak numbers for other parts.  Nodes
    without ``meta["val"]`` fall back to `DefaultCostModel`.
    """

    def __init__(
        self,
        peak_flops: float = 989e12,
        bandwidth: float = 3.35e12,
        launch_us: float = 2.0,
    ) -> None:
        self.peak_flops = peak_flops
        self.bandwidth = bandwidth
        self.launch_us = launch_us
        self._fallback = DefaultCostModel()

    def cost(self, node: Node) -> float:
        if _is_free(node):
            return 0.0
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            return self._fallback.cost(node)
        inputs = [_tensor_of(n) for n in node.all_input_nodes]
        tensors = [t for t in inputs if t is not None]
        moved = _nbytes(val) + sum(_nbytes(t) for t in tensors)
        flops = 0.0
        if tensors and _name_category(_op_name(node)) is not None:  # matmul-like or MoE
            contracted = _contracted_dim(tensors[0])
            flops = 2.0 * _numel(val) * contracted
        seconds = max(flops / self.peak_flops, moved / self.bandwidth)
        return seconds * 1e6 + self.launch_us


def _tensor_of(node: Node) -> torch.Tensor | None:
    val = node.meta.get("val")
    return val if isinstance(val, torch.Tensor) else None


def _numel(t: torch.Tensor) -> float:
    return float(math.prod(_static(d) for d in t.shape))


def _nbytes(t: torch.Tensor) -> float:
    return _numel(t) * t.element_size()


def _contracted_dim(t: torch.Tensor) -> float:
    return float(_static(t.shape[-1])) if t.dim() else 1.0


def _static(d: Any) -> int:
    """A concrete size: symbolic sizes use their hint (or 1 when there is none)."""
    if isinstance(d, int):
        return d
    try:
        return int(d.node.hint) if d.node.hint is not None else 1
    except AttributeError:
        return 1

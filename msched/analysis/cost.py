"""Cost models: how long a node runs, in arbitrary but consistent units.

`op_category` says what kind of op a node runs (matmul, attention, MoE, capture / in-place,
other); the cost table and the pictures both classify by it.  `DefaultCostModel` is a table
that needs nothing but the op: matmul-like ops (attention included) 10, MoE-like ops 20,
views / ``getitem`` / symbolic-int nodes / metadata reads (``x.shape``, ``x.size()``) 0,
everything else 1; ``call_module`` nodes by their module's type (``nn.Linear`` and
``nn.Conv*`` are matmuls, whatever their path is called); a collective its communication
time ``comm`` (30), a ``wait_tensor`` 0.  `RooflineCostModel` estimates microseconds from
shapes (``meta["val"]``, Dynamo's ``meta["example_value"]`` or ``meta["tensor_meta"]``:
FLOPs against bytes moved, weights included for modules; a collective's bytes over a link
bandwidth plus a latency) and falls back to the table where shapes are missing.
`msched.analysis.cost_table.TableCostModel` prices particular nodes and ops over either, and
`msched.analysis.measured` measures costs on the hardware (docs/costs.md).
Any object with ``cost(node) -> float`` is a cost model; whoever calls it passes each value
through `checked_cost`, so a cost that is not a finite, non-negative real number is an
`msched.InvalidArgumentError` naming the node, the value and the model, not a ``ValueError``
(or a NaN schedule) deep inside a pass.
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
from msched.analysis._modules import called_module, module_kind, module_work, weight_bytes
from msched.analysis._target_names import VIEW_NAMES
from msched.analysis.collectives import collective_of, is_wait
from msched.analysis.effects import node_info, op_info
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


def _setting(name: str, value: object, positive: bool = False) -> float:
    """A cost model's numeric setting as a float, or `msched.InvalidArgumentError`."""
    number = math.nan
    if not isinstance(value, bool) and isinstance(value, numbers.Real):
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            number = _INF
    if not (0.0 < number if positive else 0.0 <= number) or number == _INF:
        kind = "positive" if positive else "non-negative"
        raise InvalidArgumentError(
            f"{name} must be a finite, {kind} number, got {reprlib.repr(value)}"
        )
    return number


def check_cost_model(cost_model: object) -> None:
    """Raise `msched.InvalidArgumentError` unless ``cost_model`` is None or has ``cost(node)``."""
    if cost_model is not None and not callable(getattr(cost_model, "cost", None)):
        raise InvalidArgumentError(
            f"cost_model must have a cost(node) method, got {type(cost_model).__name__}"
        )


#: What `op_category` returns, in the order pictures list the kinds.
OP_CATEGORIES = ("matmul", "attention", "moe", "capture / in-place", "comm", "other")
# The words of an op's name that make it one of the kinds, tested in this order.
_NAME_WORDS = (
    ("moe", ("moe", "expert")),
    ("attention", ("attention", "attn")),
    ("matmul", ("mm", "matmul", "linear", "gemm", "conv", "einsum")),
)
_FREE_OPS = (*INPUT_OPS, "output")
# Reads of a tensor's metadata (``x.shape``, ``x.size()``, ``len(x)``): no kernel runs.
_METADATA_NAMES = frozenset(
    (
        "getattr", "len", "size", "stride", "dim", "ndimension", "numel", "nelement",
        "element_size", "is_contiguous", "storage_offset", "get_device", "is_floating_point",
        "is_complex", "data_ptr",
    )
)  # fmt: skip


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

    Graph inputs and ``output`` are ``"other"``.  A collective or a ``wait_tensor``
    (`msched.analysis.collectives`) is ``"comm"``, whatever its name says.  A
    ``call_module`` node is classified by the module's type, never by its path name
    (``q_proj`` and ``fc1`` are ``nn.Linear`` layers): linear and convolution layers are
    ``"matmul"``, ``nn.MultiheadAttention`` and transformer layers ``"attention"``, other
    ``torch.nn`` modules ``"other"``, a module
    type of the user's own by the words of its class name, and a module the graph's owner
    does not have ``"other"``.  Otherwise the op's name (without namespace
    and overload, lower case) decides: ``moe`` / ``expert`` is ``"moe"``; ``attention`` /
    ``attn`` is ``"attention"``; ``mm``, ``matmul``, ``linear``, ``gemm``, ``conv``, ``einsum``
    is ``"matmul"``.  A node whose name says none of these but that declares a write (its
    schema, an in-place method, ``inplace=True``, `msched.register_mutation`) is
    ``"capture / in-place"``; anything else, calls of unknown effect included, ``"other"``.
    """
    if node.op in _FREE_OPS:
        return "other"
    if node.op == "call_module":
        module = called_module(node)
        kind = module_kind(module) if module is not None else None
        return kind or "other"
    if is_wait(node) or collective_of(node) is not None:
        return "comm"
    kind = _name_category(_op_name(node))
    if kind is not None:
        return kind
    info = op_info(node)
    if info is not None and not info.unknown and node_info(node, info).writes:
        return "capture / in-place"
    return "other"


def _free_target(node: Node) -> bool:
    """Whether every call of this node's target is free (views, getitem, symbolic ints,
    metadata reads, modules that run no kernel)."""
    if node.op in _FREE_OPS or node.target is operator.getitem:
        return True
    if node.op == "call_module":
        module = called_module(node)
        return module is not None and module_kind(module) is None
    info = op_info(node)
    if info is not None and info.view_of_first:
        return True
    name = _op_name(node)
    return name.startswith("sym_") or name in VIEW_NAMES or name in _METADATA_NAMES


def _symbolic_value(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool))


def _value(node: Node) -> Any:
    """The fake value of ``node``: ``meta["val"]``, else Dynamo's ``meta["example_value"]``
    (as `msched.analysis.effects` reads them); None when it has neither."""
    meta = node.meta
    return meta["val"] if "val" in meta else meta.get("example_value")


def _is_free(node: Node) -> bool:
    return _free_target(node) or isinstance(
        _value(node), (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)
    )


#: `DefaultCostModel.COMM`: what a collective's communication costs unless ``comm`` is given.
COMM_DEFAULT = 30.0


class DefaultCostModel:
    """The table model by `op_category`: matmul-like and attention 10, MoE-like 20,
    views/getitem/symint/metadata reads and modules that run no kernel 0, else 1.

    A collective (`msched.analysis.collectives`: PyTorch's functional collectives and ops
    declared with `msched.register_collective`) costs ``comm``, `COMM` (30) unless given:
    how long its communication runs (for an asynchronous one, off the streams:
    `msched.analysis.communication`).  A ``wait_tensor`` costs 0: it only makes its stream
    wait.  Why 30, three matmuls: a tensor-parallel all-reduce of a layer's
    activations over NVLink takes about as long as two to four of that layer's GEMMs on
    each rank (Llama-70B on 8 H100s: about 250 us against 70 us for the sharded output
    projection of 4096 tokens), so communication is worth overlapping and no single matmul
    hides it.
    """

    TABLE = {
        "moe": 20.0,
        "attention": 10.0,
        "matmul": 10.0,
        "capture / in-place": 1.0,
        "comm": COMM_DEFAULT,  # a collective costs ``comm`` (this unless given), a wait 0
        "other": 1.0,
    }
    #: What a collective costs unless ``comm`` is given (see the class docstring).
    COMM = COMM_DEFAULT

    def __init__(self, comm: float | None = None) -> None:
        self._by_target: dict[Any, float] = {}
        self.comm = self.COMM if comm is None else _setting("comm", comm)

    def cost(self, node: Node) -> float:
        key: tuple[Any, ...] = (node.op, node.target)
        if node.op == "call_module":  # one path names different modules in different graphs
            key = (*key, type(called_module(node)))
        value = self._by_target.get(key)
        if value is None:
            value = self._table_cost(node)
            self._by_target[key] = value
        if value and node.meta and _symbolic_value(node):
            return 0.0
        return value

    def _table_cost(self, node: Node) -> float:
        """The cost of every call of ``node``'s target (whether it is a collective or a
        wait depends on the target alone)."""
        if _free_target(node) or is_wait(node):
            return 0.0
        if collective_of(node) is not None:
            return self.comm
        return self.TABLE[op_category(node)]


class RooflineCostModel:
    """Microseconds from shapes: ``max(flops / peak_flops, bytes / bandwidth) + launch``.

    FLOPs are counted for matmul-like ops (``2 * M * N * K`` over the output and the
    contracted dimension); bytes are the sizes of the tensor inputs and the output.  A
    ``call_module`` node is priced by its module's type: ``nn.Linear`` and ``nn.Conv*`` do
    ``2 * outputs * contracted`` FLOPs (input features, or input channels per group times the
    kernel size) and every module also reads its own weights; others (embeddings, norms,
    activations) move bytes only.  Shapes come from ``node.meta["val"]`` or
    ``node.meta["tensor_meta"]`` (`torch.fx.passes.shape_prop`), or in a graph Dynamo
    captured from ``node.meta["example_value"]``; a linear layer without an
    output shape takes it from its input's.  The defaults are roughly one H100 in bf16; pass
    your own peak numbers for other parts.  Nodes without shapes fall back to
    `DefaultCostModel`; metadata reads and views cost 0.

    A collective costs ``link_latency_us + payload / link_bandwidth``: the payload is the
    larger of its tensor input and its result in bytes (all-gather's result, reduce-scatter's
    input), and ``link_bandwidth`` is in bytes of that payload per second -- the algorithm
    bandwidth (``algbw``) that ``nccl-tests`` reports, which already folds in how many times
    the ring or tree moves each byte.  The defaults, 200e9 bytes/s and 10 us, are about an
    all-reduce of a few MB among 8 H100s over NVLink; give the numbers of your own link
    (InfiniBand between nodes is several times slower).  A ``wait_tensor`` costs 0.

    ``peak_flops`` (FLOP/s), ``bandwidth`` (bytes/s) and ``link_bandwidth`` must be finite
    numbers > 0, ``launch_us`` and ``link_latency_us`` finite numbers >= 0 (``bool`` is not
    a number here); anything else is an `msched.InvalidArgumentError` naming the setting.
    """

    def __init__(
        self,
        peak_flops: float = 989e12,
        bandwidth: float = 3.35e12,
        launch_us: float = 2.0,
        link_bandwidth: float = 200e9,
        link_latency_us: float = 10.0,
    ) -> None:
        self.peak_flops = _setting("peak_flops", peak_flops, positive=True)
        self.bandwidth = _setting("bandwidth", bandwidth, positive=True)
        self.launch_us = _setting("launch_us", launch_us)
        self.link_bandwidth = _setting("link_bandwidth", link_bandwidth, positive=True)
        self.link_latency_us = _setting("link_latency_us", link_latency_us)
        self._fallback = DefaultCostModel()

    def cost(self, node: Node) -> float:
        if node.op == "call_function":
            if is_wait(node):
                return 0.0
            if collective_of(node) is not None:
                return self._collective_cost(node)
        if _is_free(node):
            return 0.0
        module = called_module(node)
        if module is not None:
            return self._module_cost(module, node)
        out = _shape_of(node)
        if out is None:
            return self._fallback.cost(node)
        tensors = [s for s in map(_shape_of, node.all_input_nodes) if s is not None]
        moved = _bytes(out) + sum(map(_bytes, tensors))
        flops = 0.0
        if tensors and _name_category(_op_name(node)) is not None:  # matmul-like or MoE
            contracted = float(tensors[0][0][-1]) if tensors[0][0] else 1.0
            flops = 2.0 * math.prod(out[0]) * contracted
        return self._time(flops, moved)

    def _module_cost(self, module: torch.nn.Module, node: Node) -> float:
        inputs = [s for s in map(_shape_of, node.all_input_nodes) if s is not None]
        out = _shape_of(node)
        if out is None and inputs and isinstance(module, torch.nn.Linear):
            out = ((*inputs[0][0][:-1], module.out_features), inputs[0][1])
        if out is None:
            return self._fallback.cost(node)
        moved = weight_bytes(module) + _bytes(out) + sum(map(_bytes, inputs))
        return self._time(module_work(module, node, out, inputs), moved)

    def _collective_cost(self, node: Node) -> float:
        result = _tensor_bytes(_value(node))
        found = [_tensor_bytes(_value(n)) for n in node.all_input_nodes]
        inputs = [b for b in found if b is not None]
        if result is None and not inputs:
            return self._fallback.cost(node)
        payload = max(result or 0.0, sum(inputs))
        return self.link_latency_us + payload / self.link_bandwidth * 1e6

    def _time(self, flops: float, moved: float) -> float:
        seconds = max(flops / self.peak_flops, moved / self.bandwidth)
        return seconds * 1e6 + self.launch_us


# A tensor's shape (concrete sizes) and the bytes of one element.
_Shape = tuple[tuple[int, ...], int]


def _shape_of(node: Node) -> _Shape | None:
    """The shape of the tensor ``node`` produces, from ``meta["val"]`` (Dynamo's
    ``meta["example_value"]`` when there is none) or ``meta["tensor_meta"]``; None when it
    has neither (or produces no tensor)."""
    val = _value(node)
    if isinstance(val, torch.Tensor):
        return tuple(_static(d) for d in val.shape), val.element_size()
    meta = node.meta.get("tensor_meta")
    shape, dtype = getattr(meta, "shape", None), getattr(meta, "dtype", None)
    if shape is None or not isinstance(dtype, torch.dtype):
        return None
    return tuple(_static(d) for d in shape), dtype.itemsize


def _tensor_bytes(val: Any) -> float | None:
    """Bytes of a tensor, or of the tensors of a list or tuple; None when there are none."""
    if isinstance(val, torch.Tensor):
        return _bytes((tuple(_static(d) for d in val.shape), val.element_size()))
    if isinstance(val, (list, tuple)):
        found = [b for b in map(_tensor_bytes, val) if b is not None]
        return sum(found) if found else None
    return None


def _bytes(shape: _Shape) -> float:
    return float(math.prod(shape[0])) * shape[1]


def _static(d: Any) -> int:
    """A concrete size: symbolic sizes use their hint (or 1 when there is none)."""
    if isinstance(d, int):
        return d
    try:
        return int(d.node.hint) if d.node.hint is not None else 1
    except AttributeError:
        return 1

"""The bytes of every tensor of a graph: from the nodes' fake values, or propagated.

`msched.peak_memory` needs the storage size of every tensor a graph allocates and of its
inputs.  They come, per node, from ``meta["val"]``, Dynamo's ``meta["example_value"]`` or
``meta["tensor_meta"]`` (`torch.fx.passes.shape_prop`); a ``get_attr`` without them is read
from the module itself.  Where some node has none of them, `node_values` propagates fake
tensors from ``example_inputs`` through the whole graph (`torch.fx.Interpreter` under a
``FakeTensorMode``, without writing ``node.meta``); without ``example_inputs`` it raises
`msched.InvalidArgumentError` naming the nodes and saying what to pass.

Symbolic sizes (dynamic shapes) are evaluated by `SizeEvaluator`: at the values the caller
names (``sizes={"s0": 4096}``), else at the shape environment's hints; it records which
symbol got which value and which of them were hints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Interpreter, Node

from msched._text import agreeing, counted
from msched._torch_internals import (
    OpOverload,
    fake_tensor_mode,
    schema_of,
    symbol_hints,
    symbolic_expr,
)
from msched.errors import InvalidArgumentError

__all__ = ["SizeEvaluator", "has_value", "node_values", "returns_nothing", "storage_bytes"]

_META_KEYS = ("val", "example_value", "tensor_meta")


def has_value(node: Node) -> bool:
    """Whether ``node`` carries a fake value or tensor metadata."""
    return any(key in node.meta for key in _META_KEYS)


def _meta_value(node: Node) -> Any:
    meta = node.meta
    for key in _META_KEYS:
        if key in meta:
            return meta[key]
    return None


def node_values(
    gm: GraphModule | Graph,
    needed: Sequence[Node],
    example_inputs: Sequence[Any] | None,
) -> dict[Node, Any]:
    """The value (a fake tensor, tensor metadata, a tuple of them, ...) of every node of
    ``needed``: from its metadata, a ``get_attr`` from the module, or, when some node of
    ``needed`` has neither or ``example_inputs`` differ from the placeholders' values
    (`_inputs_differ`), every node propagated from ``example_inputs``."""
    module = gm if isinstance(gm, GraphModule) else gm.owning_module
    if example_inputs is not None and module is not None and _inputs_differ(module, example_inputs):
        return _propagated(module, example_inputs)
    missing = [n for n in needed if not has_value(n) and not _attribute_known(n, module)]
    if missing and example_inputs is None:
        shown = ", ".join(n.name for n in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise InvalidArgumentError(
            f"peak_memory needs the size of every tensor, but {counted(len(missing), 'node')} "
            f"({shown}) {agreeing(len(missing), 'has', 'have')} no meta['val'], "
            "meta['example_value'] or meta['tensor_meta']: pass "
            "example_inputs=(...) (the graph's inputs, real or fake tensors) to propagate "
            "sizes with fake tensors, or propagate them first (FakeTensorProp)"
        )
    if missing:
        if module is None:
            raise InvalidArgumentError(
                "propagating sizes from example_inputs needs the GraphModule, not a bare Graph"
            )
        return _propagated(module, example_inputs or ())
    return {n: _known_value(n, module) for n in needed}


def _inputs_differ(module: GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether ``example_inputs`` are not the inputs the graph's values were made for: another
    count, or a tensor of another shape (a symbolic one included) or dtype than its
    placeholder's value.

    Why: an engine budgets at its largest batch, and passes inputs of that size to a graph
    traced at a small one; reading the traced sizes would answer for the small batch."""
    placeholders = list(module.graph.find_nodes(op="placeholder"))
    if len(placeholders) != len(example_inputs):
        return True
    for node, given in zip(placeholders, example_inputs, strict=True):
        value = _meta_value(node)
        if not isinstance(given, torch.Tensor) or getattr(value, "shape", None) is None:
            continue
        # symbolic sizes on either side read as None: comparing one would add a guard
        dims = [d if type(d) is int else None for d in value.shape]
        if (
            dims != [d if type(d) is int else None for d in given.shape]
            or getattr(value, "dtype", given.dtype) != given.dtype
        ):
            return True
    return False


def _attribute_known(node: Node, module: torch.nn.Module | None) -> bool:
    """A ``get_attr`` of the module: a tensor (its own size) or anything else (none)."""
    return node.op == "get_attr" and _attribute(node, module) is not None


def _attribute(node: Node, module: torch.nn.Module | None) -> Any:
    value: Any = module
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value


def _known_value(node: Node, module: torch.nn.Module | None) -> Any:
    if has_value(node):
        return _meta_value(node)
    return _attribute(node, module)


class _Recorder(Interpreter):
    """Runs a graph (under a fake mode) and keeps every node's value."""

    def __init__(self, module: GraphModule) -> None:
        super().__init__(module)
        self.values: dict[Node, Any] = {}

    def run_node(self, n: Node) -> Any:
        value = super().run_node(n)
        self.values[n] = value
        return value


def _propagated(module: GraphModule, example_inputs: Sequence[Any]) -> dict[Node, Any]:
    placeholders = [n.name for n in module.graph.find_nodes(op="placeholder")]
    if len(example_inputs) != len(placeholders):
        raise InvalidArgumentError(
            f"example_inputs has {counted(len(example_inputs), 'value')}, but the graph "
            f"takes {counted(len(placeholders), 'input')} ({', '.join(placeholders)}): pass "
            "one value per input, in order"
        )
    mode = fake_tensor_mode(allow_non_fake_inputs=True)
    fake = [
        mode.from_tensor(t) if isinstance(t, torch.Tensor) and not _is_fake(t) else t
        for t in example_inputs
    ]
    recorder = _Recorder(module)
    try:
        with mode:
            recorder.run(*fake)
    except Exception as error:
        raise InvalidArgumentError(
            f"could not propagate sizes from example_inputs through the graph: "
            f"{type(error).__name__}: {error}; give every node meta['val'] instead"
        ) from error
    return recorder.values


def _is_fake(t: torch.Tensor) -> bool:
    return type(t).__name__ == "FakeTensor"


def is_export_guard(node: Node) -> bool:
    """Whether ``node`` calls the ``_guards_fn`` of a module ``torch.export`` unlifted: it
    checks the inputs' shapes, returns None and launches no work on a device."""
    if node.op != "call_module" or node.users:
        return False
    module = node.graph.owning_module
    submodule = getattr(module, str(node.target), None) if module is not None else None
    return type(submodule).__name__ == "GuardsFn"


def returns_nothing(node: Node) -> bool:
    """Whether ``node`` calls an op whose schema returns nothing, or the guard function
    ``torch.export`` puts in an unlifted module (its size is known: none).

    Why the guards: ``ExportedProgram.module()`` calls ``_guards_fn`` (it checks the inputs'
    shapes and returns None) and gives that node no fake value, though every other node has
    one; without this, every exported module would need ``example_inputs``, and a dynamic one
    would lose its symbolic sizes to the propagation."""
    if node.op == "call_module":
        return is_export_guard(node)
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return False
    return not schema_of(node.target).returns


class SizeEvaluator:
    """Sizes as ints: symbolic ones at ``given`` (symbol name -> value), else at the shape
    environment's hint.  ``used`` maps every symbol evaluated to its value; ``hinted`` lists
    the symbols that took their hint."""

    def __init__(self, given: Mapping[str, int] | None) -> None:
        self.given = dict(given or {})
        for name, value in self.given.items():
            if not isinstance(name, str) or type(value) is not int or value < 0:
                raise InvalidArgumentError(
                    f"sizes maps symbol names to non-negative ints, got {name!r}: {value!r}"
                )
        self.used: dict[str, int] = {}
        self.hinted: set[str] = set()
        self._cache: dict[Any, int] = {}

    def __call__(self, x: Any) -> int:
        if isinstance(x, int):
            return x
        expr = symbolic_expr(x)
        if expr is None:
            return int(x)
        found = self._cache.get(expr)
        if found is None:
            found = self._cache[expr] = self._evaluate(expr, x)
        return found

    def _evaluate(self, expr: Any, size: Any) -> int:
        values = {}
        for symbol in sorted(expr.free_symbols, key=str):
            name = str(symbol)
            if name in self.given:
                values[symbol] = self.given[name]
            else:
                values[symbol] = self._hint(symbol, name, size)
                self.hinted.add(name)
            self.used[name] = int(values[symbol])
        try:
            return int(expr.xreplace({s: _integer(v) for s, v in values.items()}))
        except (ZeroDivisionError, TypeError, ValueError) as error:
            shown = ", ".join(f"{s}={v}" for s, v in values.items())
            raise InvalidArgumentError(
                f"the size {expr} has no value at {shown} ({type(error).__name__}: {error}): "
                "the graph cannot run at those sizes; pass other sizes="
            ) from error

    @staticmethod
    def _hint(symbol: Any, name: str, size: Any) -> int:
        hints = symbol_hints(size)
        if symbol not in hints:
            raise InvalidArgumentError(
                f"the symbolic size {name} has no hint: pass sizes={{{name!r}: ...}}"
            )
        return int(hints[symbol])

    def check_given(self) -> None:
        """Every symbol the caller named is one the graph has."""
        unknown = sorted(set(self.given) - set(self.used))
        if unknown:
            known = ", ".join(sorted(self.used)) or "none"
            raise InvalidArgumentError(
                f"sizes names {', '.join(unknown)}, which no tensor of the graph has "
                f"(its symbolic sizes: {known})"
            )


def _integer(value: int) -> Any:
    import sympy

    return sympy.Integer(value)


def storage_bytes(value: Any, evaluate: SizeEvaluator) -> int | None:
    """The bytes of the storage of the tensor ``value`` (a tensor or tensor metadata); None
    for anything that is not a tensor."""
    if isinstance(value, torch.Tensor):
        try:
            return evaluate(value.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError, AttributeError):
            offset = value.storage_offset()
            return _extent(value.shape, value.stride(), offset, value.element_size(), evaluate)
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    stride = getattr(value, "stride", None)
    if shape is None or not isinstance(dtype, torch.dtype) or stride is None:
        return None
    return _extent(shape, stride, 0, dtype.itemsize, evaluate)


def _extent(
    shape: Sequence[Any], stride: Sequence[Any], offset: Any, itemsize: int, ev: SizeEvaluator
) -> int:
    """Bytes from the start of the storage to the last element (PyTorch's
    ``computeStorageNbytes``)."""
    sizes = [ev(d) for d in shape]
    if any(d == 0 for d in sizes):
        return 0
    last = ev(offset) + sum((d - 1) * ev(s) for d, s in zip(sizes, stride, strict=True))
    return (last + 1) * itemsize

"""Which calls of a graph are ``split_ops`` calls, for both graphs a backend splits.

Why: ``compiler="fx"`` splits AOT autograd's graph, whose calls are aten and custom ops
(``aten._scaled_dot_product_flash_attention_for_cpu.default``), while ``compiler="inductor"``
splits the graph Dynamo hands over, whose calls are torch-level functions
(``torch._C._nn.scaled_dot_product_attention``, ``torch.softmax``), Tensor methods and
modules.  A user names a split op once, in any spelling, and both compilers split at the
same calls.

A split op is (`parse_split_ops` takes it from the user and refuses anything else):

- an op: an ``OpOverload``, an ``OpOverloadPacket`` (any of its overloads) or a qualified
  name ``"namespace::name[.overload]"`` (also as Python prints ops: ``"aten.mm.default"``,
  ``"torch.ops.aten.mm"``), matched by schema, so naming an op imports nothing;
- a torch-level function: the callable (``torch.nn.functional.scaled_dot_product_attention``)
  or its dotted name (``"torch.nn.functional.scaled_dot_product_attention"``, also
  ``"torch.softmax"``, ``"torch.Tensor.softmax"``); a callable torch can name is kept as
  that name (`torch.overrides.resolve_name`), so both spellings are one split op.

What a call answers to (`CallIndex`), besides its own target:

1. A call of a torch builtin or Tensor method (Dynamo's graph) answers to the aten op of
   the same name (torch generates those bindings from aten's schemas: ``linear``,
   ``scaled_dot_product_attention``), and to the ops it dispatches to on its fake example
   values (``_scaled_dot_product_flash_attention_for_cpu`` on CPU, another kernel on CUDA;
   `msched._torch_internals.ops_dispatched_by`), found only when an aten op is to be matched.
2. A node of AOT autograd's graph answers to the torch-level function of the Dynamo call it
   came from (``meta["source_fn_stack"]``) and that function's aten op (rule 1), and to the
   op it was traced under (``meta["original_aten"]``: the ``getitem`` of a multi-output op).

Consecutive split calls that came from one Dynamo call (an attention kernel and the
``getitem`` of its output) are one call (`CallIndex.call_of`), so they make one piece.
"""

from __future__ import annotations

import functools
import importlib
import re
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Node
from torch.overrides import resolve_name

from msched._torch_internals import (
    HigherOrderOperator,
    OpOverload,
    OpOverloadPacket,
    example_value,
    ops_dispatched_by,
    original_aten,
    qualified_name,
    schema_of,
    source_function,
    tree_flatten,
)
from msched.errors import InvalidArgumentError

OP_KINDS = (OpOverload, OpOverloadPacket)

_QUALIFIED_NAME = re.compile(r"[A-Za-z_]\w*::[A-Za-z_]\w*(\.[A-Za-z_]\w*)?")
# How Python prints an op: ``aten.mm.default``, ``torch.ops.aten.mm`` (namespace.name[.overload])
_DOTTED_NAME = re.compile(r"(?:torch\.ops\.)?([A-Za-z_]\w*)\.([A-Za-z_]\w*)(\.[A-Za-z_]\w*)?")
_FUNCTION_PATH = re.compile(r"torch(\.[A-Za-z_]\w*)+")
_CALLS = ("call_function", "call_method", "call_module")


def parse_split_ops(split_ops: Any) -> tuple[Any, ...]:
    """``split_ops`` as the backend keeps them (`spec_of` each), or `InvalidArgumentError`
    unless it is a non-empty sequence of split ops (a single op or string is refused, not
    iterated)."""
    if isinstance(split_ops, (str, bytes, *OP_KINDS)) or not isinstance(split_ops, Iterable):
        raise InvalidArgumentError(
            f"split_ops must be a sequence of torch ops, op names or torch functions (e.g. "
            f'["msched::attention"]), got {split_ops!r} ({type(split_ops).__name__})'
        )
    given = tuple(split_ops)
    specs = tuple(spec_of(op) for op in given)
    bad = [op for op, spec in zip(given, specs, strict=True) if spec is None]
    if bad:
        raise InvalidArgumentError(
            "split_ops must be torch ops (OpOverload or OpOverloadPacket), qualified op names "
            '("namespace::name", "namespace::name.overload" or "namespace.name.overload") or '
            "torch-level functions (torch.nn.functional.scaled_dot_product_attention, or by "
            f'name: "torch.nn.functional.scaled_dot_product_attention"), got {bad!r}'
        )
    if not specs:
        raise InvalidArgumentError("split_ops must name at least one op to split at")
    return specs


def spec_of(op: Any) -> Any:
    """``op`` as `CallIndex.matches` takes it: an op as given; a qualified name as
    ``"ns::name[.overload]"``; a torch-level function as its dotted name when torch names it
    (else the callable); None when ``op`` is none of these."""
    if isinstance(op, OP_KINDS):
        return op
    if isinstance(op, str):
        return _name_spec(op)
    if callable(op) and not isinstance(op, (type, HigherOrderOperator)):
        name = _torch_name(op)
        return name if name is not None else op
    return None


def _name_spec(name: str) -> str | None:
    if _QUALIFIED_NAME.fullmatch(name):
        return name
    if _FUNCTION_PATH.fullmatch(name) and not name.startswith("torch.ops."):
        return name if resolve_function(name) is not None else None
    dotted = _DOTTED_NAME.fullmatch(name)
    if dotted is None:
        return None
    namespace, op_name, overload = dotted.groups()
    return f"{namespace}::{op_name}{overload or ''}"


@functools.cache
def resolve_function(path: str) -> Any:
    """The torch-level callable ``path`` names (``"torch.softmax"``, ``"torch.Tensor.view"``),
    or None: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute, None)
        ok = callable(value) and not isinstance(value, (type, *OP_KINDS, HigherOrderOperator))
        return value if ok else None
    return None


def _torch_name(function: Any) -> str | None:
    """The dotted name torch gives ``function``, when that name leads back to it."""
    try:
        name = resolve_name(function)
    except (TypeError, AttributeError):
        return None
    if name is None or not _FUNCTION_PATH.fullmatch(name):
        return None
    return name if resolve_function(name) is function else None


def qualified_op_name(op: Any) -> str:
    """``op`` spelled as ``split_ops`` takes it: ``"aten::mm.default"``, ``"aten::mm"``."""
    if isinstance(op, OpOverload):
        schema = schema_of(op)
        return f"{schema.name}.{schema.overload_name or 'default'}"
    if isinstance(op, OpOverloadPacket):
        return qualified_name(op)
    return str(op)


def describe(spec: Any) -> str:
    """A split op as messages name it (deterministic: no addresses)."""
    if isinstance(spec, OP_KINDS) or isinstance(spec, str):
        return qualified_op_name(spec)
    return function_label(spec)


def function_label(function: Any) -> str:
    """``torch.nn.functional.scaled_dot_product_attention``, ``operator.add``, ``pkg.f``."""
    name = _torch_name(function)
    if name is not None:
        return name
    module = getattr(function, "__module__", None) or ""
    qualname = getattr(function, "__qualname__", None) or getattr(function, "__name__", "")
    module = module.lstrip("_") if module in ("_operator", "_functools") else module
    return f"{module}.{qualname}" if module and qualname else repr(function)


def has_name(target: Any, name: Any) -> bool:
    """Whether the op ``target`` is the one the qualified name ``name`` stands for (an
    ``OpOverloadPacket``, as Dynamo's graphs call custom ops, by a name without overload)."""
    if isinstance(name, str) and isinstance(target, OpOverloadPacket):
        return "." not in name and qualified_name(target) == name
    if not isinstance(name, str) or not isinstance(target, OpOverload):
        return False
    schema = schema_of(target)
    if "." not in name:
        return bool(schema.name == name)
    return f"{schema.name}.{schema.overload_name or 'default'}" == name


@dataclass(frozen=True)
class Call:
    """What one node calls, as split ops are matched against it.

    ``label``: how messages name it (an op's qualified name, a torch-level function's dotted
    name, ``torch.Tensor.<method>``, a module's class); ``ops``: the ops it answers to
    without running it; ``functions``: the torch-level functions it answers to;
    ``dispatch``: what runs it on fake values (`ops_dispatched_by`), or None."""

    label: str
    ops: tuple[Any, ...]
    functions: tuple[Any, ...]
    dispatch: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None = None


class CallIndex:
    """The `Call` of every call node of one graph, made when first asked for; what the
    nodes dispatch to is found at most once per node, and only to match an aten op."""

    def __init__(self, owner: torch.nn.Module | None = None) -> None:
        self.owner = owner
        self._calls: dict[Node, Call] = {}
        self._dispatched: dict[Node, tuple[Any, ...]] = {}

    def call(self, node: Node) -> Call:
        found = self._calls.get(node)
        if found is None:
            found = self._calls[node] = _call_of(node, self.owner)
        return found

    def matches(self, node: Node, split_ops: tuple[Any, ...]) -> bool:
        """Whether ``node`` calls one of ``split_ops`` (module docstring)."""
        if node.op not in _CALLS:
            return False
        call = self.call(node)
        return any(self._matches(node, call, spec) for spec in split_ops)

    def _matches(self, node: Node, call: Call, spec: Any) -> bool:
        if isinstance(spec, OP_KINDS) or (isinstance(spec, str) and "::" in spec):
            if any(_op_matches(op, spec) for op in call.ops):
                return True
            return _may_dispatch_to(spec) and any(
                _op_matches(op, spec) for op in self.dispatched(node)
            )
        function = resolve_function(spec) if isinstance(spec, str) else spec
        return function is not None and any(f is function for f in call.functions)

    def dispatched(self, node: Node) -> tuple[Any, ...]:
        """The ops ``node``'s call dispatches to on its fake example values (() if unknown)."""
        if node not in self._dispatched:
            dispatch = self.call(node).dispatch
            self._dispatched[node] = ops_dispatched_by(*dispatch) if dispatch else ()
        return self._dispatched[node]

    def call_of(self, node: Node) -> str:
        """Which call of the user's program ``node`` belongs to: the Dynamo call an AOT
        node came from, else the node itself."""
        source = source_function(node)
        return f"source:{source[0]}" if source is not None else f"node:{node.name}"


def _op_matches(op: Any, spec: Any) -> bool:
    """Whether ``op`` is the split op ``spec`` (by schema: an overload is one op however
    it was looked up)."""
    if not isinstance(spec, str):
        spec = qualified_op_name(spec)
    return has_name(op, spec)


def _may_dispatch_to(spec: Any) -> bool:
    """Whether a torch-level call may run ``spec`` below autograd: aten and prims ops only
    (a custom op is called by its own node in Dynamo's graph)."""
    name = spec if isinstance(spec, str) else qualified_op_name(spec)
    return name.split("::", 1)[0] in ("aten", "prims")


def _call_of(node: Node, owner: torch.nn.Module | None) -> Call:
    target = node.target
    if node.op == "call_module":
        module = owner.get_submodule(str(target)) if owner is not None else None
        kind = type(module) if module is not None else None
        label = f"{kind.__module__}.{kind.__qualname__}" if kind else f"module {target}"
        return Call(label, (), ())
    if node.op == "call_method":
        method = getattr(torch.Tensor, str(target), None)
        label = f"torch.Tensor.{target}"
        if method is None:
            return Call(label, (), ())
        return Call(label, _aten_of(str(target)), (method,), _dispatch(method, node))
    if isinstance(target, OP_KINDS) or isinstance(target, HigherOrderOperator):
        ops = (target, *_traced_under(node, target))
        label = qualified_op_name(target) if isinstance(target, OP_KINDS) else target.__name__
        return Call(label, ops, _source_functions(node))
    ops = _aten_of(getattr(target, "__name__", "")) if _is_torch_builtin(target) else ()
    return Call(
        function_label(target),
        tuple(dict.fromkeys((*ops, *_traced_under(node, target)))),
        tuple(dict.fromkeys((target, *_source_functions(node)))),
        _dispatch(target, node),
    )


def _traced_under(node: Node, target: Any) -> tuple[Any, ...]:
    """AOT: the op ``node`` was traced under, and the aten op of the function it came from."""
    ops = [op for op in (original_aten(node),) if op is not None and op is not target]
    for function in _source_functions(node):
        if _is_torch_builtin(function):
            ops.extend(_aten_of(function.__name__))
    return tuple(ops)


def _source_functions(node: Node) -> tuple[Any, ...]:
    source = source_function(node)
    if source is None:
        return ()
    function = source[1]
    plain = callable(function) and not isinstance(function, (type, *OP_KINDS))
    return (function,) if plain else ()


def _is_torch_builtin(function: Any) -> bool:
    """A torch binding generated from an aten schema (``torch.softmax``,
    ``torch._C._nn.linear``) or a Tensor method: its name is the aten op's."""
    if isinstance(function, types.BuiltinFunctionType):
        module = getattr(function, "__module__", None) or ""
        return module == "torch" or module.startswith("torch._C")
    name = getattr(function, "__name__", "")
    method = isinstance(function, types.MethodDescriptorType)
    return method and getattr(torch.Tensor, name, None) is function


@functools.cache
def _aten_of(name: str) -> tuple[Any, ...]:
    """The aten op named ``name``: its only overload, or its packet when it has several."""
    packet = getattr(torch.ops.aten, name, None) if name.isidentifier() else None
    if not isinstance(packet, OpOverloadPacket):
        return ()
    overloads = packet.overloads()
    return (getattr(packet, overloads[0]),) if len(overloads) == 1 else (packet,)


def _dispatch(
    function: Any, node: Node
) -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None:
    """How to run ``node``'s call on fake values: only a call Dynamo computed a tensor for
    (a call that returns none sets state, such as grad mode, and is not run)."""
    computed, _ = tree_flatten(example_value(node))
    if not any(isinstance(value, torch.Tensor) for value in computed):
        return None
    if any(example_value(n) is None for n in node.all_input_nodes):
        return None
    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), example_value)
    return function, tuple(args), dict(kwargs)


__all__ = [
    "OP_KINDS",
    "Call",
    "CallIndex",
    "describe",
    "function_label",
    "has_name",
    "parse_split_ops",
    "qualified_op_name",
    "resolve_function",
    "spec_of",
]

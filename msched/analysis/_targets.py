"""What a call target does to the tensors it receives: the facts behind `msched.analysis.effects`.

One `OpInfo` per target (cached), derived from what can be known and nothing else:

- ``OpOverload``: its schema, exactly (``Tensor(a!)`` arguments are written, ``Tensor(a)``
  returns alias the argument with the same alias set);
- ``OpOverloadPacket`` and torch-level functions (``torch.mul``, ``torch._C._nn.linear``, …):
  the union over the aten schemas ``torch.fx.operator_schemas`` finds for them, so ``out=`` is a
  write and a view op is a view whichever overload runs;
- ``torch.Tensor`` methods (``call_method``): the schemas of the aten op of the same name;
- ``torch.nn.functional`` functions and ``torch.nn`` modules on an allowlist of pure ones, with
  ``inplace=True`` (argument or module attribute) honoured; dropout-like ones are random;
- registrations: `register_mutation`, `register_side_effect`, `register_pure`;
- collectives (`msched.analysis.collectives`): their schema's facts, always a side effect, and
  a ``collective`` role that `msched.analysis.effects` turns into the asynchronous effects.

**Sound by default**: anything else is *unknown* and assumed to read and write every tensor it
receives, to return a possible alias of them, and to touch state outside the graph (so unknown
calls keep their relative order).  A blind spot here would be a false "ok" of `msched.verify`,
which shares this analysis.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.fx.operator_schemas import get_signature_for_torch_op

from msched._torch_internals import (
    SIDE_EFFECTFUL_FUNCTIONS,
    HigherOrderOperator,
    OpOverload,
    OpOverloadPacket,
    custom_op_overload,
    has_forward_hooks,
    qualified_name,
    schema_of,
    torch_says_impure,
)
from msched.analysis._collective_targets import collective_role
from msched.analysis._target_names import (
    BATCH_NORMS,
    INPLACE_DUNDERS,
    INPLACE_OPERATORS,
    MAYBE_ALIAS_MODULES,
    MAYBE_ALIAS_NAMES,
    NON_TENSOR_NAMES,
    PURE_DUNDERS,
    PURE_FUNCTIONAL,
    PURE_MODULES,
    PURE_PYTHON,
    RANDOM_FUNCTIONAL,
    RANDOM_MODULES,
    STORAGE_SWAPS,
    UNANNOTATED_VIEWS,
    UNANNOTATED_WRITES,
    VIEW_MODULES,
    VIEW_NAMES,
)
from msched.errors import InvalidArgumentError

# A written argument that can only be passed by keyword (``out=``) has this position.
KEYWORD_ONLY = -1

# target -> argument names that it writes, for ops whose schema does not say so.
REGISTERED_MUTATIONS: dict[Any, tuple[str, ...]] = {}
# targets (ops, functions, module types or instances) with effects outside the graph's tensors.
REGISTERED_SIDE_EFFECTS: set[Any] = set()
# targets declared pure: read their inputs, write nothing, return fresh storage.
REGISTERED_PURE: set[Any] = set()
# ops whose results are new storages although they write arguments in place (each element
# of a list result its own): `register_fresh_results`.
REGISTERED_FRESH_RESULTS: set[Any] = set()


@dataclass(frozen=True)
class OpInfo:
    """What a call target does, independent of the node."""

    # (position, name) of arguments it may write; position KEYWORD_ONLY: by keyword only
    writes: tuple[tuple[int, str], ...] = ()
    # exact schemas: return index -> (position, name) of the argument it aliases, or None
    return_alias: tuple[tuple[int, str] | None, ...] = ()
    multi_output: bool = False
    # the result is a view of the first argument (reads nothing itself)
    view_of_first: bool = False
    # the result aliases the written argument the node passes (in-place and out= calls)
    returns_written: bool = False
    # the results are new storages although it writes arguments (`register_fresh_results`)
    fresh_results: bool = False
    # the result has storage of its own that may also be its first input's (``x.float()``)
    maybe_alias: bool = False
    # nothing is known: reads and writes every tensor it receives, result may alias them
    unknown: bool = False
    # touches state outside the graph's tensors (RNG, unknown code): keeps its order
    world: bool = False
    # unknown code that can reach any state of the model (hooks): touches every attribute
    any_state: bool = False
    # ``a.set_(b)``: from here on an access to the first argument is one to the second too
    swaps_storage: bool = False
    side_effect: bool = False
    # ``inplace`` parameter (position, name): a truthy value makes it write its first input
    inplace_param: tuple[int, str] | None = None
    # a collective: "async" issue, "wait" (wait_tensor) or "sync" (engine op); "" otherwise
    collective: str = ""
    # derived: fresh storage, no writes, no side effect (reads its inputs and nothing more)
    plain: bool = field(init=False, default=False)
    # derived: like ``plain``, but a side effect (stream ops, ``print``): must run
    plain_side_effect: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        single_alias = len(self.return_alias) == 1 and self.return_alias[0] is not None
        special = (
            self.writes
            or self.view_of_first
            or single_alias
            or self.maybe_alias
            or self.unknown
            or self.any_state
            or self.swaps_storage
            or self.inplace_param is not None
            or self.collective
        )
        plain = not (special or self.side_effect or self.world)
        object.__setattr__(self, "plain", plain)
        object.__setattr__(self, "plain_side_effect", not special and self.side_effect)


PLAIN = OpInfo()
UNKNOWN = OpInfo(unknown=True, world=True, side_effect=True)
_HOOKED = OpInfo(unknown=True, world=True, side_effect=True, any_state=True)
_VIEW = OpInfo(view_of_first=True)
_MAYBE_ALIAS = OpInfo(maybe_alias=True)
_WRITES_FIRST = OpInfo(writes=((0, "self"),), returns_written=True, side_effect=True)


def _is_target(op: Any) -> bool:
    """Whether ``op`` can be the target of a node: an op, a callable or a module."""
    if isinstance(op, (OpOverload, OpOverloadPacket, HigherOrderOperator, nn.Module)):
        return True
    if isinstance(op, type):
        return issubclass(op, nn.Module)
    return callable(op)


def check_target(function: str, op: Any) -> Any:
    """``op`` checked as a node target; a ``torch.library.custom_op`` result is read as its op."""
    op = custom_op_overload(op) or op
    if not _is_target(op):
        raise InvalidArgumentError(
            f"{function}: {op!r} is not an op, a function or an nn.Module (type or instance); "
            "pass the target of a node, for example torch.ops.mylib.my_op or my_function"
        )
    try:
        hash(op)
    except TypeError:
        raise InvalidArgumentError(f"{function}: {op!r} is not hashable") from None
    return op


def register_mutation(op: Any, *arg_names: str) -> None:
    """Declare that ``op`` writes the arguments named ``arg_names``.

    For ops whose schema does not mark the mutation (``Tensor(a!)``), for example Python
    functions called through ``call_function`` or custom ops defined without ``mutates_args``.
    Registering an ``OpOverloadPacket`` covers all of its overloads.
    """
    op = check_target("register_mutation", op)
    if not arg_names:
        raise InvalidArgumentError(f"register_mutation({op!r}) needs at least one argument name")
    bad = [n for n in arg_names if not isinstance(n, str)]
    if bad:
        raise InvalidArgumentError(f"register_mutation: argument names must be str, got {bad!r}")
    names = argument_names(op)
    unknown = [n for n in arg_names if names is not None and n not in names]
    if unknown:
        raise InvalidArgumentError(
            f"register_mutation: {op!r} has no argument named {', '.join(unknown)}; "
            f"its arguments are {', '.join(names or ())}"
        )
    REGISTERED_MUTATIONS[op] = tuple(arg_names)
    OP_INFO_CACHE.clear()


def register_side_effect(op: Any) -> None:
    """Declare that ``op`` has an effect outside the graph's tensors: never reordered away.

    ``op`` is an op, a function, or an ``nn.Module`` subclass or instance (``call_module``).
    """
    op = check_target("register_side_effect", op)
    REGISTERED_SIDE_EFFECTS.add(op)
    OP_INFO_CACHE.clear()


def register_pure(op: Any) -> None:
    """Declare that ``op`` reads its inputs, writes nothing and returns fresh tensors.

    msched assumes that a function, method or module it knows nothing about reads and writes
    every tensor it receives; this makes such a target as precise as a plain aten op.  ``op``
    is an op, a function, or an ``nn.Module`` subclass (its exact type) or instance.
    """
    op = check_target("register_pure", op)
    REGISTERED_PURE.add(op)
    OP_INFO_CACHE.clear()


def register_fresh_results(op: Any) -> None:
    """Declare that every result of the ``OpOverload`` ``op`` (each element of a list result)
    is a new storage, although ``op`` writes some arguments in place.

    Without it, the results of a multi-output op that writes are read as aliases of what it
    writes (``out=`` tensors come back that way).  For ops whose schema cannot say it: a
    ``Tensor[]`` result carries no alias set of its own (msched's kernel-order ops)."""
    op = check_target("register_fresh_results", op)
    if not isinstance(op, OpOverload):
        raise InvalidArgumentError(f"register_fresh_results needs an OpOverload, got {op!r}")
    REGISTERED_FRESH_RESULTS.add(op)
    OP_INFO_CACHE.clear()


def argument_names(op: Any) -> list[str] | None:
    if isinstance(op, OpOverload):
        return [a.name for a in schema_of(op).arguments]
    if isinstance(op, OpOverloadPacket):
        return sorted({a.name for o in op.overloads() for a in schema_of(getattr(op, o)).arguments})
    try:
        return list(inspect.signature(op).parameters)
    except (TypeError, ValueError):
        return None


OP_INFO_CACHE: dict[Any, OpInfo] = {}


def _is_random(op: Any) -> bool:
    return torch.Tag.nondeterministic_seeded in getattr(op, "tags", ())


def overload_info(op: Any) -> OpInfo:
    """The exact facts of one ``OpOverload``, from its schema and the registrations."""
    schema = schema_of(op)
    args = schema.arguments
    hidden = UNANNOTATED_WRITES.get(schema.name, ())
    writes = tuple((i, a.name) for i, a in enumerate(args) if _is_written(a) or a.name in hidden)
    registered = REGISTERED_MUTATIONS.get(op) or REGISTERED_MUTATIONS.get(op.overloadpacket)
    if registered:
        writes += tuple((i, a.name) for i, a in enumerate(args) if a.name in registered)
    if op in REGISTERED_PURE or op.overloadpacket in REGISTERED_PURE:
        return PLAIN
    return_alias = [_return_alias(args, r) for r in schema.returns]
    if schema.name in UNANNOTATED_VIEWS:
        return_alias = [(0, args[0].name)]
    multi = len(schema.returns) > 1 or (len(schema.returns) == 1 and _is_list(schema.returns[0]))
    is_view = bool(schema.returns) and not writes and all(r is not None for r in return_alias)
    registered_side = bool({op, op.overloadpacket} & REGISTERED_SIDE_EFFECTS)
    side = (
        bool(writes)
        or schema.is_mutable
        or registered_side
        or op in SIDE_EFFECTFUL_FUNCTIONS
        or _torch_says_impure(op)
    )
    return OpInfo(
        writes=writes,
        return_alias=tuple(return_alias),
        multi_output=multi and not is_view,
        view_of_first=is_view,
        side_effect=side,
        world=_is_random(op) or registered_side,
        swaps_storage=schema.name in STORAGE_SWAPS,
        fresh_results=op in REGISTERED_FRESH_RESULTS,
    )


def _is_list(ret: Any) -> bool:
    """Whether a schema return is a list (``Tensor[]``: its type prints as ``List[Tensor]``,
    so its elements are separate results, each taken out with ``getitem``)."""
    return isinstance(ret.type, torch.ListType)


def _is_written(argument: Any) -> bool:
    return argument.alias_info is not None and argument.alias_info.is_write


def _return_alias(args: Any, ret: Any) -> tuple[int, str] | None:
    if ret.alias_info is None:
        return None
    return _aliased_argument(args, set(ret.alias_info.before_set))


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


def schemas_info(schemas: Iterable[Any], random: bool = False) -> OpInfo:
    """The facts that hold whichever of ``schemas`` a call binds to (their union).

    An argument written by some overload is written when passed; a view returned by some
    overload makes the result a view of that argument; an overload returning a written argument
    makes the result alias it when the node passes it.
    """
    writes: dict[tuple[int, str], None] = {}
    views: dict[tuple[int, str], None] = {}
    multi = returns_written = False
    for schema in schemas:
        args = schema.arguments
        hidden = UNANNOTATED_WRITES.get(schema.name, ())
        written = {a.name for a in args if _is_written(a) or a.name in hidden}
        for i, a in enumerate(args):
            if a.name in written:
                writes[(KEYWORD_ONLY if a.kwarg_only else i, a.name)] = None
        for ret in schema.returns:
            alias = _return_alias(args, ret)
            if alias is not None and alias[1] in written:
                returns_written = True
            elif alias is not None:
                views[alias] = None
        returns = schema.returns
        multi = multi or len(returns) > 1 or (bool(returns) and _is_list(returns[0]))
    if not writes and len(views) == 1 and next(iter(views))[0] == 0:
        return OpInfo(view_of_first=True, world=random, side_effect=random)
    if views:  # a view of some argument other than the first, or views and writes: be coarse
        return OpInfo(writes=tuple(writes), maybe_alias=True, world=random, side_effect=random)
    return OpInfo(
        writes=tuple(writes),
        returns_written=returns_written,
        multi_output=multi,
        return_alias=(None, None) if multi else (),
        world=random,
        side_effect=random,
    )


def _torch_says_impure(target: Any) -> bool:
    """torch.fx's own purity rule (mutable schema, effectful or random ops), per target."""
    try:
        return bool(torch_says_impure(target))
    except Exception:  # a target torch cannot classify: rely on our own rules
        return False


def packet_info(packet: Any) -> OpInfo:
    """The union of the facts of a packet's overloads (with the registrations)."""
    overloads = [getattr(packet, name) for name in packet.overloads()]
    registered = REGISTERED_MUTATIONS.get(packet)
    if packet in REGISTERED_PURE:
        return PLAIN
    if len(overloads) == 1 or registered:
        return overload_info(overloads[0] if len(overloads) == 1 else packet.default)
    info = schemas_info((schema_of(o) for o in overloads), any(map(_is_random, overloads)))
    if packet in REGISTERED_SIDE_EFFECTS:
        info = replace(info, side_effect=True, world=True)
    if qualified_name(packet) in STORAGE_SWAPS:
        info = replace(info, swaps_storage=True)
    return info


def method_info(name: str) -> OpInfo:
    """What ``tensor.name(...)`` does (``call_method`` nodes)."""
    info = OP_INFO_CACHE.get(("method", name))
    if info is None:
        info = OP_INFO_CACHE[("method", name)] = _derive_method_info(name)
    return info


def _derive_method_info(name: str) -> OpInfo:
    if name in INPLACE_DUNDERS:
        return _WRITES_FIRST
    if name in VIEW_NAMES:
        return _VIEW
    if name in MAYBE_ALIAS_NAMES:
        return _MAYBE_ALIAS
    if name in NON_TENSOR_NAMES or name in PURE_DUNDERS:
        return PLAIN
    packet = _aten_packet(name)
    if packet is not None:
        return packet_info(packet)
    if name.endswith("_") and not name.startswith("_") and hasattr(torch.Tensor, name):
        return _WRITES_FIRST
    return UNKNOWN


def _aten_packet(name: str) -> Any:
    try:
        packet = getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError):
        return None
    return packet if isinstance(packet, OpOverloadPacket) else None


def function_info(target: Any) -> OpInfo:
    """What a ``call_function`` target does (cached per target)."""
    info = OP_INFO_CACHE.get(target)
    if info is None:
        role = collective_role(target)
        if role is not None:
            info = replace(_plain_function_info(target), side_effect=True, collective=role)
        else:
            info = _plain_function_info(target)
        OP_INFO_CACHE[target] = info
    return info


def _plain_function_info(target: Any) -> OpInfo:
    """What ``target`` does by its schema, signature or registrations alone."""
    if isinstance(target, OpOverload):
        return overload_info(target)
    if isinstance(target, OpOverloadPacket):
        return packet_info(target)
    return _callable_info(target)


def _callable_info(fn: Any) -> OpInfo:
    registered = _registered_callable_info(fn)
    if registered is not None:
        return registered
    if fn in INPLACE_OPERATORS:
        return _WRITES_FIRST
    if fn in PURE_PYTHON:
        return PLAIN
    name = getattr(fn, "__name__", "")
    if isinstance(fn, HigherOrderOperator):
        if name.startswith("auto_functionalized"):  # functional: fresh outputs
            return OpInfo(multi_output=True)
        return UNKNOWN
    if getattr(torch.Tensor, name, None) is fn:  # torch.Tensor.add_(x, 1) as a function
        return method_info(name)
    schemas = _torch_schemas(fn)
    if schemas:
        overloads = [_overload_of(s) for s in schemas]
        info = schemas_info(schemas, any(_is_random(o) for o in overloads if o is not None))
        return info if not _torch_says_impure(fn) else replace(info, side_effect=True, world=True)
    return _functional_info(fn, name)


def _registered_callable_info(fn: Any) -> OpInfo | None:
    if fn in REGISTERED_PURE:
        return PLAIN
    registered = REGISTERED_MUTATIONS.get(fn)
    side = fn in REGISTERED_SIDE_EFFECTS
    if registered:
        params = argument_names(fn) or []
        writes = tuple((params.index(n), n) for n in registered if n in params)
        return OpInfo(writes=writes, side_effect=True, world=side)
    if side or (fn in SIDE_EFFECTFUL_FUNCTIONS and fn not in INPLACE_OPERATORS):
        return OpInfo(side_effect=True, world=True)
    return None


def _torch_schemas(fn: Any) -> list[Any]:
    module = getattr(fn, "__module__", None) or ""
    if not (module == "torch" or module.startswith("torch.")) and module != "":
        return []
    try:
        found = get_signature_for_torch_op(fn, return_schemas=True)
    except Exception:  # torch cannot look it up: it is not a torch op
        return []
    schemas = found[1] if isinstance(found, tuple) else None
    return list(schemas or [])


def _overload_of(schema: Any) -> Any:
    namespace, _, name = schema.name.partition("::")
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        return getattr(packet, schema.overload_name or "default")
    except (AttributeError, RuntimeError):
        return None


def _functional_info(fn: Any, name: str) -> OpInfo:
    """torch.nn.functional's Python functions on the allowlist; anything else is unknown."""
    if getattr(F, name, None) is not fn or name not in PURE_FUNCTIONAL | RANDOM_FUNCTIONAL:
        return UNKNOWN
    random = name in RANDOM_FUNCTIONAL
    params = argument_names(fn) or []
    inplace = (params.index("inplace"), "inplace") if "inplace" in params else None
    return OpInfo(world=random, side_effect=random, inplace_param=inplace)


def inplace_variant(info: OpInfo) -> OpInfo:
    """``info`` of a call that passes ``inplace=True``: it writes its first input."""
    return replace(info, inplace_param=None, writes=((0, "input"),), returns_written=True,
                   side_effect=True)  # fmt: skip


def _has_hooks(module: nn.Module) -> bool:
    return has_forward_hooks(module)


def getattr_info(attribute: object) -> OpInfo:
    """``getattr(tensor, attribute)`` (``x.T``, ``x.shape``, ...)."""
    if attribute in VIEW_NAMES:
        return _VIEW
    if attribute in NON_TENSOR_NAMES:
        return PLAIN
    return UNKNOWN


def module_info(module: nn.Module) -> OpInfo:
    """What calling ``module`` does (``call_module``), from its exact type and attributes.

    A module with hooks (its own or global ones: a capture, ``spectral_norm``) runs code its
    type does not show, which can reach any state of the model: unknown, and touching every
    parameter, buffer and attribute tensor of the model, unless registered pure.
    """
    kind = type(module)
    if module in REGISTERED_PURE or kind in REGISTERED_PURE:
        return PLAIN
    if _has_hooks(module):
        return _HOOKED
    if module in REGISTERED_SIDE_EFFECTS or kind in REGISTERED_SIDE_EFFECTS:
        return OpInfo(side_effect=True, world=True)
    if kind in VIEW_MODULES:
        return _VIEW
    if kind in MAYBE_ALIAS_MODULES:
        return _MAYBE_ALIAS
    if kind in BATCH_NORMS and not module.training:
        return PLAIN
    random = kind in RANDOM_MODULES
    if kind not in PURE_MODULES and not random:
        return UNKNOWN
    info = OpInfo(world=random, side_effect=random)
    inplace = getattr(module, "inplace", False)
    return inplace_variant(info) if inplace else info

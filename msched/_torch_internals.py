"""Every private torch interface msched uses, and the torch versions msched is tested with.

Where torch has no public API for what msched needs, msched reaches into its internals: FX's
code generator (direct stream calls), Dynamo's table of streams and events (`trace_streams` on
CPU), the dispatcher's mode and profiler flags (`msched.ops`), op schemas, FX's own dict of a
node's inputs.  Each such use goes through a name defined here and nowhere else, so that a
torch release that changes one breaks this module only, and ``tests/msched/test_torch_internals.py``
names the interface that changed and the torch version that changed it.

Tested range: ``TORCH_TESTED`` (``pyproject.toml`` requires exactly it; CI runs the whole suite
on its lowest and highest release).  Importing msched with a torch outside it warns once
(`msched.UntestedVersionWarning`, naming the installed version and the range); an interface
found missing raises `msched.TorchInternalsError` naming it, when it is first needed: at
import for those every schedule uses, when called for the Dynamo ones (`trace_streams`).
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import operator
import re
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.fx.graph as _fx_graph
import torch.fx.node as _fx_node
from torch.fx import Graph, Node

from msched.errors import TorchInternalsError, UntestedVersionWarning

#: The torch releases msched is tested with: at least the first, below the second.
TORCH_TESTED = ((2, 13), (2, 16))


#: Every private torch interface this module reads, as (module, attribute path): the rows
#: `msched versions` checks for presence (`msched.compile.interfaces`).  Its behaviour is
#: tested in ``tests/msched/test_torch_internals.py``.
TORCH_INTERFACES: tuple[tuple[str, str], ...] = (
    ("torch._ops", "OpOverload"),
    ("torch._ops", "OpOverloadPacket"),
    ("torch._ops", "HigherOrderOperator"),
    ("torch._C", "_dispatch_get_all_op_names"),
    ("torch._library.utils", "is_impure"),
    ("torch._library.utils", "is_tensorlist_like_type"),
    ("torch.fx.node", "_side_effectful_functions"),
    ("torch.fx._lazy_graph_module", "_LazyGraphModule"),
    ("torch.fx.graph", "_PyTreeCodeGen"),
    ("torch.fx.graph", "_register_custom_builtin"),
    ("torch.fx.graph", "CodeGen._gen_python_code"),
    ("torch.utils._pytree", "tree_map"),
    ("torch.utils._pytree", "tree_flatten"),
    ("torch._C", "TensorBase.untyped_storage"),
    ("torch._C", "_len_torch_dispatch_stack"),
    ("torch._C", "_is_torch_function_mode_enabled"),
    ("torch._C._autograd", "_profiler_enabled"),
    ("torch._C", "_are_functorch_transforms_active"),
    ("torch._dynamo.backends.common", "aot_autograd"),
    ("torch._functorch.aot_autograd", "aot_module_simplified"),
    ("torch._dynamo.exc", "BackendCompilerFailed"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    ("torch._subclasses.fake_tensor", "FakeTensor"),
    ("torch._dynamo.graph_bytecode_inputs", "index_to_external_object_weakref"),
    ("torch._dynamo.graph_bytecode_inputs", "reset_user_object_tracking"),
    ("torch._dynamo.graph_bytecode_inputs", "register_user_object"),
    ("torch._dynamo.variables.streams", "SymbolicStreamState"),
    ("torch._dynamo.source", "CurrentStreamSource"),
    ("torch._dynamo.variables.lazy", "LazyVariableTracker"),
    ("torch._dynamo.utils", "get_current_stream"),
    ("torch._dynamo.guards", "get_current_stream"),
    ("torch._dispatch.python", "enable_python_dispatcher"),
    ("torch.utils._python_dispatch", "TorchDispatchMode"),
    ("torch._dynamo.utils", "counters"),
    ("torch._guards", "CompileContext.current_compile_id"),
)


def tested_range() -> str:
    """``torch>=2.13,<2.16``: the requirement ``pyproject.toml`` states."""
    low, high = (".".join(map(str, v)) for v in TORCH_TESTED)
    return f"torch>={low},<{high}"


def untested_version_message(version: Any = None) -> str | None:
    """Why ``version`` (the installed torch's by default) is outside `TORCH_TESTED`, or None."""
    version = torch.__version__ if version is None else version
    found = re.match(r"(\d+)\.(\d+)", str(version))
    release = (int(found[1]), int(found[2])) if found else (0, 0)
    if TORCH_TESTED[0] <= release < TORCH_TESTED[1]:  # a 2.15 pre-release is 2.15 here
        return None
    return (
        f"msched is tested with {tested_range()}, and torch {version} is installed: it may "
        "work, and where a private torch interface msched relies on has changed, msched "
        "raises msched.TorchInternalsError naming it; install a tested torch to be sure"
    )


def warn_if_untested(version: Any = None) -> None:
    """Warn (`UntestedVersionWarning`) when torch ``version`` is outside the tested range."""
    message = untested_version_message(version)
    if message is not None:
        warnings.warn(UntestedVersionWarning(message), stacklevel=2)


def require(owner: Any, name: str, user: str) -> Any:
    """``owner.name`` (``owner`` a module, a class or a module's dotted name), or
    `TorchInternalsError` naming the interface, the torch version and ``user``, its user."""
    where = owner if isinstance(owner, str) else getattr(owner, "__name__", repr(owner))
    try:
        if isinstance(owner, str):
            owner = importlib.import_module(owner)
        return getattr(owner, name)
    except (ImportError, AttributeError) as error:
        raise TorchInternalsError(
            f"torch {torch.__version__} has no {where}.{name}, which {user} relies on "
            f"(msched is tested with {tested_range()}): install a tested torch"
        ) from error


# Ops and schemas (every analysis) -------------------------------------------------------------

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket
HigherOrderOperator = torch._ops.HigherOrderOperator
FunctionSchema = torch._C.FunctionSchema


def schema_of(op: OpOverload) -> FunctionSchema:
    """The schema of one overload (``torch.ops.aten.add_.Tensor``)."""
    return op._schema


registered_op_names = require(torch._C, "_dispatch_get_all_op_names", "msched.proof.lookalikes")


def custom_op_overload(op: Any) -> OpOverload | None:
    """The op a ``torch.library.custom_op`` result (a ``CustomOpDef``) calls, else ``None``."""
    found = getattr(op, "_opoverload", None)
    return found if isinstance(found, OpOverload) else None


def qualified_name(packet: OpOverloadPacket) -> str:
    """``aten::add`` for ``torch.ops.aten.add``."""
    return packet._qualified_op_name


_is_impure = require("torch._library.utils", "is_impure", "msched.analysis._targets")
_is_tensorlist_like = require(
    "torch._library.utils", "is_tensorlist_like_type", "msched.compile._reinplace"
)


def torch_says_impure(target: Any) -> bool:
    """torch's own purity rule for a call target (mutable schema, effectful or random op)."""
    return bool(_is_impure(target))


def is_tensorlist_like(type_: Any) -> bool:
    """Whether a schema argument type is ``Tensor[]``-like (``Tensor?[]`` included)."""
    return bool(_is_tensorlist_like(type_))


# FX graphs and nodes ------------------------------------------------------------------------

#: torch.fx's own dict of a node's inputs (its keys are ``node.all_input_nodes`` in order,
#: read without building a list: the analyses read it for every node).
node_inputs: Callable[[Node], dict[Node, None]] = operator.attrgetter("_input_nodes")

#: The functions FX treats as side-effecting; ``torch.fx.node.has_side_effect`` adds to it.
SIDE_EFFECTFUL_FUNCTIONS = require(_fx_node, "_side_effectful_functions", "msched.analysis")

#: A ``GraphModule`` that generates its code when first needed (None: torch has none).
LazyGraphModule: type | None = getattr(
    importlib.import_module("torch.fx._lazy_graph_module"), "_LazyGraphModule", None
)


def codegen_of(graph: Graph) -> _fx_graph.CodeGen:
    """The graph's code generator (``Graph.set_codegen`` sets it; torch has no getter)."""
    return graph._codegen


PyTreeCodeGen = require(_fx_graph, "_PyTreeCodeGen", "msched.scheduling.codegen")
_register_custom_builtin = require(
    _fx_graph, "_register_custom_builtin", "msched.scheduling.codegen"
)
_GEN_PYTHON_CODE = require(_fx_graph.CodeGen, "_gen_python_code", "msched.scheduling.codegen")


def register_custom_builtin(name: str, import_line: str, value: object) -> None:
    """Make ``name`` a global of every generated graph module, imported by ``import_line``
    in code written out of it (``GraphModule.to_folder``)."""
    _register_custom_builtin(name, import_line, value)


class SourceRewriting:
    """Mixed in before a code generator class: its Python source goes through
    ``rewrite_source`` (FX has no public hook on the generated source)."""

    __slots__ = ()

    def rewrite_source(self, src: str) -> str:
        raise NotImplementedError

    def _gen_python_code(self, nodes: Any, root_module: str, namespace: Any, **kwargs: Any) -> Any:
        code = super()._gen_python_code(nodes, root_module, namespace, **kwargs)  # type: ignore[misc]
        code.src = self.rewrite_source(code.src)
        return code


# Modules -------------------------------------------------------------------------------------


def has_forward_hooks(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` runs a forward hook or pre-hook (its own or a global one)."""
    shared = torch.nn.modules.module
    return any(
        (
            module._forward_hooks,
            module._forward_pre_hooks,
            shared._global_forward_hooks,
            shared._global_forward_pre_hooks,
        )
    )


tree_map = require("torch.utils._pytree", "tree_map", "msched.proof.executor")


def storage_id(tensor: torch.Tensor) -> int:
    """An id equal for every tensor that lives in one storage, fake tensors included: the
    ``_cdata`` of its untyped storage, read through the C method (a fake tensor's Python
    override only adds a ``__torch_function__`` check).  Raises for tensors with no storage."""
    return int(_untyped_storage(tensor)._cdata)


_untyped_storage = require(torch._C.TensorBase, "untyped_storage", "msched.analysis.effects")
tree_flatten = require("torch.utils._pytree", "tree_flatten", "msched.proof.executor")


# The dispatcher's state, read by every direct stream call (msched.ops) -------------------------

dispatch_mode_depth = require(torch._C, "_len_torch_dispatch_stack", "msched.ops")
function_mode_enabled = require(torch._C, "_is_torch_function_mode_enabled", "msched.ops")
profiler_enabled = require(torch._C._autograd, "_profiler_enabled", "msched.ops")
functorch_active = require(torch._C, "_are_functorch_transforms_active", "msched.ops")


# Dynamo and AOT autograd (imported when first used: importing Dynamo takes a second) ----------


def aot_autograd(**kwargs: Any) -> Callable[..., Any]:
    """Dynamo's backend factory running AOT autograd with the given compilers."""
    factory = require("torch._dynamo.backends.common", "aot_autograd", "msched.trace_streams")
    return factory(**kwargs)


def aot_module_simplified(*args: Any, **kwargs: Any) -> Any:
    """AOT autograd over a Dynamo graph (``torch._functorch.aot_autograd``)."""
    aot = require("torch._functorch.aot_autograd", "aot_module_simplified", "msched.backend")
    return aot(*args, **kwargs)


def backend_compiler_failed() -> type[Exception]:
    """The exception ``torch.compile`` wraps a backend's error in."""
    return require("torch._dynamo.exc", "BackendCompilerFailed", "msched.compile")


def fake_tensor_mode(**kwargs: Any) -> Any:
    """A ``FakeTensorMode`` (shape propagation without data)."""
    return require("torch._subclasses.fake_tensor", "FakeTensorMode", "msched.cli")(**kwargs)


def dynamo_graph_breaks() -> dict[str, int]:
    """Every graph-break reason Dynamo has counted in this process, with its count
    (``torch._dynamo.utils.counters["graph_break"]``, the text ``torch._dynamo.explain``
    shows); none before Dynamo is imported (it has counted nothing), without importing it."""
    import sys

    if "torch._dynamo.utils" not in sys.modules:
        return {}
    counters = require("torch._dynamo.utils", "counters", "msched.backend")
    return dict(counters["graph_break"])


def dynamo_frame_id() -> int | None:
    """The id of the frame Dynamo is compiling (``torch._guards.CompileContext``): one for
    every recompile of one function; None outside a compile."""
    context = require("torch._guards", "CompileContext", "msched.backend")
    return getattr(context.current_compile_id(), "frame_id", None)


_TABLE = "torch._dynamo.graph_bytecode_inputs"
_TRACING = "msched.trace_streams"


def _external_object_refs(user: str) -> dict[int, Any] | list[Any]:
    """Dynamo's table of weak references to external objects: a dict (index -> reference) in
    torch 2.13 and 2.14, a list in 2.15 (``get_external_object_by_index`` reads it); anything
    else is a torch msched does not know, said as such."""
    refs = require(_TABLE, "index_to_external_object_weakref", user)
    if not isinstance(refs, (dict, list)):
        raise TorchInternalsError(
            f"torch {torch.__version__}'s {_TABLE}.index_to_external_object_weakref is a "
            f"{type(refs).__name__}, where msched ({user}) reads a dict (torch 2.13, 2.14) "
            f"or a list (2.15) (msched is tested with {tested_range()})"
        )
    return refs


def dynamo_external_objects() -> dict[int, Any]:
    """Dynamo's table of external objects (streams, events) as it is while a graph compiles:
    the indices the ``torch.ops.streams`` ops of the graph take."""
    refs = _external_object_refs(_TRACING)
    pairs = refs.items() if isinstance(refs, dict) else enumerate(refs)
    return {i: ref() for i, ref in pairs}


class _Unused:
    """What a list table holds below an index msched writes (never read: no op names it)."""


_UNUSED = _Unused()


def set_dynamo_external_objects(objects: dict[int, Any]) -> Callable[[], None]:
    """Write ``objects`` (index -> stream or event) into Dynamo's table, as weak references:
    the caller keeps them alive.  A list table (torch 2.15) is first padded up to the highest
    index with a placeholder no op reads; entries Dynamo registered stay as they are.

    Returns the undo: it puts back what was at those indices (a frame that made more than
    1000 streams or events has its own there) and drops the padding."""
    refs = _external_object_refs("msched.compile.native_streams")
    missing = object()
    if isinstance(refs, list):
        length = len(refs)
        saved = {i: refs[i] if i < length else missing for i in objects}
        if objects and length < max(objects) + 1:
            refs.extend([weakref.ref(_UNUSED)] * (max(objects) + 1 - length))
    else:
        saved = {i: refs.get(i, missing) for i in objects}
    for index, value in objects.items():
        refs[index] = weakref.ref(value)

    def undo() -> None:
        for index, ref in saved.items():
            if ref is not missing:
                refs[index] = ref
            elif isinstance(refs, dict):
                refs.pop(index, None)
        if isinstance(refs, list):
            del refs[length:]

    return undo


@contextlib.contextmanager
def dynamo_current_stream(caller: torch.Stream) -> Iterator[None]:
    """While tracing: Dynamo registers ``caller`` as the current stream, at index 0 of its
    table, and reads it as the current stream of its device (as it does on CUDA, where the
    current stream is registered; a CPU-only build registers none)."""
    state = require("torch._dynamo.variables.streams", "SymbolicStreamState", _TRACING)
    reset = require(_TABLE, "reset_user_object_tracking", _TRACING)
    register = require(_TABLE, "register_user_object", _TRACING)
    source_type = require("torch._dynamo.source", "CurrentStreamSource", _TRACING)
    lazy = require("torch._dynamo.variables.lazy", "LazyVariableTracker", _TRACING)
    getters = [importlib.import_module(m) for m in ("torch._dynamo.utils", "torch._dynamo.guards")]
    original_init = state.__init__
    original = [require(m, "get_current_stream", _TRACING) for m in getters]

    def init(self: Any) -> None:
        reset()
        source = source_type(caller.device)
        index = register(caller, source)
        variable = lazy.create(caller, source=source)
        variable.user_object_index = index
        self.cur_stream_stack = collections.deque([variable])

    def current(device: Any) -> Any:
        if torch.device(device).type == caller.device.type:
            return caller
        return original[0](device)

    state.__init__ = init
    for module in getters:
        module.get_current_stream = current  # type: ignore[attr-defined]
    try:
        yield
    finally:
        state.__init__ = original_init
        for module, getter in zip(getters, original, strict=True):
            module.get_current_stream = getter  # type: ignore[attr-defined]


# What a graph's calls came from and dispatch to (msched.compile.split_ops) ------------------

_SPLIT_OPS = "msched.compile.split_ops"


def symbolic_expr(size: Any) -> Any:
    """The sympy expression of a symbolic size (``SymInt.node.expr``); None for an int."""
    return getattr(getattr(size, "node", None), "expr", None)


def symbol_hints(size: Any) -> Mapping[Any, Any]:
    """The hint of every symbol of the shape environment of the symbolic size ``size``
    (``ShapeEnv.backed_var_to_val``, ``var_to_val`` in torch releases before it)."""
    env = getattr(getattr(size, "node", None), "shape_env", None)
    hints = getattr(env, "backed_var_to_val", None)
    if hints is None:
        hints = getattr(env, "var_to_val", None)
    return hints if hints is not None else {}


def example_value(node: Node) -> Any:
    """The fake value Dynamo computed for ``node`` (``meta["example_value"]``; None if none)."""
    return node.meta.get("example_value")


def source_function(node: Node) -> tuple[str, Any] | None:
    """The call of the Dynamo graph a node of AOT autograd's graph came from: the name and
    the function (or module class) of the last entry of ``meta["source_fn_stack"]``, or None."""
    stack = node.meta.get("source_fn_stack")
    if not stack:
        return None
    name, function = stack[-1]
    return str(name), function


def original_aten(node: Node) -> OpOverload | None:
    """The aten overload AOT autograd was tracing when it made ``node``
    (``meta["original_aten"]``: a ``getitem`` of a multi-output op names that op)."""
    op = node.meta.get("original_aten")
    return op if isinstance(op, OpOverload) else None


def ops_dispatched_by(function: Callable[..., Any], args: Any, kwargs: Any) -> tuple[Any, ...]:
    """The overloads ``function(*args, **kwargs)`` dispatches to below autograd (composite
    ops decomposed: ``scaled_dot_product_attention`` runs a kernel such as
    ``_scaled_dot_product_flash_attention_for_cpu``), each once, in the order first called.

    The call runs on clones of its fake tensor arguments, in their fake mode (with its shape
    environment) and without grad, so nothing real runs and no argument changes.  () when no
    argument is a fake tensor, or when the call raises: what it calls is then unknown."""
    fake_type = require("torch._subclasses.fake_tensor", "FakeTensor", _SPLIT_OPS)
    flat, _ = tree_flatten((args, kwargs))
    modes = {id(v.fake_mode): v.fake_mode for v in flat if isinstance(v, fake_type)}
    if len(modes) != 1:  # no fake argument, or fakes of two modes: nothing to run it in
        return ()
    (mode,) = modes.values()
    python_dispatcher = require("torch._dispatch.python", "enable_python_dispatcher", _SPLIT_OPS)
    base = require("torch.utils._python_dispatch", "TorchDispatchMode", _SPLIT_OPS)
    called: dict[Any, None] = {}

    class Recorder(base):  # type: ignore[misc,valid-type]
        def __torch_dispatch__(self, func: Any, types: Any, a: Any = (), k: Any = None) -> Any:
            called.setdefault(func)
            return func(*a, **(k or {}))

    def clone(value: Any) -> Any:
        return value.clone() if isinstance(value, torch.Tensor) else value

    shape_env = getattr(mode, "shape_env", None)
    fresh = shape_env.ignore_fresh_unbacked_symbols() if shape_env else contextlib.nullcontext()
    with torch.no_grad(), mode, python_dispatcher(), fresh, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            own_args, own_kwargs = tree_map(clone, (args, kwargs))
            with Recorder():
                function(*own_args, **own_kwargs)
        except Exception:  # noqa: BLE001 - a call that fails here calls nothing we know of
            return ()
    return tuple(called)

"""Every private TorchInductor interface msched uses, in one place.

Why one module: Inductor's scheduler, wrapper code generator and stream table are not public
and change between releases.  Each name used here is listed in `INTERFACES` and checked by
`check_interfaces`, which ``tests/msched/compile/test_inductor_internals.py`` runs on every
torch version CI tests (2.13 and 2.15): a change fails that test naming the interface and
the torch version, and `require_interfaces` raises `InductorInterfaceError` the same way
before msched touches Inductor.

What msched reads and where (torch 2.13, 2.14, 2.15):

1. The final kernel order: ``Scheduler.codegen`` runs on ``Scheduler.nodes`` after fusion
   and every reordering pass; msched wraps it and reads each node's buffers, reads,
   mutations and stream (``Scheduler.node_to_stream`` and ``stream_idx_to_user_obj_idx``,
   Inductor's stream -> Dynamo table index).  Stream ops stay ``ir.FallbackKernel``s whose
   ``op_overload`` is a ``torch.ops.streams`` op and whose ``constant_args`` are the indices.
2. Buffer reuse: ``PythonWrapperCodegen.memory_plan_reuse`` turns allocations into
   ``ReuseLine(node=old, reused_as=new)``; msched wraps it and reads them.
3. The guard against reuse across streams: ``GraphLowering.never_reuse_buffers`` (names the
   wrapper never reuses, in place or through the reuse pool), with a buffer read under the
   name of a mutation resolved to the one allocated (``Scheduler.mutation_real_name``).
4. The output code: ``GraphLowering.compile_to_module`` returns the module; its ``__file__``
   is the source.
5. Ordering in the post-grad graph: ``torch._inductor.fx_passes.control_dependencies``
   (``control_deps``, ``preserve_node_ordering``, ``_create_subgraph_for_node``,
   ``get_subgraph_name``).
6. The output module when it comes from Inductor's cache too: ``PyCodeCache.load_by_key_path``.
7. Dynamo's external-object table (``torch._dynamo.graph_bytecode_inputs``), which stream
   ops index.
8. Inductor's cache folder (``torch._inductor.runtime.cache_dir_utils.cache_dir``), beside
   which msched keeps the final orders of the code it verified (`msched.compile.order_records`).
9. The inputs of each piece of a piecewise graph, as Inductor compiles them: Dynamo's fake
   tensors (``torch._guards.detect_fake_mode``, their ``FakeTensorMode`` and its shape
   environment) run through the split graph under ``enable_python_dispatcher``.
10. The wrapper line that opens a stream context (``EnterCudaStreamContextLine.codegen``):
    msched writes ``pass`` under it, so a context the CPU backend leaves empty still imports.
11. Where the post-grad graph is final: ``compile_fx`` calls ``post_grad_passes`` (the name
    it imported) for every graph and subgraph, and lowers what it leaves.  Passes run after
    ``post_grad_custom_post_pass`` there (2.13: ``reinplace_inplaceable_ops``, which rebuilds
    every ``slice_scatter`` as new nodes, and ``decompose_auto_functionalized``), so msched
    schedules in a wrapper of it (`after_post_grad_passes`), where nothing rewrites after.
13. Communication kernels: ``ir._CollectiveKernel`` (a ``FallbackKernel`` of a
    ``_c10d_functional`` collective; ``op_overload``, ``unflatten_args(inputs,
    constant_args)``), ``ir._WaitKernel`` (its ``wait_tensor``) and the ``ir.MultiOutput``
    (``indices``) that takes one result of a collective's list; the collective's FX node is
    among the kernel's ``origins`` (nodes of ``GraphLowering.module``, the graph lowered).
12. Ties per kernel: ``Scheduler._init`` reads ``GraphLowering.additional_buffer_deps``
    (operation name -> names it must follow; ``control_deps`` lowering fills it) when it
    computes dependencies; msched adds, before it runs, a tie from every operation lowered
    from a node after a wait to that wait's operations
    (``GraphLowering._void_ctrl_dep_op_names``), `tie_kernels`.
13. Buffer layouts for memory (`msched.compile._inductor_buffers`): ``Buffer.get_output_spec``,
    ``NoneLayout``, ``MultiOutputLayout``, ``GraphLowering.graph_inputs`` and ``constants``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from msched.compile._inductor_buffers import buffer_layouts
from msched.compile._inductor_comm import communication, issue_positions
from msched.compile.final_order import (
    ISSUE_META,
    Buffer,
    FinalOrder,
    ScheduledNode,
    communication_op,
    stamp_issue_order,
)
from msched.errors import InductorInterfaceError

#: (module, attribute path) of every private interface this module uses.
INTERFACES: tuple[tuple[str, str], ...] = (
    ("torch._inductor.scheduler", "Scheduler.codegen"),
    ("torch._inductor.scheduler", "Scheduler._init"),
    ("torch._inductor.graph", "GraphLowering.additional_buffer_deps"),
    ("torch._inductor.graph", "GraphLowering._void_ctrl_dep_op_names"),
    ("torch._inductor.scheduler", "Scheduler.nodes"),
    ("torch._inductor.scheduler", "Scheduler.node_to_stream"),
    ("torch._inductor.scheduler", "Scheduler.stream_idx_to_user_obj_idx"),
    ("torch._inductor.scheduler", "Scheduler.mutation_real_name"),
    ("torch._inductor.codegen.wrapper", "PythonWrapperCodegen.memory_plan_reuse"),
    ("torch._inductor.codegen.wrapper", "ReuseLine"),
    ("torch._inductor.codegen.wrapper", "EnterCudaStreamContextLine.codegen"),
    ("torch._inductor.graph", "GraphLowering.compile_to_module"),
    ("torch._inductor.graph", "GraphLowering.never_reuse_buffers"),
    ("torch._inductor.graph", "GraphLowering.graph_inputs"),
    ("torch._inductor.graph", "GraphLowering.constants"),
    ("torch._inductor.ir", "Buffer.get_output_spec"),
    ("torch._inductor.ir", "MultiOutputLayout"),
    ("torch._inductor.ir", "NoneLayout"),
    ("torch._inductor.ir", "FallbackKernel"),
    ("torch._inductor.dependencies", "WeakDep"),
    ("torch._inductor.ir", "MutationOutput"),
    ("torch._inductor.ir", "ExternKernel"),
    ("torch._inductor.virtualized", "V"),
    ("torch._inductor.compile_fx", "compile_fx"),
    ("torch._inductor.config", "fx_graph_cache"),
    ("torch._inductor.config", "fx_graph_remote_cache"),
    ("torch._functorch.config", "enable_autograd_cache"),
    ("torch._inductor.compile_fx", "post_grad_passes"),
    ("torch._inductor.compile_fx", "_recursive_post_grad_passes"),
    ("torch._inductor.custom_graph_pass", "CustomGraphPass"),
    ("torch._inductor.fx_passes.control_dependencies", "control_deps"),
    ("torch._inductor.fx_passes.control_dependencies", "preserve_node_ordering"),
    ("torch._inductor.fx_passes.control_dependencies", "_create_subgraph_for_node"),
    ("torch._inductor.fx_passes.control_dependencies", "get_subgraph_name"),
    ("torch._inductor.codecache", "PyCodeCache.load_by_key_path"),
    ("torch._dynamo.graph_bytecode_inputs", "index_to_external_object_weakref"),
    ("torch._inductor.runtime.cache_dir_utils", "cache_dir"),
    ("torch._dynamo.variables.streams", "SymbolicStreamState"),
    ("torch._library.custom_ops", "OPDEFS"),
    ("torch._guards", "detect_fake_mode"),
    ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    ("torch._subclasses.fake_tensor", "FakeTensor"),
    ("torch._dispatch.python", "enable_python_dispatcher"),
    ("torch._inductor.ir", "_CollectiveKernel"),
    ("torch._inductor.ir", "_WaitKernel"),
    ("torch._inductor.ir", "MultiOutput"),
    ("torch._inductor.ir", "MultiOutput.indices"),
    ("torch._inductor.ir", "FallbackKernel.unflatten_args"),
    ("torch._inductor.graph", "GraphLowering.module"),
)

# Instance attributes: checked on the source of their class, not by getattr.
_INSTANCE_ATTRIBUTES = frozenset(
    {
        "Scheduler.nodes",
        "Scheduler.node_to_stream",
        "Scheduler.stream_idx_to_user_obj_idx",
        "Scheduler.mutation_real_name",
        "GraphLowering.never_reuse_buffers",
        "GraphLowering.graph_inputs",
        "GraphLowering.constants",
        "GraphLowering.additional_buffer_deps",
        "GraphLowering._void_ctrl_dep_op_names",
        "GraphLowering.module",
        "MultiOutput.indices",
        "FallbackKernel.unflatten_args",
    }
)


@functools.cache
def missing_interfaces() -> tuple[str, ...]:
    """The entries of `INTERFACES` this torch lacks, as ``module.attribute`` strings."""
    return tuple(
        f"{module}.{path}" for module, path in INTERFACES if not attribute_exists(module, path)
    )


def attribute_exists(module_name: str, path: str) -> bool:
    """Whether ``module_name`` imports and has the attribute ``path`` (dotted; an instance
    attribute of `_INSTANCE_ATTRIBUTES` is looked for in its class's source)."""
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError:
        return False
    *owners, last = path.split(".")
    for part in owners:
        value = getattr(value, part, None)
        if value is None:
            return False
    if path in _INSTANCE_ATTRIBUTES:
        return f"self.{last}" in _source(value)
    return hasattr(value, last)


@functools.cache
def _source(owner: Any) -> str:
    """The source of a class, read once: ``inspect.getsource`` of a class parses its whole
    module (seconds for ``torch._inductor.scheduler``), and four interfaces share one."""
    import inspect

    return inspect.getsource(owner)


def require_interfaces() -> None:
    """Raise `InductorInterfaceError` naming every missing interface and the torch version."""
    missing = missing_interfaces()
    if missing:
        raise InductorInterfaceError(
            f"msched's Inductor support needs private TorchInductor interfaces that torch "
            f"{torch.__version__} does not have: {', '.join(missing)}; msched is tested with "
            "torch 2.13 to 2.15 (see msched/compile/_inductor_internals.py; `msched versions` "
            "reports every interface)"
        )


#: ``gm.meta`` key `msched.compile.native_streams.tie_waits` fills for `tie_kernels`:
#: ``{"after": {node name: (wait name, its position)}, "positions": {node name: position}}``
#: for every node issued after a wait on its stream (positions in program order).
AFTER_WAIT_META = "msched_after_wait"


class _Recorder:
    """Collects one `FinalOrder` per graph Inductor generates while installed."""

    def __init__(self, guard_reuse: bool) -> None:
        self.guard_reuse = guard_reuse
        self.orders: list[FinalOrder] = []
        self._by_graph: dict[int, int] = {}

    def scheduled(self, graph: Any, scheduler: Any) -> None:
        if self.guard_reuse:
            graph.never_reuse_buffers.update(_cross_stream_buffers(scheduler))
        self._by_graph[id(graph)] = len(self.orders)
        self.orders.append(_final_order(graph, scheduler))

    def update(self, graph: Any, **changes: Any) -> None:
        index = self._by_graph.get(id(graph))
        if index is not None:
            from dataclasses import replace

            self.orders[index] = replace(self.orders[index], **changes)


@contextlib.contextmanager
def recording_final_orders(guard_reuse: bool = False) -> Iterator[list[FinalOrder]]:
    """While the block runs, record every graph's `FinalOrder` into the yielded list.

    With ``guard_reuse``, no buffer that a node of another stream than its producer's reads
    is ever reused (`_cross_stream_buffers`).  Not thread-safe: it patches Inductor's classes.
    """
    require_interfaces()
    from torch._inductor.codegen.wrapper import EnterCudaStreamContextLine, PythonWrapperCodegen
    from torch._inductor.graph import GraphLowering
    from torch._inductor.scheduler import Scheduler

    recorder = _Recorder(guard_reuse)
    patches = (
        (Scheduler, "codegen", _codegen_hook(Scheduler.codegen, recorder)),
        (Scheduler, "_init", _init_hook(Scheduler._init)),
        (
            PythonWrapperCodegen,
            "memory_plan_reuse",
            _reuse_hook(PythonWrapperCodegen.memory_plan_reuse, recorder),
        ),
        (
            GraphLowering,
            "compile_to_module",
            _module_hook(GraphLowering.compile_to_module, recorder),
        ),
        (
            EnterCudaStreamContextLine,
            "codegen",
            _never_empty(EnterCudaStreamContextLine.codegen),
        ),
    )
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    for owner, name, replacement in patches:
        setattr(owner, name, replacement)
    try:
        yield recorder.orders
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def _never_empty(original: Callable[..., Any]) -> Callable[..., Any]:
    """``with streamN:`` followed by ``pass`` in the Python wrapper.  On CPU, Inductor emits a
    kernel's call when its C++ kernel group is flushed (at an extern call, or a device change),
    not where the kernel's stream context was entered: a kernel on one stream followed by a
    stream op on another left ``with stream1:`` with nothing under it, and the output module
    failed to import (``IndentationError``)."""

    def codegen(self: Any, code: Any) -> None:
        from torch._inductor.virtualized import V

        original(self, code)
        if not V.graph.cpp_wrapper:
            code.writeline("pass")

    return codegen


def _codegen_hook(original: Callable[..., Any], recorder: _Recorder) -> Callable[..., Any]:
    def codegen(self: Any) -> Any:
        from torch._inductor.virtualized import V

        recorder.scheduled(V.graph, self)
        return original(self)

    return codegen


def _init_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    def _init(self: Any, nodes: Any) -> Any:
        from torch._inductor.virtualized import V

        tie_kernels(V.graph, nodes)
        return original(self, nodes)

    return _init


def tie_kernels(graph: Any, operations: Any) -> int:
    """Order every operation lowered from a node after a wait on its stream after that wait
    (interface 12), from what `msched.compile.native_streams.tie_waits` left in the module's
    ``meta`` (nothing for a graph msched did not tie); returns how many ties it added.

    Why: a tie in the FX graph (``control_deps``) covers only the operations its lowering
    makes; a node Inductor computes where a later node needs it is realized there, and
    realized as a dependency of a stream op it is ordered by its data alone.  An operation
    made from nodes on both sides of a wait (Inductor merged them) is left to its data: a
    tie could close a cycle."""
    module: Any = getattr(graph, "module", None)
    meta = getattr(module, "meta", {}).get(AFTER_WAIT_META)
    if module is None or not meta:
        return 0
    after, positions = meta["after"], meta["positions"]
    by_name = {n.name: n for n in module.graph.nodes}
    added = 0
    for op in operations:
        names = [
            o.name
            for o in getattr(op, "origins", ())
            if o.graph is module.graph and o.op == "call_function" and o.name in positions
        ]
        waits = [after.get(n) for n in names]
        if not names or None in waits:
            continue
        first = min(positions[n] for n in names)
        for wait, at in dict.fromkeys(waits):
            if at >= first:
                continue
            for dep in graph._void_ctrl_dep_op_names.get(by_name.get(wait), ()):
                if dep != op.get_operation_name():
                    graph.additional_buffer_deps[op.get_operation_name()].add(dep)
                    added += 1
    return added


def _reuse_hook(original: Callable[..., Any], recorder: _Recorder) -> Callable[..., Any]:
    def memory_plan_reuse(self: Any) -> Any:
        from torch._inductor.codegen.wrapper import ReuseLine
        from torch._inductor.virtualized import V

        result = original(self)
        reuses = tuple(
            (line.node.get_name(), line.reused_as.get_name())
            for line in self.lines
            if isinstance(line, ReuseLine)
        )
        recorder.update(V.graph, reuses=reuses)
        return result

    return memory_plan_reuse


def _module_hook(original: Callable[..., Any], recorder: _Recorder) -> Callable[..., Any]:
    def compile_to_module(self: Any) -> Any:
        module = original(self)
        path = getattr(module, "__file__", None)
        code = ""
        if path:
            with open(path, encoding="utf-8") as source:
                code = source.read()
        recorder.update(self, code=code, module=module)
        return module

    return compile_to_module


def _final_order(graph: Any, scheduler: Any) -> FinalOrder:
    to_table = dict(scheduler.stream_idx_to_user_obj_idx)
    issued = issue_positions(graph)
    nodes = tuple(
        communication(_scheduled_node(scheduler, node, to_table), node, issued)
        for node in scheduler.nodes
    )
    names = tuple((f"stream{k}", v) for k, v in sorted(to_table.items()))
    return FinalOrder(
        nodes,
        tuple(graph.graph_inputs),
        tuple(graph.get_output_names()),
        stream_names=names,
        layouts=buffer_layouts(graph, scheduler),
    )


def _scheduled_node(scheduler: Any, node: Any, to_table: dict[int, int]) -> ScheduledNode:
    from torch._inductor import ir

    inner = list(node.get_nodes())
    name = inner[0].get_name() if len(inner) > 1 else node.get_name()
    stream_index = scheduler.node_to_stream.get(node, 0)
    stream = to_table.get(stream_index) if stream_index else None
    outputs = tuple(node.get_buffer_names())
    own = set(outputs)
    reads = tuple(
        sorted({d.name for x in inner for d in x.read_writes.reads if not _fake(d)} - own)
    )
    mutates = tuple(
        (buf.get_name(), target)
        for buf in node.get_outputs()
        for target in buf.node.get_mutation_names()
    )
    origins = tuple(sorted({o.name for x in inner if x.node is not None for o in x.node.origins}))
    kernel = inner[0].node if len(inner) == 1 else None
    op = getattr(kernel, "op_overload", None) if isinstance(kernel, ir.FallbackKernel) else None
    if op is not None and getattr(op, "namespace", None) == "streams":
        return ScheduledNode(
            name, "stream", stream, outputs, reads, mutates, origins,
            op, tuple(kernel.constant_args),  # type: ignore[union-attr]
        )  # fmt: skip
    no_code = (ir.MutationOutput, *_optional(ir, "OrderingBarrier"))
    if inner and all(isinstance(x.node, no_code) for x in inner):
        kind = "alias"  # renames buffers another node wrote (control_deps outputs)
    elif isinstance(kernel, ir.ExternKernel):
        kind = "extern"
    else:
        kind = "kernel"
    return ScheduledNode(name, kind, stream, outputs, reads, mutates, origins)


def _fake(dep: Any) -> bool:
    """An ordering-only dependency (``WeakDep(is_fake=True)``: a tie, the issue order of
    collectives): no data read, so no read of the program (it read another stream's buffer)."""
    from torch._inductor.dependencies import WeakDep

    return isinstance(dep, WeakDep) and bool(dep.is_fake)


def _optional(module: Any, name: str) -> tuple[type, ...]:
    """``module.name`` as a 1-tuple, or () in a torch that lacks it (2.13 has no
    ``ir.OrderingBarrier``: its ``control_deps`` outputs are ``MutationOutput``s)."""
    value = getattr(module, name, None)
    return (value,) if isinstance(value, type) else ()


def _cross_stream_buffers(scheduler: Any) -> set[str]:
    """Buffers some node reads on another stream than the one that made them.

    A buffer a kernel wrote in place is read under the mutation's name (``buf58``, a
    mutation of ``buf57``); the wrapper frees the allocation (``del buf57``), so the name
    that stream read is resolved to it too (``Scheduler.mutation_real_name``)."""
    real = scheduler.mutation_real_name
    made_on: dict[str, int] = {}
    crossing: set[str] = set()
    for node in scheduler.nodes:
        stream = scheduler.node_to_stream.get(node, 0)
        for x in node.get_nodes():
            for dep in x.read_writes.reads:
                if dep.name in made_on and made_on[dep.name] != stream:
                    crossing.update((dep.name, real.get(dep.name, dep.name)))
        for name in node.get_buffer_names():
            made_on[name] = stream
    return crossing


def compile_fx(gm: Any, example_inputs: Any, **config: Any) -> Any:
    """``torch._inductor.compile_fx.compile_fx`` with Inductor config ``config`` patched."""
    require_interfaces()
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx as inductor_compile_fx

    with inductor_config.patch(config):
        return inductor_compile_fx(gm, example_inputs)


def compile_fx_uncached(gm: Any, example_inputs: Any) -> Any:
    """`compile_fx` with no cache that could serve a compiled graph (Inductor's FX graph
    cache, local and remote, and AOT autograd's cache), so Inductor generates its code.
    Unlike ``force_disable_caches`` (a fresh cache folder), the caches of compiled C++
    kernels and of the CPU's vector ISA checks stay on: they reuse a binary, never skip code
    generation, and a cold folder costs seconds of ``g++`` per call."""
    from torch._functorch import config as functorch_config

    with functorch_config.patch(enable_autograd_cache=False):
        return compile_fx(gm, example_inputs, fx_graph_cache=False, fx_graph_remote_cache=False)


@contextlib.contextmanager
def after_post_grad_passes(run: Callable[[Any], None]) -> Iterator[None]:
    """While the block runs, ``run(gm)`` is called on every graph module (subgraphs first,
    as Inductor runs them) right after Inductor's post-grad passes finished with it, before
    it is lowered.  Not thread-safe: it patches ``torch._inductor.compile_fx``."""
    require_interfaces()
    from torch._inductor import compile_fx as module

    original = module.__dict__["post_grad_passes"]

    def post_grad_passes(gm: Any, is_inference: bool) -> None:
        original(gm, is_inference)
        run(gm)

    module.post_grad_passes = post_grad_passes
    try:
        yield
    finally:
        module.post_grad_passes = original


def custom_graph_pass_base() -> type:
    """``torch._inductor.custom_graph_pass.CustomGraphPass`` (msched's pass subclasses it)."""
    require_interfaces()
    from torch._inductor.custom_graph_pass import CustomGraphPass

    return CustomGraphPass


def wrap_in_control_deps(gm: Any, node: Any, after: list[Any]) -> Any:
    """Replace the stream op ``node`` by ``control_deps(after, subgraph(node))``: Inductor
    then schedules it after every node of ``after``.  Returns the ``control_deps`` node."""
    from torch._inductor.fx_passes.control_dependencies import (
        _create_subgraph_for_node,
        control_deps,
        get_subgraph_name,
    )

    graph = gm.graph
    subgraph = _create_subgraph_for_node(graph, node, [])
    name = get_subgraph_name(gm, node.name)
    setattr(gm, name, subgraph)
    with graph.inserting_before(node):
        ctrl = graph.call_function(control_deps, (tuple(after), graph.get_attr(name)), {})
    ctrl.meta["custom"] = dict(node.meta.get("custom", {}))
    node.replace_all_uses_with(ctrl)
    graph.erase_node(node)
    return ctrl


def order_after(graph: Any, followers: dict[Any, Any]) -> None:
    """Make Inductor schedule every key of ``followers`` after its value."""
    from torch._inductor.fx_passes.control_dependencies import preserve_node_ordering
    from torch.utils._ordered_set import OrderedSet

    if followers:
        preserve_node_ordering(graph, {n: OrderedSet([w]) for n, w in followers.items()})


@contextlib.contextmanager
def recording_loaded_modules() -> Iterator[list[Any]]:
    """Every output module Inductor loads while the block runs (fresh or from its cache),
    into the yielded list (``PyCodeCache.load_by_key_path``)."""
    from torch._inductor.codecache import PyCodeCache

    loaded: list[Any] = []
    original = PyCodeCache.__dict__["load_by_key_path"]

    def load_by_key_path(cls: Any, *args: Any, **kwargs: Any) -> Any:
        module = original.__func__(cls, *args, **kwargs)
        loaded.append(module)
        return module

    setattr(PyCodeCache, "load_by_key_path", classmethod(load_by_key_path))  # noqa: B010
    try:
        yield loaded
    finally:
        setattr(PyCodeCache, "load_by_key_path", original)  # noqa: B010


def stream_op_named(name: str) -> Any:
    """The ``torch.ops.streams`` overload ``name`` (``"wait_event.default"``); importing
    Dynamo's stream module registers them."""
    importlib.import_module("torch._dynamo.variables.streams")
    packet, overload = name.split(".")
    return getattr(getattr(torch.ops.streams, packet), overload)


@functools.cache
def let_cpu_tensors_record_streams() -> None:
    """Make Dynamo's ``streams::record_stream`` do nothing for a CPU tensor: ``aten::
    record_stream`` has no CPU kernel, so a compiled CPU piece that keeps a buffer alive for
    a side stream raised ``NotImplementedError``.  Nothing runs on a CPU stream, so there is
    nothing to keep alive: the call stays in the code msched verifies and does nothing, like
    the CPU stand-ins' record and wait.  Once per process (a CPU call raised before)."""
    importlib.import_module("torch._dynamo.variables.streams")
    from torch._library.custom_ops import OPDEFS

    OPDEFS["streams::record_stream"].register_kernel("cpu")(lambda tensor, index: None)


@contextlib.contextmanager
def faking(example_inputs: Any) -> Iterator[Callable[[Any], Any]]:
    """Run the block in the fake mode of ``example_inputs`` (Dynamo's, with its shape
    environment, so sizes stay symbolic), or in a new one when they are real tensors;
    yields what turns a value into the fake value the block computes with."""
    require_interfaces()
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    mode = detect_fake_mode(example_inputs) or FakeTensorMode()

    def fake(value: Any) -> Any:
        real = isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor)
        return mode.from_tensor(value) if real else value

    with mode, enable_python_dispatcher():
        yield fake


def inductor_cache_dir() -> str:
    """Inductor's cache folder (``TORCHINDUCTOR_CACHE_DIR``, else its default)."""
    require_interfaces()
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


__all__ = [
    "AFTER_WAIT_META",
    "INTERFACES",
    "ISSUE_META",
    "Buffer",
    "FinalOrder",
    "ScheduledNode",
    "after_post_grad_passes",
    "attribute_exists",
    "communication_op",
    "compile_fx",
    "compile_fx_uncached",
    "custom_graph_pass_base",
    "faking",
    "inductor_cache_dir",
    "let_cpu_tensors_record_streams",
    "missing_interfaces",
    "order_after",
    "recording_final_orders",
    "recording_loaded_modules",
    "require_interfaces",
    "stamp_issue_order",
    "stream_op_named",
    "tie_kernels",
    "wrap_in_control_deps",
]

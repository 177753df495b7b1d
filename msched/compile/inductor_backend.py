"""``msched.backend(compiler="inductor")``: Inductor compiles every piece with msched's streams.

Why: engines compile with TorchInductor; a schedule run op by op (``compiler="fx"``) fuses
nothing.  Here msched schedules inside Inductor and proves the code Inductor generates.

For each graph Dynamo hands the backend:

1. With ``piecewise=True``, split it at every ``split_ops`` call (`pieces.split_pieces`;
   Dynamo's graph calls torch-level functions, which `msched.compile.split_ops` matches
   against any spelling of a split op)
   and compile every other piece now, for the fake inputs Dynamo's example inputs give it
   (`_piece_inputs`: symbolic sizes stay symbolic, so a piece compiles once, like the whole
   graph); the split calls run as they are.  Without, the graph is one piece, compiled now.
2. ``compile_fx`` with msched's `MschedPass` as ``post_grad_custom_post_pass``, where it
   re-inplaces (`msched.compile._reinplace`); once Inductor's post-grad passes are done with
   the graph (passes after the custom one rebuild nodes, which would lose their stream),
   `msched.schedule`, `native_streams.to_native` and (unless a test turns it off)
   `native_streams.tie_waits` run on it, right before lowering: nothing rewrites the graph
   after msched, and a build where that hook never ran raises `InductorInterfaceError`.
   Its ``uuid()`` covers msched's version
   and a hash of its source files (`source_digest`: an edited checkout is another build),
   the stream count, the cost model and every option, so Inductor's caches never hand one
   build's code to another.
3. While Inductor generates code, buffers read on another stream than the one that made them
   are never reused (unless a test turns the guard off), and the final order is recorded.
4. ``verify=True``: the final order, as a `msched.compile.kernel_order` program, is checked
   with `msched.verify`; a violation raises `PieceVerificationError` naming the piece and the
   kernels.  Every order read is kept beside Inductor's cache, keyed by its output source
   (`msched.compile.order_records`), so a cache hit is verified from the order kept when it
   was compiled; a hit with no kept order is compiled again under a renewed generation of
   the pass key (`order_records.renew`): Inductor misses, and its fresh entry and the order
   read now are kept together, so the next build is a verified hit.
5. Each call writes the piece's streams and events into Dynamo's table
   (`native_streams.NativeStreams`) and runs the code, under one process-wide lock (the
   table is shared; see `CompiledPiece`); on CPU the output module's stream variables, which
   Inductor declares only for GPUs, are set to CPU stand-ins.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.metadata
import re
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule

from msched._torch_internals import OpOverload, schema_of, tree_flatten
from msched.analysis.cost import DefaultCostModel
from msched.compile import _inductor_internals as internals
from msched.compile import pieces
from msched.compile._inductor_internals import FinalOrder
from msched.compile._reinplace import reinplace
from msched.compile.kernel_order import kernel_order_program
from msched.compile.native_streams import CALLER, EVENT_BASE, NativeStreams, tie_waits, to_native
from msched.compile.order_records import generation, load_order, record_path, renew, save_order
from msched.compile.pieces import Piece
from msched.errors import InductorInterfaceError, PieceVerificationError
from msched.proof.verifier import Report, verify
from msched.scheduling.pipeline import Schedule, schedule


def _version() -> str:
    try:
        return importlib.metadata.version("msched")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout
        return "unknown"


def source_digest(root: Path) -> str:
    """SHA-256 over the ``.py`` files under ``root``: each one's path relative to ``root``
    and its bytes, in sorted path order (lengths included, so no two trees hash alike)."""
    digest = hashlib.sha256()
    files = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.py"))
    for relative, path in files:
        for part in (relative.encode("utf-8"), path.read_bytes()):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest()


@functools.cache
def _msched_source_digest() -> str:
    """`source_digest` of the msched package this process imported (once per process).
    Why: the installed version is "unknown" from a PYTHONPATH checkout and stays the same
    when an editable install is edited, so only msched's code tells its builds apart."""
    return source_digest(Path(__file__).resolve().parent.parent)


@dataclass
class _PassResult:
    """What the pass left for the piece (set while Inductor compiles)."""

    gm: GraphModule | None = None
    schedule: Schedule | None = None
    tied: int = 0
    #: Graphs the pass re-inplaced and msched has not scheduled yet.
    pending: list[GraphModule] = field(default_factory=list)


def _pass_key(config: Any) -> str:
    """The pass's ``uuid()``: the build's `_build_key` and how often msched renewed its cache
    entries (`order_records.renew`)."""
    build = _build_key(config)
    return hashlib.sha256(f"{build}:{generation(build)}".encode()).hexdigest()


def _build_key(config: Any) -> str:
    cost = config.cost_model
    cost_text = "default" if cost is None else f"{type(cost).__module__}.{type(cost).__qualname__}"
    if cost is not None and hasattr(cost, "__dataclass_fields__"):
        cost_text += repr(cost)
    parts = (
        "msched", _version(), _msched_source_digest(), config.num_streams, cost_text,
        config.exit_edges, config.tie_waits, config.guard_reuse,
    )  # fmt: skip
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def make_pass(config: Any, result: _PassResult) -> Any:
    """msched's ``CustomGraphPass`` for one compile (see the module docstring, step 2).

    Inductor calls it as ``post_grad_custom_post_pass``, where it re-inplaces; passes that
    Inductor runs after that slot rebuild nodes (2.13's ``reinplace_inplaceable_ops`` makes
    new nodes of every ``slice_scatter``, which carry no stream), so the schedule is made in
    `schedule_final`, once Inductor's post-grad passes are done with the graph (`_compile`
    installs it with `internals.after_post_grad_passes`)."""
    base = internals.custom_graph_pass_base()

    class MschedPass(base):  # type: ignore[misc,valid-type]
        def __call__(self, graph: torch.fx.Graph) -> None:
            gm = graph.owning_module
            assert isinstance(gm, GraphModule)
            reinplace(gm)
            _drop_stale_eager_values(gm)
            result.pending.append(gm)

        def schedule_final(self, gm: GraphModule) -> None:
            """Schedule ``gm`` where nothing rewrites it after msched (see `make_pass`)."""
            if not any(g is gm for g in result.pending):
                return
            result.pending = [g for g in result.pending if g is not gm]
            graph = gm.graph
            codegen = graph._codegen
            cost = _FactoriesFree(config.cost_model or DefaultCostModel())
            internals.stamp_issue_order(gm)  # the order the kernel order is checked against
            sched = schedule(gm, config.num_streams, cost, exit_edges=config.exit_edges)
            graph.set_codegen(codegen)
            to_native(gm)
            result.tied = tie_waits(gm) if config.tie_waits else 0
            gm.recompile()
            result.gm, result.schedule = gm, sched

        def uuid(self) -> str:
            return _pass_key(config)

    return MschedPass()


class _FactoriesFree:
    """The build's cost model, except that a tensor made from no tensor (``full``,
    ``scalar_tensor``, ``arange``; not a random one) costs nothing, so msched leaves it on
    the caller's stream (a free node with no producer goes there).

    Why: Inductor lowers such a node to a value it computes where a later node needs it
    (usually inlined into that node's kernel, so it is free); realized by a node that only
    depends on it (a record_event's ``control_deps``), its kernel reads nothing and is
    ordered by nothing, so on a side stream it ran before the stream joined the caller's
    (Phi: ``stream 1 starts with op90 without joining stream 0``).  On the caller's stream a
    kernel that reads nothing is right wherever it runs before its users."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def cost(self, node: torch.fx.Node) -> float:
        if _made_from_nothing(node):
            return 0.0
        return float(self.inner.cost(node))


def _made_from_nothing(node: torch.fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not isinstance(target, OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags:
        return False
    value = node.meta.get("val")
    tensors = [n for n in node.all_input_nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return isinstance(value, torch.Tensor) and not tensors


def _drop_stale_eager_values(gm: GraphModule) -> None:
    """A call re-inplaced from ``auto_functionalized`` keeps the functional node's
    ``eager_input_vals``, which do not fit the in-place op (Inductor asserts on them)."""
    for node in gm.graph.nodes:
        target = node.target
        if isinstance(target, OpOverload) and schema_of(target).is_mutable:
            node.meta.pop("eager_input_vals", None)


#: Held by every `CompiledPiece` call from installing its streams and events to the return
#: of the compiled code: the table they go into is one per process (Dynamo's), at indices
#: every msched build shares, so two pieces called from two threads could each run with
#: the other's streams.  Re-entrant: compiled code that calls another piece holds it already.
_CALL_LOCK = threading.RLock()


class CompiledPiece:
    """One piece compiled by Inductor: runs the output with its streams installed.

    A call installs the piece's streams and events in Dynamo's process-wide table and runs
    the compiled code under `_CALL_LOCK`, so a call from another thread cannot install its
    own in between.  Only the host side is serialized: on CUDA the lock is released once
    the kernels are launched (they run asynchronously on their streams), so pieces of two
    threads still overlap on the device; on CPU the calls run one after the other.
    """

    def __init__(
        self, compiled: Callable[..., Any], streams: NativeStreams, num_streams: int, events: int
    ) -> None:
        self.compiled = compiled
        self.streams = streams
        self.num_streams = num_streams
        self.num_events = events

    def __call__(self, *args: Any) -> Any:
        with _CALL_LOCK:
            undo = self.streams.install(self.num_streams, self.num_events)
            try:
                return self.compiled(*args)
            finally:
                undo()


def compile_piece(
    name: str, gm: GraphModule, example_inputs: Sequence[Any], config: Any, sink: list[Any]
) -> Callable[..., Any]:
    """Compile one piece with Inductor (module docstring, steps 2-5); appends its `Piece`."""
    result = _PassResult()
    compiled, module, order = _compile(gm, example_inputs, config, result)
    if module is None and result.gm is None and _computes_nothing(gm):
        # Inductor generated no code: it runs the graph as it is, and nothing runs on a stream
        sink.append(Piece(name, gm, None, None))
        return compiled
    if config.verify and order is None:  # a cache hit whose order msched never kept
        warnings.warn(
            f"piece {name}: Inductor's cache served code msched kept no final order for "
            f"(none in {record_path('').parent}, or one that does not fit the code); it is "
            "compiled again under a renewed cache key, so the next build is a verified hit",
            RuntimeWarning,
            stacklevel=2,
        )
        result = _PassResult()
        compiled, module, order = _compile_renewed(gm, example_inputs, config, result)
    code = _source(module)
    program = kernel_order_program(order, (CALLER,)) if order is not None else None
    report = _verified(name, program) if config.verify else None
    sched = result.schedule  # None when Inductor served the code from its cache
    device = _device_of(example_inputs)
    streams = NativeStreams(device)
    if module is not None and device.type != "cuda":
        _define_stream_names(module, code, streams)
    sink.append(Piece(name, result.gm or gm, sched, report, code, program))
    return CompiledPiece(compiled, streams, config.num_streams, _events_in(code, sched))


def _computes_nothing(gm: GraphModule) -> bool:
    """Whether no call of Dynamo's graph ``gm`` makes a tensor (a graph that only reads the
    stream made before a graph break from Dynamo's table): Inductor generates no code for it
    (AOT autograd's graph has no call left) and returns a function that runs the graph."""
    calls = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    if any("example_value" not in n.meta and "val" not in n.meta for n in calls):
        return False  # a value nobody computed may be a tensor
    flat, _ = tree_flatten([n.meta.get("example_value", n.meta.get("val")) for n in calls])
    return not any(isinstance(v, torch.Tensor) for v in flat)


def _compile(
    gm: GraphModule,
    example_inputs: Sequence[Any],
    config: Any,
    result: _PassResult,
    cold: bool = False,
) -> tuple[Callable[..., Any], Any, FinalOrder | None]:
    """``compile_fx`` with msched's pass: the compiled callable, the output module and its
    final order (read now and kept, or on a cache hit the one kept when it was compiled;
    None on a hit msched kept none for).  ``cold`` turns Inductor's caches off."""
    msched_pass = make_pass(config, result)
    options: dict[str, Any] = {"post_grad_custom_post_pass": msched_pass}
    if cold:
        options["force_disable_caches"] = True
    with internals.recording_final_orders(config.guard_reuse) as orders:
        with internals.recording_loaded_modules() as modules:
            with internals.after_post_grad_passes(msched_pass.schedule_final):
                compiled = internals.compile_fx(_own_copy(gm), list(example_inputs), **options)
    _check_scheduled(result)
    module = modules[-1] if modules else None
    if orders:
        order = orders[-1]
        if order.code:
            _keep(order)
        return compiled, module, order
    code = _source(module)
    return compiled, module, load_order(code) if code else None


def _check_scheduled(result: _PassResult) -> None:
    """Every graph msched's pass saw was scheduled once Inductor's post-grad passes ended
    (a torch whose ``compile_fx`` no longer calls them where msched waits would otherwise
    compile the graph on one stream and call it verified)."""
    if result.pending:
        raise InductorInterfaceError(
            f"Inductor ran msched's post-grad pass on {len(result.pending)} graph(s) but never "
            f"ended its post-grad passes where msched schedules (torch {torch.__version__}): "
            "see msched/compile/_inductor_internals.py, interface 11"
        )


def _keep(order: FinalOrder) -> None:
    """Keep ``order`` for later cache hits of its code.  A folder msched cannot write only
    costs those hits a cold compile (this order is verified now), so it warns, not fails."""
    try:
        save_order(order)
    except OSError as error:
        warnings.warn(
            f"msched cannot keep Inductor's final order in {record_path(order.code).parent} "
            f"({error}); a later cache hit of this code is compiled again with the caches off",
            RuntimeWarning,
            stacklevel=2,
        )


def _compile_renewed(
    gm: GraphModule, example_inputs: Sequence[Any], config: Any, result: _PassResult
) -> tuple[Callable[..., Any], Any, FinalOrder | None]:
    """`_compile` after a hit msched kept no order for: under a renewed generation of the
    build's key (`order_records.renew`) Inductor misses and writes a fresh entry beside the
    order read now.  A folder msched cannot write, or a cache that still hits, leaves a cold
    compile (caches off): verified now, and cold again on the next build."""
    try:
        renew(_build_key(config))
    except OSError:
        return _compile(gm, example_inputs, config, result, cold=True)
    compiled, module, order = _compile(gm, example_inputs, config, result)
    if order is None:  # the pass did not run either: ``result`` is still empty
        return _compile(gm, example_inputs, config, result, cold=True)
    return compiled, module, order


def _own_copy(gm: GraphModule) -> GraphModule:
    """``gm`` with a graph of its own: ``compile_fx`` rewrites a graph that returns no tuple
    to return a flat one, so compiling the same piece again (a renewed or cold compile after
    a cache hit) would return a list where the graph returned a tensor."""
    return GraphModule(gm, copy.deepcopy(gm.graph))


# The event index of a ``torch.ops.streams`` call: record_event, wait_event, sync_dealloc.
_STREAM_OP_EVENT = re.compile(
    r"\bstreams\.(?:record_event|wait_event|sync_dealloc)\.default\((\d+)"
)


def _events_in(code: str, sched: Schedule | None) -> int:
    """How many of msched's events the piece uses (its schedule's, or on a cache hit the
    highest event index its stream op calls name; a size or stride in the code is none)."""
    found = [int(i) - EVENT_BASE for i in _STREAM_OP_EVENT.findall(code)]
    return max([sched.num_events if sched else 0, *(i + 1 for i in found if i >= 0)])


def _source(module: Any) -> str:
    path = getattr(module, "__file__", None)
    if not path:
        return ""
    with open(path, encoding="utf-8") as source:
        return source.read()


def _verified(name: str, program: GraphModule | None) -> Report:
    if program is None:
        message = f"piece {name}: Inductor generated no code to verify"
        raise PieceVerificationError(message, piece=name)
    report = verify(program)
    if not report.ok:
        raise PieceVerificationError(
            f"piece {name}: Inductor's final kernel order failed verification: {report}",
            piece=name,
            report=report,
        )
    return report


def _device_of(example_inputs: Sequence[Any]) -> torch.device:
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _define_stream_names(module: Any, code: str, streams: NativeStreams) -> None:
    """CPU: Inductor declares ``default_stream`` and ``streamN`` only inside a GPU device
    guard, but emits ``with streamN:`` anyway; bind the names in the output module to CPU
    stand-ins (nothing runs on a CPU stream: the kernels run in program order)."""
    module.default_stream = streams.stream(0)
    for name in sorted(set(re.findall(r"\bstream(\d+)\b", code))):
        setattr(module, f"stream{name}", streams.stream(int(name)))


def compile_graph_with_inductor(
    name: str,
    gm: GraphModule,
    example_inputs: Sequence[Any],
    config: Any,
    *,
    warned: set[tuple[Any, ...]] | None = None,
) -> tuple[Callable[..., Any], GraphModule, tuple[Piece, ...]]:
    """What the backend returns to Dynamo for ``gm`` (module docstring, step 1), the module
    that runs it (``gm``, or with ``piecewise=True`` its split module) and its pieces, in
    order.  The backend records them only once this returns: Dynamo restarts the analysis of
    some graphs from inside a compile (``TensorifyScalarRestartAnalysis``, a float it must
    specialize), and the abandoned attempt is no graph of the backend's.  ``warned``: the
    backend's record of the split-op warnings said (`pieces.check_split_ops_occur`)."""
    made: list[Piece] = []
    if config.piecewise:
        module = _compile_split(name, gm, example_inputs, config, made, warned)
        return module, module, tuple(made)
    return compile_piece(name, gm, example_inputs, config, made), gm, tuple(made)


def _compile_split(
    name: str,
    gm: GraphModule,
    example_inputs: Sequence[Any],
    config: Any,
    made: list[Any],
    warned: set[tuple[Any, ...]] | None = None,
) -> GraphModule:
    """``gm`` split at its split ops, every other piece compiled in its place."""
    calls = pieces.find_split_calls(gm.graph, config.split_ops)
    pieces.check_split_ops_occur(gm.graph, config.split_ops, name, calls, warned)
    module = pieces.split_pieces(gm, config.split_ops, calls)
    split = pieces.split_call_pieces(module)
    for sub, inputs in _piece_inputs(module, example_inputs).items():
        if sub not in split:
            piece = compile_piece(f"{name}.{sub}", getattr(module, sub), inputs, config, made)
            setattr(module, sub, _CompiledModule(piece, _layouts(inputs)))
    return module


def _piece_inputs(module: GraphModule, example_inputs: Sequence[Any]) -> dict[str, list[Any]]:
    """The inputs each piece of ``module`` gets, as fake values: Dynamo's example inputs
    (fake, with symbolic sizes where Dynamo made them dynamic) run through ``module``.

    Why: a piece compiled for these compiles once for every size Dynamo's guards admit, like
    the whole graph; compiled from the real arguments of its first call it knew no shape
    environment, so ``torch.compile(dynamic=True)`` failed on the ``.item()`` of a float
    Dynamo had made an input (LayerNorm's ``eps``)."""
    found: dict[str, list[Any]] = {}

    class Recorder(torch.fx.Interpreter):
        def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
            found[str(target)] = list(args)
            return super().call_module(target, args, kwargs)

    with internals.faking(example_inputs) as fake:
        Recorder(module).run(*map(fake, example_inputs))
    return found


def _layouts(inputs: Sequence[Any]) -> list[tuple[tuple[int, ...], tuple[int, ...]] | None]:
    """Size and stride of every tensor input a piece was compiled for, where both are
    concrete ints (None elsewhere: a symbolic layout is Inductor's to guard)."""
    found: list[tuple[tuple[int, ...], tuple[int, ...]] | None] = []
    for value in inputs:
        layout = None
        if isinstance(value, torch.Tensor):
            size, stride = tuple(value.size()), tuple(value.stride())
            if all(type(d) is int for d in (*size, *stride)):
                layout = (size, stride)
        found.append(layout)
    return found


class _CompiledModule(torch.nn.Module):
    """A compiled piece in the place of its submodule (the stitching module calls modules).

    An input whose strides differ from those the piece was compiled for is passed as a
    copy with those strides, and copied back after the call (the piece may write it).  Why:
    pieces are compiled from fake values run through the split calls, and a split call's
    fake kernel can lay its output out otherwise than the real one (tiny Phi-3's attention
    on CPU): Inductor's code asserts the strides it was compiled for and refused the call."""

    def __init__(
        self,
        compiled: Callable[..., Any],
        layouts: Sequence[tuple[tuple[int, ...], tuple[int, ...]] | None] = (),
    ) -> None:
        super().__init__()
        self.compiled = compiled
        self.layouts = list(layouts)

    def forward(self, *args: Any) -> Any:
        moved: list[tuple[torch.Tensor, torch.Tensor]] = []
        given = list(args)
        for i, layout in enumerate(self.layouts[: len(given)]):
            value = given[i]
            if layout is None or not isinstance(value, torch.Tensor):
                continue
            size, stride = layout
            if tuple(value.size()) == size and tuple(value.stride()) != stride:
                copy = torch.empty_strided(size, stride, dtype=value.dtype, device=value.device)
                copy.copy_(value)
                moved.append((value, copy))
                given[i] = copy
        result = self.compiled(*given)
        for original, copy in moved:
            original.copy_(copy)
        return result


__all__ = ["CompiledPiece", "compile_graph_with_inductor", "compile_piece", "make_pass"]

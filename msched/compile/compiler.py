"""`msched.backend`: a ``torch.compile`` backend that schedules every graph onto streams.

Why: users compile real models, and the bug msched exists for appeared only under piecewise
compilation, where every piece is a graph of its own and a capture in a piece has no path to
that piece's output.  The backend runs the same pipeline an inference engine does, so tests
can show the whole path end to end.

For each graph dynamo hands it:

1. AOT autograd for inference, keeping input mutations in the graph (a mutated graph input
   gets a ``copy_`` into its placeholder).  Training graphs are refused.
2. Re-inplace every ``auto_functionalized`` / ``auto_functionalized_v2`` node from the
   op's schema (`msched.compile._reinplace`); the ``copy_`` write-backs that become ``copy_(x, x)``
   disappear.
3. With ``piecewise=True``, split the graph at every call of a ``split_ops`` op (each such
   call is a piece of its own; default `DEFAULT_SPLIT_OPS`: ``"msched::attention"`` and
   ``"torch.nn.functional.scaled_dot_product_attention"``) with
   ``torch.fx.passes.split_module``, keeping program order between pieces.  A split op is an
   op (an ``OpOverload``; any overload of an ``OpOverloadPacket``; a qualified name
   ``"namespace::name"`` or ``"namespace::name.overload"``, or as Python prints it:
   ``"aten.mm.default"``, ``"torch.ops.aten.mm"``) or a torch-level function (the callable,
   or its dotted name), matched when a graph is split, so naming an op needs no import of
   the code that defines it (and a graph that never calls it is one piece).  One spelling
   splits the graph of either compiler at the same calls (`msched.compile.split_ops`): an
   AOT node answers to the Dynamo call it came from, so the torch function, its aten op
   (``aten::scaled_dot_product_attention``) and the kernel it became on this device
   (``aten::_scaled_dot_product_flash_attention_for_cpu`` on CPU) all split at attention.
   A graph that calls none of them but calls ops that look related (a graph that does not
   say where its nodes came from, decomposed) raises `SplitOpNotFoundError`, which lists
   them as ``split_ops`` takes them (``"aten::name.overload"``); a graph with nothing
   related stays one piece with a `SplitOpNotFoundWarning` naming everything it calls.
   Every placeholder of every piece gets
   ``meta["msched_storage"]``: the name of the storage root, in the unsplit graph, of the
   value it receives, so inputs of a piece that alias each other (a view taken before a split
   and its base) stay one storage for `msched.analysis.effects`.
4. `msched.schedule` each piece; with ``verify=True``, `msched.verify` it against its
   unscheduled original and raise `PieceVerificationError` naming the piece on a violation.
5. Return a callable that runs the graph inside the module's own `StreamRuntime`
   (``with runtime.active():``), so stream ids mean this module's CUDA streams and events.

Errors raised inside a backend reach the caller of a ``torch.compile``'d model wrapped in
``torch._dynamo.exc.BackendCompilerFailed``; `compile_pieces` unwraps msched's own errors.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule

from msched._torch_internals import (
    OpOverload,
    OpOverloadPacket,
    aot_module_simplified,
    backend_compiler_failed,
    dynamo_graph_breaks,
    qualified_name,
)
from msched.analysis.cost import CostModel, check_cost_model
from msched.compile._reinplace import reinplace
from msched.compile.pieces import (
    Piece,
    _submodule_calls,
    check_split_ops_occur,
    find_split_calls,
    split_pieces,
)
from msched.compile.split_ops import parse_split_ops
from msched.errors import (
    CollectiveOutsideGraphWarning,
    InvalidArgumentError,
    InvalidGraphError,
    MschedError,
    NoGraphCompiledError,
    PieceVerificationError,
    TrainingGraphError,
)
from msched.limits import check_flag, check_num_streams
from msched.proof.verifier import verify
from msched.runtime import StreamRuntime
from msched.scheduling.pipeline import schedule

#: Where ``piecewise=True`` splits by default: attention, by name, so the backend imports no
#: model to have it (see `backend`): the attention op of msched's reference decoders, and
#: torch's, which ``transformers`` models call (``attn_implementation="sdpa"``, their default)
#: and which is one kernel or another by device (`msched.compile.split_ops`).
DEFAULT_SPLIT_OPS = ("msched::attention", "torch.nn.functional.scaled_dot_product_attention")
#: The values of ``backend(compiler=...)``.
COMPILERS = ("fx", "inductor")


@dataclass(frozen=True)
class BackendConfig:
    """The settings of one `backend`; plain data.

    ``split_ops`` holds ``OpOverload``s, ``OpOverloadPacket``s and qualified op names
    (``"msched::attention"``).  ``exit_edges=False`` is the ablation of `msched.schedule`
    (it reproduces the Eagle3 bug; see there).
    """

    num_streams: int = 2
    piecewise: bool = False
    split_ops: tuple[Any, ...] = DEFAULT_SPLIT_OPS
    verify: bool = True
    cost_model: CostModel | None = None
    exit_edges: bool = True
    compiler: str = "fx"
    # Ablations of compiler="inductor", for tests only: without the ties of consumers to
    # waits, or without the guard against buffer reuse across streams.
    tie_waits: bool = True
    guard_reuse: bool = True


@dataclass(frozen=True)
class CompiledGraph:
    """One graph Dynamo handed to the backend (``graph<i>``): the module that runs it, its
    pieces and the runtime it runs in.

    ``compiler="fx"``: ``module`` is the scheduled AOT graph (piecewise: the module that
    stitches its pieces) and ``runtime`` the `StreamRuntime` it runs in.
    ``compiler="inductor"``: ``module`` is the graph Dynamo handed over (piecewise: the module
    that stitches its pieces, the compiled ones in their places) and ``runtime`` is None (a
    compiled piece installs its own streams; `msched.compile.inductor_backend`).
    """

    name: str
    module: GraphModule
    pieces: tuple[Piece, ...]
    runtime: StreamRuntime | None


class MschedBackend:
    """The callable `backend` returns; records what it compiled in `graphs` / `pieces`, under
    both compilers: every graph Dynamo hands over (a recompile adds one; a graph whose
    compile fails, or that Dynamo restarts, adds none)."""

    def __init__(
        self, config: BackendConfig, runtime_factory: Callable[[], StreamRuntime] = StreamRuntime
    ) -> None:
        self.config = config
        # Benchmarks pass a runtime that delays auxiliary streams; everyone else the default.
        self.runtime_factory = runtime_factory
        self._graphs: list[CompiledGraph] = []
        self.__name__ = "msched"
        # Said once per graph / per compile (`check_split_ops_occur`, `_outside`).
        self._warned_split: set[tuple[Any, ...]] = set()
        self._outside = CollectivesOutside()

    @property
    def graphs(self) -> tuple[CompiledGraph, ...]:
        """Every graph compiled so far, in order (a recompile adds one)."""
        return tuple(self._graphs)

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """The pieces of every graph compiled so far, in order."""
        return tuple(p for g in self._graphs for p in g.pieces)

    def __call__(self, gm: GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        _refuse_own_streams(gm, f"graph{len(self._graphs)}")
        self._outside.check()
        if self.config.compiler == "inductor":
            from msched.compile.inductor_backend import compile_graph_with_inductor

            if _needs_autograd(example_inputs):
                self._refuse_training(gm, example_inputs)
            name = f"graph{len(self._graphs)}"
            compiled, module, made = compile_graph_with_inductor(
                name, gm, example_inputs, self.config, warned=self._warned_split
            )
            # Only now: a graph Dynamo restarts from inside its compile, or that fails,
            # raised above, so it takes no name and leaves no pieces.
            self._graphs.append(CompiledGraph(name, module, made, None))
            return compiled
        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=self._refuse_training,
            inference_compiler=self._compile_inference,
            keep_inference_input_mutations=True,
        )

    def _refuse_training(self, gm: GraphModule, example_inputs: Sequence[Any]) -> Any:
        raise TrainingGraphError(
            "msched.backend compiles inference graphs only, but this graph needs autograd; "
            "run the model under torch.no_grad() or freeze its parameters"
        )

    def _compile_inference(self, gm: GraphModule, example_inputs: Sequence[Any]) -> Any:
        name = f"graph{len(self._graphs)}"
        runtime = self.runtime_factory()
        compiled = compile_graph(gm, self.config, name, runtime, warned=self._warned_split)
        self._graphs.append(compiled)
        return _BoxedRunner(compiled.module, runtime)


class CollectivesOutside:
    """Warns (`CollectiveOutsideGraphWarning`, once per backend for each collective) when
    Dynamo broke a graph at a collective: ``torch.distributed.all_reduce(t, async_op=True)``
    and ``Work.wait()`` cannot be traced, so Dynamo compiles the code before and after them
    as graphs of their own and runs them eagerly in between, where msched neither schedules
    nor verifies them; before, nothing said so.

    Read from Dynamo's graph-break reasons (those counted since the backend was made, or
    since its last graph): Dynamo counts a break before it compiles the graph that ends
    there, so the backend sees it when it is handed that graph."""

    def __init__(self) -> None:
        self._counted = dynamo_graph_breaks()
        self._said: set[str] = set()

    def check(self) -> None:
        counts = dynamo_graph_breaks()
        new = [r for r, n in counts.items() if n > self._counted.get(r, 0)]
        self._counted = counts
        found = [name for name in map(_collective_named, new) if name is not None]
        collectives = [n for n in dict.fromkeys(found) if n != _WORK_WAIT]
        if not collectives and _WORK_WAIT in found and not self._said:
            collectives = [_WORK_WAIT]  # a wait alone: its collective was said, or not seen
        fresh = [n for n in collectives if n not in self._said]
        if not fresh:
            return
        self._said.update(fresh)
        warnings.warn(
            CollectiveOutsideGraphWarning(
                f"Dynamo broke the graph at {', '.join(fresh)}: it runs eagerly between the "
                "compiled graphs, outside msched's schedule and verification (msched neither "
                "orders it nor checks its order); call the functional collectives "
                "(torch.distributed._functional_collectives.all_reduce and friends, or "
                "async_op=False, which Dynamo traces into the graph) to have them scheduled "
                "and proved"
            ),
            stacklevel=2,
        )


_WORK_WAIT = "Work.wait()"
_FUNCTION = re.compile(r"<function (\w+) at ")


def _collective_named(reason: str) -> str | None:
    """The collective a graph-break reason names (``torch.distributed.all_reduce(...,
    async_op=True)``, ``Work.wait()``), or None for a break elsewhere.  torch 2.13 and
    2.15 head the reason with ``async_op=True for distributed collectives`` and name the
    function in its text (``<function all_reduce at 0x...>``)."""
    first = reason.strip().splitlines()[0] if reason.strip() else ""
    if "async_op=True" in first:
        found = _FUNCTION.search(reason)
        name = found.group(1) if found else "a collective"
        return f"torch.distributed.{name}(..., async_op=True)"
    if re.search(r"\bwait\b.*\bclass `?Work\b", reason):
        return _WORK_WAIT
    if "distributed" in first.lower() and "collective" in first.lower():
        return first
    return None


def _refuse_own_streams(gm: GraphModule, name: str) -> None:
    """Raise `InvalidGraphError` when Dynamo's graph ``gm`` has stream code of its own (the
    model's ``torch.Stream`` / ``torch.Event`` calls, ``torch.ops.streams`` ops in the graph).

    Why: msched schedules a graph without streams.  The model's own stream ops were read as
    compute: with ``compiler="fx"`` the schedule failed verification ("[missing-node]
    control_deps"), with ``"inductor"`` Inductor's lowering failed on them."""
    found = [(n, _stream_op(n.target)) for n in gm.graph.nodes if n.op == "call_function"]
    ops = sorted({f"torch.ops.{op.replace('::', '.')}" for _, op in found if op})
    if not ops:
        return
    raise InvalidGraphError(
        f"{name} has stream code of its own ({', '.join(ops)}: the model's streams and "
        "events), and msched.backend schedules graphs without streams: compile the model "
        "without its stream code to let msched choose the streams, or check that code "
        "with msched.verify(msched.trace_streams(fn, *inputs))",
        nodes=tuple(n.name for n, op in found if op),
    )


def _stream_op(target: Any) -> str | None:
    """``streams::record_event`` for a ``torch.ops.streams`` op (packet or overload)."""
    if isinstance(target, OpOverload):
        target = target.overloadpacket
    if isinstance(target, OpOverloadPacket) and qualified_name(target).startswith("streams::"):
        return qualified_name(target)
    return None


def _needs_autograd(example_inputs: Sequence[Any]) -> bool:
    """Whether AOT autograd would build a training graph for these inputs (``compiler=
    "inductor"`` hands Dynamo's graph to Inductor, which would compile forward and backward)."""
    return torch.is_grad_enabled() and any(
        isinstance(value, torch.Tensor) and value.requires_grad for value in example_inputs
    )


class _BoxedRunner:
    """Runs a compiled graph inside its runtime; AOT autograd calls it with a list."""

    _boxed_call = True

    def __init__(self, module: GraphModule, runtime: StreamRuntime) -> None:
        self.module = module
        self.runtime = runtime

    def __call__(self, args: list[Any]) -> Any:
        with self.runtime.active():
            return self.module(*args)


def backend(
    num_streams: int = 2,
    piecewise: bool = False,
    split_ops: Iterable[Any] | None = None,
    verify: bool = True,
    cost_model: CostModel | None = None,
    *,
    compiler: str = "fx",
    exit_edges: bool = True,
) -> MschedBackend:
    """A ``torch.compile`` backend that schedules every graph onto ``num_streams`` streams
    (an int in ``1..msched.MAX_STREAMS``).

    ``split_ops`` are where ``piecewise=True`` splits: a sequence of ``OpOverload``s,
    ``OpOverloadPacket``s, qualified op names (``"namespace::name"`` for any overload,
    ``"namespace::name.overload"`` for one; ``"namespace.name[.overload]"``, as Python prints
    an op, means the same) or torch-level functions (``F.scaled_dot_product_attention`` or
    ``"torch.nn.functional.scaled_dot_product_attention"``), default `DEFAULT_SPLIT_OPS`
    (the attention of `msched.models.decoders` and torch's, which ``transformers`` models
    call).  They split the graph each compiler sees at the same calls (AOT autograd's
    under ``"fx"``, Dynamo's under ``"inductor"``; `msched.compile.split_ops`).  Names are
    matched when a graph is split, so the op need not exist yet, and a graph that never
    calls it is one piece.  A graph that calls none of them but ops that look related
    (decomposed out of sight) raises `msched.SplitOpNotFoundError` listing them; a graph
    with nothing related is one piece, with a `msched.SplitOpNotFoundWarning` naming
    everything it calls.  ``cost_model`` is a `CostModel` (an object with a
    ``cost(node)`` method).  ``verify=True`` verifies every piece and raises
    `msched.PieceVerificationError` naming it on a violation.  ``exit_edges=False`` is the
    ablation of `msched.schedule` that reproduces the Eagle3 bug (for tests and benchmarks).
    ``compiler`` is ``"fx"`` (the scheduled graph runs op by op) or ``"inductor"`` (Inductor
    compiles every piece with msched's streams kept and ``verify`` checks its final kernel
    order; `msched.compile.inductor_backend`).  ``piecewise``, ``verify`` and ``exit_edges`` are
    True or False (any other value, ``"no"`` or ``0`` too, is refused).  Bad arguments raise
    `InvalidArgumentError` here, not at compile time.  See the module docstring.
    """
    check_num_streams(num_streams)
    if compiler not in COMPILERS:
        raise InvalidArgumentError(
            f"compiler must be one of {', '.join(map(repr, COMPILERS))}, got {compiler!r}"
        )
    ops = parse_split_ops(split_ops) if split_ops is not None else DEFAULT_SPLIT_OPS
    check_cost_model(cost_model)
    flags = {"piecewise": piecewise, "verify": verify, "exit_edges": exit_edges}
    for flag, value in flags.items():
        check_flag(value, flag)
    config = BackendConfig(num_streams, piecewise, ops, verify, cost_model, exit_edges, compiler)
    return MschedBackend(config)


def compile_graph(
    gm: GraphModule,
    config: BackendConfig,
    name: str = "graph",
    runtime: StreamRuntime | None = None,
    *,
    warned: set[tuple[Any, ...]] | None = None,
) -> CompiledGraph:
    """Steps 2-4 of the module docstring on an AOT inference graph; ``gm`` is rewritten.

    ``runtime`` (default: a new `StreamRuntime`) is the one the compiled graph will run in;
    ``warned`` the backend's record of the split-op warnings said (`check_split_ops_occur`).
    """
    reinplace(gm)
    if config.piecewise:
        calls = find_split_calls(gm.graph, config.split_ops)
        check_split_ops_occur(gm.graph, config.split_ops, name, calls, warned)
        module = split_pieces(gm, config.split_ops, calls)
        parts = [(f"{name}.{sub}", getattr(module, sub)) for sub in _submodule_calls(module)]
    else:
        module, parts = gm, [(name, gm)]
    pieces = tuple(_schedule_piece(piece_name, part, config) for piece_name, part in parts)
    return CompiledGraph(name, module, pieces, runtime or StreamRuntime())


def _schedule_piece(name: str, gm: GraphModule, config: BackendConfig) -> Piece:
    sched = schedule(gm, config.num_streams, config.cost_model, exit_edges=config.exit_edges)
    report = None
    if config.verify:
        report = verify(gm, original=sched.original, num_streams=config.num_streams)
        if not report.ok:
            message = f"piece {name} failed verification: {report}"
            raise PieceVerificationError(message, piece=name, report=report)
    return Piece(name, gm, sched, report)


def compile_pieces(
    model: torch.nn.Module, *inputs: Any, **backend_kwargs: Any
) -> tuple[GraphModule, ...]:
    """Compile ``model`` with ``backend(**backend_kwargs)``, run it once on ``inputs``, and
    return the scheduled pieces (GraphModules) in the order the backend saw them.

    See `compile_and_run` for what the run does to dynamo's caches and to ``inputs``.
    """
    b, _ = compile_and_run(model, inputs, backend(**backend_kwargs))
    return tuple(p.gm for p in b.pieces)


def compile_and_run(
    model: torch.nn.Module, inputs: Sequence[Any], b: MschedBackend
) -> tuple[MschedBackend, Callable[..., Any]]:
    """``torch.compile(model, backend=b)``, called once on ``inputs``; returns ``b`` and the
    compiled callable.

    Runs under ``torch.no_grad()`` (inference), after ``torch.compiler.reset()`` so that an
    earlier compilation of the same code can neither be reused nor exhaust dynamo's
    recompile limit (other compiled functions recompile on their next call).  In-place
    inputs (capture buffers) are written by the run.  msched's errors raised while compiling
    are re-raised unwrapped; a model dynamo runs eagerly raises `msched.NoGraphCompiledError`.
    """
    torch.compiler.reset()
    compiled = torch.compile(model, backend=b)
    try:
        with torch.no_grad():
            compiled(*inputs)
    except backend_compiler_failed() as failed:
        inner = getattr(failed, "inner_exception", None)
        if isinstance(inner, MschedError):
            raise inner from failed
        raise
    if not b.graphs and not b.pieces:
        raise NoGraphCompiledError(
            f"torch.compile never handed a graph of {type(model).__name__} to msched.backend "
            "(the model ran eagerly); check torch._dynamo.explain(model)(*inputs)"
        )
    return b, compiled

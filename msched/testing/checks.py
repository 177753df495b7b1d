"""Plain checks of scheduled graphs, shared by the pytest plugin and anyone else.

- `schedule_and_verify`: run a scheduler (`msched.schedule`, or any callable
  ``scheduler(gm, num_streams) -> GraphModule | None``: `run_scheduler`), then `msched.verify`
  against the original; `ScheduleCheck.failure` is the message a test fails with, and
  `SchedulerFailure.failure` the one for a scheduler that raised or returned something else;
- `resolve_dialect`: the `msched.Dialect` a graph is read in (given, or detected from its ops);
- `violation_message`: a `Report` and the lines of the scheduled graph around its violations;
- `excerpt`: those lines, in host order with the stream of every node; `streams_of`: the
  stream of every node;
- `exit_joins`: whether ``output`` happens after a node;
- `written_inputs`: the graph inputs a node writes, from `msched.analysis.effects` (so
  `msched.register_mutation` applies); `capture_columns`: its ``start``/``end`` arguments.

Nothing here imports pytest: the plugin's fixtures and assertion helpers wrap these.
"""

from __future__ import annotations

import copy
import functools
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from torch.fx import Graph, GraphModule, Node

import msched
from msched._lazy import lazy_graph_module
from msched._torch_internals import OpOverload, schema_of
from msched.analysis.cost import CostModel
from msched.analysis.effects import compute_effects
from msched.errors import MschedError
from msched.pictures.naming import event_names
from msched.pictures.text import node_text, step_text, switch_text
from msched.proof.clocks import clocks_of
from msched.proof.dialects import Dialect, as_dialect, made_in, uses_ops_of
from msched.proof.interpreter import interpret
from msched.proof.verifier import Report, verify
from msched.scheduling import pipeline
from msched.scheduling.pipeline import Schedule, schedule
from msched.testing.memory_checks import memory_problem

#: Lines shown before and after each focus node of an `excerpt`.
RADIUS = 3
VERIFY_FAILED = "msched.verify found violations in the schedule:"

#: A scheduler under test: rewrites ``gm`` for ``num_streams`` streams and returns the
#: scheduled module, or None when it rewrote ``gm`` in place (`msched.schedule`, and
#: partials of it, return a `msched.Schedule`).
Scheduler = Callable[[GraphModule, int], "GraphModule | Schedule | None"]


@dataclass(frozen=True)
class ScheduleCheck:
    """A schedule and its verification report (``None`` when it was not verified).

    ``dialect`` is the dialect the scheduled graph was read in (``None``: msched's).
    """

    schedule: Schedule
    report: Report | None
    dialect: Dialect | None = None

    @property
    def failure(self) -> str | None:
        """The message a test fails with: ``None`` unless verification found violations."""
        if self.report is None or self.report.ok:
            return None
        message = violation_message(self.schedule.gm, self.report, self.dialect)
        return f"{VERIFY_FAILED}\n{message}"


@dataclass(frozen=True)
class SchedulerFailure:
    """No schedule to check: the scheduler under test raised, returned something that is not
    a scheduled module, or returned a graph that cannot be read.  ``failure`` is the message a
    test fails with; it names the scheduler."""

    failure: str


def resolve_dialect(
    gm: GraphModule,
    dialect: Dialect | str | None = None,
    *,
    configured: Dialect | str | None = None,
) -> Dialect:
    """The dialect ``gm`` is read in, first of:

    1. ``dialect``, when given (anything `msched.proof.dialects.as_dialect` accepts);
    2. for a graph msched made (`msched.proof.dialects.made_in`: `msched.trace_streams` at
       every stage, Inductor kernel orders, `msched.schedule` and so the pieces of
       `msched.compile_pieces`), the dialect of its own stream ops (`msched.Dialect.detect`,
       exact for what msched makes), unless it holds an op of ``configured``: then a pass
       of the engine under test rewrote it after msched made it, and it is the engine's;
    3. ``configured``: the default for graphs that do not say otherwise (a test's
       ``msched_dialect``);
    4. the one `msched.Dialect.detect` finds in ``gm``'s ops.

    A graph of an engine's own stream ops is never marked, so it is read in ``configured``
    (or, without one, fails on the ops no dialect reads) as before."""
    if dialect is not None:
        return as_dialect(dialect)
    if configured is None:
        return Dialect.detect(gm)
    chosen = as_dialect(configured)
    if made_in(gm) is not None and not uses_ops_of(gm, chosen):
        return Dialect.detect(gm)
    return chosen


def is_msched_schedule(scheduler: object) -> bool:
    """Whether ``scheduler`` is msched's own (`msched.schedule`; ``None`` means it too)."""
    return scheduler is None or scheduler is pipeline.schedule


def scheduler_name(scheduler: object) -> str:
    """``package.module.function`` of a scheduler, for messages (partials show their
    arguments)."""
    if isinstance(scheduler, functools.partial):
        args = [scheduler_name(scheduler.func), *map(repr, scheduler.args)]
        args += [f"{k}={v!r}" for k, v in scheduler.keywords.items()]
        return f"functools.partial({', '.join(args)})"
    qualname = getattr(scheduler, "__qualname__", None)
    if not isinstance(qualname, str):
        return repr(scheduler)
    module = getattr(scheduler, "__module__", None)
    return f"{module}.{qualname}" if isinstance(module, str) else qualname


def copy_module(gm: GraphModule) -> GraphModule:
    """A copy of ``gm`` with a graph of its own (same node names) and ``gm``'s parameters,
    buffers and submodules (shared, not copied: as `msched.Schedule.original`).  Its code is
    generated when it is first run or read (`msched._lazy`)."""
    return lazy_graph_module(gm, copy.deepcopy(gm.graph), gm.__class__.__name__)


def copy_graph(graph: Graph) -> Graph:
    """A copy of ``graph``'s nodes (same names, targets, arguments and ``meta`` entries), in
    its order, owned by ``graph``'s module (so its ``call_module`` and ``get_attr`` nodes are
    read as that module's) without generating code: enough for `msched.verify`'s
    ``original``."""
    new = Graph(owning_module=graph.owning_module)  # call_module nodes name its submodules
    new.output(new.graph_copy(graph, {}))
    return new


def run_scheduler(
    scheduler: Scheduler,
    gm: GraphModule,
    num_streams: int,
    cost_model: CostModel | None = None,
    dialect: Dialect | str | None = None,
) -> ScheduleCheck | SchedulerFailure:
    """Run a scheduler that is not msched's on ``gm``: the `msched.Schedule` read back from
    what it made, unverified (``report`` None), or a `SchedulerFailure` naming the scheduler.

    ``scheduler(gm, num_streams)`` returns the scheduled ``GraphModule`` or ``None`` (it
    rewrote ``gm`` in place); a callable that returns a `msched.Schedule` (a
    ``functools.partial`` of `msched.schedule`, say) is taken at its word.  A copy of ``gm``
    made before the call is the original, and the schedule is
    ``msched.read_schedule(result, original=..., dialect=..., cost_model=...,
    num_streams=num_streams)`` (read in ``dialect``, the configured one, unless msched
    made the result: `resolve_dialect`; the
    Schedule's ``num_streams`` is the count requested, even when the pass used fewer).
    The failure is for a scheduler that raises (with its traceback), returns anything
    else, or returns a graph that cannot be read.
    """
    name = scheduler_name(scheduler)
    original = copy_module(gm)
    try:  # the scheduler is the user's code: what it returns is checked below
        result: object = scheduler(gm, num_streams)
    except Exception as error:
        tb = error.__traceback__
        frames = traceback.format_exception(type(error), error, tb.tb_next if tb else None)
        return SchedulerFailure(
            f"the scheduler {name} raised {type(error).__name__} scheduling the graph on "
            f"{num_streams} streams: {error}\n" + "".join(frames).rstrip()
        )
    if result is None:
        result = gm
    if not isinstance(result, (GraphModule, Schedule)):
        return SchedulerFailure(
            f"the scheduler {name} returned {type(result).__name__}; a scheduler returns the "
            "scheduled torch.fx.GraphModule, or None when it rewrote the one it was given"
        )
    try:
        if isinstance(result, Schedule):
            return ScheduleCheck(result, None, resolve_dialect(result.gm, configured=dialect))
        read = resolve_dialect(result, configured=dialect)
        sched = msched.read_schedule(
            result, original=original, dialect=read, cost_model=cost_model, num_streams=num_streams
        )
    except MschedError as error:
        return SchedulerFailure(
            f"the graph the scheduler {name} returned cannot be read as a schedule: {error}"
        )
    return ScheduleCheck(sched, None, read)


def schedule_and_verify(
    gm: GraphModule,
    num_streams: int,
    cost_model: CostModel | None = None,
    *,
    strict: bool = True,
    scheduler: Scheduler | None = None,
    dialect: Dialect | str | None = None,
    cuda_graph: bool = False,
    memory_budget: float | None = None,
    example_inputs: Sequence[Any] | None = None,
) -> ScheduleCheck | SchedulerFailure:
    """Schedule ``gm`` on ``num_streams`` streams; with ``strict``, `msched.verify` the result
    against the original graph (and, with ``cuda_graph``, the CUDA-graph capture rules).

    ``scheduler`` None (or `msched.schedule`): `msched.schedule` ``gm`` in place and verify
    against a copy of its graph taken before (`copy_graph`: the graph of ``Schedule.original``,
    without generating the code of a module).  Any other scheduler runs through
    `run_scheduler`, which keeps a copy of ``gm`` as the original and reads the
    `msched.Schedule` back, or returns the `SchedulerFailure` that names it.  ``dialect`` is
    the configured dialect of scheduled graphs (``None``: detected from their ops); a graph
    msched made is read in its own (`resolve_dialect`).  Verification also
    checks that the graph uses at most ``num_streams`` streams.

    ``memory_budget`` (a ratio >= 1.0; None: none) is `msched.schedule`'s, with
    ``example_inputs`` for the sizes; another scheduler's result is checked against it
    (`msched.testing.memory_checks.memory_problem`), a `SchedulerFailure` when over.
    """
    original: GraphModule | Graph | None = None
    if is_msched_schedule(scheduler):
        # The graph as it was, to verify against: `Schedule.original` would also generate and
        # compile the code of a module nobody runs.
        original = copy_graph(gm.graph) if strict else None
        budget: dict[str, Any] = {}  # without one, the call is msched.schedule's as before
        if memory_budget is not None:
            budget = {"memory_budget": memory_budget, "example_inputs": example_inputs}
        sched = schedule(gm, num_streams, cost_model, **budget)
        run = ScheduleCheck(sched, None, resolve_dialect(sched.gm, configured=dialect))
    else:
        assert scheduler is not None
        outcome = run_scheduler(scheduler, gm, num_streams, cost_model, dialect)
        if isinstance(outcome, SchedulerFailure):
            return outcome
        run = outcome
        if memory_budget is not None:
            over = _over_budget(run, memory_budget, example_inputs, cost_model, scheduler)
            if over is not None:
                return over
    if not strict:
        return run
    sched = run.schedule
    try:
        report = verify(
            sched.gm,
            original=sched.original if original is None else original,
            dialect=run.dialect,
            num_streams=num_streams,
            cuda_graph=cuda_graph,
        )
    except MschedError as error:
        return SchedulerFailure(
            f"the graph the scheduler {scheduler_name(scheduler or schedule)} returned cannot "
            f"be verified: {error}"
        )
    return ScheduleCheck(sched, report, run.dialect)


def _over_budget(
    run: ScheduleCheck,
    budget: float,
    example_inputs: Sequence[Any] | None,
    cost_model: CostModel | None,
    scheduler: Scheduler,
) -> SchedulerFailure | None:
    """The failure of a scheduler whose schedule is over the memory ``budget``."""
    sched = run.schedule
    try:
        problem = memory_problem(
            sched.gm,
            budget,
            original=sched.original,
            example_inputs=example_inputs,
            cost_model=cost_model,
            dialect=run.dialect,
        )
    except MschedError as error:
        problem = f"its memory cannot be priced: {error}"
    if problem is None:
        return None
    return SchedulerFailure(
        f"the scheduler {scheduler_name(scheduler)} breaks msched_memory_budget={budget:g}: "
        + problem
    )


def violation_message(gm: GraphModule, report: Report, dialect: Dialect | str | None = None) -> str:
    """``report`` and the lines of ``gm`` around every node its violations involve."""
    involved = [n for v in report.violations for n in v.nodes]
    return f"{report}\n" + excerpt(gm, involved, dialect=dialect)


def exit_joins(gm: GraphModule, node: Node, dialect: Dialect | str | None = None) -> bool:
    """Whether ``output`` happens after ``node``: the caller's stream has joined it when the
    graph returns (`msched.proof.clocks`, the happens-before of `msched.verify`).  ``gm`` is
    read in ``dialect`` (``None``: detected)."""
    return clocks_of(interpret(gm, resolve_dialect(gm, dialect))).exit_happens_after(node)


def written_inputs(gm: GraphModule, nodes: Iterable[Node]) -> dict[Node, tuple[Node, ...]]:
    """The placeholders each of ``nodes`` writes, in argument order, as msched's effects
    see them: schema writes, registered mutations, and every tensor an unknown op receives."""
    writes = compute_effects(gm.graph).writes
    return {n: tuple(s for s in writes.get(n, ()) if s.op == "placeholder") for n in nodes}


def capture_columns(node: Node) -> slice:
    """The columns (last dimension) ``node`` writes: its ``start``/``end`` arguments, bound
    by name through its schema (positional or keyword); all columns without them."""
    bound = _bound_args(node)
    return slice(bound.get("start"), bound.get("end"))


def _bound_args(node: Node) -> dict[str, Any]:
    schema = schema_of(node.target) if isinstance(node.target, OpOverload) else None
    names = [a.name for a in schema.arguments] if schema is not None else []
    bound = dict(zip(names, node.args, strict=False))
    bound.update(node.kwargs)
    return bound


# Excerpts ------------------------------------------------------------------------------------


def streams_of(gm: GraphModule, dialect: Dialect | str | None = None) -> dict[Node, int]:
    """The stream every node of ``gm`` is issued on, read in ``dialect`` (``None``: detected);
    empty when the graph cannot be read."""
    try:
        return dict(interpret(gm, resolve_dialect(gm, dialect)).stream_of)
    except MschedError:
        return {}


@dataclass(frozen=True)
class _Line:
    node: Node
    stream: int  # -1: the graph's stream ops cannot be read
    text: str

    def render(self, marked: bool) -> str:
        lane = f"s{self.stream}" if self.stream >= 0 else "s?"
        indent = "  " * max(self.stream, 0)
        return f"  {'>' if marked else ' '} {lane} | {indent}{self.text}"


def _lines(gm: GraphModule, dialect: Dialect | str | None) -> list[_Line]:
    """One line per step in host order, ``set_stream`` folded into the stream column."""
    try:
        program = interpret(gm, resolve_dialect(gm, dialect))
        names = event_names(program)
    except MschedError:
        return [_Line(node, -1, node_text(node)) for node in gm.graph.nodes]
    lines: list[_Line] = []
    steps = program.steps
    i = 0
    while i < len(steps):  # a switch and its waits on one line, as in the snapshot text
        step = steps[i]
        i += 1
        if step.kind != "set_stream":
            lines.append(_Line(step.node, step.stream, step_text(step, names)))
            continue
        waits = []
        while i < len(steps) and steps[i].kind == "wait_event" and steps[i].node is step.node:
            waits.append(steps[i])
            i += 1
        if waits:
            lines.append(_Line(step.node, step.stream, switch_text(waits, names)))
    return lines


def _windows(marked: list[int], size: int, radius: int) -> list[range]:
    windows: list[range] = []
    for i in marked:
        lo, hi = max(i - radius, 0), min(i + radius + 1, size)
        if windows and lo <= windows[-1].stop:
            windows[-1] = range(windows[-1].start, max(hi, windows[-1].stop))
        else:
            windows.append(range(lo, hi))
    return windows


def excerpt(
    gm: GraphModule,
    focus: Iterable[Node | str],
    radius: int = RADIUS,
    dialect: Dialect | str | None = None,
) -> str:
    """The lines of ``gm`` within ``radius`` of each ``focus`` node (marked ``>``).

    Lines are in host (emission) order, one per node, with the stream the node is issued on
    as read by `msched.proof.interpreter.interpret`, in the layout of the snapshot text::

          s0 |   mul_tensor_86 = aten.mul.Tensor(mul_tensor_85, final_ln)
        > s1 |   capture_11 = msched.inplace_slice_copy.default(dest=dest, ...)
          s0 | output(mul_tensor_86)

    Focus nodes are matched by name, so nodes of another copy of the graph work too.  Gaps
    between windows are shown as ``...``.  The stream ops are read in ``dialect`` (``None``:
    detected from the graph's ops); streams read as ``s?`` when they cannot be read.
    """
    names = {f if isinstance(f, str) else f.name for f in focus}
    lines = _lines(gm, dialect)
    marked = {i for i, line in enumerate(lines) if line.node.name in names}
    windows = _windows(sorted(marked), len(lines), radius)
    out: list[str] = []
    for window in windows:
        if out or window.start > 0:
            out.append("    ...")
        out += [lines[i].render(i in marked) for i in window]
    if windows and windows[-1].stop < len(lines):
        out.append("    ...")
    return "\n".join(out)

"""`msched.schedule`: the whole pass, from a GraphModule to a scheduled GraphModule; and
`msched.read_schedule`, the `Schedule` of a graph another pass scheduled."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from torch.fx import Graph, GraphModule, Node
from torch.fx.node import map_arg

from msched import ops
from msched._torch_internals import codegen_of
from msched.analysis.bounds import node_costs
from msched.analysis.cost import CostModel, DefaultCostModel, check_cost_model
from msched.analysis.dag import Dag, build_dag
from msched.analysis.nodes import node_named
from msched.errors import InvalidArgumentError, InvalidGraphError
from msched.limits import check_flag, check_num_streams
from msched.proof.dialects import Dialect, mark_made
from msched.proof.memory import MemoryReport, peak_memory, sized_values
from msched.proof.scheduled import read_summary
from msched.proof.summary import Summarized, Summary
from msched.scheduling.assign import (
    Assignment,
    assign_streams,
    serial_assignment,
)
from msched.scheduling.budget import (
    Candidate,
    check_memory_budget,
    choose_within_budget,
    pin_sets,
)
from msched.scheduling.codegen import direct_stream_calls
from msched.scheduling.emit import plan_emission, relink
from msched.scheduling.exact import OptimalMakespan, check_effort, solve_from
from msched.scheduling.timetable import timetable_assignment


@dataclass(frozen=True)
class Schedule(Summarized[float]):
    """The result of `schedule`: where every node runs, and what it cost.

    ``gm`` is the scheduled module (the same object that was passed in).  ``original`` is a
    copy of the input graph as a GraphModule (sharing ``gm``'s parameters and buffers), for
    ``msched.verify(gm, original=...)`` and for running the unscheduled program.
    ``summary`` (`msched.proof.summary.Summary`) holds ``num_streams``, ``num_events``,
    ``num_waits``, ``makespan`` and ``lower_bound``, each also an attribute of the Schedule;
    the makespan and the lower bound are in cost-model units, and the lower bound is
    ``max(critical path, total cost / num_streams)`` at least.

    ``optimal`` is what the exact mode found (``effort="optimal"``; None otherwise): the
    optimum, or the solver's best schedule and bound with ``proven`` False.

    A Schedule read back from a graph another pass scheduled (`msched.read_schedule`) has no
    ``assignment`` (its times come from the timeline simulator), the ``dialect`` its stream
    ops are read in, and ``original`` only when one was given.
    """

    gm: GraphModule
    streams: Mapping[Node, int]
    summary: Summary[float]
    assignment: Assignment | None = field(repr=False)
    _snapshot: _GraphSnapshot | None = field(repr=False)
    dialect: Dialect | None = field(default=None, repr=False)
    _original: GraphModule | None = field(default=None, repr=False)
    optimal: OptimalMakespan | None = field(default=None, repr=False)

    def stream_of(self, node: Node | str) -> int:
        """The stream ``node`` (or the node named so) runs on; stream ops report their stream."""
        if isinstance(node, str):
            node = node_named(self.gm, node, "the scheduled graph")
        if node not in self.streams:
            raise InvalidArgumentError(f"node {node.name!r} is not in the scheduled graph")
        return self.streams[node]

    @cached_property
    def original(self) -> GraphModule:
        """The input graph, unscheduled, as a module of its own.

        Built on first use from a snapshot taken before scheduling (about the cost of one
        ``Graph.graph_copy``), so callers that never look at it do not pay for it.  The graph
        is its own; the parameters, buffers and submodules are the scheduled module's (no copy
        of a model's weights): running one module changes the state the other sees, so save
        and restore mutated buffers when you run both to compare them.
        """
        if self._original is not None:
            return self._original
        if self._snapshot is None:
            raise InvalidArgumentError(
                "this Schedule was read back from a scheduled graph without its original; "
                "pass original= to msched.read_schedule"
            )
        return GraphModule(self.gm, self._snapshot.graph(), self.gm.__class__.__name__)

    @cached_property
    def memory(self) -> MemoryReport:
        """`msched.peak_memory` of the scheduled module, read from its nodes' fake values
        (``meta["val"]``, ...) under the default cost model; computed on first use, then kept
        (the graph is read as it is then).  A schedule made with a ``memory_budget`` has
        it already: the report its choice was priced with (sizes from ``example_inputs``
        where given, under its ``cost_model``).  For a graph without fake values, or under
        another cost model, call ``msched.peak_memory(sched.gm, example_inputs=...,
        cost_model=...)``."""
        try:
            return peak_memory(self.gm, dialect=self.dialect)
        except InvalidArgumentError as error:
            raise InvalidArgumentError(
                f"Schedule.memory reads sizes from the graph's fake values: {error}; "
                "call msched.peak_memory(sched.gm, example_inputs=...) instead"
            ) from error


@dataclass(frozen=True)
class _GraphSnapshot:
    """Enough of a graph to rebuild a copy of it later, whatever happens to the nodes."""

    rows: tuple[tuple[Node, str, Any, Any, Any, Any, dict[str, Any]], ...]
    codegen: Any

    @classmethod
    def of(cls, graph: Graph) -> _GraphSnapshot:
        rows = tuple(
            (n, n.op, n.target, n.args, n.kwargs, n.type, dict(n.meta)) for n in graph.nodes
        )
        return cls(rows, codegen_of(graph))

    def graph(self) -> Graph:
        copy = Graph()
        copy.set_codegen(self.codegen)
        env: dict[Node, Node] = {}
        for node, op, target, args, kwargs, type_, meta in self.rows:
            new = copy.create_node(
                op,
                target,
                map_arg(args, env.__getitem__),
                map_arg(kwargs, env.__getitem__),
                name=node.name,
                type_expr=type_,
            )
            new.meta = dict(meta)
            env[node] = new
        return copy


def _check_arguments(gm: object, num_streams: object, cost_model: object) -> None:
    if not isinstance(gm, GraphModule):
        raise InvalidArgumentError(
            f"msched.schedule expects a torch.fx.GraphModule, got {type(gm).__name__}; "
            "trace the model first (torch.fx.symbolic_trace, or use msched.backend)"
        )
    check_num_streams(num_streams)
    check_cost_model(cost_model)


def _check_unscheduled(graph: Graph) -> None:
    found = [n for op in ops.STREAM_OPS for n in graph.find_nodes(op="call_function", target=op)]
    if found:
        marked = set(found)
        stream_ops = [n.name for n in graph.nodes if n in marked]
        shown = ", ".join(stream_ops[:3]) + (", ..." if len(stream_ops) > 3 else "")
        raise InvalidGraphError(
            f"the graph is already scheduled (stream ops {shown}); schedule the original graph "
            "(Schedule.original) instead",
            nodes=tuple(stream_ops),
        )


def schedule(
    gm: GraphModule,
    num_streams: int = 2,
    cost_model: CostModel | None = None,
    *,
    exit_edges: bool = True,
    effort: str = "fast",
    time_limit: float = 10.0,
    memory_budget: float | None = None,
    example_inputs: Sequence[Any] | None = None,
    keep_alive: bool = True,
) -> Schedule:
    """Schedule ``gm`` onto ``num_streams`` streams, rewriting ``gm.graph`` in place.

    Why: the graph exit depends on the last write of every in-place target, so captures into
    a graph input (Eagle3) are emitted before ``output`` and joined on the caller's stream.

    1. Build the `msched.analysis.dag.Dag` (data, RAW, WAR, WAW and exit edges); a cyclic
       graph is an `msched.InvalidGraphError` naming the cycle.
    2. Assign streams by critical-path list scheduling (`msched.scheduling.assign`).
    3. Plan the emitted order with the stream ops (`msched.scheduling.emit`), then relink the
       graph and recompile ``gm``, so calling ``gm`` runs the schedule.

    ``num_streams`` is an int in ``1..msched.MAX_STREAMS`` (`msched.limits`).  With
    ``num_streams=1`` no stream op is added and the node order is unchanged, unless the
    graph has asynchronous collectives and the list schedule on one stream beats the
    original order (it issues compute between a collective and its wait).  Node names are
    kept.  On any error ``gm`` is left exactly as it was.  ``gm.meta["msched_dialect"]`` says
    that msched made the graph (`msched.proof.dialects.mark_made`): the pytest plugin reads
    it in its own dialect whatever dialect a test configures for another engine.

    ``effort="optimal"`` also solves the schedule exactly with OR-Tools CP-SAT
    (`msched.scheduling.exact`; ``pip install 'ortools>=9.8'``) for up to
    ``time_limit`` seconds of deterministic solver time, and runs the solver's timetable when
    it is shorter than the list schedule (``Schedule.optimal`` says whether it is proven
    optimal), on one stream too when the graph has asynchronous collectives (their overlap
    depends on the order).  ``effort="fast"`` (the default) runs the list schedule only.

    ``memory_budget=r`` (a number >= 1.0; None, the default: no budget) keeps the
    schedule's ``reserved_bound`` (`msched.peak_memory`) at most ``r`` times the original
    order's: of the list schedules on ``num_streams`` down to 2 streams (also with the
    allocating nodes kept on stream 0), on one stream (with asynchronous collectives) and
    the original order, the shortest within the budget runs (`msched.scheduling.budget`;
    the original order always meets 1.0).  Sizes come from the
    nodes' fake values, else are propagated from ``example_inputs`` (read only with a
    budget); ``Schedule.memory`` is then the chosen schedule's report under ``cost_model``.
    Without a budget nothing is priced.

    A tensor used on another stream than its own, where the allocator could hand its block
    out too early, is kept alive until its stream has waited for that use when a later node
    of its stream does (``keep_alive=True``, the default: never more ``reserved_bound``,
    docs/memory.md), else it gets ``record_stream`` for the using stream, as it always does
    with ``keep_alive=False``.

    ``exit_edges=False``, an ablation for tests and benchmarks, builds the Dag without exit
    edges: it reproduces the Eagle3 bug msched exists to prevent, which `msched.verify` reports.
    ``exit_edges`` is True or False; anything else is an `msched.InvalidArgumentError`.
    """
    _check_arguments(gm, num_streams, cost_model)
    check_flag(exit_edges, "exit_edges")
    check_flag(keep_alive, "keep_alive")
    limit = check_effort(effort, time_limit)
    budget = None if memory_budget is None else check_memory_budget(memory_budget)
    dag = build_dag(gm, exit_edges=exit_edges)
    _check_unscheduled(gm.graph)
    model = cost_model or DefaultCostModel()
    original = _GraphSnapshot.of(gm.graph)
    memory = None
    if budget is not None:
        values = sized_values(gm, example_inputs)
        pins = pin_sets(values)
        candidates, optimal = _candidates(dag, num_streams, model, effort, limit, pins)
        chosen = _within_budget(gm, dag, candidates, budget, values, cost_model, keep_alive)
        assignment, (events, waits, streams), memory = chosen
    else:
        assignment, (events, waits, streams), optimal = _unbudgeted(
            gm, dag, num_streams, model, effort, limit, keep_alive
        )
    mark_made(gm, "msched")
    summary = Summary(num_streams, events, waits, assignment.makespan, assignment.lower_bound)
    result = Schedule(gm, streams, summary, assignment, original, optimal=optimal)
    if memory is not None:  # priced already: Schedule.memory need not read the graph
        result.__dict__["memory"] = memory
    return result


def _unbudgeted(
    gm: GraphModule,
    dag: Dag,
    num_streams: int,
    model: CostModel,
    effort: str,
    limit: float,
    keep_alive: bool,
) -> tuple[Assignment, tuple[int, int, dict[Node, int]], OptimalMakespan | None]:
    """The schedule without a budget, emitted: the list schedule (or the exact mode's), on
    one stream the original order unless reordering collectives makes it shorter."""
    optimal = None
    if num_streams == 1:
        assignment = serial_assignment(dag, model)
        emitted = (0, 0, dict.fromkeys(dag.nodes, 0))
        if assignment.communication:  # reordered, compute can run under communication
            listed = assign_streams(dag, 1, model)
            if effort == "optimal":
                listed, optimal = _optimal(dag, listed, model, limit)
            if listed.makespan < assignment.makespan:
                assignment = listed
                emitted = _rewrite(gm, dag, assignment, keep_alive)
        return assignment, emitted, optimal
    assignment = assign_streams(dag, num_streams, model)
    if effort == "optimal":
        assignment, optimal = _optimal(dag, assignment, model, limit)
    return assignment, _rewrite(gm, dag, assignment, keep_alive), optimal


def _candidates(
    dag: Dag,
    num_streams: int,
    model: CostModel,
    effort: str,
    limit: float,
    pins: list[frozenset[Node]],
) -> tuple[list[Candidate], OptimalMakespan | None]:
    """The schedules a budget chooses from (`msched.scheduling.budget`): the list schedules
    on ``num_streams`` down to 2 streams (the first through the exact mode with
    ``effort="optimal"``), each also with the nodes of each of ``pins`` kept on stream 0;
    on one stream where collectives let it overlap; the original order."""
    found: list[Candidate] = []
    optimal = None
    for count in range(num_streams, 1, -1):
        listed = assign_streams(dag, count, model)
        if count == num_streams and effort == "optimal":
            listed, optimal = _optimal(dag, listed, model, limit)
        found.append(Candidate(listed))
        found += [Candidate(assign_streams(dag, count, model, pinned=p)) for p in pins]
    serial = serial_assignment(dag, model)
    if serial.communication:
        found.append(Candidate(assign_streams(dag, 1, model)))
    found.append(Candidate(serial, emitted=False))
    return found, optimal


def _within_budget(
    gm: GraphModule,
    dag: Dag,
    candidates: list[Candidate],
    budget: float,
    values: dict[Node, Any],
    cost_model: CostModel | None,
    keep_alive: bool,
) -> tuple[Assignment, tuple[int, int, dict[Node, int]], MemoryReport]:
    """Price ``candidates`` in ``gm`` and keep the shortest within ``budget`` emitted."""
    codegen = codegen_of(gm.graph)
    emitted: list[tuple[int, int, dict[Node, int]]] = []

    def emit(assignment: Assignment) -> None:
        emitted.append(_rewrite(gm, dag, assignment, keep_alive))

    def take_back() -> None:
        gm.graph.set_codegen(codegen)
        _restore(gm, dag.nodes)

    try:
        chosen = choose_within_budget(gm, candidates, budget, values, cost_model, emit, take_back)
    except BaseException:
        if emitted and any(n not in dag.index for n in gm.graph.nodes):
            take_back()
        raise
    if chosen.emitted:
        return chosen.candidate.assignment, emitted[-1], chosen.memory
    serial = (0, 0, dict.fromkeys(dag.nodes, 0))
    return chosen.candidate.assignment, serial, chosen.memory


def read_schedule(
    gm: GraphModule,
    original: GraphModule | None = None,
    dialect: Dialect | str | None = None,
    cost_model: CostModel | None = None,
    num_streams: int | None = None,
) -> Schedule:
    """The `Schedule` of ``gm``, a graph some pass scheduled, read from its stream ops.

    Reading only interprets and simulates: `msched.proof.scheduled.read_summary` does it;
    this wraps its result in a `Schedule`, the type it lives next to (docs/design.md says why).
    ``dialect`` is a `Dialect`, a dialect name, or None to detect it from the graph's ops
    (`Dialect.detect`).  ``num_events`` counts the distinct events recorded, ``num_waits`` the
    waits; ``makespan`` is the `msched.simulate` makespan under ``cost_model`` (the table
    model by default).  With ``original`` the lower bound is the original graph's
    (`msched.analysis.bounds.makespan_lower_bound`) and ``Schedule.original`` is ``original``.
    ``num_streams`` is the stream count the pass was given: the Schedule's ``num_streams``
    (what its pictures and snapshot header say, and the lower bound divides by) is that
    count, or the streams the graph uses when it uses more; None: the streams it uses.
    """
    read = read_summary(gm, original, dialect, cost_model, num_streams)
    return Schedule(
        gm, read.streams, read.summary, None, None, dialect=read.dialect, _original=original
    )


def _optimal(
    dag: Dag, heuristic: Assignment, model: CostModel, time_limit: float
) -> tuple[Assignment, OptimalMakespan]:
    """The exact mode: the solver's timetable when it beats the list schedule."""
    found = solve_from(dag, heuristic, node_costs(dag, model), time_limit)
    if found.makespan < heuristic.makespan:
        timed = timetable_assignment(dag, heuristic.num_streams, model, found.start)
        if timed.makespan < heuristic.makespan:
            return timed, found
    return heuristic, found


def _rewrite(
    gm: GraphModule, dag: Dag, assignment: Assignment, keep_alive: bool
) -> tuple[int, int, dict[Node, int]]:
    graph = gm.graph
    codegen = codegen_of(graph)
    try:
        emission = plan_emission(graph, dag, assignment, keep_alive)
        relink(graph, emission.order)
        direct_stream_calls(gm, recompile=False)
        gm.recompile()
    except BaseException:
        graph.set_codegen(codegen)
        _restore(gm, dag.nodes)
        raise
    return emission.num_events, emission.num_waits, emission.stream


def _restore(gm: GraphModule, nodes: tuple[Node, ...]) -> None:
    """Erase every node that is not one of ``nodes`` and put ``nodes`` back in order."""
    graph = gm.graph
    keep = set(nodes)
    for node in reversed(list(graph.nodes)):
        if node not in keep:
            graph.erase_node(node)
    relink(graph, nodes)
    gm.recompile()

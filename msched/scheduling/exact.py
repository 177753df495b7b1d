"""The exact mode: the optimal makespan of a Dag on ``k`` streams, by OR-Tools CP-SAT.

Why: list scheduling is fast and usually at or near the optimum, but "near" is only known
against a solver.  `optimal_makespan` answers how far a schedule is from the best possible
one; ``msched.schedule(gm, k, effort="optimal")`` runs the solver's schedule.

The model: every compute node is an interval of its cost; every Dag edge ``p -> v`` says
``start(v) >= end(p)``; at most ``k`` intervals run at once (a cumulative constraint: any
such timetable is ``k`` streams, by colouring the intervals in start order); the objective is
the latest end.  With asynchronous collectives (`msched.analysis.communication`, the model
the list scheduler and `msched.simulate` share): a collective's issue holds its stream for
nothing and collectives are issued in the original order; its communication is an interval
of its cost on its process group's channel, starting no earlier than its issue, after the
communication of the group's collective before it; a wait starts no earlier than the end of
the communication it waits for.  OR-Tools is an optional dependency
(msched's ``optimal`` extra: ``pip install 'ortools>=9.8'``).

Determinism: one search worker, a fixed seed, and ``time_limit`` given to the solver as its
*deterministic* time (a count of work, about a second each on an idle core), so a call gives
the same answer on every machine and every run; only a machine so loaded that the work takes
more than `_WALL_GUARD` times ``time_limit`` in wall-clock seconds stops it earlier.  When the
list schedule already meets `msched.analysis.bounds.makespan_lower_bound` it is the optimum
and the solver does not run.  Costs are integers to CP-SAT: integral costs (the table model's) are
used as they are; others are scaled so the largest is `RESOLUTION` and rounded, and the
schedule found is then timed with the real costs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torch.fx import GraphModule, Node

from msched.analysis.bounds import makespan_lower_bound, node_costs
from msched.analysis.communication import Communication, split_communication
from msched.analysis.cost import CostModel, DefaultCostModel, check_cost_model
from msched.analysis.dag import Dag, build_dag
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError, MissingDependencyError
from msched.limits import check_num_streams
from msched.scheduling.assign import Assignment, assign_streams

#: Integer resolution of non-integral costs (the largest cost becomes this many units).
RESOLUTION = 10**6
EXTRA = "pip install 'ortools>=9.8' (msched's optimal extra)"
# Wall-clock cap, in multiples of ``time_limit``, for a machine too loaded to reach the
# deterministic limit in reasonable time (the only case where an answer can depend on load).
_WALL_GUARD = 4


@dataclass(frozen=True)
class OptimalMakespan:
    """What CP-SAT found for a Dag on ``num_streams`` streams, in cost-model units.

    ``makespan`` is the best schedule it found (``start`` holds its start times) and
    ``bound`` the lower bound it proved; ``proven`` says they are equal, i.e. ``makespan`` is
    the optimum (with non-integral costs: the optimum of the rounded costs).
    """

    makespan: float
    bound: float
    proven: bool
    num_streams: int
    start: dict[Node, float] = field(repr=False)


def check_time_limit(time_limit: object) -> float:
    """``time_limit`` as a float, or `msched.InvalidArgumentError` unless it is a positive,
    finite number of seconds."""
    ok = isinstance(time_limit, (int, float)) and not isinstance(time_limit, bool)
    if not ok or not 0 < float(time_limit) < math.inf:  # type: ignore[arg-type]
        raise InvalidArgumentError(
            f"time_limit must be a positive number of seconds, got {time_limit!r}"
        )
    return float(time_limit)  # type: ignore[arg-type]


def _cp_model() -> Any:
    try:
        from ortools.sat.python import cp_model
    except ImportError as error:
        raise MissingDependencyError(
            f"the optimal mode needs OR-Tools, which is not installed: {EXTRA}"
        ) from error
    return cp_model


def _scale(values: list[float]) -> float:
    """Units per cost-model unit: 1 when every value is integral, else the largest value
    becomes `RESOLUTION` units."""
    if all(float(c).is_integer() for c in values):
        return 1.0
    return RESOLUTION / max(values, default=1.0) if any(values) else 1.0


def _units(cost: Mapping[Node, float], scale: float) -> dict[Node, int]:
    return {n: int(c) if scale == 1.0 else round(c * scale) for n, c in cost.items()}


def _bound_units(
    dag: Dag, cost: dict[Node, float], num_streams: int, scale: float, comm: Communication | None
) -> int:
    """`makespan_lower_bound` in solver units: rounded up when the costs are integral (a
    makespan is then integral too), else rounded down past the rounding of the costs."""
    bound = makespan_lower_bound(dag.nodes, dag.preds, cost, num_streams, comm=comm)
    if scale == 1.0:
        return math.ceil(bound - 1e-9)
    return max(0, math.floor(bound * scale * (1 - 1e-6)) - len(dag.nodes))


def solve(
    dag: Dag,
    cost: dict[Node, float],
    num_streams: int,
    time_limit: float,
    hint: Mapping[Node, float] | None = None,
    *,
    known_bound: bool = True,
    comm: Communication | None = None,
) -> OptimalMakespan:
    """Minimise the makespan of ``dag`` (costs ``cost``) on ``num_streams`` streams.

    ``hint`` (start times of a schedule, such as the list schedule's) is where the search
    starts.  With ``known_bound`` `msched.analysis.bounds.makespan_lower_bound` is given to
    the solver as a bound it need not prove again (tests of that bound turn it off).  With
    ``comm`` (`msched.analysis.communication.split_communication`), ``cost`` is what each
    node holds its stream for and the communication is modelled (the module docstring).
    """
    cp_model = _cp_model()
    nodes = [n for n in dag.nodes if n.op not in INPUT_OPS and n is not dag.output]
    times = dict(comm.time) if comm is not None else {}
    scale = _scale([cost[n] for n in nodes] + list(times.values()))
    units = _units({n: cost[n] for n in nodes}, scale)
    horizon = sum(units.values()) + sum(_units(times, scale).values())
    model = cp_model.CpModel()
    start = {n: model.new_int_var(0, horizon, f"s{i}") for i, n in enumerate(nodes)}
    intervals = [
        model.new_fixed_size_interval_var(start[n], units[n], f"i{i}") for i, n in enumerate(nodes)
    ]
    model.add_cumulative(intervals, [1] * len(nodes), num_streams)
    for n in nodes:
        for p in dag.preds[n]:
            if p in start:
                model.add(start[n] >= start[p] + units[p])
    if comm is not None:
        _communication(model, comm, start, _units(times, scale), horizon)
    end = model.new_int_var(0, horizon, "makespan")
    for n in nodes:
        model.add(end >= start[n] + units[n])
    if known_bound:
        model.add(end >= _bound_units(dag, cost, num_streams, scale, comm))
    for n, t in (hint or {}).items():
        if n in start:
            model.add_hint(start[n], round(t * scale))
    model.minimize(end)
    solver, status = _run(cp_model, model, time_limit)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # no solution within the time
        bound = solver.best_objective_bound / scale
        return OptimalMakespan(math.inf, bound, False, num_streams, {})
    found = {n: solver.value(start[n]) / scale for n in nodes}
    makespan = solver.objective_value / scale
    proven = status == cp_model.OPTIMAL
    bound = makespan if proven else solver.best_objective_bound / scale
    return OptimalMakespan(makespan, bound, proven, num_streams, found)


def _run(cp_model: Any, model: Any, time_limit: float) -> tuple[Any, Any]:
    """Solve ``model`` deterministically (the module docstring); the solver and its status."""
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = time_limit
    solver.parameters.max_time_in_seconds = _WALL_GUARD * time_limit
    return solver, solver.solve(model)


def _communication(
    model: Any, comm: Communication, start: dict[Node, Any], time: dict[Node, int], horizon: int
) -> None:
    """The constraints of asynchronous communication (the module docstring)."""
    issued = [c for c in comm.collectives if c in start]
    for before, after in zip(issued, issued[1:], strict=False):
        model.add(start[after] >= start[before])  # every rank issues them in one order
    talk = {c: model.new_int_var(0, horizon, f"c{i}") for i, c in enumerate(time)}
    last: dict[Any, Node] = {}
    for c in issued:
        if c not in talk:
            continue
        model.add(talk[c] >= start[c])
        group = comm.channel[c]
        if group in last:  # the group's channel runs one communication at a time, in order
            model.add(talk[c] >= talk[last[group]] + time[last[group]])
        last[group] = c
    for wait, c in comm.waits.items():
        if wait in start and c in talk:
            model.add(start[wait] >= talk[c] + time[c])


EFFORTS = ("fast", "optimal")


def check_effort(effort: object, time_limit: object) -> float:
    """The time limit of a valid ``effort``/``time_limit`` pair, or
    `msched.InvalidArgumentError` naming the bad one."""
    if effort not in EFFORTS:
        raise InvalidArgumentError(
            f"effort must be one of {', '.join(map(repr, EFFORTS))}, got {effort!r}"
        )
    return check_time_limit(time_limit)


def optimal_makespan(
    gm: GraphModule,
    num_streams: int = 2,
    cost_model: CostModel | None = None,
    *,
    time_limit: float = 10.0,
) -> OptimalMakespan:
    """The optimal makespan of ``gm``'s `msched.Dag` on ``num_streams`` streams under
    ``cost_model`` (`msched.DefaultCostModel`), by CP-SAT (see the module docstring).

    ``gm`` is not changed.  Needs OR-Tools (`MissingDependencyError` names the extra to
    install); a bad ``num_streams``, cost model or ``time_limit`` is an
    `msched.InvalidArgumentError`.
    """
    if not isinstance(gm, GraphModule):
        raise InvalidArgumentError(
            f"msched.optimal_makespan expects a torch.fx.GraphModule, got {type(gm).__name__}"
        )
    check_num_streams(num_streams)
    check_cost_model(cost_model)
    limit = check_time_limit(time_limit)
    dag = build_dag(gm)
    model = cost_model or DefaultCostModel()
    cost = node_costs(dag, model)
    return solve_from(dag, assign_streams(dag, num_streams, model), cost, limit)


def solve_from(
    dag: Dag, heuristic: Assignment, cost: dict[Node, float], time_limit: float
) -> OptimalMakespan:
    """`solve`, starting from the list schedule ``heuristic``; without the solver when that
    schedule meets its lower bound (it is then optimal).  ``cost`` is every node's cost (a
    collective's: its communication time); the communication is modelled as the list
    scheduler models it."""
    if heuristic.makespan <= heuristic.lower_bound:
        start = {n: heuristic.start[n] for n in heuristic.order}
        m = heuristic.makespan
        return OptimalMakespan(m, m, True, heuristic.num_streams, start)
    occupancy, comm = split_communication(dag.nodes, cost)
    return solve(dag, occupancy, heuristic.num_streams, time_limit, heuristic.start, comm=comm)

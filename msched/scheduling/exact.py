"""The exact mode: the optimal makespan of a Dag on ``k`` streams, by OR-Tools CP-SAT.

Why: list scheduling is fast and usually at or near the optimum, but "near" is only known
against a solver.  `optimal_makespan` answers how far a schedule is from the best possible
one; ``msched.schedule(gm, k, effort="optimal")`` runs the solver's schedule.

The model: every compute node is an interval of its cost; every Dag edge ``p -> v`` says
``start(v) >= end(p)``; at most ``k`` intervals run at once (a cumulative constraint: any
such timetable is ``k`` streams, by colouring the intervals in start order); the objective is
the latest end.  OR-Tools is an optional dependency (``pip install 'pytest-msched[optimal]'``).

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
from msched.analysis.cost import CostModel, DefaultCostModel, check_cost_model
from msched.analysis.dag import Dag, build_dag
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError, MissingDependencyError
from msched.limits import check_num_streams
from msched.scheduling.assign import Assignment, assign_streams

#: Integer resolution of non-integral costs (the largest cost becomes this many units).
RESOLUTION = 10**6
EXTRA = "pip install 'pytest-msched[optimal]'"
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


def _integral(cost: dict[Node, float]) -> tuple[dict[Node, int], float]:
    """Integer costs for CP-SAT and the scale (units per cost-model unit)."""
    values = cost.values()
    if all(float(c).is_integer() for c in values):
        return {n: int(c) for n, c in cost.items()}, 1.0
    scale = RESOLUTION / max(values)
    return {n: round(c * scale) for n, c in cost.items()}, scale


def _bound_units(dag: Dag, cost: dict[Node, float], num_streams: int, scale: float) -> int:
    """`makespan_lower_bound` in solver units: rounded up when the costs are integral (a
    makespan is then integral too), else rounded down past the rounding of the costs."""
    bound = makespan_lower_bound(dag.nodes, dag.preds, cost, num_streams)
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
) -> OptimalMakespan:
    """Minimise the makespan of ``dag`` (costs ``cost``) on ``num_streams`` streams.

    ``hint`` (start times of a schedule, such as the list schedule's) is where the search
    starts.  With ``known_bound`` `msched.analysis.bounds.makespan_lower_bound` is given to
    the solver as a bound it need not prove again (tests of that bound turn it off).
    """
    cp_model = _cp_model()
    nodes = [n for n in dag.nodes if n.op not in INPUT_OPS and n is not dag.output]
    units, scale = _integral({n: cost[n] for n in nodes})
    horizon = sum(units.values())
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
    end = model.new_int_var(0, horizon, "makespan")
    for n in nodes:
        model.add(end >= start[n] + units[n])
    if known_bound:
        model.add(end >= _bound_units(dag, cost, num_streams, scale))
    for n, t in (hint or {}).items():
        if n in start:
            model.add_hint(start[n], round(t * scale))
    model.minimize(end)
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    solver.parameters.max_deterministic_time = time_limit
    solver.parameters.max_time_in_seconds = _WALL_GUARD * time_limit
    status = solver.solve(model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # no solution within the time
        bound = solver.best_objective_bound / scale
        return OptimalMakespan(math.inf, bound, False, num_streams, {})
    found = {n: solver.value(start[n]) / scale for n in nodes}
    makespan = solver.objective_value / scale
    proven = status == cp_model.OPTIMAL
    bound = makespan if proven else solver.best_objective_bound / scale
    return OptimalMakespan(makespan, bound, proven, num_streams, found)


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
    schedule meets its lower bound (it is then optimal).

    The solver's model has no communication, so a Dag with asynchronous collectives is an
    `msched.InvalidArgumentError` (use ``effort="fast"``, whose list schedule models it).
    """
    if heuristic.communication:
        names = ", ".join(n.name for n in list(heuristic.communication)[:3])
        raise InvalidArgumentError(
            f"the exact mode does not model asynchronous communication yet (collectives "
            f"{names}); schedule this graph with effort='fast'"
        )
    if heuristic.makespan <= heuristic.lower_bound:
        start = {n: heuristic.start[n] for n in heuristic.order}
        m = heuristic.makespan
        return OptimalMakespan(m, m, True, heuristic.num_streams, start)
    return solve(dag, cost, heuristic.num_streams, time_limit, heuristic.start)

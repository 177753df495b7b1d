"""`msched.read_schedule`: a `Schedule` read back from a graph any pass scheduled.

Downstream engines have their own multi-stream pass with their own stream ops.  To test,
snapshot and picture their output the same way as msched's own, the plugin reads their graph
back: the stream of every node and the events and waits from the stream ops (in the graph's
dialect), the makespan from the timeline simulator under a cost model, and the lower bound
from the original graph when it is given (from the scheduled graph's host order otherwise).
"""

from __future__ import annotations

from torch.fx import GraphModule

from msched.analysis.bounds import makespan_lower_bound
from msched.analysis.cost import CostModel, DefaultCostModel, check_cost_model, lower_bound
from msched.analysis.dag import build_dag
from msched.errors import InvalidArgumentError
from msched.limits import check_num_streams
from msched.proof.dialects import Dialect, as_dialect, detect_dialect
from msched.proof.interpreter import interpret
from msched.proof.timeline import simulate
from msched.scheduling.assign import node_costs
from msched.scheduling.pipeline import Schedule


def read_schedule(
    gm: GraphModule,
    original: GraphModule | None = None,
    dialect: Dialect | str | None = None,
    cost_model: CostModel | None = None,
    num_streams: int | None = None,
) -> Schedule:
    """The `Schedule` of ``gm``, a graph some pass scheduled, read from its stream ops.

    ``dialect`` is a `Dialect`, a dialect name, or None to detect it from the graph's ops
    (`Dialect.detect`).  ``num_events`` counts the distinct events recorded, ``num_waits`` the
    waits; ``makespan`` is the `msched.simulate` makespan under ``cost_model`` (the table
    model by default).  With ``original`` the lower bound is the original graph's
    (`msched.analysis.bounds.makespan_lower_bound`) and ``Schedule.original`` is ``original``.
    ``num_streams`` is the stream count the pass was given: the Schedule's ``num_streams``
    (what its pictures and snapshot header say, and the lower bound divides by) is that
    count, or the streams the graph uses when it uses more; None: the streams it uses.
    """
    for name, value in (("gm", gm), ("original", original)):
        if value is not None and not isinstance(value, GraphModule):
            raise InvalidArgumentError(
                f"read_schedule: {name} must be a torch.fx.GraphModule, got {type(value).__name__}"
            )
    check_cost_model(cost_model)
    model = cost_model or DefaultCostModel()
    chosen = detect_dialect(gm.graph) if dialect is None else as_dialect(dialect)
    program = interpret(gm, chosen)
    timeline = simulate(gm, model, chosen)
    if num_streams is not None:
        check_num_streams(num_streams)
    streams = max(num_streams or 0, program.num_streams)
    bound = lower_bound(timeline.critical_path, timeline.total_cost, streams)
    if streams == timeline.num_streams:
        bound = timeline.lower_bound
    if original is not None:
        dag = build_dag(original)
        cost = node_costs(dag, model)
        bound = makespan_lower_bound(dag.nodes, dag.preds, cost, streams)
    return Schedule(
        gm,
        streams,
        dict(program.stream_of),
        program.num_events,
        program.num_waits,
        timeline.makespan,
        bound,
        None,
        None,
        dialect=chosen,
        _original=original,
    )

"""What `msched.read_schedule` reads of a graph any pass scheduled: `read_summary`.

Downstream engines have their own multi-stream pass with their own stream ops.  To test,
snapshot and picture their output the same way as msched's own, the plugin reads their graph
back: the stream of every node and the events and waits from the stream ops (in the graph's
dialect), the makespan from the timeline simulator under a cost model, and the lower bound
from the original graph when it is given (from the scheduled graph's host order otherwise).
Reading only interprets and simulates, so it lives here; `msched.read_schedule` wraps the
result in a `msched.Schedule`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch.fx import GraphModule, Node

from msched.analysis.bounds import makespan_lower_bound, node_costs
from msched.analysis.cost import CostModel, DefaultCostModel, check_cost_model, lower_bound
from msched.analysis.dag import build_dag
from msched.errors import InvalidArgumentError
from msched.limits import check_num_streams
from msched.proof.dialects import Dialect, as_dialect, detect_dialect
from msched.proof.interpreter import interpret
from msched.proof.summary import Summary
from msched.proof.timeline import simulate

__all__ = ["ReadSummary", "read_summary"]


@dataclass(frozen=True)
class ReadSummary:
    """A scheduled graph read back: its `Summary`, the stream of every node and the dialect
    its stream ops were read in."""

    summary: Summary[float]
    streams: dict[Node, int]
    dialect: Dialect


def read_summary(
    gm: GraphModule,
    original: GraphModule | None = None,
    dialect: Dialect | str | None = None,
    cost_model: CostModel | None = None,
    num_streams: int | None = None,
) -> ReadSummary:
    """What `msched.read_schedule` reads of ``gm`` (its docstring has the contract).

    1. Read ``gm`` in ``dialect`` (detected from its ops when None) and simulate it under
       ``cost_model``: its timeline's summary.
    2. The stream count is ``num_streams`` or the streams ``gm`` uses, whichever is more; the
       lower bound divides by it.
    3. With ``original`` the lower bound is the original graph's.
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
        bound = makespan_lower_bound(dag.nodes, dag.preds, node_costs(dag, model), streams)
    summary = replace(timeline.summary, num_streams=streams, lower_bound=bound)
    return ReadSummary(summary, dict(program.stream_of), chosen)

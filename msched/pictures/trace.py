"""Chrome / Perfetto trace-event JSON of a schedule's timeline (open it at ui.perfetto.dev)."""

from __future__ import annotations

import json
from typing import Any

from torch.fx import GraphModule, Node

from msched.analysis.cost import CostModel, op_category
from msched.analysis.nodes import INPUT_OPS
from msched.pictures.labels import format_number, json_number, op_label, stream_title
from msched.pictures.view import View, communications, view_of
from msched.proof.dialects import Dialect
from msched.proof.program import Step
from msched.scheduling.pipeline import Schedule

__all__ = ["render_perfetto", "trace_data"]

_TRACE_PID = 1


def _trace_metadata(v: View) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": _TRACE_PID, "name": "process_name", "args": {"name": "msched schedule"}}
    ]
    for s in range(v.num_streams):
        events.append(
            {
                "ph": "M",
                "pid": _TRACE_PID,
                "tid": s,
                "name": "thread_name",
                "args": {"name": stream_title(s)},
            }
        )
        events.append(
            {
                "ph": "M",
                "pid": _TRACE_PID,
                "tid": s,
                "name": "thread_sort_index",
                "args": {"sort_index": s},
            }
        )
    return events


def _slice(v: View, node: Node, name: str, cat: str) -> dict[str, Any]:
    start = v.start[node]
    return {
        "ph": "X",
        "pid": _TRACE_PID,
        "tid": v.program.stream_of[node],
        "name": name,
        "cat": cat,
        "ts": json_number(start),
        "dur": json_number(v.finish[node] - start),
        "args": {"node": node.name, "op": op_label(node)},
    }


def _flow_ids(v: View) -> tuple[dict[Step, list[int]], dict[Step, int]]:
    """One flow id per (record, wait) pair: ids leaving each record, the id reaching each wait."""
    out: dict[Step, list[int]] = {}
    into: dict[Step, int] = {}
    for use in v.events:
        if use.record is None:
            continue
        for wait in use.waits:
            flow_id = len(into) + 1
            out.setdefault(use.record, []).append(flow_id)
            into[wait] = flow_id
    return out, into


def _flow(v: View, node: Node, phase: str, event: int | None, flow_id: int) -> dict[str, Any]:
    flow = {
        "ph": phase,
        "pid": _TRACE_PID,
        "tid": v.program.stream_of[node],
        "cat": "event",
        "name": f"e{event}",
        "id": flow_id,
        "ts": json_number(v.start[node]),
    }
    if phase == "f":
        flow["bp"] = "e"
    return flow


def _trace_body(v: View) -> list[dict[str, Any]]:
    """Complete events for compute nodes and for record/wait markers, each flow after its marker."""
    flows_out, flow_in = _flow_ids(v)
    body = []
    for step in v.program.steps:
        node = step.node
        if step.kind == "compute" and node.op not in INPUT_OPS:
            cat = "output" if node is v.program.output else op_category(node)
            body.append(_slice(v, node, node.name, cat))
        elif step.kind == "record_event":
            body.append(_slice(v, node, f"record e{step.event}", "sync"))
            body += [_flow(v, node, "s", step.event, i) for i in flows_out.get(step, [])]
        elif step.kind == "wait_event":
            body.append(_slice(v, node, f"wait e{step.event}", "sync"))
            if step in flow_in:
                body.append(_flow(v, node, "f", step.event, flow_in[step]))
        elif step.kind == "wait_stream":
            body.append(_slice(v, node, f"wait s{step.to_stream}", "sync"))
    return body


def _comm_events(v: View) -> list[dict[str, Any]]:
    """An async slice (``ph: "b"`` / ``"e"``, category ``comm``) per asynchronous collective,
    from its issue to the end of its wait, on the issue's track."""
    events = []
    for i, c in enumerate(communications(v), start=1):
        common = {
            "pid": _TRACE_PID,
            "tid": v.program.stream_of[c.issue],
            "cat": "comm",
            "name": f"{c.issue.name} communication",
            "id": i,
        }
        waited = c.wait.name if c.wait is not None else None
        args = {"collective": c.label, "wait": waited}
        events.append({"ph": "b", **common, "ts": json_number(c.start), "args": args})
        events.append({"ph": "e", **common, "ts": json_number(c.end)})
    return events


def _memory_counters(v: View) -> list[dict[str, Any]]:
    """A counter track per stream pool (``ph: "C"``, ``memory s1 pool``): the bytes of the
    segments the pool holds (`msched.peak_memory`'s ``reserved`` model), set where a node
    of its stream changes it; nothing when the graph carries no sizes."""
    if v.memory is None:
        return []
    nodes = {n.name: n for n in v.gm.graph.nodes}
    held: dict[int, int] = {}
    events = []
    for point in v.memory.curve:
        node = nodes.get(point.node)
        if node is None or node not in v.start or held.get(point.stream) == point.pool:
            continue
        held[point.stream] = point.pool
        events.append(
            {
                "ph": "C",
                "pid": _TRACE_PID,
                "name": f"memory s{point.stream} pool",
                "cat": "memory",
                "ts": json_number(v.start[node]),
                "args": {"reserved bytes": point.pool},
            }
        )
    return events


def trace_data(
    obj: Schedule | GraphModule,
    cost_model: CostModel | None = None,
    *,
    dialect: Dialect | str | None = None,
) -> dict[str, Any]:
    """The Chrome trace-event document `render_perfetto` writes (see there)."""
    v = view_of(obj, cost_model, dialect)
    # A stable sort by time keeps each flow event right after the marker it binds to.
    events = _trace_body(v) + _comm_events(v) + _memory_counters(v)
    body = sorted(events, key=lambda e: e["ts"])
    return {
        "traceEvents": _trace_metadata(v) + body,
        "displayTimeUnit": "ns",
        "otherData": {
            "generator": "msched",
            "time_unit": "cost-model units, shown as microseconds",
            "streams": v.num_streams,
            "events": v.num_events,
            "waits": v.num_waits,
            "makespan": format_number(v.makespan),
            "lower_bound": format_number(v.lower_bound),
            **_memory_data(v),
        },
    }


def _memory_data(v: View) -> dict[str, int]:
    """The peaks of `msched.peak_memory`, in bytes, when the graph carries sizes."""
    m = v.memory
    if m is None:
        return {}
    return {
        "memory_allocated": m.allocated,
        "memory_reserved": m.reserved,
        "memory_reserved_bound": m.reserved_bound,
    }


def render_perfetto(
    obj: Schedule | GraphModule,
    cost_model: CostModel | None = None,
    *,
    dialect: Dialect | str | None = None,
) -> str:
    """Chrome / Perfetto trace-event JSON of the timeline (open it at ui.perfetto.dev).

    One track (``tid``) per stream, named by ``thread_name`` metadata and sorted by stream.
    Every compute node is a complete event (``ph: "X"``, ``ts``/``dur`` in cost-model units
    shown as microseconds, category by op kind); every ``record_event`` and ``wait_event`` is
    a zero-length complete event named ``record eK`` / ``wait eK``; every record is joined to
    each of its waits by a flow (``ph: "s"`` at the record, ``ph: "f"`` with ``bp: "e"`` at the
    wait, one flow id per pair), drawn as an arrow between streams.  Every asynchronous
    collective is an async slice (``ph: "b"`` / ``"e"``, category ``comm``) from its issue to
    the end of its wait: the communication.  When the graph's nodes carry sizes, a counter
    track per stream pool (``ph: "C"``, ``memory sK pool``) shows the segments that stream's
    pool of the CUDA caching allocator holds (`msched.peak_memory`), and ``otherData`` the
    peaks.  Deterministic bytes.
    ``dialect`` is the dialect of the graph's stream ops (a `msched.Dialect` or a name, as
    `msched.verify` takes it; None: a Schedule's own, else detected from the graph's ops).
    """
    return json.dumps(trace_data(obj, cost_model, dialect=dialect), indent=1) + "\n"

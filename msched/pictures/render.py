"""Pictures of a scheduled graph: canonical text, JSON, Graphviz DOT, Perfetto trace, SVG.

Every renderer accepts a `msched.Schedule` or a scheduled ``GraphModule`` and reads the
graph with `msched.proof.dialects.interpret` (host order, stream of every node, event ids).
Times come from the Schedule's assignment when given a Schedule whose streams issue their
nodes in order of those times (always, except with one stream, where `msched.schedule` keeps
the input order), and otherwise from the timeline simulator (`msched.simulate`) under
``cost_model`` (default: the table model). A stream op happens when its stream reaches it.

Every output is deterministic: the same graph gives byte-identical text regardless of
``PYTHONHASHSEED`` or process.  Nothing is ordered by hashing, no object address is printed,
and times are printed with `format_number` (integers without a decimal point, others with six
significant digits), so cost sums such as ``0.1 + 0.2`` do not leak float noise.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Node

from msched.analysis.cost import CostModel, DefaultCostModel
from msched.errors import InvalidArgumentError
from msched.proof.dialects import Step, StreamProgram, interpret
from msched.scheduling.pipeline import Schedule

__all__ = [
    "format_number",
    "render_dot",
    "render_json",
    "render_svg",
    "render_text",
    "render_trace",
]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def format_number(x: float) -> str:
    """``x`` as deterministic text: ``12`` for integral values, else six significant digits."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return format(x, ".6g")


def _round(x: float) -> float | int:
    """A JSON number without float noise (same rule as `format_number`)."""
    if x == int(x) and abs(x) < 1e15:
        return int(x)
    return float(format(x, ".6g"))


# ---------------------------------------------------------------------------------------------
# The view every renderer starts from.


@dataclass(frozen=True)
class EventUse:
    """One record of an event and the waits that consume it (the last record before each)."""

    event: int
    record: Node | None
    waits: tuple[Node, ...]


@dataclass(frozen=True)
class View:
    """A scheduled graph read for rendering: host-order program, times and events.

    ``start``/``finish`` hold every node of the graph; a stream op's start and finish are the
    moment its stream reaches it.  ``events`` lists the records in host order (a wait whose
    event was never recorded appears with ``record=None``).
    """

    gm: GraphModule
    program: StreamProgram
    num_streams: int
    num_events: int
    num_waits: int
    makespan: float
    lower_bound: float
    start: dict[Node, float]
    finish: dict[Node, float]
    events: tuple[EventUse, ...]


def view(obj: Schedule | GraphModule, cost_model: CostModel | None = None) -> View:
    """Read ``obj`` (a `Schedule` or a scheduled ``GraphModule``) for rendering."""
    if isinstance(obj, Schedule):
        return _schedule_view(obj, cost_model or DefaultCostModel())
    if isinstance(obj, GraphModule):
        return _module_view(obj, cost_model or DefaultCostModel())
    raise InvalidArgumentError(
        f"can only render a msched.Schedule or a scheduled torch.fx.GraphModule, "
        f"got {type(obj).__name__}"
    )


def _schedule_view(sched: Schedule, cost_model: CostModel) -> View:
    program = interpret(sched.gm)
    a = sched.assignment
    if _follows_host_order(program, a.start):
        start, finish = _stream_op_times(program, a.start, a.finish)
    else:
        # With one stream `schedule` keeps the input order, which the assignment's times
        # (list-scheduled) do not follow; the picture must show the program that runs.
        from msched.proof.executor import simulate

        timeline = simulate(sched.gm, cost_model)
        start, finish = _stream_op_times(program, timeline.start, timeline.end)
    return View(
        gm=sched.gm,
        program=program,
        num_streams=sched.num_streams,
        num_events=sched.num_events,
        num_waits=sched.num_waits,
        makespan=sched.makespan,
        lower_bound=sched.lower_bound,
        start=start,
        finish=finish,
        events=_event_uses(program),
    )


def _follows_host_order(program: StreamProgram, start: dict[Node, float]) -> bool:
    """Whether every stream issues its timed nodes in order of their start times."""
    last = [0.0] * program.num_streams
    for step in program.compute_steps:
        t = start.get(step.node)
        if t is None or step.node is program.output:
            continue
        if t < last[step.stream]:
            return False
        last[step.stream] = t
    return True


def _module_view(gm: GraphModule, cost_model: CostModel) -> View:
    from msched.proof.executor import simulate

    program = interpret(gm)
    timeline = simulate(gm, cost_model)
    start, finish = _stream_op_times(program, timeline.start, timeline.end)
    events = _event_uses(program)
    return View(
        gm=gm,
        program=program,
        num_streams=program.num_streams,
        num_events=len({e.event for e in events if e.record is not None}),
        num_waits=sum(1 for s in program.steps if s.kind == "wait_event"),
        makespan=timeline.makespan,
        lower_bound=timeline.lower_bound,
        start=start,
        finish=finish,
        events=events,
    )


def _event_uses(program: StreamProgram) -> tuple[EventUse, ...]:
    """Pair every wait with the last record of its event before it in host order."""
    records: list[tuple[int, Node | None]] = []
    waits: dict[int, list[Node]] = {}
    last: dict[int, int] = {}
    for step in program.steps:
        if step.kind == "record_event" and step.arg is not None:
            last[step.arg] = len(records)
            records.append((step.arg, step.node))
        elif step.kind == "wait_event" and step.arg is not None:
            if step.arg not in last:
                last[step.arg] = len(records)
                records.append((step.arg, None))
            waits.setdefault(last[step.arg], []).append(step.node)
    return tuple(
        EventUse(event, record, tuple(waits.get(i, ())))
        for i, (event, record) in enumerate(records)
    )


def _stream_op_times(
    program: StreamProgram, start: dict[Node, float], finish: dict[Node, float]
) -> tuple[dict[Node, float], dict[Node, float]]:
    """Complete ``start``/``finish`` with the nodes they lack (stream ops, inputs, output).

    A node without a time happens when its stream reaches it: after the previous timed node
    of that stream, and for a wait, not before its event was recorded.
    """
    cursor = [0.0] * program.num_streams
    recorded: dict[int, float] = {}
    out_start: dict[Node, float] = {}
    out_finish: dict[Node, float] = {}
    for step in program.steps:
        node, s = step.node, step.stream
        if node in start and node is not program.output:
            out_start[node], out_finish[node] = start[node], finish[node]
            cursor[s] = max(cursor[s], finish[node])
            continue
        t = cursor[s]
        if step.kind == "record_event" and step.arg is not None:
            recorded[step.arg] = t
        elif step.kind == "wait_event" and step.arg is not None:
            t = max(t, recorded.get(step.arg, t))
        elif node is program.output:
            t = max([t, *cursor]) if node not in start else start[node]
        cursor[s] = t
        out_start[node] = out_finish[node] = t
    return out_start, out_finish


# ---------------------------------------------------------------------------------------------
# Canonical text.


def _target_name(node: Node) -> str:
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return str(target)
    if isinstance(target, str):
        return target
    if target is operator.getitem:
        return "getitem"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        return _ADDRESS.sub("", repr(target))
    return f"{module.lstrip('_')}.{name}" if module not in ("builtins", "") else name


def format_arg(value: Any) -> str:
    """An FX argument as deterministic text: nodes by name, containers recursively."""
    if isinstance(value, Node):
        return value.name
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, tuple):
        inner = ", ".join(format_arg(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(format_arg(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{format_arg(k)}: {format_arg(v)}" for k, v in value.items()) + "}"
    if isinstance(value, slice):
        return (
            f"slice({format_arg(value.start)}, {format_arg(value.stop)}, {format_arg(value.step)})"
        )
    return _ADDRESS.sub(
        "", repr(value) if isinstance(value, (str, int, bool, type(None))) else str(value)
    )


def _call_args(node: Node) -> str:
    parts = [format_arg(a) for a in node.args]
    parts += [f"{k}={format_arg(v)}" for k, v in node.kwargs.items()]
    return ", ".join(parts)


def node_text(node: Node) -> str:
    """One node as ``name = op(args)``; stream ops as ``record e3`` / ``wait e3``.

    Stream ops are recognised by the default dialect; the caller folds ``set_stream``.
    """
    if node.op == "placeholder":
        return f"{node.name} = input"
    if node.op == "get_attr":
        return f"{node.name} = self.{node.target}"
    if node.op == "output":
        return f"output({format_arg(node.args[0])})"
    if node.op == "call_method":
        return f"{node.name} = {format_arg(node.args[0])}.{node.target}({_rest_args(node)})"
    if node.op == "call_module":
        return f"{node.name} = self.{node.target}({_call_args(node)})"
    return f"{node.name} = {_target_name(node)}({_call_args(node)})"


def _rest_args(node: Node) -> str:
    parts = [format_arg(a) for a in node.args[1:]]
    parts += [f"{k}={format_arg(v)}" for k, v in node.kwargs.items()]
    return ", ".join(parts)


def step_text(step: Step) -> str:
    if step.kind == "record_event":
        return f"record e{step.arg}"
    if step.kind == "wait_event":
        return f"wait e{step.arg}"
    if step.kind == "record_stream":
        tensor = step.tensor.name if step.tensor is not None else "?"
        return f"record_stream({tensor}, s{step.arg})"
    return node_text(step.node)


def header_lines(v: View) -> list[str]:
    """The header of the canonical text: counts, then makespan against the lower bound."""
    return [
        f"# streams {v.num_streams}, events {v.num_events}, waits {v.num_waits}",
        f"# makespan {format_number(v.makespan)}, lower bound {format_number(v.lower_bound)}",
    ]


def lane_lines(v: View, steps: Iterable[Step] | None = None) -> list[str]:
    """One line per step: ``s1 |   mm_3 = aten.mm.default(mul_2, l0_wq)``.

    The lane column and an indentation of two spaces per stream show the stream a node is
    issued on; ``set_stream`` nodes are folded into it (the lane changes where they stood).
    """
    width = len(str(max(v.num_streams - 1, 0)))
    lines = []
    for step in v.program.steps if steps is None else steps:
        if step.kind == "set_stream":
            continue
        lane = f"s{step.stream}".ljust(width + 1)
        lines.append(f"{lane} | {'  ' * step.stream}{step_text(step)}")
    return lines


def render_text(obj: Schedule | GraphModule, cost_model: CostModel | None = None) -> str:
    """The canonical text of a scheduled graph, for snapshots reviewed in CI.

    A header (``# streams S, events E, waits W`` and ``# makespan M, lower bound L``), then
    one line per node in emission (host) order: the stream lane ``sN |``, an indentation of two
    spaces per stream, and the node (``name = op(args)``, ``record eK``, ``wait eK``,
    ``record_stream(t, sN)``).  ``set_stream`` nodes are folded into the lane column: a change
    of lane is where one stood.  ``output`` is last (anything after it would be shown after it).
    The text ends with a newline and is identical across runs, processes and hash seeds.
    """
    v = view(obj, cost_model)
    return "\n".join(header_lines(v) + lane_lines(v)) + "\n"


# ---------------------------------------------------------------------------------------------
# JSON.


def _op_label(node: Node) -> str:
    if node.op in ("placeholder", "get_attr", "output"):
        return node.op
    if node.op == "call_method":
        return f".{node.target}"
    return _target_name(node)


CATEGORIES = ("matmul", "attention", "moe", "capture / in-place", "other")


def _writes(node: Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return node.op == "call_method" and str(node.target).endswith("_")
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def category(node: Node) -> str:
    """The op kind a picture colours ``node`` by: one of `CATEGORIES`."""
    name = _op_label(node).lower()
    if "moe" in name or "expert" in name:
        return "moe"
    if "attention" in name or "attn" in name:
        return "attention"
    if any(w in name for w in ("mm", "matmul", "linear", "conv")):
        return "matmul"
    return "capture / in-place" if _writes(node) else "other"


def schedule_data(
    obj: Schedule | GraphModule, cost_model: CostModel | None = None
) -> dict[str, Any]:
    """The schedule as plain data: the document `render_json` writes.

    ``nodes`` lists every node in host order with ``name``, ``op``, ``kind`` (``compute`` or
    the stream-op kind), ``stream``, ``start`` and ``end``; ``events`` lists every record with
    its ``event`` id, the ``record`` site and its ``waits`` (each ``{node, stream, time}``).
    """
    v = view(obj, cost_model)
    return {
        "format": "msched-schedule/1",
        "streams": v.num_streams,
        "num_events": v.num_events,
        "num_waits": v.num_waits,
        "makespan": _round(v.makespan),
        "lower_bound": _round(v.lower_bound),
        "nodes": [_node_data(v, step) for step in v.program.steps],
        "events": [_event_data(v, use) for use in v.events],
    }


def _node_data(v: View, step: Step) -> dict[str, Any]:
    data = {
        "name": step.node.name,
        "op": _op_label(step.node),
        "kind": step.kind,
        "stream": step.stream,
        "start": _round(v.start[step.node]),
        "end": _round(v.finish[step.node]),
    }
    if step.kind in ("set_stream", "record_event", "wait_event", "record_stream"):
        data["arg"] = step.arg
    return data


def _site(v: View, node: Node | None) -> dict[str, Any] | None:
    if node is None:
        return None
    return {"node": node.name, "stream": v.program.stream_of[node], "time": _round(v.start[node])}


def _event_data(v: View, use: EventUse) -> dict[str, Any]:
    return {
        "event": use.event,
        "record": _site(v, use.record),
        "waits": [_site(v, w) for w in use.waits],
    }


def render_json(obj: Schedule | GraphModule, cost_model: CostModel | None = None) -> str:
    """`schedule_data` as JSON text: two-space indent, fixed key order, trailing newline.

    Byte-identical for the same graph across runs, processes and hash seeds.
    """
    return json.dumps(schedule_data(obj, cost_model), indent=2) + "\n"


# ---------------------------------------------------------------------------------------------
# Dependencies, by node name (for DOT and `msched explain`).


def dependencies_by_name(obj: Schedule | GraphModule) -> dict[str, dict[str, set[str]]]:
    """``{node name: {dependency name: reasons}}`` of the graph that was scheduled.

    For a `Schedule` the Dag of ``Schedule.original`` (the input program order defines the
    hazards); for a bare module the Dag of its compute nodes in scheduled host order.
    """
    if isinstance(obj, Schedule):
        graph = obj.original.graph
    elif isinstance(obj, GraphModule):
        graph = _without_stream_ops(obj)
    else:
        raise InvalidArgumentError(
            f"expected a Schedule or a GraphModule, got {type(obj).__name__}"
        )
    from msched.analysis.dag import build_dag

    dag = build_dag(graph)
    return {n.name: {d.name: r for d, r in dag.dependencies(n).items()} for n in dag.nodes}


def _without_stream_ops(gm: GraphModule) -> Graph:
    program = interpret(gm)
    graph = Graph()
    env: dict[Node, Node] = {}
    for step in program.steps:
        if step.kind == "compute":
            env[step.node] = graph.node_copy(step.node, lambda n: env[n])
    return graph


# ---------------------------------------------------------------------------------------------
# Graphviz DOT.

# Colour-blind-safe (Okabe-Ito); stream 0 gets the neutral blue.
STREAM_COLOURS = (
    "#0072B2",
    "#E69F00",
    "#009E73",
    "#CC79A7",
    "#56B4E9",
    "#D55E00",
    "#F0E442",
    "#999999",
)
_REASON_STYLE = {
    "raw": 'color="#D55E00"',
    "war": 'color="#CC79A7", style=dashed',
    "waw": 'color="#7F3C8D", style=dashed',
    "exit": 'color="#C00000", penwidth=2',
}


def stream_colour(stream: int) -> str:
    return STREAM_COLOURS[stream % len(STREAM_COLOURS)]


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_dot(
    obj: Schedule | GraphModule, cost_model: CostModel | None = None, weights: bool = False
) -> str:
    """Graphviz DOT of the scheduled graph: one cluster per stream, edges with their reasons.

    Nodes are filled with their stream's colour and labelled ``name`` / ``op``.  Edges come
    from the Dag (see `dependencies_by_name`): plain data edges are unlabelled; every other
    edge is labelled with its reasons (``raw``, ``war``, ``waw``, ``exit``) and styled by the
    strongest.  Stream ops are not drawn (they are what the edges between clusters become).
    ``get_attr`` nodes (weights) are left out unless ``weights``.
    """
    v = view(obj, cost_model)
    deps = dependencies_by_name(obj)
    shown = [s.node for s in v.program.compute_steps if weights or s.node.op != "get_attr"]
    names = {n.name for n in shown}
    lines = [
        "digraph msched {",
        '  graph [rankdir=TB, fontname="Helvetica", labelloc=t, '
        f"label={_dot_quote(_dot_title(v))}];",
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9, color="#555555"];',
    ]
    for s in range(v.num_streams):
        lines += _dot_cluster(v, s, [n for n in shown if v.program.stream_of[n] == s])
    for node in shown:
        for dep, reasons in sorted(deps.get(node.name, {}).items()):
            if dep in names:
                lines.append(_dot_edge(dep, node.name, reasons))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _counts(v: View) -> str:
    def n(count: int, what: str) -> str:
        return f"{count} {what}" + ("" if count == 1 else "s")

    return f"{n(v.num_streams, 'stream')}, {n(v.num_events, 'event')}, {n(v.num_waits, 'wait')}"


def _dot_title(v: View) -> str:
    return (
        f"{_counts(v)}, makespan "
        f"{format_number(v.makespan)} (lower bound {format_number(v.lower_bound)}); "
        "unlabelled edges are data edges"
    )


def _dot_cluster(v: View, stream: int, nodes: list[Node]) -> list[str]:
    colour = stream_colour(stream)
    title = "stream 0 (caller)" if stream == 0 else f"stream {stream}"
    lines = [
        f"  subgraph cluster_s{stream} {{",
        f'    label={_dot_quote(title)}; color="{colour}"; fontcolor="{colour}";',
    ]
    for node in nodes:
        label = f"{node.name}\\n{_op_label(node)}"
        style = f'fillcolor="{colour}33", color="{colour}"'
        lines.append(f'    {_dot_quote(node.name)} [label="{label}", {style}];')
    lines.append("  }")
    return lines


def _dot_edge(src: str, dst: str, reasons: set[str]) -> str:
    extra = sorted(reasons - {"data"}, key=["raw", "war", "waw", "exit"].index)
    if not extra:
        return f"  {_dot_quote(src)} -> {_dot_quote(dst)};"
    style = _REASON_STYLE[extra[-1]]
    label = ",".join(sorted(reasons, key=["data", "raw", "war", "waw", "exit"].index))
    return f"  {_dot_quote(src)} -> {_dot_quote(dst)} [label={_dot_quote(label)}, {style}];"


# ---------------------------------------------------------------------------------------------
# Chrome / Perfetto trace.

_TRACE_PID = 1


def _stream_title(stream: int) -> str:
    return "stream 0 (caller)" if stream == 0 else f"stream {stream}"


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
                "args": {"name": _stream_title(s)},
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
        "ts": _round(start),
        "dur": _round(v.finish[node] - start),
        "args": {"node": node.name, "op": _op_label(node)},
    }


def _flow_ids(v: View) -> tuple[dict[Node, list[int]], dict[Node, int]]:
    """One flow id per (record, wait) pair: ids leaving each record, the id reaching each wait."""
    out: dict[Node, list[int]] = {}
    into: dict[Node, int] = {}
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
        "ts": _round(v.start[node]),
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
        if step.kind == "compute" and node.op not in ("placeholder", "get_attr"):
            cat = "output" if node is v.program.output else category(node)
            body.append(_slice(v, node, node.name, cat))
        elif step.kind == "record_event":
            body.append(_slice(v, node, f"record e{step.arg}", "sync"))
            body += [_flow(v, node, "s", step.arg, i) for i in flows_out.get(node, [])]
        elif step.kind == "wait_event":
            body.append(_slice(v, node, f"wait e{step.arg}", "sync"))
            if node in flow_in:
                body.append(_flow(v, node, "f", step.arg, flow_in[node]))
    return body


def trace_data(obj: Schedule | GraphModule, cost_model: CostModel | None = None) -> dict[str, Any]:
    """The Chrome trace-event document `render_trace` writes (see there)."""
    v = view(obj, cost_model)
    # A stable sort by time keeps each flow event right after the marker it binds to.
    body = sorted(_trace_body(v), key=lambda e: e["ts"])
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
        },
    }


def render_trace(obj: Schedule | GraphModule, cost_model: CostModel | None = None) -> str:
    """Chrome / Perfetto trace-event JSON of the timeline (open it at ui.perfetto.dev).

    One track (``tid``) per stream, named by ``thread_name`` metadata and sorted by stream.
    Every compute node is a complete event (``ph: "X"``, ``ts``/``dur`` in cost-model units
    shown as microseconds, category by op kind); every ``record_event`` and ``wait_event`` is
    a zero-length complete event named ``record eK`` / ``wait eK``; every record is joined to
    each of its waits by a flow (``ph: "s"`` at the record, ``ph: "f"`` with ``bp: "e"`` at the
    wait, one flow id per pair), drawn as an arrow between streams.  Deterministic bytes.
    """
    return json.dumps(trace_data(obj, cost_model), indent=1) + "\n"


# ---------------------------------------------------------------------------------------------
# SVG Gantt chart.

CATEGORY_COLOURS = {
    "matmul": "#56B4E9",
    "attention": "#0072B2",
    "moe": "#E69F00",
    "capture / in-place": "#D55E00",
    "other": "#C8C8C8",
}
_DARK = ("attention", "capture / in-place")
_LEFT, _TOP, _LANE, _BOX, _CHAR = 130, 64, 46, 30, 6.1


def _xml(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    )


def _nice_step(span: float, target_ticks: int) -> float:
    """A tick step of 1, 2 or 5 times a power of ten giving about ``target_ticks`` ticks."""
    raw = max(span, 1e-9) / max(target_ticks, 1)
    power = 10.0 ** int(f"{raw:e}".split("e")[1])
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


@dataclass(frozen=True)
class _Frame:
    """Where things go on the chart: ``x(t)`` and the lane of each stream."""

    scale: float
    num_streams: int
    width: float
    height: float

    def x(self, t: float) -> float:
        return _LEFT + t * self.scale

    def lane_top(self, stream: int) -> float:
        return _TOP + stream * _LANE


def _frame(v: View, scale: float | None) -> _Frame:
    # At 6 px per unit a table-model matmul (10 units) is wide enough for a short label; very
    # long schedules are squeezed to 20 000 px so viewers still open them.
    span = max(v.makespan, 1e-9)
    if scale is None:
        scale = max(6.0, 1100.0 / span) if span * 6.0 <= 20000 else 20000.0 / span
    width = _LEFT + span * scale + 40
    height = _TOP + v.num_streams * _LANE + 70
    return _Frame(scale, v.num_streams, max(width, 760.0), height)


# Each step shortens a label further; a box shows the longest form that fits.
_ABBREVIATIONS = (
    (("_default", ""), ("_tensor", ""), ("_scalar", "")),
    (("attention", "attn"), ("_experts", "")),
)


def _short_label(name: str, room: float) -> tuple[str, int] | None:
    """The node name or a shorter form of it, and a font size (10 or 8 px), if it fits."""
    forms = [name]
    for step in _ABBREVIATIONS:
        short = forms[-1]
        for long_form, short_form in step:
            short = short.replace(long_form, short_form)
        forms.append(short)
    for size in (10, 8):
        for label in forms:
            if len(label) * _CHAR * size / 10 + 6 <= room:
                return label, size
    return None


def _svg_box(v: View, f: _Frame, node: Node) -> list[str]:
    start, end = v.start[node], v.finish[node]
    cat = category(node)
    x, y, w = (
        f.x(start),
        f.lane_top(v.program.stream_of[node]) + (_LANE - _BOX) / 2,
        (end - start) * f.scale,
    )
    when = f"{format_number(start)}-{format_number(end)}"
    tip = f"{node.name} = {_op_label(node)}; stream {v.program.stream_of[node]}, {when}"
    out = [
        f'<g><title>{_xml(tip)}</title><rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 1.0):.1f}" '
        f'height="{_BOX}" rx="2" fill="{CATEGORY_COLOURS[cat]}" stroke="#ffffff" stroke-width="1"/>'
    ]
    fitted = _short_label(node.name, w)
    if fitted is not None:
        label, size = fitted
        colour = "#ffffff" if cat in _DARK else "#000000"
        out.append(
            f'<text x="{x + w / 2:.1f}" y="{y + _BOX / 2 + 3.5:.1f}" fill="{colour}" '
            f'text-anchor="middle" font-size="{size}px">{_xml(label)}</text>'
        )
    elif cat == "capture / in-place":
        out.append(
            f'<text x="{x + w / 2:.1f}" y="{y - 3:.1f}" fill="#D55E00" text-anchor="middle" '
            f'class="label">{_xml(node.name)}</text>'
        )
    out.append("</g>")
    return ["".join(out)]


def _svg_lanes(v: View, f: _Frame) -> list[str]:
    out = []
    for s in range(v.num_streams):
        y = f.lane_top(s)
        fill = "#F4F6F8" if s % 2 == 0 else "#FFFFFF"
        out.append(
            f'<rect x="{_LEFT}" y="{y}" width="{f.width - _LEFT - 20:.1f}" height="{_LANE}" '
            f'fill="{fill}" class="lane" data-stream="{s}"/>'
        )
        out.append(
            f'<text x="{_LEFT - 10}" y="{y + _LANE / 2 + 4}" text-anchor="end" '
            f'class="lanelabel">{_xml(_stream_title(s))}</text>'
        )
    return out


def _svg_axis(v: View, f: _Frame) -> list[str]:
    bottom = f.lane_top(v.num_streams)
    step = _nice_step(v.makespan, max(int((f.width - _LEFT) / 110), 2))
    out = [
        f'<line x1="{_LEFT}" y1="{_TOP - 6}" x2="{f.x(v.makespan):.1f}" y2="{_TOP - 6}" '
        'stroke="#555"/>',
        f'<text x="{_LEFT - 10}" y="{_TOP - 14}" text-anchor="end" class="tick">'
        "time (cost units)</text>",
    ]
    k = 0
    while k * step <= v.makespan + 1e-9:
        x = f.x(k * step)
        out.append(f'<line x1="{x:.1f}" y1="{_TOP - 10}" x2="{x:.1f}" y2="{bottom}" class="grid"/>')
        out.append(
            f'<text x="{x:.1f}" y="{_TOP - 14}" text-anchor="middle" class="tick">'
            f"{format_number(k * step)}</text>"
        )
        k += 1
    x = f.x(v.makespan)
    out.append(f'<line x1="{x:.1f}" y1="{_TOP - 10}" x2="{x:.1f}" y2="{bottom + 6}" class="exit"/>')
    out.append(
        f'<text x="{x:.1f}" y="{bottom + 18}" text-anchor="end" class="exitlabel">'
        f"output @ {format_number(v.makespan)}</text>"
    )
    return out


def _svg_links(v: View, f: _Frame) -> list[str]:
    """A thin curve from each record to each of its waits on another stream."""
    out = []
    joins = set(exit_waits(v))
    for use in v.events:
        if use.record is None:
            continue
        rs = v.program.stream_of[use.record]
        for wait in use.waits:
            ws = v.program.stream_of[wait]
            x1, x2 = f.x(v.start[use.record]), f.x(v.start[wait])
            y1 = f.lane_top(rs) + _LANE / 2
            y2 = f.lane_top(ws) + _LANE / 2
            mid = (y1 + y2) / 2
            cls = "link exitlink" if wait in joins else "link"
            tip = f"e{use.event}: {use.record.name} on stream {rs} -> {wait.name} on stream {ws}"
            curve = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}"
            out.append(f'<path d="{curve}" class="{cls}"><title>{_xml(tip)}</title></path>')
            out.append(f'<circle cx="{x2:.1f}" cy="{y2:.1f}" r="2.5" class="waitdot"/>')
    return out


def exit_waits(v: View) -> tuple[Node, ...]:
    """The waits in the run of stream ops right before ``output``: they join the exit."""
    steps = v.program.steps
    i = next(k for k, s in enumerate(steps) if s.node is v.program.output)
    found: list[Node] = []
    while i > 0 and steps[i - 1].kind in ("wait_event", "record_stream", "set_stream"):
        i -= 1
        if steps[i].kind == "wait_event":
            found.append(steps[i].node)
    return tuple(reversed(found))


_SVG_STYLE = (
    "text{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif}"
    ".label{font-size:10px}.tick{font-size:11px;fill:#333}.lanelabel{font-size:12px;font-weight:bold;fill:#222}"
    ".title{font-size:15px;font-weight:bold}.legend{font-size:11px;fill:#222}"
    ".grid{stroke:#000;stroke-opacity:.08}.exit{stroke:#C00000;stroke-width:2;stroke-dasharray:5,3}"
    ".exitlabel{font-size:11px;fill:#C00000;font-weight:bold}"
    ".link{fill:none;stroke:#333;stroke-opacity:.35;stroke-width:1}"
    ".exitlink{stroke:#C00000;stroke-opacity:.9;stroke-width:1.8}.waitdot{fill:#333;fill-opacity:.6}"
)


def _svg_legend(f: _Frame, y: float) -> list[str]:
    out = []
    x = float(_LEFT)
    for cat, colour in CATEGORY_COLOURS.items():
        out.append(f'<rect x="{x:.1f}" y="{y - 10}" width="14" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 19:.1f}" y="{y}" class="legend">{_xml(cat)}</text>')
        x += 30 + len(cat) * 6.6
    out.append(f'<path d="M{x:.1f},{y - 4} L{x + 24:.1f},{y - 4}" class="link"/>')
    out.append(f'<text x="{x + 29:.1f}" y="{y}" class="legend">record → wait</text>')
    x += 125
    out.append(f'<path d="M{x:.1f},{y - 4} L{x + 24:.1f},{y - 4}" class="link exitlink"/>')
    out.append(f'<text x="{x + 29:.1f}" y="{y}" class="legend">wait joined by output</text>')
    return out


def render_svg(
    obj: Schedule | GraphModule, cost_model: CostModel | None = None, scale: float | None = None
) -> str:
    """A self-contained SVG Gantt chart of the timeline: one lane per stream.

    Boxes are compute nodes placed at their start and end (``scale`` pixels per cost unit;
    by default at least 6, so a table-model matmul has room for a label), coloured by
    `category`; hovering shows name, op and times.  Each record is linked to each of its
    waits by a thin curve; the waits that join ``output`` are red, as is the dashed line at
    the makespan.  A time axis is on top and a legend below.  Every lane is a ``rect`` with
    ``class="lane"`` and ``data-stream``.  Deterministic bytes.
    """
    v = view(obj, cost_model)
    f = _frame(v, scale)
    title = (
        f"msched schedule: {_counts(v)}, "
        f"makespan {format_number(v.makespan)} (lower bound {format_number(v.lower_bound)})"
    )
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{f.width:.0f}" height="{f.height:.0f}" '
        f'viewBox="0 0 {f.width:.0f} {f.height:.0f}">',
        f"<style>{_SVG_STYLE}</style>",
        f'<rect width="{f.width:.0f}" height="{f.height:.0f}" fill="#ffffff"/>',
        f'<text x="12" y="22" class="title">{_xml(title)}</text>',
    ]
    body += _svg_lanes(v, f) + _svg_axis(v, f)
    for step in v.program.compute_steps:
        node = step.node
        if node.op not in ("placeholder", "get_attr", "output") and v.finish[node] > v.start[node]:
            body += _svg_box(v, f, node)
    body += _svg_links(v, f)
    body += _svg_legend(f, f.lane_top(v.num_streams) + 48)
    body.append("</svg>")
    return "\n".join(body) + "\n"


# ---------------------------------------------------------------------------------------------
# Questions about a scheduled graph (used by `msched demo` and `msched explain`).


def joining_wait(v: View, node: Node, stream: int) -> Node | None:
    """The first wait that makes ``stream`` happen-after ``node``, or None.

    Walks host order after ``node`` tracking which streams already happen-after it and which
    events carry it (recorded on such a stream after it), so joins through a third stream are
    found too.  Returns None when ``node`` is on ``stream`` (no wait is needed) or none joins.
    """
    steps = v.program.steps
    if v.program.stream_of[node] == stream:
        return None
    i = next(k for k, s in enumerate(steps) if s.node is node)
    informed = {v.program.stream_of[node]}
    carrying: set[int] = set()
    for step in steps[i + 1 :]:
        if step.kind == "record_event" and step.arg is not None:
            if step.stream in informed:
                carrying.add(step.arg)
            else:
                carrying.discard(step.arg)
        elif step.kind == "wait_event" and step.arg in carrying and step.stream not in informed:
            if step.stream == stream:
                return step.node
            informed.add(step.stream)
    return None


def host_index(v: View, node: Node) -> int:
    """The position of ``node`` in host (emission) order, 0-based."""
    return next(k for k, s in enumerate(v.program.steps) if s.node is node)


def event_of(v: View, wait: Node) -> EventUse:
    """The record that ``wait`` consumes."""
    return next(use for use in v.events if wait in use.waits)

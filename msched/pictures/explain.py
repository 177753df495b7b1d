"""The questions ``msched explain`` answers about one node of a schedule, as lines of text.

Why the node is on its stream comes from the `msched.scheduling.assign.Placement` that
`assign_streams` recorded when it placed the node (``Assignment.reasons``), never from
re-deriving assign's rules here.  Dependencies come from the Dag of ``Schedule.original``;
which wait orders each of them before the node comes from the view (`joining_wait`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch.fx import GraphModule, Node

from msched.analysis.collectives import collective_of, waited, waits_of
from msched.analysis.cost import CostModel
from msched.analysis.dag import REASONS
from msched.analysis.nodes import node_named
from msched.pictures.labels import format_number
from msched.pictures.text import memory_text, node_text, step_text, switch_text
from msched.pictures.view import (
    View,
    dependencies_by_name,
    event_of,
    host_index,
    joining_wait,
    view_of,
)
from msched.proof.dialects import Dialect
from msched.proof.memory import format_bytes
from msched.proof.program import Step
from msched.scheduling import assign
from msched.scheduling.pipeline import Schedule, read_schedule

__all__ = ["explain_lines", "placement_text"]

_REASON_ORDER = tuple(name for _, name in REASONS)


@dataclass(frozen=True)
class _Explained:
    """What the explanation needs: the view, the schedule, dependencies and nodes by name."""

    v: View
    sched: Schedule
    deps: dict[str, dict[str, set[str]]]
    nodes: dict[str, Node]

    def stream(self, node: Node) -> int:
        return self.v.program.stream_of[node]

    def host(self, name: str) -> int:
        return host_index(self.v, self.nodes[name])


def _reasons(reasons: set[str]) -> str:
    return ",".join(r for r in _REASON_ORDER if r in reasons)


def explain_lines(
    sched: Schedule | GraphModule,
    node: Node | str,
    cost_model: CostModel | None = None,
    *,
    dialect: Dialect | str | None = None,
) -> list[str]:
    """The text of ``msched explain`` for ``node`` (or the node of that name) of ``sched``:
    placement, dependencies, waits, dependents; for a stream op, what it does and which node
    it is issued for.

    ``sched`` is a `Schedule`, or a ``GraphModule`` another pass scheduled (read back with
    `msched.read_schedule`: its placement is that pass's own).  ``dialect`` is the dialect of
    the graph's stream ops (a `msched.Dialect` or a name, as `msched.verify` takes it; None:
    a Schedule's own, else detected from the graph's ops).
    """
    if isinstance(sched, GraphModule):
        sched = read_schedule(sched, dialect=dialect, cost_model=cost_model)
    if isinstance(node, str):
        node = node_named(sched.gm, node, "the scheduled graph")
    v = view_of(sched, cost_model, dialect)
    nodes = {n.name: n for n in sched.gm.graph.nodes}
    e = _Explained(v, sched, dependencies_by_name(sched, dialect), nodes)
    if v.program.steps[host_index(v, node)].kind != "compute":
        return _stream_op_lines(e, node)
    s, name = e.stream(node), node.name
    times = f"{format_number(v.start[node])}-{format_number(v.finish[node])}"
    return [
        node_text(node),
        f"  stream {s}, time {times}, host position {host_index(v, node)} "
        f"(output is at {host_index(v, v.program.output)})",
        *_collective_lines(e, node),
        f"Why stream {s}:",
        "  " + placement_text(sched, node),
        f"Dependencies of {name} (dependency, its stream, reasons, how it is ordered):",
        *_dependency_lines(e, node),
        f"Waits right before {name}:",
        *_wait_lines(e, node),
        f"Nodes that depend on {name}:",
        *_dependent_lines(e, node),
        *_memory_lines(e.v, node),
    ]


def _memory_lines(v: View, node: Node) -> list[str]:
    """The schedule's peak memory and the memory right after ``node`` (`View.memory`);
    nothing when the graph carries no sizes."""
    m = v.memory
    if m is None:
        return []
    lines = ["Memory (msched.peak_memory):", f"  peak: {memory_text(m)}"]
    point = next((p for p in m.curve if p.node == node.name), None)
    if point is not None:
        lines.append(
            f"  after {node.name}: {format_bytes(point.allocated)} live, "
            f"{format_bytes(point.reserved)} reserved"
        )
    return lines


def placement_text(sched: Schedule, node: Node) -> str:
    """Why ``node`` is on its stream: the rule `assign_streams` recorded for it, in words."""
    a = sched.assignment
    if a is None:  # read back from another pass's graph: its reasons are that pass's own
        return f"placed on stream {sched.stream_of(node)} by the pass that scheduled the graph."
    why, s = a.reasons[node], a.stream[node]
    if why.rule == assign.OUTPUT:
        return (
            "output always runs on stream 0, the caller's stream, once stream 0 has "
            "joined every dependency of the exit."
        )
    if why.rule == assign.INPUT:
        return "graph inputs and weights are ready on stream 0, the caller's stream."
    if why.rule == assign.IN_ORDER:
        return (
            "with one stream the input order is kept: it starts when the node before it "
            f"finishes, at {format_number(a.start[node])}."
        )
    producer = why.producer
    if producer is None:
        lead, busy_stream = "it has no dependencies", 0
        if why.rule == assign.AFFINITY:
            return f"{lead}; stream {s} is idle at 0."
    else:
        busy_stream = a.stream[producer]
        lead = (
            f"its dependency {producer.name} finishes last, at {format_number(why.ready)}, "
            f"on stream {busy_stream}"
        )
    if why.rule == assign.ZERO_COST:
        return f"it costs nothing, and zero-cost nodes follow their producer: {lead}."
    if why.rule == assign.AFFINITY:
        return f"{lead}; it stays on that stream, which is idle then (fewer events)."
    if why.rule == assign.TIMETABLE:
        when = format_number(a.start[node])
        return f"{lead}; the exact mode's timetable (CP-SAT) runs it on stream {s} at {when}."
    busy = _busy_at(sched, busy_stream, why.ready)
    why_not = f"stream {busy_stream} is busy then" + (f" running {busy.name}" if busy else "")
    when = format_number(a.start[node])
    return f"{lead}; {why_not}, and stream {s} is the first free for it (starts at {when})."


def _busy_at(sched: Schedule, stream: int, t: float) -> Node | None:
    """The node that runs on ``stream`` at time ``t`` in the assignment, if any."""
    a = sched.assignment
    assert a is not None  # only asked for schedules msched made
    for node in a.order:
        if a.stream[node] == stream and a.start[node] <= t < a.finish[node]:
            return node
    return None


def _dependency_lines(e: _Explained, node: Node) -> list[str]:
    s = e.stream(node)
    deps = sorted(e.deps[node.name].items(), key=lambda kv: e.host(kv[0]))
    width = _reasons_width(reasons for _, reasons in deps)
    lines = []
    for name, reasons in deps:
        dep = e.nodes[name]
        ds = e.stream(dep)
        if ds == s:
            how = "same stream, earlier in its order"
        else:
            wait = joining_wait(e.v, dep, s)
            how = f"joined by {_wait_name(e, wait)}" if wait is not None else "NOT JOINED"
        lines.append(f"  {name:<24} stream {ds}  {_reasons(reasons):<{width}} {how}")
    return lines or ["  (none)"]


def _reasons_width(reasons: Iterable[set[str]]) -> int:
    """The width of a block's reasons column: 9, or its longest entry (``collective``)."""
    return max([9, *(len(_reasons(r)) for r in reasons)])


def _wait_name(e: _Explained, wait: Step) -> str:
    """``wait @add_tensor_2 (wait_event_3, stream 1)``: the wait as the canonical text names
    it, its node and its stream."""
    return f"{step_text(wait, e.v.names)} ({wait.node.name}, stream {wait.stream})"


_WAITS = ("wait_event", "wait_stream", "synchronize")


def _waits_before(e: _Explained, node: Node) -> list[Step]:
    """The waits (event waits, stream-wide joins, host barriers) in the run of stream ops
    right before ``node``."""
    steps = e.v.program.steps
    i = host_index(e.v, node)
    found = []
    while i > 0 and steps[i - 1].kind != "compute":
        i -= 1
        if steps[i].kind in _WAITS:
            found.append(steps[i])
    return found[::-1]


def _covered(e: _Explained, node: Node, wait: Step) -> list[str]:
    """The dependencies of ``node`` that ``wait`` is the first to order before it."""
    s = e.stream(node)
    return [
        f"{d} ({_reasons(rs)})"
        for d, rs in e.deps[node.name].items()
        if joining_wait(e.v, e.nodes[d], s) is wait
    ]


def _join_line(e: _Explained, node: Node, wait: Step) -> str:
    """A stream-wide join or host barrier before ``node``, and what it orders before it."""
    if wait.kind == "wait_stream":
        what = f"stream {wait.stream} waits for all work issued on stream {wait.to_stream} so far"
    elif wait.event is not None:
        what = "the host waits for that record; later work on every stream follows"
    elif wait.to_stream is not None:
        what = f"the host waits for stream {wait.to_stream}; later work on every stream follows"
    else:
        what = "the host waits for the whole device; later work on every stream follows"
    head = f"  {step_text(wait, e.v.names)} ({wait.node.name}): {what}"
    if wait not in e.v.clocks.clock_after and wait not in e.v.clocks.barrier_after:
        return f"{head}; after output, it never runs"
    covered = _covered(e, node, wait)
    if covered:
        return f"{head}; it orders {', '.join(covered)} before {node.name}"
    return f"{head}; it orders that work before {node.name}"


def _wait_lines(e: _Explained, node: Node) -> list[str]:
    lines = []
    s = e.stream(node)
    for wait in _waits_before(e, node):
        if wait.kind != "wait_event":
            lines.append(_join_line(e, node, wait))
            continue
        use = event_of(e.v, wait)
        if use is None:
            lines.append(f"  {_wait_name(e, wait)}: after output, it never runs")
            continue
        if use.record is None:
            lines.append(f"  wait e{use.event} (unrecorded): its event is never recorded before it")
            continue
        covered = _covered(e, node, wait)
        r = use.record.stream
        head = (
            f"  wait {e.v.names.records[use.record]}: recorded on stream {r} by "
            f"{use.record.node.name}"
        )
        if covered:
            lines.append(f"{head}; it orders {', '.join(covered)} before {node.name}")
        elif use.event == 0:
            lines.append(
                f"{head} after the preamble; stream {s} joins stream 0 "
                "before its first node, because graph inputs are ready only there"
            )
        else:
            lines.append(f"{head}; it orders that stream's earlier work before {node.name}")
    return lines or ["  (none: every dependency is on its stream or was joined earlier)"]


def _dependent_lines(e: _Explained, node: Node) -> list[str]:
    s = e.stream(node)
    width = _reasons_width(deps[node.name] for deps in e.deps.values() if node.name in deps)
    lines = []
    for name, deps in e.deps.items():
        reasons = deps.get(node.name)
        if reasons is None:
            continue
        us = e.stream(e.nodes[name])
        wait = joining_wait(e.v, node, us) if us != s else None
        if us == s:
            how = "same stream"
        else:
            how = f"joined by {_wait_name(e, wait)}" if wait is not None else "NOT JOINED"
        lines.append(f"  {name:<24} stream {us}  {_reasons(reasons):<{width}} {how}")
        if "collective" in reasons:
            lines.append(
                f"    collective dependency: {name} is the next collective; msched keeps the "
                "collectives in program order so that every rank issues them alike"
            )
        if "exit" in reasons:
            lines.append(
                f"    exit dependency: the graph may not return before {node.name} has "
                "run, so whoever reads its result after the call sees it"
            )
    return lines or ["  (none)"]


def _collective_lines(e: _Explained, node: Node) -> list[str]:
    """For a collective: its group and where its communication ends; for a wait: which
    collective it completes.  Nothing for other nodes."""
    c = collective_of(node)
    if c is not None:
        group = "its own group" if c.group is None else f"group {c.group}"
        if not c.asynchronous:
            return [f"  collective {c.op} of {group}, synchronous on stream {e.stream(node)}"]
        waits = waits_of(e.v.clocks.order).get(node, [])
        at = ", ".join(f"{w.name} (stream {e.stream(w)})" for w in waits) or "no wait: never"
        held = "; it reads its input until then" if c.holds_input else ""
        return [f"  collective {c.op} of {group}, asynchronous: completes at {at}{held}"]
    issue = waited(node)
    if issue is None:
        return []
    return [f"  waits for {issue.name} (stream {e.stream(issue)}): its result is ready after it"]


def _stream_op_lines(e: _Explained, node: Node) -> list[str]:
    """For a stream op: what it does, and which node it is issued for (or who waits on it)."""
    steps = e.v.program.steps
    i = host_index(e.v, node)
    records = []  # the records of a switch that records (before its switch), or the record
    while steps[i].kind == "record_event" and i + 1 < len(steps) and steps[i + 1].node is node:
        records.append(steps[i])
        i += 1
    step = steps[i]
    text = step_text(step, e.v.names)
    if step.kind == "set_stream":  # a switch, with the waits of the same node after it
        own = [t for t in steps[i + 1 :] if t.node is node and t.kind in _WAITS]
        if own and all(t.kind == "wait_event" for t in own):
            text = switch_text(own, e.v.names)
        elif own:
            text = "switch, " + ", ".join(step_text(t, e.v.names) for t in own)
    head = [f"{node.name}: {step_text(r, e.v.names)} on stream {r.stream}, then" for r in records]
    head.append(f"{node.name}: {text}, a stream op issued on stream {step.stream}")
    if step.kind == "record_event":
        records.append(step)
    for record in records:
        use = next(u for u in e.v.events if u.record is record)
        waits = ", ".join(f"{w.node.name} (stream {w.stream})" for w in use.waits) or "nothing"
        head.append(f"  {step_text(record, e.v.names)} waited on by {waits}")
    if step.kind == "record_event":
        return head
    following = (t.node for t in steps[i + 1 :] if t.kind == "compute" and t.stream == step.stream)
    user = next(following, None)
    if user is None:
        return head
    return [
        *head,
        f"  it is issued for {user.name}; the waits right before it:",
        *_wait_lines(e, user),
    ]

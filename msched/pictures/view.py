"""The view every picture starts from, and the questions `msched explain` and the demo ask.

`view_of` reads a `msched.Schedule` or a scheduled ``GraphModule`` with
`msched.proof.interpreter.interpret` (host order, stream of every node, event ids) and
`msched.proof.clocks.clocks_of` (which record each wait binds to, which wait joins a node on a
stream: the pictures interpret no record or wait themselves), and times every node.  Times
come from the Schedule's assignment when its streams issue their nodes in order of those
times (always for a graph `msched.schedule` rewrote and nobody edited since), and otherwise
from the timeline simulator (`msched.simulate`) under ``cost_model`` (default: the table
model).  A stream op happens when its stream reaches it.  The graph is read in the dialect
the picture is given (``dialect=``, a `msched.Dialect` or a name), else in a Schedule's own,
else in the one detected from its ops (`picture_dialect`): the detection and the errors are
`msched.proof.interpreter.interpret`'s, as for `msched.verify`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from torch.fx import Graph, GraphModule, Node

from msched.analysis.collectives import collective_of, waits_of
from msched.analysis.cost import CostModel, DefaultCostModel
from msched.analysis.dag import build_dag
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError
from msched.pictures.naming import EventNames, event_names
from msched.proof.clocks import Clocks, clocks_of
from msched.proof.dialects import Dialect, as_dialect
from msched.proof.interpreter import interpret
from msched.proof.memory import MemoryReport, sized_memory
from msched.proof.program import Step, StreamProgram
from msched.proof.summary import Summarized, Summary
from msched.proof.timeline import simulate
from msched.scheduling.pipeline import Schedule

__all__ = [
    "Communication",
    "EventUse",
    "StreamJoin",
    "View",
    "communications",
    "dependencies_by_name",
    "event_of",
    "exit_waits",
    "host_index",
    "joining_wait",
    "picture_dialect",
    "stream_joins",
    "view_of",
]


@dataclass(frozen=True)
class EventUse:
    """One record of an event and the waits that bind to it (`Clocks.binding`).

    ``record`` is None for the waits of ``event`` that come before any record of it (they
    wait for nothing).
    """

    event: int
    record: Step | None
    waits: tuple[Step, ...]


@dataclass(frozen=True)
class View(Summarized[float]):
    """A scheduled graph read for a picture: host-order program, happens-before, times, events.

    ``summary`` is the Schedule's (`msched.proof.summary.Summary`), or for a bare module its
    timeline's (`msched.simulate`); its fields are attributes of the View too.
    ``start``/``finish`` hold every node of the graph; a stream op's start and finish are the
    moment its stream reaches it.  ``events`` lists the records in host order (the waits of an
    event that come before any record of it appear with ``record=None``); waits after
    ``output`` never run and bind to no record.  ``position`` is each node's index in host
    order; ``names`` the stable name of every record and wait (`msched.pictures.naming`),
    what the canonical text prints.  ``dialect`` is the one the graph was read in (None:
    detected); ``memory`` its `msched.peak_memory` when its nodes carry sizes.
    """

    gm: GraphModule
    program: StreamProgram
    summary: Summary[float]
    start: dict[Node, float]
    finish: dict[Node, float]
    events: tuple[EventUse, ...]
    clocks: Clocks
    position: dict[Node, int]
    names: EventNames
    dialect: Dialect | None = None

    @cached_property
    def memory(self) -> MemoryReport | None:
        """The graph's memory (`msched.proof.memory.sized_memory`), computed on first use;
        None when its nodes carry no sizes (the pictures then show none)."""
        return sized_memory(self.gm, dialect=self.dialect)


def picture_dialect(obj: Schedule | GraphModule, dialect: Dialect | str | None) -> Dialect | None:
    """The dialect a picture reads ``obj`` in: ``dialect`` when given (a `Dialect` or a name,
    as `msched.verify` takes it: `msched.proof.dialects.as_dialect`), else a Schedule's own,
    else None: detected from the graph's ops (`Dialect.detect`), as everywhere."""
    if dialect is not None:
        return as_dialect(dialect)
    return obj.dialect if isinstance(obj, Schedule) else None


def view_of(
    obj: Schedule | GraphModule,
    cost_model: CostModel | None = None,
    dialect: Dialect | str | None = None,
) -> View:
    """Read ``obj`` (a `Schedule` or a scheduled ``GraphModule``) for a picture, in
    ``dialect`` (`picture_dialect`)."""
    if isinstance(obj, Schedule):
        gm, summary, a = obj.gm, obj.summary, obj.assignment
    elif isinstance(obj, GraphModule):
        gm, summary, a = obj, None, None
    else:
        raise InvalidArgumentError(
            f"can only render a msched.Schedule or a scheduled torch.fx.GraphModule, "
            f"got {type(obj).__name__}"
        )
    dialect = picture_dialect(obj, dialect)
    program = interpret(gm, dialect)
    clocks = clocks_of(program)
    if a is not None and summary is not None and _follows_host_order(program, a.start):
        start, finish = _stream_op_times(clocks, a.start, a.finish)
    else:
        # A bare module, one read back from another pass's graph (no assignment), or one
        # edited after scheduling (the assignment's times no longer describe the program
        # that runs): the picture times the program that runs instead.
        timeline = simulate(gm, cost_model or DefaultCostModel(), dialect)
        start, finish = _stream_op_times(clocks, timeline.start, timeline.end)
        summary = summary or timeline.summary
    return View(
        gm=gm,
        program=program,
        summary=summary,
        start=start,
        finish=finish,
        events=_event_uses(clocks),
        clocks=clocks,
        position=_first_steps(program),
        names=event_names(program, clocks),
        dialect=dialect,
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


def _first_steps(program: StreamProgram) -> dict[Node, int]:
    """Each node's first step in host order (a stream op may have several)."""
    position: dict[Node, int] = {}
    for k, step in enumerate(program.steps):
        position.setdefault(step.node, k)
    return position


def _event_uses(clocks: Clocks) -> tuple[EventUse, ...]:
    """Every record in host order with the waits that bind to it; the waits of an event that
    bind to nothing (no record before them) grouped where the first of them stands."""
    binding = clocks.binding  # the waits that run (before output), in host order
    bound: dict[Step, list[Step]] = {}
    unbound: dict[int, list[Step]] = {}
    for step, record in binding.items():
        if record is not None:
            bound.setdefault(record, []).append(step)
        elif step.event is not None:
            unbound.setdefault(step.event, []).append(step)
    uses: list[EventUse] = []
    for step in clocks.program.steps:
        if step.event is None or step.kind not in ("record_event", "wait_event"):
            continue
        if step.kind == "record_event":
            uses.append(EventUse(step.event, step, tuple(bound.get(step, ()))))
        elif unbound.get(step.event, [None])[0] is step:  # its event's first unbound wait
            uses.append(EventUse(step.event, None, tuple(unbound[step.event])))
    return tuple(uses)


def _stream_op_times(
    clocks: Clocks, start: dict[Node, float], finish: dict[Node, float]
) -> tuple[dict[Node, float], dict[Node, float]]:
    """Complete ``start``/``finish`` with the nodes they lack (stream ops, inputs, output).

    A node without a time happens when its stream reaches it: after the previous timed node
    of that stream, and for a wait, not before what it waits for (the record it binds to,
    the work issued so far on the stream it joins); a host barrier happens when what it
    waits for is done, and every stream reaches it.
    """
    program = clocks.program
    cursor = [0.0] * program.num_streams
    out_start: dict[Node, float] = {}
    out_finish: dict[Node, float] = {}
    for step in program.steps:
        node, s = step.node, step.stream
        if node in start and node is not program.output:
            out_start[node], out_finish[node] = start[node], finish[node]
            cursor[s] = max(cursor[s], finish[node])
            continue
        t = cursor[s]
        if node in out_start:  # a later action of a stream op that has several
            t = max(t, out_start[node])
        if node is program.output:
            t = max([t, *cursor]) if node not in start else start[node]
        else:
            t = max([t, *_waited_times(clocks, step, cursor, out_start)])
        cursor[s] = t
        if step.kind == "synchronize":
            cursor = [max(c, t) for c in cursor]
        out_start[node] = out_finish[node] = t
    return out_start, out_finish


def _waited_times(
    clocks: Clocks, step: Step, cursor: list[float], out_start: dict[Node, float]
) -> list[float]:
    """When what a stream op waits for is done: its record, the stream(s) it joins."""
    if step.kind not in ("wait_event", "wait_stream", "synchronize"):
        return []
    if step.event is not None:
        found = clocks.binding if step.kind == "wait_event" else clocks.synchronize_binding
        record = found.get(step)
        return [out_start[record.node]] if record is not None else []
    if step.to_stream is not None:
        return [cursor[step.to_stream]]
    return list(cursor) if step.kind == "synchronize" else []


# ---------------------------------------------------------------------------------------------
# Questions about a scheduled graph (the demo, `msched explain`, the SVG's exit links).


def host_index(v: View, node: Node) -> int:
    """The position of ``node``'s first step in host (emission) order, 0-based."""
    return v.position[node]


def event_of(v: View, wait: Step) -> EventUse | None:
    """The record that wait step ``wait`` binds to (``record=None``: none before it); None
    for a wait that never runs (after ``output``)."""
    if wait not in v.clocks.binding:
        return None
    record = v.clocks.binding[wait]
    return next(u for u in v.events if u.record is record and wait in u.waits)


def joining_wait(v: View, node: Node, stream: int) -> Step | None:
    """The first wait that makes ``stream`` happen-after ``node``, or None.

    Joins through a third stream count.  None when ``node`` is on ``stream`` (no wait is
    needed), never runs (after ``output``) or no wait joins it (`Clocks.joining_wait`).
    """
    return v.clocks.joining_wait(node, stream)


def exit_waits(v: View) -> tuple[Step, ...]:
    """The waits that join the exit: those on ``output``'s stream after the previous node of
    that stream, bound to a record (`Clocks.binding`), stream-wide joins and host barriers,
    in host order."""
    out = v.program.output
    stream, binding = v.program.stream_of[out], v.clocks.binding
    found: list[Step] = []
    for step in reversed(v.program.steps[: host_index(v, out)]):
        if step.stream != stream:
            continue
        if step.kind == "compute":
            break
        if step.kind in ("wait_stream", "synchronize") or binding.get(step) is not None:
            found.append(step)
    return tuple(reversed(found))


@dataclass(frozen=True)
class StreamJoin:
    """A stream-wide join (``wait_stream``) or host barrier (``synchronize``) that runs, and
    the points it waits for: ``sources`` holds ``(stream, time)`` for each, the finish of the
    last node issued on a joined stream before it, or the time of the record a barrier on an
    event binds to (empty when what it waits for ran nothing)."""

    step: Step
    sources: tuple[tuple[int, float], ...]


def stream_joins(v: View) -> tuple[StreamJoin, ...]:
    """Every stream-wide join and host barrier before ``output``, in host order."""
    last: dict[int, Node] = {}  # stream -> its last compute node so far
    found: list[StreamJoin] = []
    for step in v.program.steps:
        if step.node is v.program.output:
            break
        if step.kind == "compute" and step.node.op not in INPUT_OPS:
            last[step.stream] = step.node
        elif step.kind in ("wait_stream", "synchronize"):
            found.append(StreamJoin(step, _join_sources(v, step, last)))
    return tuple(found)


def _join_sources(v: View, step: Step, last: dict[int, Node]) -> tuple[tuple[int, float], ...]:
    if step.event is not None:
        record = v.clocks.synchronize_binding.get(step)
        return () if record is None else ((record.stream, v.start[record.node]),)
    streams = range(v.num_streams) if step.to_stream is None else (step.to_stream,)
    return tuple((t, v.finish[last[t]]) for t in streams if t in last)


@dataclass(frozen=True)
class Communication:
    """An asynchronous collective that runs, from its issue to its first wait that runs
    (``wait`` None: none does, and the communication lasts to the makespan); ``label`` names
    its op and group (``all_reduce, group 0``)."""

    issue: Node
    wait: Node | None
    start: float
    end: float
    label: str


def communications(v: View) -> tuple[Communication, ...]:
    """Every asynchronous collective issued before ``output``, in host order."""
    order = v.clocks.order
    waits = waits_of(order)
    found = []
    for issue, own in waits.items():
        c = collective_of(issue)
        assert c is not None
        wait = next((w for w in own if w in v.finish), None)
        end = v.finish[wait] if wait is not None else v.makespan
        group = "its own group" if c.group is None else f"group {c.group}"
        found.append(Communication(issue, wait, v.start[issue], end, f"{c.op}, {group}"))
    return tuple(found)


def dependencies_by_name(
    obj: Schedule | GraphModule, dialect: Dialect | str | None = None
) -> dict[str, dict[str, set[str]]]:
    """``{node name: {dependency name: reasons}}`` of the graph that was scheduled.

    For a `Schedule` the Dag of ``Schedule.original`` (the input program order defines the
    hazards); for a bare module, or a Schedule read back without its original
    (`msched.read_schedule`), the Dag of its compute nodes in scheduled host order, read in
    ``dialect`` (`picture_dialect`).
    """
    if isinstance(obj, Schedule):
        original = _original_graph(obj)
        read = picture_dialect(obj, dialect)
        graph = original if original is not None else _without_stream_ops(obj.gm, read)
    elif isinstance(obj, GraphModule):
        graph = _without_stream_ops(obj, picture_dialect(obj, dialect))
    else:
        raise InvalidArgumentError(
            f"expected a Schedule or a GraphModule, got {type(obj).__name__}"
        )
    dag = build_dag(graph)
    return {n.name: {d.name: r for d, r in dag.dependencies(n).items()} for n in dag.nodes}


def _original_graph(sched: Schedule) -> Graph | None:
    """``sched.original``'s graph; None for a Schedule read back without one."""
    try:
        return sched.original.graph
    except InvalidArgumentError:  # read_schedule(gm) without original=
        return None


def _without_stream_ops(gm: GraphModule, dialect: Dialect | None = None) -> Graph:
    """The compute nodes of ``gm`` in host order (a passthrough stream op's users read the
    value it passes through)."""
    program = interpret(gm, dialect)
    graph = Graph()
    env: dict[Node, Node] = {}
    for step in program.steps:
        if step.kind == "compute":
            env[step.node] = graph.node_copy(
                step.node, lambda n: env[program.passthrough.get(n, n)]
            )
    return graph

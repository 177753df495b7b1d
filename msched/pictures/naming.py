"""Stable names of events: what the canonical text prints for every record and wait.

An integer event id is a counter of the emitter: adding one record early in a graph shifts the
id of every later one, and a snapshot of the schedule would change on every sync line after
it.  The text names a record after the point of its stream it marks instead (``@add_tensor_2``,
``@entry.s0``, ``@add_tensor_2#2``), and a wait after the record it binds to
(`msched.proof.clocks.Clocks.binding`); a wait that binds to no record prints ``eK
(unrecorded)``.  The names are specified in ``docs/text-format.md`` ("Event names").  They
depend only on node names (Python identifiers: no ``.`` or ``#``, so the spellings never
collide) and host order, never on event ids or hashing, and come from the `StreamProgram`, so
every dialect gets them.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import Graph

from msched.analysis.nodes import INPUT_OPS
from msched.errors import MschedError
from msched.proof.clocks import Clocks, clocks_of
from msched.proof.interpreter import interpret
from msched.proof.program import Step, StreamProgram

__all__ = ["ENTRY", "EventNames", "event_names", "event_names_of_graph", "record_name"]

# The steps that wait for a record: an event wait, and a host barrier on an event.
_WAITS = ("wait_event", "synchronize")

#: The anchor of a record before any compute node of its stream: ``@entry.sN``.
ENTRY = "entry"


def record_name(anchor: str | None, stream: int, ordinal: int = 1) -> str:
    """The name of the ``ordinal``-th record after compute node ``anchor`` (None: before any
    compute node of ``stream``): ``@add_tensor_2``, ``@entry.s1``, ``@add_tensor_2#2``."""
    base = f"@{anchor}" if anchor is not None else f"@{ENTRY}.s{stream}"
    return base if ordinal == 1 else f"{base}#{ordinal}"


def unrecorded_name(event: int | None) -> str:
    """What a wait that binds to no record prints: ``e7 (unrecorded)``."""
    return f"e{event} (unrecorded)"


@dataclass(frozen=True)
class EventNames:
    """The name of every record and wait of a program (see the module docstring).

    ``records[r]`` is the name of record step ``r``; ``waits[w]`` the name of the record that
    wait step ``w`` (or host barrier on an event, a ``synchronize`` step) binds to, None when
    it binds to none (steps, not nodes: one stream op may wait on several events).  `text` is
    what a line prints after ``record `` / ``wait `` / ``synchronize ``.
    """

    records: dict[Step, str]
    waits: dict[Step, str | None]

    def text(self, step: Step) -> str:
        """``@add_tensor_2`` for a record or a wait (``eK (unrecorded)``: a wait bound to
        nothing; ``eK`` for a stream op these names do not cover)."""
        if step.kind == "record_event":
            name = self.records.get(step)
        elif step.kind in _WAITS:
            name = self.waits.get(step)
            if name is None and step in self.waits:
                return unrecorded_name(step.event)
        else:
            name = None
        return name if name is not None else f"e{step.event}"


def event_names(program: StreamProgram, clocks: Clocks | None = None) -> EventNames:
    """Name every record and wait of ``program`` (``clocks``: its `clocks_of`, computed when
    not given).  One pass over the steps."""
    clocks = clocks if clocks is not None else clocks_of(program)
    binding = {**clocks.binding, **clocks.synchronize_binding}
    last: dict[int, str] = {}  # stream -> the name of its last compute node
    seen: dict[str, int] = {}  # base name -> records at that point so far
    latest: dict[int | None, Step] = {}  # event -> its latest record (for waits after output)
    records: dict[Step, str] = {}
    waits: dict[Step, str | None] = {}
    for step in program.steps:
        node, kind, s = step.node, step.kind, step.stream
        if kind == "compute":
            if node.op not in INPUT_OPS:
                last[s] = node.name
        elif kind == "record_event":
            base = record_name(last.get(s), s)
            ordinal = seen[base] = seen.get(base, 0) + 1
            records[step] = record_name(last.get(s), s, ordinal)
            latest[step.event] = step
        elif kind == "wait_event" or (kind == "synchronize" and step.event is not None):
            record = binding[step] if step in binding else latest.get(step.event)
            waits[step] = records[record] if record is not None else None
    return EventNames(records, waits)


# Names for a step seen without its program (`msched.pictures.text.step_text` called with one
# step): computed for the step's graph once, kept on the graph (so they go when it goes; a
# cache keyed by the graph would keep it alive through its nodes) and recomputed when the
# graph changed.
_CACHE_ATTRIBUTE = "_msched_event_names"


def _fingerprint(graph: Graph) -> tuple[object, ...]:
    """What the names of a graph depend on: its nodes in order, their names and arguments."""
    return tuple((n, n.name, n.args, n.kwargs) for n in graph.nodes)


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    try:
        return a == b
    except Exception:  # an argument whose == is not a bool (a tensor): call it changed
        return False


def event_names_of_graph(graph: Graph) -> EventNames | None:
    """`event_names` of ``graph`` read in the dialect its stream ops have
    (`msched.proof.interpreter.interpret` detecting it); None when it cannot be read.

    Cached on the graph and recomputed when its nodes, their order, names or arguments
    changed; `event_names` of a program you already have is cheaper.
    """
    key = _fingerprint(graph)
    cached = getattr(graph, _CACHE_ATTRIBUTE, None)
    if cached is not None and _same(cached[0], key):
        return cached[1]
    try:
        names = event_names(interpret(graph))
    except MschedError:
        return None
    setattr(graph, _CACHE_ATTRIBUTE, (key, names))
    return names

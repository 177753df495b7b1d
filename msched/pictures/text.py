"""The canonical text of a scheduled graph: what snapshots store and reviewers read in CI.

The format (header, lines, event names, versions, determinism) is specified in one place,
``docs/text-format.md``; this module is its writer (`render_text`) and its reader (`read_text`,
`parse_schedule`), kept together so the two cannot drift.  A text without a version line is
format 1 and is read too; a text of a version this module does not know is an error naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule, Node

from msched.analysis.cost import CostModel
from msched.errors import InvalidArgumentError
from msched.pictures.json_doc import read_json
from msched.pictures.labels import ADDRESS, format_number, is_kernel, peaks_text, target_name
from msched.pictures.naming import EventNames, event_names_of_graph
from msched.pictures.parsed import ParsedSchedule, ProgramBuilder
from msched.pictures.view import View, view_of
from msched.proof.dialects import Dialect
from msched.proof.memory import MemoryReport
from msched.proof.program import Step
from msched.proof.summary import Summary
from msched.scheduling.pipeline import Schedule

__all__ = [
    "VERSION",
    "VERSION_LINE",
    "format_arg",
    "header_lines",
    "lane_lines",
    "memory_text",
    "node_text",
    "parse_schedule",
    "parsed",
    "read_text",
    "render_text",
    "step_text",
    "switch_text",
]

#: The version of the canonical text `render_text` writes, and the newest `read_text` reads.
VERSION = 2
#: The first line of a text of this version; format 1 texts have no version line.
VERSION_LINE = f"# msched text format {VERSION}"
_VERSION_PREFIX = "# msched text format "
#: What starts the line of a host-only node: ``host e = myeng.event_create.default('a')``.
_HOST = "host "


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
    return ADDRESS.sub(
        "", repr(value) if isinstance(value, (str, int, bool, type(None))) else str(value)
    )


def _call_args(node: Node, skip: int = 0) -> str:
    parts = [format_arg(a) for a in node.args[skip:]]
    parts += [f"{k}={format_arg(v)}" for k, v in node.kwargs.items()]
    return ", ".join(parts)


def node_text(node: Node) -> str:
    """One node as ``name = op(args)`` (``x = input``, ``output(y)``).

    Every node is shown by what it is in FX, stream ops included; `step_text` shows a stream
    op as what it does (``record @add_tensor_2``).
    """
    if node.op == "placeholder":
        return f"{node.name} = input"
    if node.op == "get_attr":
        return f"{node.name} = self.{node.target}"
    if node.op == "output":
        return f"output({format_arg(node.args[0])})"
    if node.op == "call_method":
        return f"{node.name} = {format_arg(node.args[0])}.{node.target}({_call_args(node, 1)})"
    if node.op == "call_module":
        return f"{node.name} = self.{node.target}({_call_args(node)})"
    if is_kernel(node):
        return _kernel_text(node)
    return f"{node.name} = {target_name(node)}({_call_args(node)})"


def _kernel_text(node: Node) -> str:
    """A kernel of Inductor's final order: ``op3 = kernel(reads=[buf1], writes=[arg2_1])``."""
    text = f"{node.name} = kernel(reads={format_arg(node.args[1])}"
    if len(node.args) > 2:
        text += f", writes={format_arg(node.args[2])}"
    return text + ")"


def step_text(step: Step, names: EventNames | None = None) -> str:
    """One step of a stream program: ``record @add_tensor_2``, ``wait @add_tensor_2``, a
    stream-wide join ``wait s1``, a host barrier ``synchronize`` / ``synchronize s1`` /
    ``synchronize @add_tensor_2``, ``record_stream(t, s1)``, a host-only node (a stream op
    that does nothing on a stream, ``host e = myeng.event_create.default('a')``), or the
    node's `node_text`.

    Records and waits print their stable name (`msched.pictures.naming`) from ``names``, the
    `EventNames` of the step's program (``View.names``).  Without it the names of the step's
    graph are computed (and cached until the graph changes), reading the stream ops in the
    dialect the graph's ops have; a stream op they do not cover prints ``eK``.
    """
    if step.kind in ("record_event", "wait_event"):
        event = _event_text(step, names)
        return f"{'record' if step.kind == 'record_event' else 'wait'} {event}"
    if step.kind == "wait_stream":
        return f"wait s{step.to_stream}"
    if step.kind == "synchronize":
        return _synchronize_text(step, names)
    if step.kind == "record_stream":
        tensor = step.tensor.name if step.tensor is not None else "?"
        return f"record_stream({tensor}, s{step.to_stream})"
    if step.kind == "host":
        return _HOST + node_text(step.node)
    return node_text(step.node)


def _synchronize_text(step: Step, names: EventNames | None) -> str:
    """A host barrier: on an event (named as a wait names it), a stream, or the device."""
    if step.event is not None:
        return f"synchronize {_event_text(step, names)}"
    if step.to_stream is not None:
        return f"synchronize s{step.to_stream}"
    return "synchronize"


def _event_text(step: Step, names: EventNames | None) -> str:
    if names is None:
        names = event_names_of_graph(step.node.graph)
    return names.text(step) if names is not None else f"e{step.event}"


def switch_text(waits: Iterable[Step], names: EventNames | None = None) -> str:
    """A switch and the waits of the same node right after it: ``switch, wait @add_3 @mul_5``
    (each wait named as `step_text` names it)."""
    return "switch, wait " + " ".join(_event_text(w, names) for w in waits)


#: What starts the header's memory line (``docs/text-format.md``).
MEMORY_PREFIX = "# memory "


def memory_text(m: MemoryReport) -> str:
    """The three peaks of a `MemoryReport` as the header's memory line shows them (after
    ``# memory ``): ``allocated 3.5 KiB, reserved 4 MiB, bound 4 MiB``."""
    return peaks_text(m.allocated, m.reserved, m.reserved_bound)


def header_lines(v: View) -> list[str]:
    """The header of the canonical text: the version line, counts, makespan against the
    lower bound, then the peak memory when the graph's nodes carry sizes (`View.memory`)."""
    lines = [
        VERSION_LINE,
        f"# streams {v.num_streams}, events {v.num_events}, waits {v.num_waits}",
        f"# makespan {format_number(v.makespan)}, lower bound {format_number(v.lower_bound)}",
    ]
    if v.memory is not None:
        lines.append(MEMORY_PREFIX + memory_text(v.memory))
    return lines


def lane_lines(v: View, steps: Iterable[Step] | None = None) -> list[str]:
    """One line per step: ``s1 |   mm_3 = aten.mm.default(mul_2, l0_wq)``.

    The lane column and an indentation of two spaces per stream show the stream a node is
    issued on; a switch is folded into it (the lane changes where it stood), except a switch
    that waits: it and its waits are one line, ``s1 |   switch, wait @add_3 @mul_5``.
    """
    width = len(str(max(v.num_streams - 1, 0)))
    lines = []
    todo = list(v.program.steps if steps is None else steps)
    i = 0
    while i < len(todo):
        step = todo[i]
        i += 1
        if step.kind == "set_stream":
            waits = []
            while i < len(todo) and todo[i].kind == "wait_event" and todo[i].node is step.node:
                waits.append(todo[i])
                i += 1
            if not waits:
                continue
            text = switch_text(waits, v.names)
        else:
            text = step_text(step, v.names)
        lane = f"s{step.stream}".ljust(width + 1)
        lines.append(f"{lane} | {'  ' * step.stream}{text}")
    return lines


def render_text(
    obj: Schedule | GraphModule,
    cost_model: CostModel | None = None,
    *,
    dialect: Dialect | str | None = None,
) -> str:
    """The canonical text of a scheduled graph, for snapshots reviewed in CI
    (``docs/text-format.md``): the header (`header_lines`), then one line per node in emission
    (host) order (`lane_lines`).  It ends with a newline and is identical across runs,
    processes and hash seeds.
    ``dialect`` is the dialect of the graph's stream ops (a `msched.Dialect` or a name, as
    `msched.verify` takes it; None: a Schedule's own, else detected from the graph's ops).
    """
    v = view_of(obj, cost_model, dialect)
    return "\n".join(header_lines(v) + lane_lines(v)) + "\n"


# ---------------------------------------------------------------------------------------------
# Reading.


@dataclass(frozen=True)
class _Grammar:
    """The lines of one version of the text that are not the same in every version.

    Format 1 also names events by id (``record e7``, ``wait e7``, ``switch, wait e3 e5``,
    ``synchronize e7``; a wait on an event never recorded says ``e7`` with or without
    `` (unrecorded)``) and has no host-only lines; format 2 names every record after the point
    it marks (`msched.pictures.naming`) and an event by id only when it was never recorded.
    """

    version: int
    record: re.Pattern[str]
    wait: re.Pattern[str]
    switch: re.Pattern[str]
    switch_event: re.Pattern[str]
    synchronize: re.Pattern[str]
    host: re.Pattern[str] | None


_FORMAT_1 = _Grammar(
    1,
    record=re.compile(r"record (?:@(\S+)|e(\d+))$"),
    wait=re.compile(r"wait (?:@(\S+)|e(\d+)(?: \(unrecorded\))?)$"),
    switch=re.compile(r"switch, wait ((?:(?:@\S+|e\d+(?: \(unrecorded\))?)(?: |$))+)$"),
    switch_event=re.compile(r"@(\S+)|e(\d+)(?: \(unrecorded\))?"),
    synchronize=re.compile(r"synchronize(?: (?:s(\d+)|@(\S+)|e(\d+)(?: \(unrecorded\))?))?$"),
    host=None,
)
_FORMAT_2 = _Grammar(
    2,
    record=re.compile(r"record @(\S+)()$"),
    wait=re.compile(r"wait (?:@(\S+)|e(\d+) \(unrecorded\))$"),
    switch=re.compile(r"switch, wait ((?:(?:@\S+|e\d+ \(unrecorded\))(?: |$))+)$"),
    switch_event=re.compile(r"@(\S+)|e(\d+) \(unrecorded\)"),
    synchronize=re.compile(r"synchronize(?: (?:s(\d+)|@(\S+)|e(\d+) \(unrecorded\)))?$"),
    host=re.compile(rf"{_HOST}([A-Za-z_]\w*) = (.*)$"),
)
_GRAMMARS = {g.version: g for g in (_FORMAT_1, _FORMAT_2)}
assert max(_GRAMMARS) == VERSION

_HEADER_COUNTS = re.compile(r"# streams (\d+), events (\d+), waits (\d+)$")
_HEADER_TIMES = re.compile(r"# makespan (\S+), lower bound (\S+)$")
_LANE = re.compile(r"s(\d+) *\| (.*)$")
_COMPUTE = re.compile(r"([A-Za-z_]\w*) = (.*)$")
_RECORD_STREAM = re.compile(r"record_stream\((.*), s(\d+)\)$")
_WAIT_STREAM = re.compile(r"wait s(\d+)$")


def read_text(text: str, where: str = "the schedule") -> ParsedSchedule:
    """A schedule from its canonical text, of any version this module reads (a text without
    a version line is format 1); ``where`` names it in errors.  Raises
    `msched.InvalidArgumentError` naming the version or the line that cannot be read."""
    lines = text.splitlines()
    grammar, first = _grammar_of(lines, where)
    head = _header(lines[first : first + 2], where)
    body = first + 2
    memory = None
    if body < len(lines) and lines[body].startswith(MEMORY_PREFIX):
        memory = lines[body][len(MEMORY_PREFIX) :]  # optional: texts before it lack it
        body += 1
    reader = _TextReader(grammar)
    for number, line in enumerate(lines[body:], start=body + 1):
        if line.strip():
            reader.line(line, f"{where}, line {number}")
    return reader.b.finish(head, where, memory)


def _grammar_of(lines: list[str], where: str) -> tuple[_Grammar, int]:
    """The grammar of the text's version and the index of its first line after the version
    line (format 1: no version line)."""
    if not lines or not lines[0].startswith(_VERSION_PREFIX):
        return _FORMAT_1, 0
    version = lines[0][len(_VERSION_PREFIX) :]
    grammar = _GRAMMARS.get(int(version)) if version.isdigit() else None
    if grammar is None:
        known = ", ".join(str(v) for v in sorted(_GRAMMARS))
        raise InvalidArgumentError(
            f"{where}: msched text format {version!r} is not one this msched reads (it reads "
            f"formats {known}); read it with the msched that wrote it, or write it again "
            "with this one"
        )
    return grammar, 1


def _header(lines: list[str], where: str) -> Summary[str]:
    if len(lines) < 2:
        raise InvalidArgumentError(f"{where}: not a schedule (no '# streams ...' header)")
    counts, times = _HEADER_COUNTS.match(lines[0]), _HEADER_TIMES.match(lines[1])
    if counts is None or times is None:
        raise InvalidArgumentError(
            f"{where}: not a schedule: it starts with {lines[0][:60]!r}, not "
            "'# streams S, events E, waits W' and '# makespan M, lower bound L'"
        )
    streams, events, waits = (int(g) for g in counts.groups())
    return Summary(streams, events, waits, times.group(1), times.group(2))


def _int(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"{where}: expected an integer, got {text!r}") from None


class _TextReader:
    """The lines of one text, read in order into a `ProgramBuilder`.

    Event ids of the parsed program: ``2k`` for an event named by id (``eK``: format 1, and
    a wait on an event never recorded), odd ids for the named records, in order.
    """

    def __init__(self, grammar: _Grammar) -> None:
        self.g = grammar
        self.b = ProgramBuilder()
        self.record_ids: dict[str, int] = {}  # "@name" of a record line -> its event id

    def line(self, line: str, at: str) -> None:
        lane = _LANE.match(line)
        if lane is None:
            raise InvalidArgumentError(f"{at}: expected 'sN | ...', got {line[:60]!r}")
        stream, body = int(lane.group(1)), lane.group(2).lstrip(" ")
        if not (self._node(stream, body, at) or self._sync(stream, body, at)):
            if not self._join(stream, body, at):
                raise InvalidArgumentError(f"{at}: cannot read {body[:60]!r}")

    def _node(self, stream: int, body: str, at: str) -> bool:
        """A line of a node of the graph: compute, host-only, an input or ``output``."""
        b = self.b
        if self.g.host is not None and (m := self.g.host.match(body)) is not None:
            b.host(m.group(1), stream, m.group(2), at)
        elif (m := _COMPUTE.match(body)) is not None:
            name, rhs = m.groups()
            b.compute(name, stream, _op_of(rhs), rhs, at)
        elif body.startswith("output(") and body.endswith(")"):
            b.compute("output", stream, "output", body, at)
        else:
            return False
        return True

    def _sync(self, stream: int, body: str, at: str) -> bool:
        """A record, a wait, a switch that waits, or a ``record_stream`` line."""
        b, g = self.b, self.g
        if (m := g.record.match(body)) is not None:
            name, old = m.groups()
            if name is not None:
                event = self.record_ids[name] = 2 * len(self.record_ids) + 1
            else:
                event = 2 * int(old)
            b.stream_op("record_event", stream, body, event)
        elif (m := g.wait.match(body)) is not None:
            b.stream_op("wait_event", stream, body, self._waited(m.groups(), at))
        elif (m := g.switch.match(body)) is not None:
            b.stream_op("set_stream", stream, "switch", to_stream=stream)
            b.text[b.steps[-1].node] = None
            for found in g.switch_event.finditer(m.group(1)):
                label = f"wait {found.group(0)}"
                b.stream_op("wait_event", stream, label, self._waited(found.groups(), at))
        elif (m := _RECORD_STREAM.match(body)) is not None:
            tensor, to = m.groups()
            b.stream_op("record_stream", stream, body, to_stream=_int(to, at), tensor=None)
            b.text[b.steps[-1].node] = tensor
        else:
            return False
        return True

    def _join(self, stream: int, body: str, at: str) -> bool:
        """A stream-wide join (``wait s1``) or host barrier (``synchronize``,
        ``synchronize s1``, ``synchronize @add_2``) line; False for any other line."""
        if (m := _WAIT_STREAM.match(body)) is not None:
            self.b.stream_op("wait_stream", stream, body, to_stream=_int(m.group(1), at))
            return True
        if (m := self.g.synchronize.match(body)) is None:
            return False
        to, name, old = m.groups()
        event = None if name is None and old is None else self._waited((name, old), at)
        to_stream = None if to is None else _int(to, at)
        self.b.stream_op("synchronize", stream, body, event, to_stream=to_stream)
        return True

    def _waited(self, groups: tuple[str | None, ...], at: str) -> int:
        """The event id of a wait (or a host barrier) on ``@name`` (a record line before it)
        or ``eK`` (format 1, and an event never recorded)."""
        name, old = groups
        if name is None:
            return 2 * int(str(old))
        if name not in self.record_ids:
            raise InvalidArgumentError(f"{at}: a wait on @{name} before any 'record @{name}'")
        return self.record_ids[name]


def _op_of(rhs: str) -> str:
    """The FX op of a node line's right-hand side: ``input`` is a graph input, ``self.w``
    (no call) a weight load, anything else a call."""
    if rhs == "input":
        return "placeholder"
    if rhs.startswith("self.") and "(" not in rhs:
        return "get_attr"
    return "call_function"


def parse_schedule(text: str, where: str = "the schedule") -> ParsedSchedule:
    """A schedule from its canonical text (`read_text`) or its JSON (``{`` first,
    `msched.pictures.json_doc.read_json`); ``where`` names it in errors.  Raises
    `msched.InvalidArgumentError` naming the line that cannot be read."""
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidArgumentError(f"{where}: invalid JSON ({error})") from None
        return read_json(doc, where)
    return read_text(text, where)


def parsed(
    obj: Schedule | GraphModule,
    cost_model: CostModel | None = None,
    *,
    dialect: Dialect | str | None = None,
) -> ParsedSchedule:
    """A `msched.Schedule` or scheduled ``GraphModule`` read through its canonical text (its
    stream ops in ``dialect``, as `render_text` reads them)."""
    return read_text(render_text(obj, cost_model, dialect=dialect), "the schedule")

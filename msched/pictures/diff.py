"""What changed between two schedules, in schedule terms: ``msched diff`` and snapshot failures.

`parse_schedule` reads a schedule back from its canonical text (`msched.pictures.text`, what
snapshots store; the text of event ids of earlier versions, ``record e7``, too; a stream-wide
join or host barrier that earlier versions printed as its op, ``w = streams.wait_stream(0, 1)``,
reads as a compute node, as it did then) or from its
JSON (`msched.pictures.json_doc`); `parsed` reads a `msched.Schedule` or a scheduled
``GraphModule`` through its canonical text.  `schedule_diff` compares two and returns the
summary lines, empty when they are the same schedule::

    + capture_0 on s1 (waits for add_tensor_2 on s0; joined by output)
    nodes 481 → 482, events 76 → 77, waits 100 → 101, makespan 810 → 810

- ``+ N on sK (...)`` / ``- N on sK (...)``: a node only the second / only the first schedule
  has; ``~ N s1 → s2 (...)``: a node that moved to another stream.  In parentheses: the
  records its stream waits for right before it (``waits for add_tensor_2 on s0``, named by
  the node each record follows; ``stream s1`` for a stream-wide join, ``wait s1`` in the
  text; ``after synchronize s1`` for a host barrier), and who is ordered after it among the
  nodes that read it on
  other streams and the exit (``joined by mm_3 on s2, output``; ``NOT joined by``: a race, or
  an exit that returns before it ran), from `msched.proof.clocks` run on the parsed program.
  The sync of such a node (the waits before it, the records after it and their waits, a
  record only its waits use) is not listed again.
- ``~ N reordered on sK: now after A (was after B)``: a node its stream issues in another
  order among the nodes both schedules run there.
- ``+ wait on s0 for capture_11 on s1, before output`` / ``- wait ...``: a wait only one
  schedule has; ``~ wait on s1 for P on s0: now before X (was before Y)``: one that moved.
  ``+ record @N on sK, waited on by nothing``: a record no wait uses.
  ``+ wait on s0 for stream s1, before output``: a stream-wide join only one schedule has
  (``wait s1`` in the text); ``+ synchronize s1 on s0, before add``: a host barrier;
  ``~ wait on s0 for stream s1: now before X (was before Y)``: one that moved.
  ``+ record_stream(t, s1) on s0, before N``: a ``record_stream`` only one schedule has.
- the last line: the counts and the makespan, before → after (``streams`` and
  ``lower bound`` when they changed; ``nodes`` when the count of nodes changed; how many
  nodes call their op with other arguments, which the lines above do not list).

Records are matched by place, not name: the k-th record on a stream after the last node
that both schedules run on that stream, so a node inserted before a record (which renames it
to ``@new_node``) leaves the record and its waits matched.  Waits are matched by stream,
record, and the next node both schedules run on that stream after the wait.

`snapshot_summary` is what a failing snapshot comparison shows first: the counts line of
`schedule_diff` of the stored and the received text, then its changes cut to a few lines;
empty when either text cannot be read.  A weight load (``get_attr``) printed on another lane
is no moved node: it runs no kernel.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from torch.fx import Graph, GraphModule, Node

from msched.analysis.cost import CostModel
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError
from msched.pictures.labels import format_number
from msched.pictures.naming import ENTRY, event_names
from msched.pictures.text import render_text
from msched.proof.clocks import Clocks, clocks_of
from msched.proof.dialects import Step, StreamProgram
from msched.scheduling.pipeline import Schedule

__all__ = [
    "ParsedSchedule",
    "parse_schedule",
    "parsed",
    "same_schedule",
    "schedule_diff",
    "snapshot_summary",
]

ARROW = "→"
_HEADER_COUNTS = re.compile(r"# streams (\d+), events (\d+), waits (\d+)$")
_HEADER_TIMES = re.compile(r"# makespan (\S+), lower bound (\S+)$")
_LANE = re.compile(r"s(\d+) *\| (.*)$")
_COMPUTE = re.compile(r"([A-Za-z_]\w*) = (.*)$")
_RECORD = re.compile(r"record (?:@(\S+)|e(\d+))$")
_WAIT = re.compile(r"wait (?:@(\S+)|e(\d+)(?: \(unrecorded\))?)$")
_SWITCH = re.compile(r"switch, wait ((?:(?:@\S+|e\d+(?: \(unrecorded\))?)(?: |$))+)$")
_SWITCH_EVENT = re.compile(r"@(\S+)|e(\d+)(?: \(unrecorded\))?")
_RECORD_STREAM = re.compile(r"record_stream\((.*), s(\d+)\)$")
_WAIT_STREAM = re.compile(r"wait s(\d+)$")
_SYNCHRONIZE = re.compile(r"synchronize(?: (?:s(\d+)|@(\S+)|e(\d+)(?: \(unrecorded\))?))?$")
_IDENT = re.compile(r"(?<![\w.'\"])([A-Za-z_]\w*)(?!\s*=[^=])(?![\w'\"])")
_MAX_NAMED = 4  # dependents named in a node's line before "and N more"
JOINS = ("wait_stream", "synchronize")  # the steps that join a whole stream (or every stream)


def _marker(*args: Any) -> None:
    """The target of the nodes of a parsed program (never called)."""


@dataclass(frozen=True)
class ParsedSchedule:
    """A schedule read back from its canonical text or JSON.

    ``program`` is its stream program with one FX node per line (`msched.proof.clocks` runs
    on it); ``name_of`` the node name (compute nodes) or stream-op label of each of its nodes;
    ``record_name[r]`` the stable name of record ``r`` and ``binding[w]`` the record wait
    ``w`` binds to (`msched.proof.clocks.Clocks.binding`, also for waits after ``output``: the
    record they would bind to); ``text`` the right-hand side of each compute node's line
    (``aten.mm.default(a, b)``) and the tensor of each ``record_stream`` (None when read from
    JSON, which keeps neither) and ``reads`` the nodes a compute node names as arguments.
    Header values are kept as printed.
    """

    num_streams: int
    num_events: int
    num_waits: int
    makespan: str
    lower_bound: str
    program: StreamProgram
    clocks: Clocks
    name_of: dict[Node, str]
    record_name: dict[Node, str]
    binding: dict[Node, Node | None]
    text: dict[Node, str | None]
    reads: dict[Node, tuple[Node, ...]]

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.program.steps

    def compute(self) -> dict[str, Step]:
        """Every compute step (graph inputs and ``output`` included) by node name."""
        return {self.name_of[s.node]: s for s in self.steps if s.kind == "compute"}


# ---------------------------------------------------------------------------------------------
# Reading.


class _Builder:
    """Steps of a parsed program, one FX node each."""

    def __init__(self) -> None:
        self.graph = Graph()
        self.steps: list[Step] = []
        self.name_of: dict[Node, str] = {}
        self.text: dict[Node, str | None] = {}
        self.by_name: dict[str, Node] = {}
        self.output: Node | None = None
        self.pending_reads: dict[Node, list[str]] = {}

    def compute(self, name: str, stream: int, kind: str, text: str | None, where: str) -> None:
        if name in self.by_name:
            raise InvalidArgumentError(f"{where}: node {name!r} appears twice")
        if kind == "output":
            if self.output is not None:
                raise InvalidArgumentError(f"{where}: a second output")
            node = self.graph.create_node("output", "output", (None,))
            self.output = node
        else:
            op = kind if kind in ("placeholder", "get_attr") else "call_function"
            node = self.graph.create_node(op, _marker if op == "call_function" else name)
        node.name = name  # as the text has it (FX would make some names unique otherwise)
        self.by_name[name] = node
        self.name_of[node] = name
        self.text[node] = text
        if text is not None:
            self.pending_reads[node] = _argument_names(text)
        self.steps.append(Step(node, "compute", stream))

    def stream_op(
        self, kind: str, stream: int, label: str, event: int | None = None, **more: Any
    ) -> Node:
        node = self.graph.create_node("call_function", _marker)
        self.name_of[node] = label
        self.steps.append(Step(node, kind, stream, event, **more))
        return node

    def finish(self, where: str) -> tuple[StreamProgram, dict[Node, tuple[Node, ...]]]:
        if self.output is None:
            raise InvalidArgumentError(f"{where}: no output line")
        highest = max((s.stream for s in self.steps), default=0)
        for step in self.steps:
            if step.to_stream is not None:
                highest = max(highest, step.to_stream)
        stream_of = {s.node: s.stream for s in self.steps}
        program = StreamProgram(tuple(self.steps), stream_of, highest + 1, self.output)
        reads = {
            node: tuple(self.by_name[n] for n in names if n in self.by_name)
            for node, names in self.pending_reads.items()
        }
        return program, reads


def _argument_names(rhs: str) -> list[str]:
    """The identifiers ``rhs`` uses as values (``aten.mm.default(a, b)`` -> ``a``, ``b``;
    ``x.mul(y)`` -> ``x``, ``y``; keyword names and op names left out)."""
    if rhs == "input" or rhs.startswith("self."):
        return []
    head, paren, args = rhs.partition("(")
    found = [head.split(".")[0]] if paren and "." in head else []  # x.mul(y) reads x
    found += _IDENT.findall(args if paren else rhs)
    return list(dict.fromkeys(found))


def _int(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidArgumentError(f"{where}: expected an integer, got {text!r}") from None


def _finish(b: _Builder, head: tuple[int, int, int, str, str], where: str) -> ParsedSchedule:
    program, reads = b.finish(where)
    clocks = clocks_of(program)
    names = event_names(program, clocks)
    by_record_name = {name: record.node for record, name in names.records.items()}
    binding: dict[Node, Node | None] = {}
    for step in program.steps:
        if step.kind == "wait_event" or (step.kind == "synchronize" and step.event is not None):
            name = names.waits.get(step)
            binding[step.node] = by_record_name.get(name) if name is not None else None
    return ParsedSchedule(
        *head,
        program=program,
        clocks=clocks,
        name_of=b.name_of,
        record_name={record.node: name for record, name in names.records.items()},
        binding=binding,
        text=b.text,
        reads=reads,
    )


def _parse_text(text: str, where: str) -> ParsedSchedule:
    lines = text.splitlines()
    if len(lines) < 2:
        raise InvalidArgumentError(f"{where}: not a schedule (no '# streams ...' header)")
    counts, times = _HEADER_COUNTS.match(lines[0]), _HEADER_TIMES.match(lines[1])
    if counts is None or times is None:
        raise InvalidArgumentError(
            f"{where}: not a schedule: it starts with {lines[0][:60]!r}, not "
            "'# streams S, events E, waits W' and '# makespan M, lower bound L'"
        )
    streams, events, waits = (int(g) for g in counts.groups())
    head = (streams, events, waits, times.group(1), times.group(2))
    b = _Builder()
    record_ids: dict[str, int] = {}  # "@name" of a record line -> its event id in the program
    for number, line in enumerate(lines[2:], start=3):
        at = f"{where}, line {number}"
        if not line.strip():
            continue
        lane = _LANE.match(line)
        if lane is None:
            raise InvalidArgumentError(f"{at}: expected 'sN | ...', got {line[:60]!r}")
        stream, body = int(lane.group(1)), lane.group(2).lstrip(" ")
        _parse_line(b, stream, body, at, record_ids)
    return _finish(b, head, where)


def _parse_line(
    b: _Builder,
    stream: int,
    body: str,
    at: str,
    record_ids: dict[str, int],
) -> None:
    # Event ids of the parsed program: 2k for ``eK`` of old texts, odd ids for named records.
    if (m := _COMPUTE.match(body)) is not None:
        name, rhs = m.groups()
        kind = (
            "placeholder"
            if rhs == "input"
            else "get_attr"
            if rhs.startswith("self.") and ("(" not in rhs)
            else "compute"
        )
        b.compute(name, stream, kind, rhs, at)
    elif body.startswith("output(") and body.endswith(")"):
        b.compute("output", stream, "output", body, at)
    elif (m := _RECORD.match(body)) is not None:
        name, old = m.groups()
        if name is not None:
            event = record_ids[name] = 2 * len(record_ids) + 1
        else:
            event = 2 * int(old)
        b.stream_op("record_event", stream, body, event)
    elif (m := _WAIT.match(body)) is not None:
        b.stream_op("wait_event", stream, body, _waited(m.groups(), at, record_ids))
    elif (m := _SWITCH.match(body)) is not None:
        b.stream_op("set_stream", stream, "switch", to_stream=stream)
        b.text[b.steps[-1].node] = None
        for found in _SWITCH_EVENT.finditer(m.group(1)):
            label = f"wait {found.group(0)}"
            b.stream_op("wait_event", stream, label, _waited(found.groups(), at, record_ids))
    elif (m := _RECORD_STREAM.match(body)) is not None:
        tensor, to = m.groups()
        b.stream_op("record_stream", stream, body, to_stream=_int(to, at), tensor=None)
        b.text[b.steps[-1].node] = tensor
    elif not _parse_join(b, stream, body, at, record_ids):
        raise InvalidArgumentError(f"{at}: cannot read {body[:60]!r}")


def _parse_join(b: _Builder, stream: int, body: str, at: str, record_ids: dict[str, int]) -> bool:
    """Read a stream-wide join (``wait s1``) or host barrier (``synchronize``,
    ``synchronize s1``, ``synchronize @add_2``) line; False for any other line."""
    if (m := _WAIT_STREAM.match(body)) is not None:
        b.stream_op("wait_stream", stream, body, to_stream=_int(m.group(1), at))
        return True
    if (m := _SYNCHRONIZE.match(body)) is None:
        return False
    to, name, old = m.groups()
    event = None if name is None and old is None else _waited((name, old), at, record_ids)
    b.stream_op("synchronize", stream, body, event, to_stream=None if to is None else _int(to, at))
    return True


def _waited(groups: tuple[str | None, ...], at: str, record_ids: dict[str, int]) -> int:
    """The event id of a wait (or a host barrier) on ``@name`` (a record line before it) or
    ``eK`` (old texts, and an event never recorded before)."""
    name, old = groups
    if name is None:
        return 2 * int(str(old))
    if name not in record_ids:
        raise InvalidArgumentError(f"{at}: a wait on @{name} before any 'record @{name}'")
    return record_ids[name]


def _parse_json(doc: Any, where: str) -> ParsedSchedule:
    if not isinstance(doc, dict) or doc.get("format") != "msched-schedule/1":
        raise InvalidArgumentError(f"{where}: not an msched-schedule/1 JSON document")
    try:
        head = (
            int(doc["streams"]),
            int(doc["num_events"]),
            int(doc["num_waits"]),
            _number_text(doc["makespan"]),
            _number_text(doc["lower_bound"]),
        )
        b = _Builder()
        previous: dict[str, Any] = {}
        for k, item in enumerate(doc["nodes"]):
            if _waits_in_switch(previous, item):  # the text's 'switch, wait ...' line
                b.stream_op("set_stream", int(item["stream"]), "switch", to_stream=item["stream"])
                b.text[b.steps[-1].node] = None
            _json_node(b, item, f"{where}, nodes[{k}]")
            previous = item
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidArgumentError(f"{where}: malformed schedule JSON ({error!r})") from None
    return _finish(b, head, where)


def _waits_in_switch(previous: dict[str, Any], item: dict[str, Any]) -> bool:
    """Whether ``item`` is the first wait of the switch ``previous`` (one node, two entries)."""
    return (
        item["kind"] == "wait_event"
        and previous.get("kind") == "set_stream"
        and previous.get("name") == item["name"]
    )


def _json_node(b: _Builder, item: dict[str, Any], at: str) -> None:
    kind, stream, name = item["kind"], int(item["stream"]), str(item["name"])
    if kind in ("compute", "host"):  # the text prints a host-only stream op as its node
        op = item["op"]
        node_kind = "output" if op == "output" else op if op in ("placeholder", "get_attr") else ""
        b.compute(name, stream, node_kind or "compute", None, at)
    elif kind in ("record_event", "wait_event"):
        b.stream_op(kind, stream, name, 2 * int(item["arg"]))
    elif kind == "record_stream":
        to = int(item["arg"])
        b.stream_op(kind, stream, f"record_stream(?, s{to})", to_stream=to)
        b.text[b.steps[-1].node] = None
    elif kind == "wait_stream":
        b.stream_op(kind, stream, name, to_stream=int(item["arg"]))
    elif kind == "synchronize":
        arg = None if item["arg"] is None else int(item["arg"])
        if "event_name" in item:  # on an event, named as the text names it
            shown = item["event_name"] or f"e{arg} (unrecorded)"
            b.stream_op(kind, stream, f"synchronize {shown}", 2 * int(item["arg"]))
        else:
            label = "synchronize" if arg is None else f"synchronize s{arg}"
            b.stream_op(kind, stream, label, to_stream=arg)
    elif kind != "set_stream":
        raise ValueError(f"unknown node kind {kind!r}")


def _number_text(x: Any) -> str:
    return format_number(float(x))


def parse_schedule(text: str, where: str = "the schedule") -> ParsedSchedule:
    """A schedule from its canonical text or its JSON (``{`` first); ``where`` names it in
    errors.  Raises `msched.InvalidArgumentError` naming the line that cannot be read."""
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as error:
            raise InvalidArgumentError(f"{where}: invalid JSON ({error})") from None
        return _parse_json(doc, where)
    return _parse_text(text, where)


def parsed(obj: Schedule | GraphModule, cost_model: CostModel | None = None) -> ParsedSchedule:
    """A `msched.Schedule` or scheduled ``GraphModule`` read through its canonical text."""
    return _parse_text(render_text(obj, cost_model), "the schedule")


# ---------------------------------------------------------------------------------------------
# Comparing.


class _Side:
    """One schedule of the pair, read with what the pair has in common.

    ``common`` names the compute nodes both schedules run on the same stream; records are
    keyed by their place among them (`records`), waits and record_streams by the next of them
    on their stream.
    """

    def __init__(self, p: ParsedSchedule, common: frozenset[str]) -> None:
        self.p = p
        self.common = common
        self.compute = p.compute()
        self.index = {step.node: k for k, step in enumerate(p.steps)}
        self.step_of = {step.node: step for step in p.steps}
        self.next_compute: dict[Node, Node | None] = {}
        self.next_common: dict[Node, str | None] = {}
        ahead: dict[int, Node] = {}
        ahead_common: dict[int, str] = {}
        for step in reversed(p.steps):
            if step.kind == "compute":
                ahead[step.stream] = step.node
                if self.is_common(step.node):
                    ahead_common[step.stream] = self.name(step.node)
            else:
                self.next_compute[step.node] = ahead.get(step.stream)
                self.next_common[step.node] = ahead_common.get(step.stream)
        self.waits_of: dict[Node, list[Node]] = {}
        for wait, record in p.binding.items():
            if record is not None:
                self.waits_of.setdefault(record, []).append(wait)
        self.users: dict[Node, list[Node]] = {}
        for user, reads in p.reads.items():
            for read in reads:
                self.users.setdefault(read, []).append(user)

    def name(self, node: Node) -> str:
        return self.p.name_of[node]

    def stream(self, node: Node) -> int:
        return self.p.program.stream_of[node]

    def is_common(self, node: Node) -> bool:
        return self.name(node) in self.common

    def records(self) -> dict[Node, tuple[int, str | None, int]]:
        """Each record's place: (stream, last common compute node of its stream before it,
        how many records came at that place so far)."""
        last: dict[int, str] = {}
        seen: Counter[tuple[int, str | None]] = Counter()
        keys = {}
        for step in self.p.steps:
            if step.kind == "compute" and self.is_common(step.node):
                last[step.stream] = self.name(step.node)
            elif step.kind == "record_event":
                place = (step.stream, last.get(step.stream))
                seen[place] += 1
                keys[step.node] = (*place, seen[place])
        return keys

    def keyed(
        self, kinds: tuple[str, ...], key_of: Callable[[Step], tuple[object, ...]]
    ) -> dict[Node, Any]:
        """``key_of`` of every step of one of ``kinds``, equal keys numbered in host order."""
        seen: Counter[tuple[object, ...]] = Counter()
        out: dict[Node, Any] = {}
        for step in self.p.steps:
            if step.kind in kinds:
                key = key_of(step)
                seen[key] += 1
                out[step.node] = (*key, seen[key])
        return out

    def stream_ops_before(self, node: Node) -> list[Step]:
        """The stream ops between ``node`` and the previous compute node of its stream."""
        steps, s = self.p.steps, self.stream(node)
        found = []
        for step in reversed(steps[: self.index[node]]):
            if step.stream != s:
                continue
            if step.kind == "compute":
                break
            found.append(step)
        return found[::-1]

    def records_after(self, node: Node) -> list[Node]:
        """The records right after ``node`` on its stream (before its next compute node)."""
        steps, s = self.p.steps, self.stream(node)
        found = []
        for step in steps[self.index[node] + 1 :]:
            if step.stream != s:
                continue
            if step.kind == "compute":
                break
            if step.kind == "record_event":
                found.append(step.node)
        return found

    def own_sync(self, node: Node) -> set[Node]:
        """The stream ops that are ``node``'s: the waits and record_streams right before it,
        the records right after it and their waits."""
        own = {step.node for step in self.stream_ops_before(node)}
        for record in self.records_after(node):
            own.add(record)
            own.update(self.waits_of.get(record, ()))
        return own

    def anchor(self, record: Node | None) -> str:
        """``add_tensor_2 on s0`` / ``the entry of s1``: what a record follows."""
        if record is None:
            return "an unrecorded event"
        base = self.p.record_name[record][1:].split("#")[0]
        if base.startswith(f"{ENTRY}.s"):
            return f"the entry of {base[len(ENTRY) + 1 :]}"
        return f"{base} on s{self.stream(record)}"

    def waited(self, wait: Step) -> str:
        """What a wait before a node waits for: ``a on s0`` (a record), ``stream s1``."""
        if wait.kind == "wait_stream":
            return f"stream s{wait.to_stream}"
        return self.anchor(self.p.binding[wait.node])

    def join_text(self, op: Node) -> str:
        """``wait on s0 for stream s1`` / ``synchronize s1 on s0``: a join, where it stands."""
        step = self.step_of[op]
        if step.kind == "wait_stream":
            return f"wait on s{step.stream} for stream s{step.to_stream}"
        return f"{self.name(op)} on s{step.stream}"

    def before(self, op: Node) -> str:
        user = self.next_compute[op]
        return f"before {self.name(user)}" if user is not None else "last on its stream"

    def node_line(self, head: str, node: Node) -> str:
        """``head (waits for ...; joined by ...)`` for a compute node."""
        if node.op in INPUT_OPS or node is self.p.program.output:
            return head
        if node not in self.p.clocks.stamp:
            return f"{head} (after output: it never runs)"
        parts = []
        before = self.stream_ops_before(node)
        waits = [self.waited(st) for st in before if st.kind in ("wait_event", "wait_stream")]
        if waits:
            parts.append("waits for " + ", ".join(waits))
        barriers = [self.name(st.node) for st in before if st.kind == "synchronize"]
        if barriers:
            parts.append("after " + ", ".join(barriers))
        parts += self.joins(node)
        return f"{head} ({'; '.join(parts)})" if parts else head

    def joins(self, node: Node) -> list[str]:
        """Who is ordered after ``node`` among its readers on other streams and the exit."""
        clocks, s = self.p.clocks, self.stream(node)
        joined: list[str] = []
        not_joined: list[str] = []
        for user in self.users.get(node, ()):
            if self.stream(user) == s or user not in clocks.stamp:
                continue
            label = "output" if user is self.p.program.output else self.name(user)
            label += "" if label == "output" else f" on s{self.stream(user)}"
            (joined if clocks.happens_before(node, user) else not_joined).append(label)
        out = self.p.program.output
        implied = any(self.stream(u) == self.stream(out) for u in self.users.get(node, ()))
        if self.stream(out) != s and "output" not in joined + not_joined:
            if not clocks.exit_happens_after(node):
                not_joined.append("output")
            elif not (implied and joined):  # a reader on output's stream joined it first
                joined.append("output")
        parts = []
        if joined:
            parts.append("joined by " + _some(joined))
        if not_joined:
            parts.append("NOT joined by " + _some(not_joined))
        return parts


def _some(names: list[str]) -> str:
    if len(names) <= _MAX_NAMED:
        return ", ".join(names)
    return ", ".join(names[:_MAX_NAMED]) + f" and {len(names) - _MAX_NAMED} more"


def _unmatched(keys: dict[Node, Any], other: dict[Node, Any]) -> list[Node]:
    theirs = set(other.values())
    return [node for node, key in keys.items() if key not in theirs]


class _Diff:
    """The comparison of schedule ``a`` (before) with schedule ``b`` (after)."""

    def __init__(self, a: ParsedSchedule, b: ParsedSchedule) -> None:
        ca, cb = a.compute(), b.compute()
        common = frozenset(n for n in ca.keys() & cb.keys() if ca[n].stream == cb[n].stream)
        self.a, self.b = _Side(a, common), _Side(b, common)
        self.added = [n for n in cb if n not in ca]
        self.removed = [n for n in ca if n not in cb]
        # A weight load (get_attr) runs no kernel: the lane it is printed on says nothing.
        self.moved = [
            n
            for n in cb
            if n in ca and ca[n].stream != cb[n].stream and cb[n].node.op != "get_attr"
        ]
        ra, rb = self.a.records(), self.b.records()
        place_b = {key: node for node, key in rb.items()}
        pair: dict[Node, object] = {}  # record of either side -> the place both share
        for node, key in ra.items():
            if key in place_b:
                pair[node] = pair[place_b[key]] = key
        self.records_a = [r for r in ra if r not in pair]
        self.records_b = [r for r in rb if r not in pair]
        tensors = all(_tensors_known(p) for p in (a, b))
        wa, wb = (self._waits(side, pair) for side in (self.a, self.b))
        sa, sb = (self._record_streams(side, tensors) for side in (self.a, self.b))
        self.wait_keys = {**wa, **wb}
        self.waits_a, self.waits_b = _unmatched(wa, wb), _unmatched(wb, wa)
        self.rs_a, self.rs_b = _unmatched(sa, sb), _unmatched(sb, sa)
        ja, jb = (self._joins(side, pair) for side in (self.a, self.b))
        self.join_keys = {**ja, **jb}
        self.joins_a, self.joins_b = _unmatched(ja, jb), _unmatched(jb, ja)

    @staticmethod
    def _waits(side: _Side, pair: dict[Node, object]) -> dict[Node, Any]:
        def key(step: Step) -> tuple[object, ...]:
            record = side.p.binding[step.node]
            place = None if record is None else pair.get(record, ("only here", record))
            return (step.stream, place, side.next_common[step.node])

        return side.keyed(("wait_event",), key)

    @staticmethod
    def _record_streams(side: _Side, tensors: bool) -> dict[Node, Any]:
        def key(step: Step) -> tuple[object, ...]:
            tensor = side.p.text[step.node] if tensors else None
            return (step.stream, step.to_stream, tensor, side.next_common[step.node])

        return side.keyed(("record_stream",), key)

    @staticmethod
    def _joins(side: _Side, pair: dict[Node, object]) -> dict[Node, Any]:
        """Stream-wide joins and host barriers, keyed by what they wait for (``key[0]``) and
        the next common node of their stream."""

        def key(step: Step) -> tuple[object, ...]:
            place: object = None
            if step.event is not None:
                record = side.p.binding[step.node]
                place = "unrecorded" if record is None else pair.get(record, ("only", record))
            what = (step.stream, step.kind, step.to_stream, place)
            return (what, side.next_common[step.node])

        return side.keyed(JOINS, key)

    def lines(self) -> list[str]:
        own_a: set[Node] = set()
        own_b: set[Node] = set()
        out = []
        for name in self.added:
            node = self.b.compute[name].node
            own_b |= self.b.own_sync(node)
            out.append(self.b.node_line(f"+ {name} on s{self.b.stream(node)}", node))
        for name in self.removed:
            node = self.a.compute[name].node
            own_a |= self.a.own_sync(node)
            out.append(self.a.node_line(f"- {name} on s{self.a.stream(node)}", node))
        for name in self.moved:
            was, node = self.a.compute[name].node, self.b.compute[name].node
            own_a |= self.a.own_sync(was)
            own_b |= self.b.own_sync(node)
            head = f"~ {name} s{self.a.stream(was)} {ARROW} s{self.b.stream(node)}"
            out.append(self.b.node_line(head, node))
        out += self._reorder_lines()
        return out + self._sync_lines(own_a, own_b)

    def _reorder_lines(self) -> list[str]:
        out = []
        for s in range(max(self.a.p.num_streams, self.b.p.num_streams)):
            seq_a, seq_b = _common_on(self.a, s), _common_on(self.b, s)
            if seq_a == seq_b:
                continue
            was_after = {n: (seq_a[i - 1] if i else "(first)") for i, n in enumerate(seq_a)}
            matcher = SequenceMatcher(None, seq_a, seq_b, autojunk=False)
            for tag, _, _, j1, j2 in matcher.get_opcodes():
                if tag not in ("insert", "replace"):
                    continue
                for j in range(j1, j2):
                    now = seq_b[j - 1] if j else "(first)"
                    out.append(
                        f"~ {seq_b[j]} reordered on s{s}: now after {now} "
                        f"(was after {was_after[seq_b[j]]})"
                    )
        return out

    def _sync_lines(self, own_a: set[Node], own_b: set[Node]) -> list[str]:
        for side, records, own in (
            (self.a, self.records_a, own_a),
            (self.b, self.records_b, own_b),
        ):
            for record in records:  # a record only some node's own waits use is its too
                waits = side.waits_of.get(record, [])
                if waits and all(w in own for w in waits):
                    own.add(record)
        waits_a = [w for w in self.waits_a if w not in own_a]
        waits_b = [w for w in self.waits_b if w not in own_b]
        out = self._moved_waits(waits_a, waits_b)
        out += self._join_lines(own_a, own_b)
        for sign, side, waits in (("+", self.b, waits_b), ("-", self.a, waits_a)):
            for w in waits:
                out.append(
                    f"{sign} wait on s{side.stream(w)} for {side.anchor(side.p.binding[w])}, "
                    f"{side.before(w)}"
                )
        for sign, side, records, own in (
            ("+", self.b, self.records_b, own_b),
            ("-", self.a, self.records_a, own_a),
        ):
            for r in records:
                if r not in own and not side.waits_of.get(r):
                    out.append(
                        f"{sign} record {side.p.record_name[r]} on s{side.stream(r)}, "
                        "waited on by nothing"
                    )
        for sign, side, ops, own in (
            ("+", self.b, self.rs_b, own_b),
            ("-", self.a, self.rs_a, own_a),
        ):
            for op in ops:
                if op not in own:
                    out.append(f"{sign} {side.name(op)} on s{side.stream(op)}, {side.before(op)}")
        return out

    def _join_lines(self, own_a: set[Node], own_b: set[Node]) -> list[str]:
        """The stream-wide joins and host barriers only one side has (the sync of an added,
        removed or moved node left out), or that moved: ``+ wait on s0 for stream s1, before
        output``, ``~ synchronize s1 on s0: now before add (was before mul)``."""
        joins_a = [j for j in self.joins_a if j not in own_a]
        joins_b = [j for j in self.joins_b if j not in own_b]
        out = []
        for jb in list(joins_b):
            ja = next((j for j in joins_a if self.join_keys[j][0] == self.join_keys[jb][0]), None)
            if ja is None:
                continue
            joins_a.remove(ja)
            joins_b.remove(jb)
            now, was = self.b.before(jb), self.a.before(ja)
            out.append(f"~ {self.b.join_text(jb)}: now {now} (was {was})")
        for sign, side, joins in (("+", self.b, joins_b), ("-", self.a, joins_a)):
            out += [f"{sign} {side.join_text(j)}, {side.before(j)}" for j in joins]
        return out

    def _moved_waits(self, waits_a: list[Node], waits_b: list[Node]) -> list[str]:
        """Pair (and take out) the unmatched waits of both sides that wait on one stream for
        one record: the wait moved."""
        out = []
        for wb in list(waits_b):
            kb = self.wait_keys[wb]
            wa = next((w for w in waits_a if self.wait_keys[w][:2] == kb[:2]), None)
            if wa is None or kb[1] is None:
                continue
            waits_a.remove(wa)
            waits_b.remove(wb)
            what = self.b.anchor(self.b.p.binding[wb])
            out.append(
                f"~ wait on s{self.b.stream(wb)} for {what}: now {self.b.before(wb)} "
                f"(was {self.a.before(wa)})"
            )
        return out

    def counts_line(self) -> str:
        a, b = self.a.p, self.b.p

        def change(what: str, x: object, y: object) -> str:
            return f"{what} {x} {ARROW} {y}"

        parts = []
        if a.num_streams != b.num_streams:
            parts.append(change("streams", a.num_streams, b.num_streams))
        if len(self.a.compute) != len(self.b.compute):
            parts.append(change("nodes", len(self.a.compute), len(self.b.compute)))
        parts += [
            change("events", a.num_events, b.num_events),
            change("waits", a.num_waits, b.num_waits),
            change("makespan", a.makespan, b.makespan),
        ]
        if a.lower_bound != b.lower_bound:
            parts.append(change("lower bound", a.lower_bound, b.lower_bound))
        line = ", ".join(parts)
        other, unread = self.other_arguments()
        if other:
            shown = ", ".join(other[:_NAMED]) + (", ..." if len(other) > _NAMED else "")
            many = "s" if len(other) != 1 else ""
            line += f"; {len(other)} node{many} with other arguments ({shown})"
        if unread:
            line += "; arguments not compared (a JSON schedule does not record them)"
        return line

    def other_arguments(self) -> tuple[list[str], bool]:
        """The nodes both schedules have that call their op with other arguments, in the
        second schedule's host order, and whether some node's arguments are unknown (JSON)."""
        changed: list[str] = []
        unread = False
        common = self.a.compute.keys() & self.b.compute.keys()
        for step in self.b.p.steps:
            name = self.b.name(step.node)
            if step.kind != "compute" or name not in common:
                continue
            ta = self.a.p.text[self.a.compute[name].node]
            tb = self.b.p.text[self.b.compute[name].node]
            if ta is None or tb is None:
                unread = unread or (ta is None) != (tb is None) or step.node.op not in INPUT_OPS
            elif ta != tb:
                changed.append(name)
        return changed, unread


# How many nodes with other arguments the counts line names.
_NAMED = 6


def _common_on(side: _Side, s: int) -> list[str]:
    """The common compute nodes of stream ``s`` in host order, graph inputs left out."""
    return [
        side.name(st.node)
        for st in side.p.steps
        if st.kind == "compute"
        and st.stream == s
        and st.node.op not in INPUT_OPS
        and side.is_common(st.node)
    ]


def _tensors_known(p: ParsedSchedule) -> bool:
    return all(p.text[s.node] is not None for s in p.steps if s.kind == "record_stream")


def _lines_of(p: ParsedSchedule, texts: bool) -> list[tuple[object, ...]]:
    """One entry per line of ``p``'s text (``texts``: with each compute node's arguments and
    each record_stream's tensor)."""
    out: list[tuple[object, ...]] = []
    for step in p.steps:
        node, s = step.node, step.stream
        if step.kind == "compute":
            out.append((s, p.name_of[node], p.text[node] if texts else None))
        elif step.kind == "record_event":
            out.append((s, "record", p.record_name[node]))
        elif step.kind == "wait_event":
            record = p.binding[node]
            out.append((s, "wait", None if record is None else p.record_name[record]))
        elif step.kind == "set_stream":
            continue  # a switch that waits is one line with its waits: the same sync
        elif step.kind in JOINS:  # a host barrier on an event: the record it binds to
            record = p.binding.get(node)
            bound = "unrecorded" if record is None else p.record_name[record]
            out.append((s, step.kind, step.to_stream, None if step.event is None else bound))
        else:
            out.append((s, step.kind, step.to_stream, p.text[node] if texts else None))
    return out


def same_schedule(a: ParsedSchedule, b: ParsedSchedule) -> bool:
    """Whether ``a`` and ``b`` print the same text (arguments and tensors compared where both
    know them: JSON does not keep them), up to how waits are grouped: ``switch, wait @a @b``
    is the same sync as ``wait @a`` and ``wait @b`` lines after a change of lane (the text of
    earlier versions, or a dialect without a switch that waits)."""
    texts = all(t is not None for p in (a, b) for t in p.text.values())
    head_a = (a.num_streams, a.num_events, a.num_waits, a.makespan, a.lower_bound)
    head_b = (b.num_streams, b.num_events, b.num_waits, b.makespan, b.lower_bound)
    return head_a == head_b and _lines_of(a, texts) == _lines_of(b, texts)


def schedule_diff(a: ParsedSchedule, b: ParsedSchedule) -> list[str]:
    """What changed from schedule ``a`` to schedule ``b``, one line each and the counts last;
    empty when they are the same schedule (`same_schedule`).  See the module docstring."""
    if same_schedule(a, b):
        return []
    d = _Diff(a, b)
    lines = d.lines()
    if not lines and not d.other_arguments()[0]:
        lines.append("host order differs: each stream runs the same nodes and sync in order")
    return [*lines, d.counts_line()]


def snapshot_summary(old: str, new: str, limit: int = 8) -> list[str]:
    """The lines a failing snapshot comparison shows first: the counts line of
    `schedule_diff` of the stored text ``old`` and the received text ``new`` (what a reviewer
    reads first, before pytest cuts a long message), then at most ``limit`` lines of changes
    (then ``... and N more changes (msched diff shows all)``).

    Empty when they are the same schedule or either text cannot be read; never raises.
    """
    try:
        a = parse_schedule(old, "the snapshot")
        b = parse_schedule(new, "the received schedule")
        lines = schedule_diff(a, b)
    except Exception:  # a summary must never hide the comparison it introduces
        return []
    if not lines:
        return []
    changes, counts = lines[:-1], lines[-1]
    if len(changes) > limit:
        rest = len(changes) - limit
        more = f"... and {rest} more change{'s' if rest != 1 else ''} (msched diff shows all)"
        changes = [*changes[:limit], more]
    return [counts, *changes]

"""What changed between two schedules, in schedule terms: ``msched diff`` and snapshot failures.

`schedule_diff` compares two schedules read back from their canonical text or JSON
(`msched.pictures.text.parse_schedule`, of any text version it reads; `parsed` reads a
`msched.Schedule` or a scheduled ``GraphModule`` through its canonical text) and returns the
summary lines, empty when they are the same schedule::

    + capture_0 on s1 (waits for add_tensor_2 on s0; joined by output)
    nodes 481 → 482, events 76 → 77, waits 100 → 101, makespan 810 → 810

What each line says, and how nodes, records and waits of the two schedules are matched, is
specified with the text format in ``docs/text-format.md`` ("The summary of a change"); who is
ordered after a node comes from `msched.proof.clocks` run on the parsed program.

`snapshot_summary` is what a failing snapshot comparison shows first: the counts line of
`schedule_diff` of the stored and the received text, then its changes cut to a few lines;
empty when either text cannot be read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from difflib import SequenceMatcher
from typing import Any

from torch.fx import Node

from msched.analysis.nodes import INPUT_OPS
from msched.pictures.naming import ENTRY
from msched.pictures.parsed import ParsedSchedule
from msched.pictures.text import parse_schedule
from msched.proof.program import Step

__all__ = [
    "same_schedule",
    "schedule_diff",
    "snapshot_summary",
]

ARROW = "→"
# How many names a line lists before it cuts the list short: the readers of a node that are
# (or are not) ordered after it (``joined by a, b, c, d and 2 more``), and the nodes the counts
# line names as called with other arguments (``(a, b, c, d, e, f, ...)``).
_READERS_SHOWN = 4
_OTHER_ARGUMENTS_SHOWN = 6
JOINS = ("wait_stream", "synchronize")  # the steps that join a whole stream (or every stream)


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
    if len(names) <= _READERS_SHOWN:
        return ", ".join(names)
    return ", ".join(names[:_READERS_SHOWN]) + f" and {len(names) - _READERS_SHOWN} more"


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
        self._claim_records(own_a, own_b)
        waits_a = [w for w in self.waits_a if w not in own_a]
        waits_b = [w for w in self.waits_b if w not in own_b]
        out = self._moved_waits(waits_a, waits_b)
        out += self._join_lines(own_a, own_b)
        return out + self._one_sided_lines(waits_a, waits_b, own_a, own_b)

    def _claim_records(self, own_a: set[Node], own_b: set[Node]) -> None:
        """Add to each side's ``own`` the records that only some node's own waits use."""
        for side, records, own in (
            (self.a, self.records_a, own_a),
            (self.b, self.records_b, own_b),
        ):
            for record in records:
                waits = side.waits_of.get(record, [])
                if waits and all(w in own for w in waits):
                    own.add(record)

    def _one_sided_lines(
        self, waits_a: list[Node], waits_b: list[Node], own_a: set[Node], own_b: set[Node]
    ) -> list[str]:
        """The waits, records and ``record_stream`` calls only one side has, the sync of an
        added or removed node left out: ``+ wait on s1 for ...``, ``- record ...``."""
        out = []
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
        if _memory_changed(a, b):
            parts.append(_memory_change(str(a.memory), str(b.memory)))
        line = ", ".join(parts)
        other, unread = self.other_arguments()
        if other:
            shown = ", ".join(other[:_OTHER_ARGUMENTS_SHOWN])
            shown += ", ..." if len(other) > _OTHER_ARGUMENTS_SHOWN else ""
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
        if step.kind in ("compute", "host"):
            out.append((s, step.kind, p.name_of[node], p.text[node] if texts else None))
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
    earlier versions, or a dialect without a switch that waits).  The memory lines are
    compared when both texts have one (texts written before the line existed have none)."""
    return a.summary == b.summary and not _memory_changed(a, b) and _same_lines(a, b)


def _memory_change(a: str, b: str) -> str:
    """``memory: reserved 4 MiB → 6 MiB, bound 4 MiB → 8 MiB``: the figures of the header's
    memory lines that changed (the whole lines when they do not read as figures)."""
    fa, fb = _memory_figures(a), _memory_figures(b)
    if fa.keys() != fb.keys():
        return f"memory {a} {ARROW} {b}"
    changed = [f"{k} {fa[k]} {ARROW} {fb[k]}" for k in fa if fa[k] != fb[k]]
    return "memory: " + ", ".join(changed)


def _memory_figures(text: str) -> dict[str, str]:
    """``allocated 2.5 KiB, reserved 4 MiB, ...`` as ``{"allocated": "2.5 KiB", ...}``."""
    figures = {}
    for part in text.split(", "):
        name, _, value = part.partition(" ")
        figures[name] = value
    return figures


def _memory_changed(a: ParsedSchedule, b: ParsedSchedule) -> bool:
    """Whether both headers show memory, and differently."""
    return a.memory is not None and b.memory is not None and a.memory != b.memory


def _same_lines(a: ParsedSchedule, b: ParsedSchedule) -> bool:
    """Whether ``a`` and ``b`` have the same lines after the header (see `same_schedule`)."""
    texts = all(_texts_known(p) for p in (a, b))
    return _lines_of(a, texts) == _lines_of(b, texts)


def _texts_known(p: ParsedSchedule) -> bool:
    """Whether ``p`` knows the text of every line `_lines_of` compares by text (a JSON
    schedule knows none)."""
    kinds = ("compute", "host", "record_stream")
    return all(p.text[s.node] is not None for s in p.steps if s.kind in kinds)


def schedule_diff(a: ParsedSchedule, b: ParsedSchedule) -> list[str]:
    """What changed from schedule ``a`` to schedule ``b``, one line each and the counts last;
    empty when they are the same schedule (`same_schedule`).  See the module docstring."""
    if same_schedule(a, b):
        return []
    d = _Diff(a, b)
    lines = d.lines()
    if not lines and not d.other_arguments()[0] and not _same_lines(a, b):
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

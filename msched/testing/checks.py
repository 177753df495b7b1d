"""Plain checks of scheduled graphs, shared by the pytest plugin and anyone else.

- `schedule_and_verify`: `msched.schedule`, then `msched.verify` against the original;
  `ScheduleCheck.failure` is the message a test fails with;
- `violation_message`: a `Report` and the lines of the scheduled graph around its violations;
- `excerpt`: those lines, in host order with the stream of every node; `streams_of`: the
  stream of every node;
- `exit_joins`: whether ``output`` happens after a node;
- `written_inputs`: the graph inputs a node writes, from `msched.analysis.effects` (so
  `msched.register_mutation` applies); `capture_columns`: its ``start``/``end`` arguments.

Nothing here imports pytest: the plugin's fixtures and assertion helpers wrap these.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule, Node

from msched.analysis.cost import CostModel
from msched.analysis.effects import compute_effects
from msched.errors import MschedError
from msched.pictures.text import node_text, step_text
from msched.proof.clocks import clocks_of
from msched.proof.dialects import interpret
from msched.proof.verifier import Report, verify
from msched.scheduling.pipeline import Schedule, schedule

#: Lines shown before and after each focus node of an `excerpt`.
RADIUS = 3
VERIFY_FAILED = "msched.verify found violations in the schedule:"


@dataclass(frozen=True)
class ScheduleCheck:
    """A schedule and its verification report (``None`` when it was not verified)."""

    schedule: Schedule
    report: Report | None

    @property
    def failure(self) -> str | None:
        """The message a test fails with: ``None`` unless verification found violations."""
        if self.report is None or self.report.ok:
            return None
        return f"{VERIFY_FAILED}\n{violation_message(self.schedule.gm, self.report)}"


def schedule_and_verify(
    gm: GraphModule,
    num_streams: int,
    cost_model: CostModel | None = None,
    *,
    strict: bool = True,
) -> ScheduleCheck:
    """`msched.schedule` ``gm`` (in place); with ``strict``, `msched.verify` it against
    ``Schedule.original``."""
    sched = schedule(gm, num_streams, cost_model)
    report = verify(sched.gm, original=sched.original) if strict else None
    return ScheduleCheck(sched, report)


def violation_message(gm: GraphModule, report: Report) -> str:
    """``report`` and the lines of ``gm`` around every node its violations involve."""
    involved = [n for v in report.violations for n in v.nodes]
    return f"{report}\n" + excerpt(gm, involved)


def exit_joins(gm: GraphModule, node: Node) -> bool:
    """Whether ``output`` happens after ``node``: the caller's stream has joined it when the
    graph returns (`msched.proof.clocks`, the happens-before of `msched.verify`)."""
    return clocks_of(interpret(gm)).exit_happens_after(node)


def written_inputs(gm: GraphModule, nodes: Iterable[Node]) -> dict[Node, tuple[Node, ...]]:
    """The placeholders each of ``nodes`` writes, in argument order, as msched's effects
    see them: schema writes, registered mutations, and every tensor an unknown op receives."""
    writes = compute_effects(gm.graph).writes
    return {n: tuple(s for s in writes.get(n, ()) if s.op == "placeholder") for n in nodes}


def capture_columns(node: Node) -> slice:
    """The columns (last dimension) ``node`` writes: its ``start``/``end`` arguments, bound
    by name through its schema (positional or keyword); all columns without them."""
    bound = _bound_args(node)
    return slice(bound.get("start"), bound.get("end"))


def _bound_args(node: Node) -> dict[str, Any]:
    schema = getattr(node.target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    bound = dict(zip(names, node.args, strict=False))
    bound.update(node.kwargs)
    return bound


# Excerpts ------------------------------------------------------------------------------------


def streams_of(gm: GraphModule) -> dict[Node, int]:
    """The stream every node of ``gm`` is issued on (empty when the graph cannot be read)."""
    try:
        return dict(interpret(gm).stream_of)
    except MschedError:
        return {}


@dataclass(frozen=True)
class _Line:
    node: Node
    stream: int  # -1: the graph's stream ops cannot be read
    text: str

    def render(self, marked: bool) -> str:
        lane = f"s{self.stream}" if self.stream >= 0 else "s?"
        indent = "  " * max(self.stream, 0)
        return f"  {'>' if marked else ' '} {lane} | {indent}{self.text}"


def _lines(gm: GraphModule) -> list[_Line]:
    """One line per step in host order, ``set_stream`` folded into the stream column."""
    try:
        steps = interpret(gm).steps
    except MschedError:
        return [_Line(node, -1, node_text(node)) for node in gm.graph.nodes]
    return [_Line(s.node, s.stream, step_text(s)) for s in steps if s.kind != "set_stream"]


def _windows(marked: list[int], size: int, radius: int) -> list[range]:
    windows: list[range] = []
    for i in marked:
        lo, hi = max(i - radius, 0), min(i + radius + 1, size)
        if windows and lo <= windows[-1].stop:
            windows[-1] = range(windows[-1].start, max(hi, windows[-1].stop))
        else:
            windows.append(range(lo, hi))
    return windows


def excerpt(gm: GraphModule, focus: Iterable[Node | str], radius: int = RADIUS) -> str:
    """The lines of ``gm`` within ``radius`` of each ``focus`` node (marked ``>``).

    Lines are in host (emission) order, one per node, with the stream the node is issued on
    as read by `msched.proof.dialects.interpret`, in the layout of the snapshot text::

          s0 |   mul_tensor_86 = aten.mul.Tensor(mul_tensor_85, final_ln)
        > s1 |   capture_11 = msched.inplace_slice_copy.default(dest=dest, ...)
          s0 | output(mul_tensor_86)

    Focus nodes are matched by name, so nodes of another copy of the graph work too.  Gaps
    between windows are shown as ``...``.  Streams read as ``s?`` when the graph's stream
    ops cannot be read.
    """
    names = {f if isinstance(f, str) else f.name for f in focus}
    lines = _lines(gm)
    marked = {i for i, line in enumerate(lines) if line.node.name in names}
    windows = _windows(sorted(marked), len(lines), radius)
    out: list[str] = []
    for window in windows:
        if out or window.start > 0:
            out.append("    ...")
        out += [lines[i].render(i in marked) for i in window]
    if windows and windows[-1].stop < len(lines):
        out.append("    ...")
    return "\n".join(out)

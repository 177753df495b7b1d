"""The report of ``msched demo``: a decoder stack scheduled on 1, 2 and 3 streams, verified.

`demo_lines` is the text the command prints for the rows it built (one `DemoRow` per stream
count): a table of counts, makespans and speed-ups, one decoder layer's lanes in host order,
and where each capture runs relative to ``output``; `demo_pictures` the files of ``--out``,
every picture of every row.  The CLI (`msched.cli`) builds, schedules and verifies the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch.fx import Node

from msched.analysis.cost import CostModel, op_category
from msched.models.decoders import DecoderStack
from msched.pictures.dot import render_dot
from msched.pictures.json_doc import render_json
from msched.pictures.labels import format_number
from msched.pictures.svg import render_svg
from msched.pictures.text import render_text, step_text
from msched.pictures.trace import render_perfetto
from msched.pictures.view import View, host_index, joining_wait, view_of
from msched.proof.memory import MemoryReport, format_bytes, sized_memory
from msched.proof.program import Step
from msched.scheduling.pipeline import Schedule

__all__ = [
    "DEMO_CAPTURES",
    "DEMO_LANE_LAYER",
    "DEMO_LAYERS",
    "DEMO_STREAMS",
    "DemoRow",
    "demo_lines",
    "demo_pictures",
    "layer_members",
]

# The demo's stack: 12 layers with MoE blocks, captures at 1, 5 and 11, on 1, 2 and 3 streams;
# the lanes shown are layer 5's.
DEMO_LAYERS, DEMO_CAPTURES = 12, (1, 5, 11)
DEMO_STREAMS, DEMO_LANE_LAYER = (1, 2, 3), 5
# Each picture of ``--out``: its renderer and the suffix of its file.
_PICTURES = {
    "txt": render_text,
    "json": render_json,
    "dot": render_dot,
    "trace.json": render_perfetto,
    "svg": render_svg,
}


@dataclass(frozen=True)
class DemoRow:
    """One stream count of the demo: the stack, its schedule under ``cost_model``, and whether
    it verified (``problems``: one line per violation)."""

    streams: int
    stack: DecoderStack
    schedule: Schedule
    cost_model: CostModel
    ok: bool
    problems: tuple[str, ...]


def demo_lines(rows: Sequence[DemoRow]) -> list[str]:
    """The lines ``msched demo`` prints for ``rows`` (the first one stream, the last the most),
    the problems of every row last."""
    last = rows[-1]
    last_view = view_of(last.schedule)
    layer = _layer_steps(last_view, layer_members(last.stack, DEMO_LANE_LAYER))
    caps = ", ".join(map(str, DEMO_CAPTURES))
    lines = [
        f"msched demo: {DEMO_LAYERS}-layer MoE decoder stack, Eagle3 captures of layers {caps} "
        "(the last layer included), table cost model",
        "",
        *_table_lines(rows),
        "",
        f"Layer {DEMO_LANE_LAYER} on {last.streams} streams, host order (lane and indentation = "
        "stream; s0 is the caller's stream):",
        *_compact_lines(last_view, layer),
        "",
        "Captures, relative to output (host step / step of output):",
        *_capture_lines(rows[1:]),
    ]
    for row in rows:
        lines += [f"{row.streams} streams: {p}" for p in row.problems]
    return lines


def demo_pictures(rows: Sequence[DemoRow]) -> dict[str, str]:
    """The files ``msched demo --out`` writes: every picture of every row, by file name."""
    return {
        f"demo-{row.streams}streams.{suffix}": render(row.schedule, row.cost_model)
        for row in rows
        for suffix, render in _PICTURES.items()
    }


#: The demo table's columns, and the width of each.
_TABLE = (
    ("streams", 8),
    ("nodes", 8),
    ("events", 8),
    ("waits", 8),
    ("makespan", 8),
    ("lower bound", 11),
    ("speed-up", 11),
    ("peak allocated", 16),
    ("reserved bound", 16),
    ("verified", 11),
)


def _table_lines(rows: Sequence[DemoRow]) -> list[str]:
    """The table: counts, times and speed-up against one stream; then the peak memory
    (allocated, and reserved under any timing) and its ratio to the unscheduled graph's
    (`msched.peak_memory`; ``-`` where the graph carries no sizes)."""
    base = rows[0].schedule.makespan
    original = _original_memory(rows[0].schedule)
    lines = ["  ".join(f"{h:>{w}}" for h, w in _TABLE)]
    for row in rows:
        s = row.schedule
        memory = _view_memory(row)
        cells = (
            row.streams,
            len(s.gm.graph.nodes),
            s.num_events,
            s.num_waits,
            format_number(s.makespan),
            format_number(s.lower_bound),
            f"{base / s.makespan:.2f}x" if s.makespan else "-",
            _memory_cell(memory, original, "allocated"),
            _memory_cell(memory, original, "reserved_bound"),
            "ok" if row.ok else f"FAILED ({len(row.problems)})",
        )
        lines.append("  ".join(f"{c:>{w}}" for c, (_, w) in zip(cells, _TABLE, strict=True)))
    return lines


def _view_memory(row: DemoRow) -> MemoryReport | None:
    return sized_memory(row.schedule.gm, dialect=row.schedule.dialect)


def _original_memory(sched: Schedule) -> MemoryReport | None:
    """The memory of the graph before it was scheduled (its host order, one stream)."""
    return sized_memory(sched.original)


def _memory_cell(memory: MemoryReport | None, original: MemoryReport | None, what: str) -> str:
    """``3.5 KiB 1.40x``: a peak and its ratio to the original's; ``-`` when unknown."""
    if memory is None:
        return "-"
    peak = getattr(memory, what)
    cell = format_bytes(peak)
    base = getattr(original, what) if original is not None else 0
    return f"{cell} {peak / base:.2f}x" if base else cell


def layer_members(stack: DecoderStack, layer: int) -> set[str]:
    """Names of the ops of decoder layer ``layer`` (its weights left out), capture included."""
    layer_of = stack.layer_of
    nodes = stack.gm.graph.nodes
    return {n.name for n in nodes if n.op == "call_function" and layer_of.get(n.name) == layer}


def _layer_steps(v: View, members: set[str]) -> list[Step]:
    """The host-order steps of a layer: its compute nodes, the waits right before them and
    the records right after them (on their stream)."""
    steps = v.program.steps
    keep: list[Step] = []
    last_compute: dict[int, bool] = {}
    pending: dict[int, list[Step]] = {}
    for step in steps:
        s = step.stream
        if step.kind == "compute":
            inside = step.node.name in members
            if inside:
                keep += pending.get(s, [])
                keep.append(step)
            pending[s], last_compute[s] = [], inside
        elif step.kind == "record_event" and last_compute.get(s):
            keep.append(step)
        elif step.kind == "wait_event":
            pending.setdefault(s, []).append(step)
    return keep


def _compact_lines(v: View, steps: list[Step]) -> list[str]:
    """Lane lines for the demo: compute nodes with kind and times, records and waits; a run of
    elementwise ops on one stream is folded into one line."""
    lines: list[str] = []
    run: list[Node] = []

    def flush() -> None:
        if run:
            s = v.program.stream_of[run[0]]
            many = f"{run[0].name} .. {run[-1].name}  ({len(run)} elementwise ops)"
            lines.append(f"s{s} | {'  ' * s}{run[0].name if len(run) == 1 else many}")
            run.clear()

    for step in steps:
        node = step.node
        if step.kind in ("set_stream", "record_stream"):
            continue
        if step.kind == "compute" and op_category(node) == "other":
            if run and v.program.stream_of[run[0]] != step.stream:
                flush()
            run.append(node)
            continue
        flush()
        text = step_text(step, v.names)
        if step.kind == "compute":
            times = f"{format_number(v.start[node])}-{format_number(v.finish[node])}"
            text = f"{node.name}  ({op_category(node)}, {times})"
        lines.append(f"s{step.stream} | {'  ' * step.stream}{text}")
    flush()
    return lines


def _capture_lines(rows: Sequence[DemoRow]) -> list[str]:
    """One line per (stream count, capture): its stream, host position and the joining wait."""
    lines = ["streams  capture     stream  host step  steps before output  joined on stream 0 by"]
    for row in rows:
        v = view_of(row.schedule)
        out_at = host_index(v, v.program.output)
        for cap in row.stack.captures:
            at, s = host_index(v, cap), v.program.stream_of[cap]
            wait = joining_wait(v, cap, 0)
            if s == 0:
                join = "(runs on stream 0)"
            elif wait is None:
                join = "NOTHING: output does not wait for it"
            else:
                join = f"{step_text(wait, v.names)} ({wait.node.name})"
            where = f"{at:>4}/{out_at:<4}  {out_at - at:>19}"
            lines.append(f"{row.streams:>7}  {cap.name:<10}  {s:>6}  {where}  {join}")
    return lines

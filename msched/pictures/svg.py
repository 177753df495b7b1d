"""A self-contained SVG Gantt chart of a schedule's timeline: one lane per stream."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch.fx import GraphModule, Node

from msched.analysis.cost import CostModel, op_category
from msched.analysis.nodes import INPUT_OPS
from msched.pictures.labels import counts, format_number, op_label, stream_title
from msched.pictures.text import memory_text, step_text
from msched.pictures.view import (
    Communication,
    StreamJoin,
    View,
    communications,
    exit_waits,
    stream_joins,
    view_of,
)
from msched.proof.dialects import Dialect
from msched.proof.memory import format_bytes
from msched.proof.program import Step
from msched.scheduling.pipeline import Schedule

__all__ = ["CATEGORY_COLOURS", "render_svg"]

# One colour per kind of `msched.analysis.cost.OP_CATEGORIES`, in its order (the legend's).
CATEGORY_COLOURS = {
    "matmul": "#56B4E9",
    "attention": "#0072B2",
    "moe": "#E69F00",
    "capture / in-place": "#D55E00",
    "comm": "#009E73",  # the communication bars' colour (`_COMM_STYLE`)
    "other": "#C8C8C8",
}
_DARK = ("attention", "capture / in-place", "comm")
_LEFT, _TOP, _LANE, _BOX, _CHAR = 130, 64, 46, 30, 6.1
_LEGEND_ROW = 18  # a second legend row: the stream-wide joins and host barriers
_BAND, _BAND_GAP = 48, 28  # the memory band under the lanes, and the room above it


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


def _frame(v: View, scale: float | None, legend_rows: int = 1, band: bool = False) -> _Frame:
    # At 6 px per unit a table-model matmul (10 units) is wide enough for a short label; very
    # long schedules are squeezed to 20 000 px so viewers still open them.
    span = max(v.makespan, 1e-9)
    if scale is None:
        scale = max(6.0, 1100.0 / span) if span * 6.0 <= 20000 else 20000.0 / span
    width = _LEFT + span * scale + 40
    height = _TOP + v.num_streams * _LANE + 70 + (legend_rows - 1) * _LEGEND_ROW
    height += _BAND + _BAND_GAP if band else 0
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
    cat = op_category(node)
    x, y, w = (
        f.x(start),
        f.lane_top(v.program.stream_of[node]) + (_LANE - _BOX) / 2,
        (end - start) * f.scale,
    )
    when = f"{format_number(start)}-{format_number(end)}"
    tip = f"{node.name} = {op_label(node)}; stream {v.program.stream_of[node]}, {when}"
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
            f'class="lanelabel">{_xml(stream_title(s))}</text>'
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
        rs = use.record.stream
        for wait in use.waits:
            cls = "link exitlink" if wait in joins else "link"
            tip = (
                f"e{use.event}: {use.record.node.name} on stream {rs} -> {wait.node.name} on "
                f"stream {wait.stream}"
            )
            out += _svg_link(f, (rs, v.start[use.record.node]), wait, v.start[wait.node], cls, tip)
    return out


def _svg_link(
    f: _Frame, source: tuple[int, float], wait: Step, at: float, cls: str, tip: str
) -> list[str]:
    """A curve from ``source`` (a stream and a time) to ``wait`` on its stream at ``at``."""
    (rs, t1), ws = source, wait.stream
    x1, x2 = f.x(t1), f.x(at)
    y1, y2 = f.lane_top(rs) + _LANE / 2, f.lane_top(ws) + _LANE / 2
    mid = (y1 + y2) / 2
    curve = f"M{x1:.1f},{y1:.1f} C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}"
    return [
        f'<path d="{curve}" class="{cls}"><title>{_xml(tip)}</title></path>',
        f'<circle cx="{x2:.1f}" cy="{y2:.1f}" r="2.5" class="waitdot"/>',
    ]


def _svg_joins(v: View, f: _Frame, joins: tuple[StreamJoin, ...]) -> list[str]:
    """A curve from each stream a ``wait_stream`` joins (where its last node issued before
    the join ends) to the waiting stream; a host barrier is a dotted line across every lane
    at its time, with a curve from each point it waits for."""
    out = []
    exits = set(exit_waits(v))
    for join in joins:
        step, at = join.step, v.start[join.step.node]
        what = f"{step_text(step, v.names)} ({step.node.name})"
        if step.kind == "synchronize":
            top, bottom = f.lane_top(0), f.lane_top(v.num_streams)
            tip = f"{what}: a host barrier; later work on every stream comes after it"
            out.append(
                f'<line x1="{f.x(at):.1f}" y1="{top}" x2="{f.x(at):.1f}" y2="{bottom}" '
                f'class="barrier"><title>{_xml(tip)}</title></line>'
            )
            for source in join.sources:
                out += _svg_link(f, source, step, at, "link barrierlink", tip)
            continue
        cls = "link joinlink exitlink" if step in exits else "link joinlink"
        for source in join.sources:
            tip = f"{what}: stream {step.stream} waits for all work issued on stream {source[0]}"
            out += _svg_link(f, source, step, at, cls, tip + " so far")
    return out


_SVG_STYLE = (
    "text{font-family:'DejaVu Sans',Helvetica,Arial,sans-serif}"
    ".label{font-size:10px}.tick{font-size:11px;fill:#333}.lanelabel{font-size:12px;font-weight:bold;fill:#222}"
    ".title{font-size:15px;font-weight:bold}.legend{font-size:11px;fill:#222}"
    ".grid{stroke:#000;stroke-opacity:.08}.exit{stroke:#C00000;stroke-width:2;stroke-dasharray:5,3}"
    ".exitlabel{font-size:11px;fill:#C00000;font-weight:bold}"
    ".link{fill:none;stroke:#333;stroke-opacity:.35;stroke-width:1}"
    ".exitlink{stroke:#C00000;stroke-opacity:.9;stroke-width:1.8}.waitdot{fill:#333;fill-opacity:.6}"
    ".violation{fill:none;stroke:#E00000;stroke-width:3}"
    ".violationlink{stroke:#E00000;stroke-width:2;stroke-dasharray:6,3}"
)
# Drawn only in pictures that have stream-wide joins or host barriers (msched's own have none).
_JOIN_STYLE = (
    ".joinlink{stroke-dasharray:4,2}"
    ".barrier{stroke:#6A3D9A;stroke-width:1.5;stroke-dasharray:2,2}.barrierlink{stroke:#6A3D9A}"
)


# Drawn only in pictures of graphs whose nodes carry sizes (the memory band).
_MEMORY_STYLE = (
    ".memband{fill:#F7F3EA}.memreserved{fill:#E69F00;fill-opacity:.35;stroke:#B07800}"
    ".memallocated{fill:none;stroke:#7A3E00;stroke-width:1.5}.memlabel{font-size:10px;fill:#333}"
)


def _svg_memory(v: View, f: _Frame, top: float) -> list[str]:
    """The memory band: under the lanes, the bytes the stream pools hold (``reserved``,
    filled) and the live tensor bytes (``allocated``, a line) after each node, at its start
    (`msched.peak_memory`'s curve), scaled to the peak; nothing without sizes."""
    m = v.memory
    if m is None:
        return []
    nodes = {node.name: node for node in v.start}
    points = sorted(
        (v.start[nodes[p.node]], p.step, p.allocated, p.reserved)
        for p in m.curve
        if p.node in nodes
    )
    peak = max(m.reserved, m.allocated, 1)

    def y(nbytes: float) -> float:
        return top + _BAND - nbytes * (_BAND - 6) / peak

    tip = f"memory: {memory_text(m)} (+ {format_bytes(m.baseline)} inputs and weights)"
    out = [
        f'<g class="memory"><title>{_xml(tip)}</title>'
        f'<rect x="{_LEFT}" y="{top}" width="{f.width - _LEFT - 20:.1f}" height="{_BAND}" '
        'class="memband"/>',
        f'<text x="{_LEFT - 10}" y="{top + _BAND / 2 + 4}" text-anchor="end" '
        'class="lanelabel">memory</text>',
    ]
    for column, cls in ((3, "memreserved"), (2, "memallocated")):
        d = f"M{f.x(0):.1f},{y(0):.1f}"
        for point in points:
            d += f" H{f.x(point[0]):.1f} V{y(point[column]):.1f}"
        d += f" H{f.x(v.makespan):.1f}"
        d += f" V{y(0):.1f} Z" if cls == "memreserved" else ""
        out.append(f'<path d="{d}" class="{cls}"/>')
    out.append(
        f'<text x="{_LEFT + 4}" y="{top + 11}" class="memlabel">peak {_xml(memory_text(m))}'
        "</text></g>"
    )
    return out


# Drawn only in pictures of graphs with asynchronous collectives.
_COMM_STYLE = ".comm{fill:#009E73;fill-opacity:.75}"


def _svg_comms(v: View, f: _Frame, comms: tuple[Communication, ...]) -> list[str]:
    """A thin bar under each asynchronous collective, in its issue's lane, from the issue to
    the end of its wait: the communication that may overlap the compute above it."""
    out = []
    for c in comms:
        x, w = f.x(c.start), max((c.end - c.start) * f.scale, 1.0)
        y = f.lane_top(v.program.stream_of[c.issue]) + _LANE - 6
        waited = f"waited by {c.wait.name}" if c.wait is not None else "never waited"
        tip = f"{c.issue.name} ({c.label}): communication {format_number(c.start)}-"
        tip += f"{format_number(c.end)}, {waited}"
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="3" class="comm">'
            f"<title>{_xml(tip)}</title></rect>"
        )
    return out


def _svg_highlight(v: View, f: _Frame, groups: list[tuple[str, ...]]) -> list[str]:
    """A red outline around each node of each group (the nodes one violation names, in its
    order) and a dashed red line from the group's first node to each other one."""
    by_name = {node.name: node for node in v.start}
    out = []
    for group in groups:
        nodes = [by_name[name] for name in group if name in by_name]
        boxes = []
        for node in nodes:
            x, w = f.x(v.start[node]), max((v.finish[node] - v.start[node]) * f.scale, 6.0)
            y = f.lane_top(v.program.stream_of.get(node, 0)) + (_LANE - _BOX) / 2 - 2
            boxes.append((x + w / 2, y + _BOX / 2 + 2))
            out.append(
                f'<rect x="{x - 2:.1f}" y="{y:.1f}" width="{w + 4:.1f}" height="{_BOX + 4}" '
                f'rx="3" class="violation"><title>{_xml(", ".join(group))}</title></rect>'
            )
        for x2, y2 in boxes[1:]:
            x1, y1 = boxes[0]
            out.append(
                f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
                'class="violationlink"/>'
            )
    return out


def _svg_legend(
    f: _Frame,
    y: float,
    joins: tuple[StreamJoin, ...],
    comms: tuple[Communication, ...] = (),
    collectives: bool = False,
) -> list[str]:
    out = []
    x = float(_LEFT)
    for cat, colour in CATEGORY_COLOURS.items():
        if cat == "comm" and not collectives:
            continue  # a graph without collectives draws the legend it always had
        out.append(f'<rect x="{x:.1f}" y="{y - 10}" width="14" height="12" fill="{colour}"/>')
        out.append(f'<text x="{x + 19:.1f}" y="{y}" class="legend">{_xml(cat)}</text>')
        x += 30 + len(cat) * 6.6
    out.append(f'<path d="M{x:.1f},{y - 4} L{x + 24:.1f},{y - 4}" class="link"/>')
    out.append(f'<text x="{x + 29:.1f}" y="{y}" class="legend">record → wait</text>')
    x += 125
    out.append(f'<path d="M{x:.1f},{y - 4} L{x + 24:.1f},{y - 4}" class="link exitlink"/>')
    out.append(f'<text x="{x + 29:.1f}" y="{y}" class="legend">wait joined by output</text>')
    if comms:
        x += 185
        out.append(f'<rect x="{x:.1f}" y="{y - 6}" width="24" height="3" class="comm"/>')
        out.append(f'<text x="{x + 29:.1f}" y="{y}" class="legend">collective → its wait</text>')
    kinds = {join.step.kind for join in joins}
    x, y = float(_LEFT), y + _LEGEND_ROW
    for kind, cls, label in (
        ("wait_stream", "link joinlink", "stream-wide join (wait sN)"),
        ("synchronize", "barrier", "host barrier (synchronize)"),
    ):
        if kind in kinds:
            out.append(f'<path d="M{x:.1f},{y - 4} L{x + 24:.1f},{y - 4}" class="{cls}"/>')
            out.append(f'<text x="{x + 29:.1f}" y="{y}" class="legend">{label}</text>')
            x += 190
    return out


def render_svg(
    obj: Schedule | GraphModule,
    cost_model: CostModel | None = None,
    scale: float | None = None,
    highlight: Iterable[Iterable[str]] = (),
    *,
    dialect: Dialect | str | None = None,
) -> str:
    """A self-contained SVG Gantt chart of the timeline: one lane per stream.

    Boxes are compute nodes placed at their start and end (``scale`` pixels per cost unit;
    by default at least 6, so a table-model matmul has room for a label), coloured by
    `msched.analysis.cost.op_category`; hovering shows name, op and times.  Each record is
    linked to each of its waits by a thin curve, and each stream a stream-wide join
    (``wait sN``) waits for to the waiting stream, from where the joined stream's last node
    issued before the join ends (dashed); the waits that join ``output`` are red, as is the
    dashed line at the makespan.  A host barrier (``synchronize``) is a dotted purple line
    across every lane, with a curve from each point it waits for.  An asynchronous collective
    has a thin green bar (``class="comm"``) under its lane from its issue to the end of its
    wait: the communication that compute may overlap.  When the graph's nodes carry sizes,
    a memory band (``class="memory"``) under the lanes draws the bytes the stream pools hold
    and the live tensor bytes over time (`msched.peak_memory`), with the peaks.  A time axis
    is on top and a legend below.  Every lane is a ``rect`` with ``class="lane"`` and
    ``data-stream``.  Deterministic bytes.

    ``highlight`` is groups of node names, for example the ``nodes`` of each
    `msched.Violation` of a report: each node of a group gets a red outline
    (``class="violation"``) and a dashed red line (``class="violationlink"``) joins the
    group's first node to each other one; names not in the graph are left out.
    ``dialect`` is the dialect of the graph's stream ops (a `msched.Dialect` or a name, as
    `msched.verify` takes it; None: a Schedule's own, else detected from the graph's ops).
    """
    v = view_of(obj, cost_model, dialect)
    joins = stream_joins(v)
    band = v.memory is not None
    f = _frame(v, scale, 2 if joins else 1, band)
    comms = communications(v)
    style = _SVG_STYLE + (_JOIN_STYLE if joins else "") + (_COMM_STYLE if comms else "")
    style += _MEMORY_STYLE if band else ""
    title = (
        f"msched schedule: {counts(v)}, "
        f"makespan {format_number(v.makespan)} (lower bound {format_number(v.lower_bound)})"
    )
    body = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{f.width:.0f}" height="{f.height:.0f}" '
        f'viewBox="0 0 {f.width:.0f} {f.height:.0f}">',
        f"<style>{style}</style>",
        f'<rect width="{f.width:.0f}" height="{f.height:.0f}" fill="#ffffff"/>',
        f'<text x="12" y="22" class="title">{_xml(title)}</text>',
    ]
    body += _svg_lanes(v, f) + _svg_axis(v, f)
    for step in v.program.compute_steps:
        node = step.node
        if node.op not in (*INPUT_OPS, "output") and v.finish[node] > v.start[node]:
            body += _svg_box(v, f, node)
    body += _svg_comms(v, f, comms) + _svg_links(v, f) + _svg_joins(v, f, joins)
    body += _svg_highlight(v, f, [tuple(group) for group in highlight])
    collectives = bool(comms) or any(
        op_category(step.node) == "comm" for step in v.program.compute_steps
    )
    bottom = f.lane_top(v.num_streams)
    body += _svg_memory(v, f, bottom + _BAND_GAP)
    legend = bottom + 48 + (_BAND + _BAND_GAP if band else 0)
    body += _svg_legend(f, legend, joins, comms, collectives)
    body.append("</svg>")
    return "\n".join(body) + "\n"

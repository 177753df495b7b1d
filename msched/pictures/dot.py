"""Graphviz DOT of a scheduled graph: one cluster per stream, Dag edges with their reasons."""

from __future__ import annotations

from torch.fx import GraphModule, Node

from msched.analysis.cost import CostModel
from msched.analysis.dag import REASONS
from msched.pictures.labels import counts, format_number, op_label, stream_title
from msched.pictures.view import View, dependencies_by_name, view_of
from msched.proof.dialects import Dialect
from msched.scheduling.pipeline import Schedule

__all__ = ["STREAM_COLOURS", "render_dot", "stream_colour"]

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
    "collective": 'color="#009E73", style=bold',
}
_REASON_ORDER = [name for _, name in REASONS]


def stream_colour(stream: int) -> str:
    """The colour of ``stream``'s cluster (the palette repeats after eight streams)."""
    return STREAM_COLOURS[stream % len(STREAM_COLOURS)]


def _dot_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_dot(
    obj: Schedule | GraphModule,
    cost_model: CostModel | None = None,
    weights: bool = False,
    *,
    dialect: Dialect | str | None = None,
) -> str:
    """Graphviz DOT of the scheduled graph: one cluster per stream, edges with their reasons.

    Nodes are filled with their stream's colour and labelled ``name`` / ``op``.  Edges come
    from the Dag (see `dependencies_by_name`): plain data edges are unlabelled; every other
    edge is labelled with its reasons (``raw``, ``war``, ``waw``, ``exit``, ``collective``)
    and styled by the strongest.  Stream ops are not drawn (they are what the edges between
    clusters become).
    ``get_attr`` nodes (weights) are left out unless ``weights``.
    ``dialect`` is the dialect of the graph's stream ops (a `msched.Dialect` or a name, as
    `msched.verify` takes it; None: a Schedule's own, else detected from the graph's ops).
    """
    v = view_of(obj, cost_model, dialect)
    deps = dependencies_by_name(obj, dialect)
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
        lines += _dot_cluster(s, [n for n in shown if v.program.stream_of[n] == s])
    for node in shown:
        for dep, reasons in sorted(deps.get(node.name, {}).items()):
            if dep in names:
                lines.append(_dot_edge(dep, node.name, reasons))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _dot_title(v: View) -> str:
    return (
        f"{counts(v)}, makespan "
        f"{format_number(v.makespan)} (lower bound {format_number(v.lower_bound)}); "
        "unlabelled edges are data edges"
    )


def _dot_cluster(stream: int, nodes: list[Node]) -> list[str]:
    colour = stream_colour(stream)
    lines = [
        f"  subgraph cluster_s{stream} {{",
        f'    label={_dot_quote(stream_title(stream))}; color="{colour}"; fontcolor="{colour}";',
    ]
    for node in nodes:
        label = f"{node.name}\\n{op_label(node)}"
        style = f'fillcolor="{colour}33", color="{colour}"'
        lines.append(f'    {_dot_quote(node.name)} [label="{label}", {style}];')
    lines.append("  }")
    return lines


def _dot_edge(src: str, dst: str, reasons: set[str]) -> str:
    extra = sorted(reasons - {"data"}, key=_REASON_ORDER.index)
    if not extra:
        return f"  {_dot_quote(src)} -> {_dot_quote(dst)};"
    style = _REASON_STYLE[extra[-1]]
    label = ",".join(sorted(reasons, key=_REASON_ORDER.index))
    return f"  {_dot_quote(src)} -> {_dot_quote(dst)} [label={_dot_quote(label)}, {style}];"

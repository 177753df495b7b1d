"""Excerpts of a scheduled graph for failure messages: a few lines around the problem.

Lines are in host (emission) order, one per node, with the stream the node is issued on as
read by `msched.proof.dialects.interpret`, in the layout of the snapshot text::

      s0 |   mul_tensor_86 = aten.mul.Tensor(mul_tensor_85, final_ln)
    > s1 |   capture_11 = msched.inplace_slice_copy.default(dest=dest, ...)
      s0 | output(mul_tensor_86)

``set_stream`` nodes are folded into the stream column, as in the snapshots.
"""

from __future__ import annotations

from collections.abc import Iterable

from torch.fx import GraphModule, Node

from msched import MschedError
from msched.pictures.render import step_text
from msched.proof.dialects import Step, interpret

RADIUS = 3


def streams_of(gm: GraphModule) -> dict[Node, int]:
    """The stream every node of ``gm`` is issued on (empty when the graph cannot be read)."""
    try:
        return dict(interpret(gm).stream_of)
    except MschedError:
        return {}


def _steps(gm: GraphModule) -> list[Step]:
    try:
        steps = list(interpret(gm).steps)
    except MschedError:
        steps = [Step(node, "compute", -1) for node in gm.graph.nodes]
    return [s for s in steps if s.kind != "set_stream"]


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

    Focus nodes are matched by name, so nodes of another copy of the graph work too.  Gaps
    between windows are shown as ``...``.  Streams read as ``s?`` when the graph's stream
    ops cannot be read.
    """
    names = {f if isinstance(f, str) else f.name for f in focus}
    steps = _steps(gm)
    marked = {i for i, s in enumerate(steps) if s.node.name in names}
    windows = _windows(sorted(marked), len(steps), radius)
    lines: list[str] = []
    for window in windows:
        if lines or window.start > 0:
            lines.append("    ...")
        lines += [_line(steps[i], i in marked) for i in window]
    if windows and windows[-1].stop < len(steps):
        lines.append("    ...")
    return "\n".join(lines)


def _line(step: Step, marked: bool) -> str:
    lane = f"s{step.stream}" if step.stream >= 0 else "s?"
    indent = "  " * max(step.stream, 0)
    return f"  {'>' if marked else ' '} {lane} | {indent}{step_text(step)}"

"""The canonical text of a scheduled graph: what snapshots store and reviewers read in CI.

Deterministic: the same graph gives byte-identical text regardless of ``PYTHONHASHSEED`` or
process (nothing is ordered by hashing, no object address is printed, numbers go through
`msched.pictures.labels.format_number`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.fx import GraphModule, Node

from msched.analysis.cost import CostModel
from msched.pictures.labels import ADDRESS, format_number, is_kernel, target_name
from msched.pictures.naming import EventNames, event_names_of_graph
from msched.pictures.view import View, view_of
from msched.proof.dialects import Step
from msched.scheduling.pipeline import Schedule

__all__ = [
    "format_arg",
    "header_lines",
    "lane_lines",
    "node_text",
    "render_text",
    "step_text",
    "switch_text",
]


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
    ``synchronize @add_tensor_2``, ``record_stream(t, s1)``, or the node's `node_text`.

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


def header_lines(v: View) -> list[str]:
    """The header of the canonical text: counts, then makespan against the lower bound."""
    return [
        f"# streams {v.num_streams}, events {v.num_events}, waits {v.num_waits}",
        f"# makespan {format_number(v.makespan)}, lower bound {format_number(v.lower_bound)}",
    ]


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


def render_text(obj: Schedule | GraphModule, cost_model: CostModel | None = None) -> str:
    """The canonical text of a scheduled graph, for snapshots reviewed in CI.

    A header (``# streams S, events E, waits W`` and ``# makespan M, lower bound L``), then
    one line per node in emission (host) order: the stream lane ``sN |``, an indentation of two
    spaces per stream, and the node (``name = op(args)``, ``record @add_tensor_2``,
    ``wait @add_tensor_2``, ``record_stream(t, sN)``; a switch with its waits:
    ``switch, wait @add_tensor_2 @mm_3``; a stream-wide join, the lane's stream waiting for
    all work issued on stream N so far: ``wait sN``; a host barrier: ``synchronize`` (the
    device), ``synchronize sN``, ``synchronize @add_tensor_2`` (an event)).  Records and
    waits are named after the
    point they mark, not by event id (`msched.pictures.naming`: ``@node``, ``@entry.sN``,
    ``@node#2``), so adding one event leaves every other line unchanged.  A switch that waits
    for nothing is folded into the lane column: a change of lane is where one stood.
    ``output`` is last (anything after it would be shown after it).  The text ends with a
    newline and is identical across runs, processes and hash seeds.
    """
    v = view_of(obj, cost_model)
    return "\n".join(header_lines(v) + lane_lines(v)) + "\n"

"""The ``msched`` command: ``demo``, ``schedule`` and ``explain`` on reference decoder stacks.

Every subcommand builds a synthetic decoder stack (`msched.decoder.decoder_stack`), schedules
it with `msched.schedule` and reads the result with `msched.render`.  Wrong arguments print one
line (``msched <command>: error: ...``) to stderr and exit with status 2; a graph that fails
verification exits with status 1.  Progress goes to stderr, only when it is a terminal and the
graph is big, so piped output stays clean.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO

from torch.fx import GraphModule, Node

import msched
from msched import render
from msched.cost import CostModel, DefaultCostModel, RooflineCostModel
from msched.decoder import DecoderStack, decoder_stack
from msched.errors import InvalidArgumentError, MschedError
from msched.schedule import Schedule

FORMATS = ("text", "json", "dot", "trace", "svg")
_RENDERERS = {
    "text": render.render_text,
    "json": render.render_json,
    "dot": render.render_dot,
    "trace": render.render_trace,
    "svg": render.render_svg,
}
_PROGRESS_NODES = 2000  # below this a run takes well under a second: no progress needed
DEMO_LAYERS, DEMO_CAPTURES, DEMO_STREAMS, DEMO_LANE_LAYER = 12, (1, 5, 11), (1, 2, 3), 5


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``msched schedule: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


class UsageError(MschedError):
    """A bad command-line argument found after parsing (exit status 2)."""


# ---------------------------------------------------------------------------------------------
# Arguments.


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer numbers such as 1,5,11, got {text!r}"
        ) from None
    if any(layer < 0 for layer in layers):
        raise argparse.ArgumentTypeError(f"layer numbers start at 0, got {text!r}")
    return layers


def _add_stack_args(p: argparse.ArgumentParser, streams_default: int | None = None) -> None:
    p.add_argument("--layers", type=_positive_int, default=12, help="decoder layers (default 12)")
    p.add_argument(
        "--captures", type=_layer_list, default=(1, 5, 11), metavar="A,B,C",
        help="0-based layers whose hidden state is captured (default 1,5,11)",
    )
    p.add_argument("--moe", action="store_true", help="MoE feed-forward blocks (routed ∥ shared)")
    p.add_argument(
        "--streams", type=_positive_int, default=streams_default or 3, metavar="S",
        help="number of streams, stream 0 is the caller's (default 3)",
    )
    p.add_argument(
        "--cost", choices=("table", "roofline"), default="table",
        help="cost model: op table (default) or roofline estimate from shapes",
    )


def build_parser() -> _Parser:
    """The ``msched`` argument parser, with one subparser per command."""
    parser = _Parser(prog="msched", description="Multi-stream scheduling of torch.fx graphs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="schedule the reference 12-layer MoE stack on 1, 2 and 3 streams",
        description="Schedule a 12-layer MoE decoder stack with Eagle3 captures at layers 1, 5 "
        "and 11 on 1, 2 and 3 streams, verify each schedule and show where the captures run.",
    )
    demo.add_argument("--out", type=Path, metavar="DIR", help="also write SVG, trace, DOT, JSON, text")
    sched = sub.add_parser(
        "schedule", help="schedule a decoder stack and print it in one format",
        description="Schedule a decoder stack and write the scheduled graph in one format.",
    )
    _add_stack_args(sched)
    sched.add_argument("--format", choices=FORMATS, default="text", help="output format (default text)")
    sched.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here, not to stdout")
    explain = sub.add_parser(
        "explain", help="why a node is on its stream and why each wait before it exists",
        description="Explain the placement of NODE: its stream, the waits before it and the "
        "dependency (data, raw, war, waw, exit) behind each, and who waits for it.",
    )
    _add_stack_args(explain)
    explain.add_argument("node", metavar="NODE", help="node name, for example capture_11")
    return parser


def _check_captures(layers: int, captures: tuple[int, ...]) -> None:
    beyond = [c for c in captures if c >= layers]
    if beyond:
        raise UsageError(
            f"capture layer {', '.join(map(str, beyond))} is beyond the stack: "
            f"layers are 0..{layers - 1}"
        )
    if len(set(captures)) != len(captures):
        raise UsageError(f"capture layers repeat: {','.join(map(str, captures))}")


# ---------------------------------------------------------------------------------------------
# Progress.


class Progress:
    """Stage messages on stderr, only when it is a terminal and the graph is big."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.t0 = time.perf_counter()

    @classmethod
    def for_layers(cls, layers: int, moe: bool) -> Progress:
        estimated_nodes = layers * (45 if moe else 40)
        tty = sys.stderr.isatty()
        return cls(sys.stderr, tty and estimated_nodes >= _PROGRESS_NODES)

    def step(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.t0
            self.stream.write(f"\r\x1b[K[{elapsed:6.1f}s] {message}")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


# ---------------------------------------------------------------------------------------------
# Building and scheduling.


@dataclass(frozen=True)
class Scheduled:
    """One scheduled stack: the stack, its schedule and the cost model used."""

    stack: DecoderStack
    schedule: Schedule
    cost_model: CostModel


def _cost_model(name: str, stack: DecoderStack) -> CostModel:
    if name == "table":
        return DefaultCostModel()
    _propagate_shapes(stack)
    return RooflineCostModel()


def _propagate_shapes(stack: DecoderStack) -> None:
    """Fill ``node.meta["val"]`` with fake tensors so the roofline model sees shapes."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(stack.gm).propagate(*stack.example_inputs())


def build_and_schedule(
    layers: int, captures: Sequence[int], moe: bool, streams: int, cost: str = "table",
    progress: Progress | None = None,
) -> Scheduled:
    """Build a decoder stack and schedule it (the shared first half of every command)."""
    progress = progress or Progress(sys.stderr, False)
    progress.step(f"building a {layers}-layer decoder stack")
    stack = decoder_stack(layers, tuple(captures), moe=moe)
    model = _cost_model(cost, stack)
    progress.step(f"scheduling {len(stack.gm.graph.nodes)} nodes on {streams} streams")
    sched = msched.schedule(stack.gm, streams, model)
    return Scheduled(stack, sched, model)


def verify_schedule(sched: Schedule) -> Any:
    """`msched.verify` of a schedule against its original graph."""
    return msched.verify(sched.gm, original=sched.original)  # type: ignore[attr-defined]

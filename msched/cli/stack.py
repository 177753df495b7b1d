"""Building the decoder stack a command names and scheduling it: the shared first half of
``demo``, ``schedule``, ``svg``, ``explain`` and a stack side of ``diff``.

The stack is `msched.models.decoders.decoder_stack`, scheduled with `msched.schedule` under the
cost model ``--cost`` names (the roofline model reads shapes, so its stack gets fake tensors
first).  `Progress` writes stage messages to stderr, only when it is a terminal and the graph
is big, so piped output stays clean.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

import msched
from msched.analysis.cost import CostModel, DefaultCostModel, RooflineCostModel
from msched.analysis.measured import MeasuredCostModel
from msched.cli.options import StackOptions
from msched.errors import InvalidArgumentError, UsageError, one_line
from msched.models.decoders import DecoderStack, decoder_stack
from msched.scheduling.pipeline import Schedule

_PROGRESS_NODES = 2000  # below this a run takes well under a second: no progress needed


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


@dataclass(frozen=True)
class Scheduled:
    """One scheduled stack: the stack, its schedule and the cost model used."""

    stack: DecoderStack | None  # None for a graph of the user's (--graph)
    schedule: Schedule
    cost_model: CostModel


def named_cost_model(name: str) -> CostModel:
    """The cost model ``--cost NAME`` names (`msched.cli.options.COST_MODELS`), or the one
    a ``.json`` cost file holds (a file that does not load is a `UsageError` saying why)."""
    if name.endswith(".json"):
        try:
            return MeasuredCostModel.load(name)
        except InvalidArgumentError as error:
            raise UsageError(f"--cost {name}: {one_line(error)}") from None
    return RooflineCostModel() if name == "roofline" else DefaultCostModel()


def _cost_model(name: str, stack: DecoderStack) -> CostModel:
    # Sizes for the memory every picture shows; the roofline model reads them too.
    stack.with_sizes()
    return named_cost_model(name)


def build_and_schedule(
    layers: int,
    captures: Sequence[int],
    moe: bool,
    streams: int,
    cost: str = "table",
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


def build_stack(stack: StackOptions, progress: Progress | None = None) -> Scheduled:
    """`build_and_schedule` of a `StackOptions`."""
    return build_and_schedule(
        stack.layers, stack.captures, stack.moe, stack.streams, stack.cost, progress
    )

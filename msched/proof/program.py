"""A graph read in host order: the `Step`s of every node and the `StreamProgram` they make.

`msched.proof.interpreter.interpret` builds the program; `msched.proof.clocks` turns it into
happens-before, which `msched.verify`, the executor, the timeline and the pictures read.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

from torch.fx import Node


class Step(NamedTuple):
    """One action in host order: its kind (one of `msched.proof.actions.ACTION_KINDS`,
    ``"compute"`` for a node that runs work, ``"host"`` for a stream op that does nothing
    on a stream), the stream it acts on, and what it names.

    ``event`` is the event of a ``record_event`` / ``wait_event`` / ``synchronize``;
    ``to_stream`` the stream a ``set_stream`` switches to (equal to ``stream``), a
    ``wait_stream`` waits for, a ``record_stream`` marks ``tensor`` as used on, or a
    ``synchronize`` waits for.  Fields a kind does not use are None.  A node has one step per
    action (a stream op that switches and waits has two or more), compute nodes one.

    Immutable; a named tuple rather than a dataclass because a graph has one per node and
    `msched.verify` must stay cheaper than copying the graph.
    """

    node: Node
    kind: str
    stream: int
    event: int | None = None
    to_stream: int | None = None
    tensor: Node | None = None


# ``Step(...)`` runs NamedTuple's Python-level __new__; `interpret` makes one step per node and
# tuple.__new__ builds the same object at half the cost (verify must stay cheap).
new_step = tuple.__new__


@dataclass(frozen=True)
class StreamProgram:
    """A graph read in host order: its steps, the stream of every node (a stream op's: the
    current stream after it), the number of streams, the output node, and the stream ops
    whose value is one of their inputs (``passthrough[node]``, `msched.proof.actions.passes`).
    ``stream_keys`` / ``event_keys`` say which dialect key each numbered stream or event
    stands for, where it is not the int id itself (a PyTorch table index, a name).
    """

    steps: tuple[Step, ...]
    stream_of: dict[Node, int]
    num_streams: int
    output: Node
    passthrough: dict[Node, Node] = field(default_factory=dict)
    stream_keys: dict[int, Hashable] = field(default_factory=dict)
    event_keys: dict[int, Hashable] = field(default_factory=dict)

    @property
    def compute_steps(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.kind == "compute")

    @property
    def num_waits(self) -> int:
        """Wait actions (``wait_event`` and ``wait_stream``), wherever they sit."""
        return sum(1 for s in self.steps if s.kind in ("wait_event", "wait_stream"))

    @property
    def num_events(self) -> int:
        """The distinct events recorded (an event re-recorded counts once)."""
        return len({s.event for s in self.steps if s.kind == "record_event"})


__all__ = ["Step", "StreamProgram", "new_step"]

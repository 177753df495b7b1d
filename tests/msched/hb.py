"""Happens-before facts about a scheduled graph, for tests of the scheduler itself.

A deliberately small re-reading of the stream ops (independent of `msched.verify`), so the
scheduler's tests do not trust the verifier they are meant to cross-check.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import GraphModule, Node

from msched.proof.interpreter import interpret
from msched.proof.program import Step


@dataclass(frozen=True)
class Wait:
    node: Node
    step: int  # the wait's index in the program's steps (a node may hold several waits)
    stream: int
    before: tuple[int, ...]
    event: tuple[int, ...]


@dataclass(frozen=True)
class HappensBefore:
    position: dict[str, tuple[int, int]]  # node name -> (stream, sequence number)
    knows: dict[str, tuple[int, ...]]  # node name -> vector clock of its stream when it runs
    waits: tuple[Wait, ...]
    host_order: tuple[str, ...]
    entry: int  # stream 0's position when the first stream op is issued (after the preamble)

    def ordered(self, before: str, after: str) -> bool:
        stream, seq = self.position[before]
        return self.knows[after][stream] >= seq


class _Reader:
    """The vector clocks of one program read step by step: `happens_before`'s state."""

    def __init__(self, n: int) -> None:
        self.vc = [[-1] * n for _ in range(n)]
        self.vc[0][0] = 0
        self.count = [0] * n
        self.events: dict[int, tuple[int, ...]] = {}
        self.position: dict[str, tuple[int, int]] = {}
        self.knows: dict[str, tuple[int, ...]] = {}
        self.waits: list[Wait] = []

    def read(self, index: int, step: Step) -> None:
        vc, s, name = self.vc, step.stream, step.node.name
        if step.node.op in ("placeholder", "get_attr"):
            self.position[name] = (0, 0)
            self.knows[name] = tuple(vc[0])
        elif step.kind == "record_event":
            assert step.event is not None
            self.events[step.event] = tuple(vc[s])
        elif step.kind == "wait_event":
            assert step.event is not None
            snap = self.events.get(step.event)
            if snap is not None:  # with no record of it before, it waits for nothing
                self.waits.append(Wait(step.node, index, s, tuple(vc[s]), snap))
                vc[s] = [max(a, b) for a, b in zip(vc[s], snap, strict=True)]
        elif step.kind == "compute":
            self.count[s] += 1
            vc[s][s] = self.count[s]
            self.position[name] = (s, self.count[s])
            self.knows[name] = tuple(vc[s])


def happens_before(
    gm: GraphModule, skip: frozenset[str] = frozenset(), skip_steps: frozenset[int] = frozenset()
) -> HappensBefore:
    """Read ``gm``'s stream ops in host order, ignoring the nodes named in ``skip`` and the
    steps at the indices ``skip_steps`` (one wait of a switch that waits on several)."""
    prog = interpret(gm)
    reader = _Reader(prog.num_streams)
    entry: int | None = None
    for index, step in enumerate(prog.steps):
        if step.node.name in skip or index in skip_steps:
            continue
        if entry is None and step.kind != "compute":
            entry = reader.vc[0][0]
        reader.read(index, step)
    order = tuple(step.node.name for step in prog.steps)
    first = reader.vc[0][0] if entry is None else entry
    return HappensBefore(reader.position, reader.knows, tuple(reader.waits), order, first)

"""Happens-before facts about a scheduled graph, for tests of the scheduler itself.

A deliberately small re-reading of the stream ops (independent of `msched.verify`), so the
scheduler's tests do not trust the verifier they are meant to cross-check.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch.fx import GraphModule, Node

from msched.proof.dialects import interpret


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


def happens_before(
    gm: GraphModule, skip: frozenset[str] = frozenset(), skip_steps: frozenset[int] = frozenset()
) -> HappensBefore:
    """Read ``gm``'s stream ops in host order, ignoring the nodes named in ``skip`` and the
    steps at the indices ``skip_steps`` (one wait of a switch that waits on several)."""
    prog = interpret(gm)
    n = prog.num_streams
    vc = [[-1] * n for _ in range(n)]
    vc[0][0] = 0
    count = [0] * n
    events: dict[int, tuple[int, ...]] = {}
    position: dict[str, tuple[int, int]] = {}
    knows: dict[str, tuple[int, ...]] = {}
    waits: list[Wait] = []
    entry: int | None = None
    for index, step in enumerate(prog.steps):
        if step.node.name in skip or index in skip_steps:
            continue
        s = step.stream
        if entry is None and step.kind != "compute":
            entry = vc[0][0]
        if step.node.op in ("placeholder", "get_attr"):
            position[step.node.name] = (0, 0)
            knows[step.node.name] = tuple(vc[0])
        elif step.kind == "record_event":
            assert step.event is not None
            events[step.event] = tuple(vc[s])
        elif step.kind == "wait_event":
            assert step.event is not None
            snap = events.get(step.event)
            if snap is None:  # no record of it before: it waits for nothing
                continue
            waits.append(Wait(step.node, index, s, tuple(vc[s]), snap))
            vc[s] = [max(a, b) for a, b in zip(vc[s], snap, strict=True)]
        elif step.kind == "compute":
            count[s] += 1
            vc[s][s] = count[s]
            position[step.node.name] = (s, count[s])
            knows[step.node.name] = tuple(vc[s])
    order = tuple(step.node.name for step in prog.steps)
    return HappensBefore(position, knows, tuple(waits), order, vc[0][0] if entry is None else entry)

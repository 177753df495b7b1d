"""The happens-before engine: vector clocks over a `StreamProgram`.

Every reader of a scheduled graph asks the same question (does ``u`` run before ``v`` on the
GPU?) and `clocks_of` is the one place that answers it from the stream ops.  It walks the host
order once, up to and including ``output`` (what follows never runs), with one vector clock
per stream:

- compute node ``k`` of stream ``s`` gets the `Stamp` ``(s, k, clock)``, ``clock`` being its
  stream's vector clock after the last wait before it; graph inputs are ready on stream 0
  before the graph starts and share the stamp ``(0, 0, ())``;
- a ``record_event`` snapshots the clock of the stream it records on; a ``wait_event`` binds
  to the latest earlier record of its event (events are re-recorded) and joins that snapshot
  into its stream's clock.  A wait on an event not recorded before it waits for nothing, as
  on a GPU.  A ``wait_stream`` joins the other stream's clock as it is then; a
  ``synchronize`` (a host barrier) joins the clock of what it waits for into every stream.

Waits are steps, not nodes: one stream op may switch and wait on several events
(`msched.proof.actions`), and each wait is its own `Step`.

`msched.verify`, the adversarial executor (`msched.execute`), the timeline (`msched.simulate`)
and the pictures read ordering from `Clocks` and nothing else; none of them interprets a
record or a wait itself.  (``tests/msched/hb.py`` is the tests' independent re-reading, kept
separate on purpose.)

Questions the pictures and the plugin ask, and the `Clocks` attribute that answers each
(``clocks = clocks_of(interpret(gm))``):

- *Which wait joins node N on stream S* (the first wait step, ``wait_event`` or
  ``wait_stream``, or host barrier, ``synchronize``, after which stream ``S`` happens-after
  ``N``):
  ``clocks.joining_wait(N, S)``; None when ``N`` runs on ``S`` or no wait joins it.  Joins
  through a third stream count.
- *Which record does wait W bind to* (``W`` a ``wait_event`` step): ``clocks.binding[W]``,
  the record step; None when the event was not recorded before ``W``.  ``binding`` lists the
  event waits before ``output`` in host order, so the waits of one record are
  ``[w for w, r in clocks.binding.items() if r is R]``.
- *Does the exit happen-after node N* (has the caller's stream joined it when the graph
  returns): ``clocks.exit_happens_after(N)``; False for a node that never runs.
- *u before v*: ``clocks.happens_before(u, v)``; *what does v directly wait for*:
  ``clocks.predecessors[v]`` (the previous node of its stream and what its waits observe).
- Diagnostics, as plain data: ``clocks.unrecorded_waits`` (the wait `Step`s whose event had no
  earlier record; ``clocks.later_record(step)`` is the record that comes too late, if any) and
  ``clocks.unjoined_starts`` (the first node of each auxiliary stream that starts without
  having joined stream 0, where graph inputs are ready).

Cost: one pass over the steps, O(streams) per wait; `predecessors` costs a second pass on
first use.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from torch.fx import Node

from msched._text import counted
from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError
from msched.limits import check_num_streams
from msched.proof.program import Step, StreamProgram


class Stamp(NamedTuple):
    """Where a compute node sits in happens-before.

    ``stream`` is the stream it runs on; ``seq`` its sequence number there (the ``seq``-th
    compute node of that stream, from 1; 0 for graph inputs); ``clock`` the vector clock of
    its stream after the last wait before it (entry ``t`` of another stream: the ``seq`` of
    the last node of stream ``t`` it happens after, -1 for none; ``()`` for graph inputs).
    """

    stream: int
    seq: int
    clock: tuple[int, ...]


_INPUT_STAMP = Stamp(0, 0, ())
# ``Stamp(...)`` runs NamedTuple's Python-level __new__; the walk makes one stamp per node, and
# tuple.__new__ builds the same object at half the cost (verify must stay cheap).
_new_stamp = tuple.__new__


@dataclass(frozen=True, repr=False)
class Clocks:
    """Happens-before over the nodes that run (host order up to and including ``output``).

    ``stamp[n]`` is ``n``'s `Stamp` for every compute node that runs (graph inputs and
    ``output`` included); ``order`` lists those nodes in host order.  ``binding[w]`` is the
    record step each ``wait_event`` step before ``output`` binds to (None: unrecorded) and
    ``clock_after[w]`` the vector clock of its stream right after each wait step
    (``wait_event`` or ``wait_stream``); ``barrier_after[b]`` the clock of every stream
    right after each ``synchronize`` step before ``output`` (a host barrier joins them
    all).  ``unrecorded_waits`` and ``unjoined_starts`` are the diagnostics of the module
    docstring.  ``num_streams`` is the width of every clock.
    """

    program: StreamProgram
    num_streams: int
    stamp: dict[Node, Stamp]
    order: tuple[Node, ...]
    binding: dict[Step, Step | None]
    clock_after: dict[Step, tuple[int, ...]]
    unrecorded_waits: tuple[Step, ...]
    unjoined_starts: tuple[Node, ...]
    barrier_after: dict[Step, tuple[tuple[int, ...], ...]] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (
            f"Clocks({len(self.order)} nodes that run, {self.num_streams} streams, "
            f"{len(self.binding)} waits)"
        )

    @property
    def output(self) -> Node:
        return self.program.output

    def happens_before(self, u: Node, v: Node) -> bool:
        """Whether ``u`` is ordered before ``v`` on the GPU (both must have run)."""
        su, ku, _ = self.stamp[u]
        sv, kv, clock = self.stamp[v]
        if su == sv:
            return ku < kv
        return len(clock) > su and clock[su] >= ku

    def exit_happens_after(self, node: Node) -> bool:
        """Whether ``output`` happens after ``node``; False when ``node`` never runs."""
        return node in self.stamp and self.happens_before(node, self.program.output)

    def joining_wait(self, node: Node, stream: int) -> Step | None:
        """The first wait on ``stream`` (or host barrier) after which ``stream``
        happens-after ``node``.

        None when ``node`` runs on ``stream`` (no wait is needed), never runs, or no wait
        joins it.  A graph input is ready on stream 0, so the first wait that joins stream 0
        joins it.  Clocks only grow along a stream, so this is a binary search.
        """
        at = self.stamp.get(node)
        if at is None or at.stream == stream:
            return None
        waits = self._waits_by_stream.get(stream, ())
        i = bisect_left(waits, at.seq, key=lambda w: w[1][at.stream])
        return waits[i][0] if i < len(waits) else None

    def later_record(self, wait: Step) -> Step | None:
        """The first record of ``wait``'s event after it in host order (None: there is none):
        why an unrecorded wait is unrecorded."""
        steps = self.program.steps
        position = next(i for i, step in enumerate(steps) if step is wait)
        for step in steps[position + 1 :]:
            if step.kind == "record_event" and step.event == wait.event:
                return step
        return None

    @cached_property
    def _waits_by_stream(self) -> dict[int, tuple[tuple[Step, tuple[int, ...]], ...]]:
        """Each stream's waits and the host barriers, in host order, with the stream's
        clock right after each."""
        by_stream: dict[int, list[tuple[Step, tuple[int, ...]]]] = {}
        after, barriers = self.clock_after, self.barrier_after
        for step in self.program.steps:
            if step in after:
                by_stream.setdefault(step.stream, []).append((step, after[step]))
            elif step in barriers:
                for t, clock in enumerate(barriers[step]):
                    by_stream.setdefault(t, []).append((step, clock))
            if step.node is self.program.output:
                break
        return {s: tuple(waits) for s, waits in by_stream.items()}

    @cached_property
    def predecessors(self) -> dict[Node, tuple[Node, ...]]:
        """The nodes each compute node that runs directly happens after (graph inputs
        excluded, ``output`` included, keys in host order): the previous node of its stream,
        then the nodes whose completion the waits before it observe.

        A record stands for the last node of its stream plus what that stream has waited for
        since (pending joins); a wait hands those to the next node of the waiting stream (a
        ``wait_stream`` what the other stream stands for then, a ``synchronize`` what every
        stream it waits for stands for, to every stream).
        """
        last: dict[int, Node] = {}
        pending: dict[int, list[Node]] = {}
        carried: dict[Step, tuple[Node, ...]] = {}  # record -> the nodes it stands for
        preds: dict[Node, tuple[Node, ...]] = {}
        for step in self.program.steps:
            s, node = step.stream, step.node
            if step.kind == "compute" and node.op not in INPUT_OPS:
                before = [last[s]] if s in last else []
                preds[node] = tuple(dict.fromkeys(before + pending.pop(s, [])))
                last[s] = node
                if node is self.program.output:
                    break
            elif step.kind == "record_event":
                carried[step] = _stands_for(s, last, pending)
            elif step.kind == "wait_event":
                record = self.binding[step]
                if record is not None:
                    pending.setdefault(s, []).extend(carried[record])
            elif step.kind == "wait_stream":
                assert step.to_stream is not None
                pending.setdefault(s, []).extend(_stands_for(step.to_stream, last, pending))
            elif step.kind == "synchronize":
                done = self._synchronized(step, last, pending, carried)
                for t in range(self.num_streams):
                    pending.setdefault(t, []).extend(done)
        return preds

    def _synchronized(
        self,
        step: Step,
        last: dict[int, Node],
        pending: dict[int, list[Node]],
        carried: dict[Step, tuple[Node, ...]],
    ) -> tuple[Node, ...]:
        """What a ``synchronize`` step waits for, as nodes (see `predecessors`)."""
        if step.event is not None:
            record = self.synchronize_binding.get(step)
            return carried.get(record, ()) if record is not None else ()
        streams = range(self.num_streams) if step.to_stream is None else (step.to_stream,)
        return tuple(n for t in streams for n in _stands_for(t, last, pending))

    @cached_property
    def synchronize_binding(self) -> dict[Step, Step | None]:
        """The record each event ``synchronize`` step before ``output`` binds to."""
        latest: dict[int | None, Step] = {}
        found: dict[Step, Step | None] = {}
        for step in self.program.steps:
            if step.kind == "record_event":
                latest[step.event] = step
            elif step.kind == "synchronize" and step.event is not None:
                found[step] = latest.get(step.event)
            if step.node is self.program.output:
                break
        return found


def _stands_for(
    stream: int, last: dict[int, Node], pending: dict[int, list[Node]]
) -> tuple[Node, ...]:
    """The nodes a record on ``stream`` stands for now: its last node and pending joins."""
    return (*([last[stream]] if stream in last else []), *pending.get(stream, []))


def clocks_of(program: StreamProgram, num_streams: int | None = None) -> Clocks:
    """Stamp every node of ``program`` that runs with its vector clock (see the module).

    ``num_streams`` is the width of the clocks: at least ``program.num_streams`` (the
    default); `msched.verify` passes a wider one when told the schedule's stream count.
    """
    width = program.num_streams
    if num_streams is not None:
        width = check_num_streams(num_streams)
        if width < program.num_streams:
            raise InvalidArgumentError(
                f"num_streams must be at least the {counted(program.num_streams, 'stream')} the "
                f"program uses, got {width}"
            )
    return _walk(program, width)


def _join(row: list[int], clock: Sequence[int]) -> None:
    """``row`` becomes the elementwise maximum of itself and ``clock``."""
    for t, x in enumerate(clock):
        if x > row[t]:
            row[t] = x


def _synchronized(
    step: Step, vc: list[list[int]], records: dict[int, tuple[Step, tuple[int, ...]]]
) -> tuple[int, ...]:
    """The clock a host barrier waits for: its event's record, its stream, or every stream."""
    if step.event is not None:
        record = records.get(step.event)
        return record[1] if record is not None else ()
    if step.to_stream is not None:
        return tuple(vc[step.to_stream])
    return tuple(max(column) for column in zip(*vc, strict=True))


# Over the length and complexity limits (ruff C901, PLR0915) on purpose: see the docstring.
def _walk(program: StreamProgram, width: int) -> Clocks:  # noqa: C901, PLR0915
    """The host-order walk of `clocks_of`.

    Longer than 40 lines on purpose: it is the inner loop of `msched.verify` (one iteration
    per node of the graph), and splitting it into calls per step costs more than the rest of
    the walk.
    """
    vc = [[-1] * width for _ in range(width)]  # vc[s]: the vector clock of stream s
    vc[0][0] = 0  # graph inputs: ready on stream 0 before its first node
    joined = [tuple(row) for row in vc]  # each stream's clock after its last wait
    count = [0] * width  # compute nodes issued on each stream
    records: dict[int, tuple[Step, tuple[int, ...]]] = {}  # event -> last record, snapshot
    stamp: dict[Node, Stamp] = {}
    order: list[Node] = []
    binding: dict[Step, Step | None] = {}
    clock_after: dict[Step, tuple[int, ...]] = {}
    barrier_after: dict[Step, tuple[tuple[int, ...], ...]] = {}
    unrecorded: list[Step] = []
    unjoined: list[Node] = []
    out = program.output
    for step in program.steps:
        node, kind, s = step.node, step.kind, step.stream
        if kind == "compute":
            order.append(node)
            if node.op in INPUT_OPS:
                stamp[node] = _INPUT_STAMP
                continue
            if node is out:
                stamp[node] = _new_stamp(Stamp, (s, count[s] + 1, joined[s]))
                break
            k = count[s] = count[s] + 1
            vc[s][s] = k
            stamp[node] = _new_stamp(Stamp, (s, k, joined[s]))
            if k == 1 and s != 0 and joined[s][0] < 0:
                unjoined.append(node)
        elif kind == "record_event":
            assert step.event is not None  # interpret gives every record and wait its event
            records[step.event] = (step, tuple(vc[s]))
        elif kind == "wait_event":
            assert step.event is not None
            record = records.get(step.event)
            if record is None:
                binding[step] = None
                unrecorded.append(step)
            else:
                binding[step] = record[0]
                _join(vc[s], record[1])
                joined[s] = tuple(vc[s])
            clock_after[step] = joined[s]
        elif kind == "wait_stream":
            assert step.to_stream is not None
            _join(vc[s], vc[step.to_stream])
            joined[s] = tuple(vc[s])
            clock_after[step] = joined[s]
        elif kind == "synchronize":
            done = _synchronized(step, vc, records)
            for t in range(width):
                _join(vc[t], done)
                joined[t] = tuple(vc[t])
            barrier_after[step] = tuple(joined)
    return Clocks(
        program,
        width,
        stamp,
        tuple(order),
        binding,
        clock_after,
        tuple(unrecorded),
        tuple(unjoined),
        barrier_after,
    )

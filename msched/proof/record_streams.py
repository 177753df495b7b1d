"""Two readings `msched.verify` shares with its helpers: the effects of a scheduled graph
(whose host order may use a node before its definition, when the schedule is broken) and the
``record_stream`` rule (``missing-record-stream``).

A tensor used on another stream than the one that allocated it needs a ``record_stream`` for
the using stream; storages of graph inputs never do.  Only the uses `msched.analysis.lifetimes`
finds unsafe need one (work on its stream that may allocate could take the block before the
use ends; views, ``getitem``, ``wait_tensor`` and stream ops allocate nothing): the emitter's
rule, so both agree.  Keeping the tensor alive until its stream has waited for the use is
safe too, and counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from torch.fx import Graph, Node

from msched.analysis.effects import Effects, compute_effects, produces_tensor
from msched.analysis.lifetimes import UnsafeUse, unsafe_cross_stream_uses
from msched.analysis.nodes import inputs_first
from msched.proof.clocks import Clocks
from msched.proof.program import StreamProgram

__all__ = ["check_record_streams", "scheduled_effects", "unrecorded_uses"]


def scheduled_effects(graph: Graph, views: Mapping[Node, Node] | None = None) -> Effects:
    """`compute_effects` of a scheduled graph, whose host order may use a node early."""
    return compute_effects(inputs_first(graph), views)


def check_record_streams(
    program: StreamProgram,
    clocks: Clocks,
    root: Mapping[Node, Node],
    may_allocate: Callable[[Node], bool],
    add: Callable[..., None],
) -> None:
    """Report cross-stream uses that need a ``record_stream`` and have none before output.

    The rule is the emitter's (`msched.analysis.lifetimes`), so that everything `msched.schedule`
    emits verifies.  A record of any alias of the storage for the using stream counts, and so
    does keeping the storage alive until its stream has waited for the use (a reference to it
    on the host after that wait, such as msched's ``record_stream`` for its own stream).
    ``may_allocate`` says which scheduled nodes may take a freed block
    (`msched.analysis.lifetimes.allocates`).
    """
    reported: set[tuple[Node, int]] = set()
    for use in unrecorded_uses(program, clocks, root, may_allocate):
        if (use.root, use.stream) not in reported:
            reported.add((use.root, use.stream))  # one report per storage and stream
            _missing_record(use, clocks.stamp[use.root].stream, add)


def unrecorded_uses(
    program: StreamProgram,
    clocks: Clocks,
    root: Mapping[Node, Node],
    may_allocate: Callable[[Node], bool],
) -> list[UnsafeUse]:
    """The cross-stream uses whose block a later allocation on the storage's own stream may
    take before they end: unsafe (`msched.analysis.lifetimes`) and with no ``record_stream``
    of the storage for the using stream before ``output``.  `msched.execute` hands such a
    block out (it overwrites the storage) where its order lets it."""
    recorded: set[tuple[Node, int]] = set()
    for step in program.steps:
        if step.node is program.output:
            break
        if step.kind == "record_stream" and step.tensor is not None and step.to_stream is not None:
            recorded.add((root.get(step.tensor, step.tensor), step.to_stream))
    unsafe = _unsafe_uses(program, clocks, root, may_allocate)
    return [u for u in unsafe if (u.root, u.stream) not in recorded]


def _unsafe_uses(
    program: StreamProgram,
    clocks: Clocks,
    root: Mapping[Node, Node],
    may_allocate: Callable[[Node], bool],
) -> list[UnsafeUse]:
    """The uses `msched.analysis.lifetimes` finds unsafe, over the nodes that run between the
    graph inputs and ``output``, in host order, with the ``record_stream`` steps: each holds
    its tensor alive (a keep-alive for the tensor's own stream moves its free later)."""
    stamp = clocks.stamp
    body: list[Node] = []
    stream: dict[Node, int] = {}
    for step in program.steps:
        node = step.node
        if node is program.output:
            break
        if step.kind == "compute" and stamp[node].seq:
            body.append(node)
            stream[node] = stamp[node].stream
        elif step.kind == "record_stream" and step.tensor is not None and node not in stream:
            body.append(node)
            stream[node] = step.stream
    return unsafe_cross_stream_uses(
        body,
        program.output,
        stream,
        {n: stamp[n].seq for n in body if n in stamp},
        {n: stamp[n].clock for n in body if n in stamp},
        root,
        produces_tensor,
        may_allocate,
    )


def _missing_record(use: UnsafeUse, home: int, add: Callable[..., None]) -> None:
    t, s = use.tensor.name, use.stream
    add(
        "missing-record-stream",
        [t, use.user.name],
        f"`{t}` is allocated on stream {home} and used by `{use.user.name}` on stream {s} "
        f"without record_stream: add record_stream({t}, {s}) before `{use.user.name}`, or "
        f"keep `{t}` alive until stream {home} has waited for stream {s}, so the caching "
        f"allocator does not reuse its memory while stream {s} may still read it",
        streams=(home, s),
    )

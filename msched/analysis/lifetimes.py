"""When a cross-stream tensor use needs ``record_stream``: the rule shared by emit and verify.

The CUDA caching allocator hands a freed block back to the stream that allocated it; the next
allocation on that stream may reuse it at once.  The generated code of an FX graph frees a
tensor right after its last use in host order.  So a use of tensor ``X`` (allocated on stream
``t`` by the producer of its storage) on another stream ``s`` is unsafe exactly when some work
issued on ``t`` after ``X`` is freed may run before that use: the first compute node on ``t``
after the free point does not happen-after the last use of ``X`` on ``s``.  Only then is
``X.record_stream(s)`` needed.  Vector clocks are monotonic along a stream, so checking that
first node is enough.

Not needed: storages of graph inputs (owned by the caller), storages returned by the graph
(never freed inside it), and storages with no later work on their stream (``output`` joins
every stream before the caller can allocate again).  ``record_stream`` on every cross-stream
use, as msched's first design did, is safe too but costs an allocator call each and delays
memory reuse; this rule keeps only the calls that prevent a real reuse race.

Happens-before comes in as plain maps (each node's stream, sequence number on it and vector
clock), not from reading stream ops here: `msched.verify` passes the stamps of
`msched.proof.clocks`, the emitter the clocks it keeps while emitting (`msched.analysis`
imports neither `msched.proof` nor `msched.scheduling`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torch.fx import Node

from msched._torch_internals import node_inputs


@dataclass(frozen=True)
class UnsafeUse:
    """A storage used on ``stream`` that needs ``record_stream(tensor, stream)``.

    ``tensor`` is the alias of the storage that ``user`` (the first user on ``stream``) reads.
    """

    root: Node
    stream: int
    tensor: Node
    user: Node


def unsafe_cross_stream_uses(
    order: Sequence[Node],
    output: Node,
    stream: Mapping[Node, int],
    seq: Mapping[Node, int],
    knows: Mapping[Node, Sequence[int]],
    root: Mapping[Node, Node],
    is_tensor: Callable[[Node], bool],
) -> list[UnsafeUse]:
    """The cross-stream uses in ``order`` (compute nodes in host order) that need a record.

    ``seq[n]`` is ``n``'s position on its stream; ``knows[n]`` the vector clock of its stream
    right after it.  Nodes missing from ``seq`` (graph inputs, the preamble) allocate nothing.
    """
    last, uses, on_stream = _last_and_cross_uses(order, stream, seq, root)
    returned = {root.get(a, a) for a in output.all_input_nodes}
    unsafe: list[UnsafeUse] = []
    for r, per_stream in uses.items():
        if r in returned:
            continue
        positions = on_stream.get(stream[r], [])
        i = bisect_right(positions, last[r])
        if i == len(positions):
            continue
        first_after = order[positions[i]]
        for s in sorted(per_stream):
            last_seq, user, alias = per_stream[s]
            if knows[first_after][s] < last_seq and is_tensor(alias):
                unsafe.append(UnsafeUse(r, s, alias, user))
    return unsafe


def _last_and_cross_uses(
    order: Sequence[Node],
    stream: Mapping[Node, int],
    seq: Mapping[Node, int],
    root: Mapping[Node, Node],
) -> tuple[dict[Node, int], dict[Node, dict[int, tuple[int, Node, Node]]], dict[int, list[int]]]:
    """Per storage: host position of its last use, and per other stream its last use there.
    Also the host positions of the nodes of each stream (those in ``seq``)."""
    last: dict[Node, int] = {}
    uses: dict[Node, dict[int, tuple[int, Node, Node]]] = {}
    on_stream: dict[int, list[int]] = {}
    root_of = root.get
    for pos, user in enumerate(order):
        s = stream[user]
        counted = user in seq
        if counted:
            positions = on_stream.get(s)
            if positions is None:
                on_stream[s] = [pos]
            else:
                positions.append(pos)
        for alias in node_inputs(user):  # torch.fx's dict of the node's inputs
            r = root_of(alias, alias)
            if r not in seq:
                continue  # a graph input, or allocated by the preamble: owned by the caller
            last[r] = pos
            if counted and s != stream[r]:
                per_stream = uses.setdefault(r, {})
                known = per_stream.get(s)
                if known is None:
                    per_stream[s] = (seq[user], user, alias)
                else:
                    per_stream[s] = (seq[user], known[1], known[2])
    return last, uses, on_stream

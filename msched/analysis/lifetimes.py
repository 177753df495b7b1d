"""When a cross-stream tensor use needs ``record_stream``: the rule shared by emit and verify.

The CUDA caching allocator hands a freed block back to the stream that allocated it; the next
allocation on that stream may reuse it at once.  The generated code of an FX graph frees a
tensor right after its last use in host order.  So a use of tensor ``X`` (allocated on stream
``t`` by the producer of its storage) on another stream ``s`` is unsafe exactly when some work
issued on ``t`` after ``X`` is freed may take the block before that use ends: the first node
on ``t`` after the free point that may allocate (`allocates`) does not happen-after the last
use of ``X`` on ``s``.  Only then is ``X.record_stream(s)`` needed.  Vector clocks are
monotonic along a stream, so checking that first node is enough.  A node that allocates
nothing cannot hand the block out, whatever it waits for: a true view (``view``, ``t``,
``slice``, ...: not ``reshape`` or ``contiguous``, which copy when they must), ``getitem``
(its producer allocated), a ``wait_tensor`` (it returns its input) and the stream ops.
Anything else may: a new storage, an op of unknown effect, a collective's issue (its result),
and in-place and ``out=`` ops too (several kernels allocate scratch space from the caching
allocator: ``index_put_`` with ``accumulate=True`` sorts into temporaries, ``addmm_``
into a non-contiguous ``self`` computes into a fresh tensor and copies back, and a custom
op's insides are unknown).

Instead of the record, the storage may be kept alive until its own stream has waited for the
use: a later reference on the host (msched emits ``record_stream(X, t)`` for ``X``'s own
stream ``t``, which the allocator ignores: a use on the allocation stream needs nothing) moves
the free after that wait, and every later allocation on ``t`` then happens-after the use.  Both
are safe; the memory differs (`msched.proof.memory`).

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

import operator
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from torch.fx import Node

from msched._torch_internals import node_inputs
from msched.analysis._collective_targets import op_name
from msched.analysis._target_names import VIEW_NAMES
from msched.analysis.collectives import is_wait
from msched.analysis.effects import Effects
from msched.analysis.nodes import INPUT_OPS


@dataclass(frozen=True)
class UnsafeUse:
    """A storage used on ``stream`` that needs ``record_stream(tensor, stream)``, or to be
    kept alive until its own stream has waited for ``stream``.

    ``tensor`` is the alias of the storage that ``user`` (the first user on ``stream``) reads;
    ``last`` is the last user on ``stream``, ``last_seq`` its position there, and ``reuser``
    the first node of the storage's own stream after its free that may take the block.
    """

    root: Node
    stream: int
    tensor: Node
    user: Node
    last: Node | None = None
    last_seq: int = 0
    reuser: Node | None = None


def allocates(node: Node, effects: Effects) -> bool:
    """Whether running ``node`` may take a block from the caching allocator on its stream
    (the module docstring says which nodes do not).  ``effects``: those of ``node``'s graph."""
    if node.op in INPUT_OPS or node.op == "output":
        return False
    if node.op == "call_function" and node.target is operator.getitem:
        return False
    if is_wait(node):
        return False
    if effects.root.get(node, node) is node or effects.writes.get(node):
        return True
    # Its value lives in an input's storage.  The schemas of `reshape`, `contiguous` and `to`
    # say so too, but they copy when they must: only a true view never allocates.
    return _view_name(node) not in VIEW_NAMES


def _view_name(node: Node) -> str | None:
    """The name ``node``'s target is known by among the views: an aten op's, a method's, a
    torch function's."""
    if node.op == "call_method":
        return str(node.target)
    if node.op != "call_function":
        return None
    namespace, _, name = (op_name(node.target) or "").partition("::")
    if name:
        return name if namespace == "aten" else None
    return getattr(node.target, "__name__", None)


def unsafe_cross_stream_uses(
    order: Sequence[Node],
    output: Node,
    stream: Mapping[Node, int],
    seq: Mapping[Node, int],
    knows: Mapping[Node, Sequence[int]],
    root: Mapping[Node, Node],
    is_tensor: Callable[[Node], bool],
    may_allocate: Callable[[Node], bool],
) -> list[UnsafeUse]:
    """The cross-stream uses in ``order`` (compute nodes in host order) that need a record.

    ``seq[n]`` is ``n``'s position on its stream; ``knows[n]`` the vector clock of its stream
    right after it.  Nodes missing from ``seq`` (graph inputs, the preamble) allocate nothing,
    nor do those ``may_allocate`` refuses (`allocates`, asked only after a free).  ``order``
    may also hold stream ops that take a tensor (not in ``seq``, with a ``stream``): they only
    hold it alive, so that a keep-alive ``record_stream`` moves its free later.
    """
    last, uses, on_stream = _last_and_cross_uses(order, stream, seq, root)
    returned = {root.get(a, a) for a in output.all_input_nodes}
    unsafe: list[UnsafeUse] = []
    next_allocation = _NextAllocation(order, on_stream, may_allocate)
    for r, per_stream in uses.items():
        if r in returned:
            continue
        first_after = next_allocation.after(stream[r], last[r])
        if first_after is None:
            continue
        for s in sorted(per_stream):
            last_seq, user, alias, last_user = per_stream[s]
            if knows[first_after][s] < last_seq and is_tensor(alias):
                unsafe.append(UnsafeUse(r, s, alias, user, last_user, last_seq, first_after))
    return unsafe


class _NextAllocation:
    """The first node of a stream after a host position that may allocate (remembered: the
    storages freed between two nodes of a stream all ask the same question)."""

    def __init__(
        self,
        order: Sequence[Node],
        on_stream: Mapping[int, list[int]],
        may_allocate: Callable[[Node], bool],
    ) -> None:
        self.order, self.on_stream, self.may_allocate = order, on_stream, may_allocate
        self.known: dict[tuple[int, int], Node | None] = {}

    def after(self, s: int, position: int) -> Node | None:
        positions = self.on_stream.get(s, [])
        i = bisect_right(positions, position)
        if (s, i) in self.known:
            return self.known[(s, i)]
        end = i
        while end < len(positions) and not self.may_allocate(self.order[positions[end]]):
            end += 1
        found = self.order[positions[end]] if end < len(positions) else None
        for k in range(i, end + 1):  # every free point from i to the allocation shares it
            self.known[(s, k)] = found
        return found


def _last_and_cross_uses(
    order: Sequence[Node],
    stream: Mapping[Node, int],
    seq: Mapping[Node, int],
    root: Mapping[Node, Node],
) -> tuple[
    dict[Node, int], dict[Node, dict[int, tuple[int, Node, Node, Node]]], dict[int, list[int]]
]:
    """Per storage: host position of its last use, and per other stream its last use there
    (its position on that stream, the first user and the alias it reads, the last user).
    Also the host positions of the nodes of each stream (those in ``seq``); a node not in
    ``seq`` (a stream op that holds a tensor) counts only as a use."""
    last: dict[Node, int] = {}
    uses: dict[Node, dict[int, tuple[int, Node, Node, Node]]] = {}
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
                    per_stream[s] = (seq[user], user, alias, user)
                else:
                    per_stream[s] = (seq[user], known[1], known[2], user)
    return last, uses, on_stream

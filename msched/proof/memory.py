"""`msched.peak_memory`: what a scheduled graph costs in device memory, three ways.

Why: branches that run at once keep more tensors alive, a collective issued early and waited
late holds its buffers longer, and PyTorch's CUDA caching allocator keeps one pool per
stream: a 2-stream schedule can hold two pools where one stream held one.  Nothing runs on a
GPU to find out; this reads the stream program (any dialect) and its simulated timeline.

Facts of the allocator (PyTorch's ``c10/cuda/CUDACachingAllocator.cpp``, its header comment
and ``recordStream``; the constants of ``c10/core/AllocatorConfig.h`` of the installed torch;
https://pytorch.org/docs/stable/notes/cuda.html#memory-management):

- every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``), at least 512;
  a zero-byte tensor takes no block;
- requests of at most 1 MiB (``kSmallSize``) come from a small pool of 2 MiB segments
  (``kSmallBuffer``); larger ones below 10 MiB (``kMinLargeAlloc``) from 20 MiB segments
  (``kLargeBuffer``) of the large pool; 10 MiB and more get a segment of their own, rounded up
  to 2 MiB (``kRoundLarge``);
- a block belongs to the stream it was allocated on: once freed, only that stream's later
  allocations reuse it;
- a block used on another stream (``record_stream``) returns to its pool only when the events
  the allocator records on those streams at the free have completed on the device (polled at
  later allocations): the allocator does not know that a stream will later wait.

The three figures (integer bytes; graph inputs, parameters and buffers are the ``baseline``,
apart):

1. ``allocated``: the peak of live tensor bytes in host order, as
   ``torch.cuda.max_memory_allocated`` counts blocks.  A node allocates its result when its
   storage is its own (`msched.analysis.effects`: views, ``getitem`` of a view list, in-place
   and ``out=`` results allocate nothing; the fresh outputs of a multi-output op are
   allocated by the op); a storage is freed after its last use in host order, a use being an
   input of a node or a storage it reads or writes (an asynchronous collective's ``wait``
   reads the input the work holds, so an all-to-all's buffers live until their wait); what
   ``output`` returns lives to the end.
2. ``reserved``: the segments the allocator holds at its peak when the device keeps up with
   `msched.simulate`'s timeline.  One pool per stream; each block is held in its pool from its
   allocation until it is returned: at its free when no other stream used it, else once the
   other streams' work issued before the free has ended (`msched.simulate`'s end times) at an
   allocation of its pool that starts later.
3. ``reserved_bound``: the same under any timing, the host arbitrarily far ahead: a block
   recorded on another stream never returns during the graph; a block freed on its own
   stream (kept alive until the stream waited for the other use) returns at its free.

The pool model, kept simple: in each pool the bytes held are fungible within their segment
class (fragmentation inside segments is not modeled), and segments are never released.
A pool holds ``2 MiB * ceil(small bytes held / 2 MiB)`` in its small class and
``20 MiB * ceil(1-10 MiB bytes held / 20 MiB)`` plus the 2 MiB-rounded bytes of the larger
blocks in its large class, each at its peak so far.  Both walks visit the same allocations
and a block is held at least as long for the bound, and both formulas grow with the bytes
held, so ``allocated <= reserved <= reserved_bound`` always holds; on one stream (no block
used elsewhere) ``reserved == reserved_bound``.  Not modeled: fragmentation inside segments
(a large block whose segment leaves 1 MiB or less is not split, and counts whole in
``max_memory_allocated``), a 1-10 MiB request served from a freed larger segment, expandable
segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), CUDA-graph private pools,
the caller's blocks and segments from before the graph.

Cost: linear in the graph (one interpretation, one timeline, two walks with a heap).  The
walks take plain maps (the host order, the blocks, each node's start, end and stream), so a
scheduler can price a candidate schedule with its own times before it emits anything.
"""

from __future__ import annotations

import gc
import heapq
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torch.fx import Graph, GraphModule, Node

from msched._torch_internals import node_inputs
from msched.analysis._graphcheck import check_acyclic
from msched.analysis.cost import CostModel, check_cost_model
from msched.analysis.effects import Effects
from msched.analysis.nodes import INPUT_OPS, graph_of
from msched.analysis.sizes import (
    SizeEvaluator,
    has_value,
    node_values,
    returns_nothing,
    storage_bytes,
)
from msched.errors import InvalidArgumentError
from msched.proof.clocks import clocks_of
from msched.proof.dialects import Dialect
from msched.proof.interpreter import interpret
from msched.proof.program import StreamProgram
from msched.proof.record_streams import scheduled_effects
from msched.proof.timeline import timeline_of

__all__ = [
    "MemoryPoint",
    "MemoryReport",
    "block_bytes",
    "format_bytes",
    "peak_memory",
    "segment_bytes",
    "sized_memory",
]

KIB = 1024
MIB = 1024 * KIB
MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = MIB  # kSmallSize: the largest small request
SMALL_SEGMENT = 2 * MIB  # kSmallBuffer
LARGE_SEGMENT = 20 * MIB  # kLargeBuffer
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: from here a segment of its own
ROUND_LARGE = 2 * MIB  # kRoundLarge


def block_bytes(nbytes: int) -> int:
    """The block the allocator gives a request of ``nbytes`` (0 for none)."""
    if nbytes <= 0:
        return 0
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def segment_bytes(block: int) -> int:
    """The segment a fresh block of ``block`` bytes (rounded) is cut from."""
    if block <= SMALL_SIZE:
        return SMALL_SEGMENT
    if block < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-block // ROUND_LARGE) * ROUND_LARGE


class MemoryPoint(NamedTuple):
    """The memory right after ``node`` (the ``step``-th node in host order) allocated:
    live tensor bytes and the segments held (the ``reserved`` model), in bytes; ``stream``
    is the node's stream and ``pool`` the segments its stream's pool holds then (what a
    picture draws per pool)."""

    step: int
    node: str
    allocated: int
    reserved: int
    stream: int = 0
    pool: int = 0


@dataclass(frozen=True)
class MemoryReport:
    """What `peak_memory` found (see `msched.proof.memory`); every figure in bytes.

    ``allocated`` <= ``reserved`` <= ``reserved_bound``; ``baseline`` is the graph's inputs,
    parameters and buffers (not in the three).  ``per_stream`` and ``per_stream_bound`` hold
    each stream pool's segments at its peak.  ``curve`` has a `MemoryPoint` per node that
    runs.  ``sizes`` maps every symbolic size evaluated to its value; ``hinted`` names those
    taken from the shape environment's hints rather than from the ``sizes=`` given.
    """

    allocated: int
    reserved: int
    reserved_bound: int
    baseline: int
    per_stream: Mapping[int, int]
    per_stream_bound: Mapping[int, int]
    curve: tuple[MemoryPoint, ...] = field(repr=False)
    sizes: Mapping[str, int] = field(default_factory=dict)
    hinted: tuple[str, ...] = ()

    def __str__(self) -> str:
        def mib(n: int) -> str:
            return f"{n / MIB:.2f} MiB"

        line = (
            f"peak memory: {mib(self.allocated)} allocated, {mib(self.reserved)} reserved, "
            f"{mib(self.reserved_bound)} reserved under any timing "
            f"(+ {mib(self.baseline)} inputs, parameters and buffers)"
        )
        if self.sizes:
            shown = ", ".join(f"{k}={v}" for k, v in sorted(self.sizes.items()))
            line += f" at {shown}" + (" (hints)" if self.hinted else "")
        return line


def format_bytes(n: int) -> str:
    """``n`` bytes as deterministic text in the largest unit it fills, exact to six
    significant digits: ``512 B``, ``3.5 KiB``, ``24 MiB``, ``1.5 GiB``."""
    for unit, size in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= size:
            value = n / size
            text = str(int(value)) if value == int(value) else f"{value:.6g}"
            return f"{text} {unit}"
    return f"{n} B"


def sized_memory(
    gm: GraphModule | Graph,
    *,
    cost_model: CostModel | None = None,
    dialect: Dialect | str | None = None,
) -> MemoryReport | None:
    """`peak_memory` of ``gm`` from the sizes its nodes carry; None when they carry none or
    not all of them (nothing to show: a picture shows memory only where it is known).

    Why: every picture shows the peak, and graphs built without fake values (the decoder
    stacks, a user's traced module) must still render.  A graph whose nodes carry no size at
    all is answered at once, without reading its program.
    """
    graph = graph_of(gm)
    if not any(has_value(n) for n in graph.nodes if n.op != "output"):
        return None
    try:
        return peak_memory(gm, cost_model=cost_model, dialect=dialect)
    except InvalidArgumentError:
        return None


def peak_memory(
    gm: GraphModule | Graph,
    *,
    cost_model: CostModel | None = None,
    dialect: Dialect | str | None = None,
    example_inputs: Sequence[Any] | None = None,
    sizes: Mapping[str, int] | None = None,
) -> MemoryReport:
    """The `MemoryReport` of the scheduled (or unscheduled: one stream) graph ``gm``.

    Why: a schedule's memory is part of what it costs; serving engines size their KV cache
    from what is left.  Algorithm (the module docstring gives the rules):

    1. Read ``gm`` in ``dialect`` (`msched.proof.interpreter.interpret`, detected when
       None), stamp it (`msched.proof.clocks`) and time it under ``cost_model``
       (`msched.simulate`'s timeline).
    2. Find every storage (`msched.analysis.effects`, as `msched.verify` reads a scheduled
       graph), the node that allocates it, its bytes (`msched.analysis.sizes`: the nodes'
       fake values, else propagated from ``example_inputs``; symbolic sizes at ``sizes`` or
       the hints) and its last use in host order.
    3. Walk the host order once for ``allocated``, then twice over the stream pools for
       ``reserved`` and ``reserved_bound``.

    Raises `msched.InvalidArgumentError` when sizes are missing and no ``example_inputs`` are
    given, for a bad cost model or a ``sizes`` name the graph does not have, and
    `msched.InvalidGraphError` for a graph that cannot be read.
    """
    check_cost_model(cost_model)
    return _report(
        gm, cost_model, dialect, lambda needed: node_values(gm, needed, example_inputs), sizes
    )


def sized_values(gm: GraphModule, example_inputs: Sequence[Any] | None) -> dict[Node, Any]:
    """The values (fake tensors, tensor metadata) `peak_memory` reads of the unscheduled
    ``gm``: its inputs' and every node's that may allocate, from the nodes' fake values or
    propagated once from ``example_inputs``.  A scheduler prices its candidates with them
    (`peak_memory_with`): scheduling keeps the nodes, so the same values serve every one."""
    graph = graph_of(gm)
    program = interpret(graph, None)
    effects = scheduled_effects(graph, program.passthrough)
    order = _host_order(graph, program)
    fresh = _fresh_nodes(order, program, effects)
    inputs = [n for n in order if n.op in INPUT_OPS]
    return node_values(gm, [*inputs, *fresh], example_inputs)


def peak_memory_with(
    gm: GraphModule, values: Mapping[Node, Any], cost_model: CostModel | None = None
) -> MemoryReport:
    """`peak_memory` of a graph msched scheduled, with the ``values`` of `sized_values`
    (taken before it was scheduled) instead of reading or propagating them again."""

    def known(needed: Sequence[Node]) -> dict[Node, Any]:
        missing = [n for n in needed if n not in values]
        found = node_values(gm, missing, None) if missing else {}
        return {n: values[n] if n in values else found[n] for n in needed}

    return _report(gm, cost_model, "msched", known, None)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """CPython's automatic garbage collection off for the block (when it was on).

    Why: the steps make a few objects per node that live through the call (the program's
    steps, the clocks, the blocks, the curve); once they outnumber a quarter of the heap,
    CPython runs a full collection, a pass over every object of the process (the graph, its
    fake values, torch itself: 0.28 s on a 24k-node graph, about half a million objects).
    It frees nothing here (the steps make no cycles of garbage), and it made the cost per
    node grow with the graph: 20 us per node at 1k nodes, 35 at 24k.  Paused, the cost is
    linear.  Collection resumes after the block, also on an error (if it was on before).
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


@_collector_paused()
def _report(
    gm: GraphModule | Graph,
    cost_model: CostModel | None,
    dialect: Dialect | str | None,
    values_of: Callable[[Sequence[Node]], Mapping[Node, Any]],
    sizes: Mapping[str, int] | None,
) -> MemoryReport:
    """`peak_memory`'s steps, the values of the needed nodes from ``values_of``."""
    graph = graph_of(gm)
    check_acyclic(graph)
    program = interpret(graph, dialect)
    clocks = clocks_of(program)
    timeline = timeline_of(graph, clocks, cost_model)
    effects = scheduled_effects(graph, program.passthrough)
    order = _host_order(graph, program)
    fresh = _fresh_nodes(order, program, effects)
    inputs = [n for n in order if n.op in INPUT_OPS]
    values = values_of([*inputs, *fresh])
    evaluate = SizeEvaluator(sizes)
    blocks = _blocks(order, fresh, values, effects, program, evaluate)
    baseline = _baseline(inputs, values, effects, evaluate)
    evaluate.check_given()
    walk = _Walk(order, blocks, timeline.start, timeline.end, timeline.stream)
    allocated, live_curve = walk.allocated()
    reserved, per_stream, held_curve, pool_curve = walk.pools(returns=True)
    bound, per_stream_bound, _, _ = walk.pools(returns=False)
    start, stream = timeline.start, timeline.stream
    curve = tuple(
        MemoryPoint(i, node.name, live_curve[i], held_curve[i], stream.get(node, 0), pool_curve[i])
        for i, node in enumerate(order)
        if node in start
    )
    return MemoryReport(
        allocated,
        reserved,
        bound,
        baseline,
        per_stream,
        per_stream_bound,
        curve,
        dict(sorted(evaluate.used.items())),
        tuple(sorted(evaluate.hinted)),
    )


def _host_order(graph: Graph, program: StreamProgram) -> list[Node]:
    """The nodes that run, in host order, up to and including ``output``."""
    order = []
    for node in graph.nodes:
        order.append(node)
        if node is program.output:
            break
    return order


def _fresh_nodes(order: list[Node], program: StreamProgram, effects: Effects) -> list[Node]:
    """The compute nodes whose value is a storage of their own (they may allocate)."""
    stream_ops = {s.node for s in program.steps if s.kind != "compute"}
    root = effects.root
    return [
        n
        for n in order
        if n.op not in INPUT_OPS
        and n is not program.output
        and n not in stream_ops
        and root.get(n) is n
        and not returns_nothing(n)
        and not _getitem_of_fresh(n, root)
    ]


def _getitem_of_fresh(node: Node, root: Mapping[Node, Node]) -> bool:
    """A ``getitem`` whose storage is one of the fresh outputs of its multi-output op: the
    op allocated it (`_blocks`)."""
    parent = node.args[0] if node.args else None
    return (
        node.op == "call_function"
        and getattr(node.target, "__name__", "") == "getitem"
        and isinstance(parent, Node)
        and root.get(parent) is parent
    )


@dataclass(slots=True)
class _Block:
    """One allocation: its rounded bytes, stream, host positions of the allocating node and
    of the last use (``free`` = len(order): never freed), the node that allocates it, and
    the other streams it was recorded on.

    Slots and a shared empty ``recorded`` (most blocks are recorded nowhere): one object per
    block, so that a large graph's blocks do not push the garbage collector into a full
    pass over the heap (see `_Walk`)."""

    nbytes: int
    stream: int
    alloc: int
    free: int
    node: Node
    recorded: frozenset[int] = frozenset()


def _blocks(
    order: list[Node],
    fresh: list[Node],
    values: Mapping[Node, Any],
    effects: Effects,
    program: StreamProgram,
    evaluate: SizeEvaluator,
) -> list[_Block]:
    """Every allocation of the graph, with its lifetime and the streams it was recorded on."""
    position = {n: i for i, n in enumerate(order)}
    last = _last_uses(order, effects)
    blocks: list[_Block] = []
    by_root: dict[Node, _Block] = {}
    for node in fresh:
        at, stream = position[node], program.stream_of[node]
        for keys, nbytes in _allocations(node, values.get(node), effects.root, evaluate):
            size = block_bytes(nbytes)
            if not size:
                continue
            free = max(last.get(k, at) for k in keys)
            block = _Block(size, stream, at, free, node)
            blocks.append(block)
            for k in keys:
                by_root[k] = block
    _note_records(program, effects.root, by_root)
    return blocks


def _allocations(
    node: Node, value: Any, root: Mapping[Node, Node], evaluate: SizeEvaluator
) -> list[tuple[tuple[Node, ...], int]]:
    """The storages ``node`` allocates: the roots that name each (the node itself, or the
    ``getitem`` nodes of a fresh output, with the node) and its bytes."""
    if not isinstance(value, (list, tuple)):
        nbytes = storage_bytes(value, evaluate)
        return [((node,), nbytes)] if nbytes else []
    items: dict[int, list[Node]] = {}
    for user in node.users:
        if getattr(user.target, "__name__", "") == "getitem" and isinstance(user.args[1], int):
            items.setdefault(user.args[1], []).append(user)
    found = []
    for i, element in enumerate(value):
        users = items.get(i, [])
        if users and all(root.get(u) not in (u, node) for u in users):
            continue  # an alias of an input (a schema's ``Tensor(a)`` return)
        nbytes = storage_bytes(element, evaluate)
        if nbytes:
            found.append(((node, *[u for u in users if root.get(u) is u]), nbytes))
    return found


def _last_uses(order: list[Node], effects: Effects) -> dict[Node, int]:
    """The host position of the last use of every storage; ``len(order)`` for the
    storages ``output`` returns (they live to the end)."""
    root, reads, writes, aliases = effects.root, effects.reads, effects.writes, effects.aliases
    last: dict[Node, int] = {}
    output = len(order) - 1
    for i, node in enumerate(order):
        touched = [root.get(a, a) for a in node_inputs(node)]
        touched += reads.get(node, ()) + writes.get(node, ())
        if node.op != "output" and root.get(node) is not None:
            touched.append(root[node])
        for r in touched:
            for s in aliases.get(r, (r,)):
                last[s] = len(order) if i == output else i
    return last


def _note_records(
    program: StreamProgram, root: Mapping[Node, Node], by_root: Mapping[Node, _Block]
) -> None:
    """Mark each block with the other streams a ``record_stream`` before ``output`` named."""
    for step in program.steps:
        if step.node is program.output:
            break
        if step.kind != "record_stream" or step.tensor is None or step.to_stream is None:
            continue
        block = by_root.get(root.get(step.tensor, step.tensor))
        if block is not None and step.to_stream != block.stream:
            block.recorded |= {step.to_stream}


def _baseline(
    inputs: list[Node], values: Mapping[Node, Any], effects: Effects, evaluate: SizeEvaluator
) -> int:
    """The rounded bytes of the distinct storages of the graph's inputs and attributes."""
    seen: dict[Node, int] = {}
    for node in inputs:
        r = effects.root.get(node, node)
        nbytes = storage_bytes(values.get(node), evaluate) or 0
        seen[r] = max(seen.get(r, 0), block_bytes(nbytes))
    return sum(seen.values())


class _Pool:
    """One stream's pool: bytes held per segment class, and its segments at their peak."""

    def __init__(self) -> None:
        self.small = self.middle = self.large = 0
        self.small_segments = self.large_segments = 0

    def hold(self, nbytes: int, sign: int) -> None:
        if nbytes <= SMALL_SIZE:
            self.small += sign * nbytes
        elif nbytes < MIN_LARGE_ALLOC:
            self.middle += sign * nbytes
        else:
            self.large += sign * segment_bytes(nbytes)
        if sign > 0:
            small = -(-self.small // SMALL_SEGMENT) * SMALL_SEGMENT
            large = -(-self.middle // LARGE_SEGMENT) * LARGE_SEGMENT + self.large
            self.small_segments = max(self.small_segments, small)
            self.large_segments = max(self.large_segments, large)

    @property
    def segments(self) -> int:
        return self.small_segments + self.large_segments


class _Walk:
    """The walks over the host order of one graph's blocks.

    Times come in as plain maps (each compute node's start, end and stream), not as a
    `Timeline`, so that a scheduler can price a candidate schedule with its own times.

    The blocks are kept in two lists, by allocation and by free, walked with a cursor each,
    and the curves are lists of integers: a graph's walks make a constant number of objects
    the garbage collector tracks, not one or two per node.  (Each object that outlives a
    young collection counts toward CPython's full collection, a pass over the whole heap:
    on a 20k-node graph, one full pass cost a third of a second and made the cost per node
    grow with the graph.)"""

    def __init__(
        self,
        order: list[Node],
        blocks: list[_Block],
        start: Mapping[Node, float],
        end: Mapping[Node, float],
        stream: Mapping[Node, int],
    ) -> None:
        self.order = order
        self.start = start
        self.stream = stream
        # stable sorts: blocks allocated (or freed) at one step keep their order
        self.by_alloc = sorted(blocks, key=_alloc_of)
        self.by_free = sorted(blocks, key=_free_of)
        self.ready = self._ready_times(blocks, end, stream)

    def allocated(self) -> tuple[int, list[int]]:
        """The peak of live bytes, and the live bytes right after each step allocated."""
        live = peak = 0
        curve = []
        by_alloc, by_free = self.by_alloc, self.by_free
        a = f = 0
        for i in range(len(self.order)):
            while a < len(by_alloc) and by_alloc[a].alloc == i:
                live += by_alloc[a].nbytes
                a += 1
            peak = max(peak, live)
            curve.append(live)
            while f < len(by_free) and by_free[f].free == i:
                live -= by_free[f].nbytes
                f += 1
        return peak, curve

    def pools(self, returns: bool) -> tuple[int, dict[int, int], list[int], list[int]]:
        """The segments of all pools at their peak, each pool's, and after each step the
        segments held and those of the step's stream's pool (two curves); ``returns``: a
        recorded block returns once its uses have ended."""
        pools: dict[int, _Pool] = {}
        pending: dict[int, list[tuple[float, int, _Block]]] = {}
        pushed = 0  # ties in the heaps are broken by the order of the frees
        total = 0
        held_curve: list[int] = []
        pool_curve: list[int] = []
        by_alloc, by_free = self.by_alloc, self.by_free
        a = f = 0
        for i, node in enumerate(self.order):
            while a < len(by_alloc) and by_alloc[a].alloc == i:
                total += self._allocate(by_alloc[a], pools, pending)
                a += 1
            own = pools.get(self.stream.get(node, -1))
            held_curve.append(total)
            pool_curve.append(own.segments if own is not None else 0)
            while f < len(by_free) and by_free[f].free == i:
                b = by_free[f]
                f += 1
                if not b.recorded:
                    pools[b.stream].hold(b.nbytes, -1)
                elif returns:
                    pushed += 1
                    heapq.heappush(pending.setdefault(b.stream, []), (self.ready[id(b)], pushed, b))
        per_stream = {s: pools[s].segments for s in sorted(pools)}
        return total, per_stream, held_curve, pool_curve

    def _allocate(
        self,
        b: _Block,
        pools: dict[int, _Pool],
        pending: dict[int, list[tuple[float, int, _Block]]],
    ) -> int:
        """Allocate ``b`` in its stream's pool, first returning the recorded blocks whose
        uses ended before it starts; the segments the pool grew by."""
        pool = pools.setdefault(b.stream, _Pool())
        waiting = pending.get(b.stream)
        now = self.start.get(b.node, 0.0)
        while waiting and waiting[0][0] <= now:
            pool.hold(heapq.heappop(waiting)[2].nbytes, -1)
        before = pool.segments
        pool.hold(b.nbytes, 1)
        return pool.segments - before

    def _ready_times(
        self, blocks: list[_Block], end: Mapping[Node, float], stream: Mapping[Node, int]
    ) -> dict[int, float]:
        """When each recorded block's uses on other streams have ended: the end of the last
        node each recording stream issued before the free (the allocator's event)."""
        ends: dict[int, tuple[list[int], list[float]]] = {}
        for i, node in enumerate(self.order):
            if node in end:
                positions, times = ends.setdefault(stream[node], ([], []))
                positions.append(i)
                times.append(max(end[node], times[-1] if times else 0.0))
        ready = {}
        for b in blocks:
            if b.recorded:
                ready[id(b)] = max(_end_before(ends.get(s), b.free) for s in b.recorded)
        return ready


def _alloc_of(block: _Block) -> int:
    return block.alloc


def _free_of(block: _Block) -> int:
    return block.free


def _end_before(ends: tuple[list[int], list[float]] | None, position: int) -> float:
    """The end of the last node of a stream issued at or before host ``position``."""
    if ends is None:
        return 0.0
    i = bisect_right(ends[0], position)
    return ends[1][i - 1] if i else 0.0

"""Which scheduled node is which node of the original graph: paired by what each node is and
what it reads, never by its name.

Why: `msched.verify` with ``original=`` checks a scheduled graph against the orderings of the
graph it was made from, so it must know which scheduled node stands for which original one.
Names prove nothing: a pass may rename every node, and a schedule that swaps two all-reduces
and swaps their names too would read, by name, as the original order while every rank reduces
another tensor in each slot.  A node is what it computes: its op and target, its constant
arguments, and the values it reads, themselves paired the same way.

Algorithm (one pass over each graph):

1. Key every original node by its structure: op, target (an op overload by its packet, as
   Dynamo writes it) and arguments, each input node
   standing for itself; a placeholder by its position among the placeholders (the calling
   convention), a ``get_attr`` by the attribute it reads.  A ``wait_tensor`` read as an
   input stands for the value it waits for (it returns its input): reading a collective's
   result before its wait is a matter of order, which `verify` checks, not another value.
   The nodes of one key queue in program order.
2. Walk the scheduled graph's compute nodes inputs first (host order otherwise).  A value a
   stream op passes through (`msched.proof.actions.passes`) is the value it passes.  A node
   whose inputs are all paired gets the key it would have in the original, each input
   replaced by its pair, and takes the first original node still queued under that key.
   Two original nodes of one key compute the same thing from the same values: in the
   scheduled graph's host order they stand for the original's in program order, and where a
   write between them tells them apart, `verify`'s orderings check that the one paired first
   runs first (happens-before implies host order).  Among them, a scheduled node stands
   for one whose readers read it beside the same paired values (`_Matcher._fits`): two
   ``empty`` buffers are equal until ``copy_(buffer, a)`` fills one of them, so a node
   that reads nothing is walked just before its first reader, after the reader's other
   inputs (`_late_sources`).  The pairing is deterministic.
3. A node with no original left under its key repeats one (a *twin*, the first of that key),
   or else is an *extra*.  A node reading a value that is not paired -- an extra node or a
   node of another graph, both reported on their own -- pairs with the first queued original
   node that matches it everywhere except at those inputs (a *rewired* node; it is an extra
   when none does).  Original nodes never taken are *missing*.
4. ``output`` pairs with ``output``; ``wrong_returns`` lists the returned values that, paired,
   are not the original's (the last word on two equal-looking nodes swapped across a write).

Cost: O(nodes + arguments) dictionary work.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch.fx import Graph, Node

from msched._torch_internals import OpOverload, OpOverloadPacket
from msched.analysis.collectives import is_wait
from msched.analysis.effects import node_info, op_info
from msched.analysis.nodes import inputs_first
from msched.proof.program import StreamProgram

__all__ = ["NodeMatch", "match_nodes", "paired_in_host_order"]


@dataclass(frozen=True)
class NodeMatch:
    """The pairing of an original graph's nodes with a scheduled graph's compute nodes.

    ``pairs`` maps original nodes to scheduled ones; ``missing`` lists the original nodes
    with no counterpart (program order); ``extras`` the scheduled compute nodes with none
    (host order), of which ``twins`` maps those that repeat an original node to it;
    ``wrong_returns`` holds ``(original value, scheduled value)`` for each value ``output``
    returns where the original returns another one.
    """

    pairs: dict[Node, Node]
    missing: tuple[Node, ...]
    extras: tuple[Node, ...]
    twins: dict[Node, Node]
    wrong_returns: tuple[tuple[Node, Node], ...]


class _Unpaired:
    """Stands in a key for an input that has no original counterpart."""

    def __repr__(self) -> str:
        return "<unpaired>"


_UNPAIRED = _Unpaired()
_SELF = "<self>"  # in a reader's key, the node whose readers are compared


def _holds_unpaired(key: object) -> bool:
    if key is _UNPAIRED:
        return True
    return isinstance(key, tuple) and any(_holds_unpaired(k) for k in key)


_EXACT = (int, str, bool, type(None))  # equal exactly when equal, kept apart by their type


def _shape(value: Any, resolve: Callable[[Node], object]) -> object:
    """The hashable structure of an argument, each node replaced by ``resolve(node)``."""
    kind = type(value)
    if kind is Node:
        return resolve(value)
    if kind in _EXACT:
        return (kind, value)  # 1 and True stay apart
    if isinstance(value, (list, tuple)):
        return (kind is tuple, tuple([_shape(v, resolve) for v in value]))
    if isinstance(value, dict):
        return tuple([(k, _shape(v, resolve)) for k, v in value.items()])
    if isinstance(value, Node):
        return resolve(value)
    return (kind.__qualname__, repr(value))  # a float by its text: nan equals nan


def _key(node: Node, resolve: Callable[[Node], object], placeholders: dict[Node, int]) -> object:
    """What ``node`` computes, its inputs given by ``resolve``."""
    if node.op == "placeholder":
        return ("placeholder", placeholders[node])
    if node.op == "get_attr":
        return ("get_attr", node.target)
    target = node.target
    if isinstance(target, OpOverload):  # Dynamo writes the packet, AOT an overload of it
        target = target.overloadpacket
    # An op by its identity (both graphs hold the same op objects, alive during the call):
    # hashing an op packet runs Python code, and keys are hashed for every node.
    what = target if isinstance(target, str) else id(target)
    return (node.op, what, _shape(node.args, resolve), _shape(node.kwargs, resolve))


def _waited_value(node: Node) -> Node:
    """The value ``node`` is: through ``wait_tensor``s, the tensor waited for."""
    while _is_wait_op(node) and node.args and isinstance(node.args[0], Node):
        node = node.args[0]
    return node


_WAIT_OPS: dict[Any, bool] = {}  # op packet or overload -> whether it is wait_tensor


def _is_wait_op(node: Node) -> bool:
    """`is_wait`, remembered per op (it is asked of every input of every node)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, (OpOverload, OpOverloadPacket)):
        return False
    known = _WAIT_OPS.get(target)
    if known is None:
        known = _WAIT_OPS[target] = is_wait(node)
    return known


def _placeholders(nodes: Any) -> dict[Node, int]:
    found = [n for n in nodes if n.op == "placeholder"]
    return {n: i for i, n in enumerate(found)}


# How far `_Readers` looks down: the readers of a node and their readers.
_DEPTH = 2


class _Readers:
    """What reads a node, `_DEPTH` levels down, as a comparable value: of two original nodes
    that compute the same thing from the same values, a scheduled one stands for the one
    read as it is (a dead twin is not the one a consumer reads, and a returned one keeps
    its place in ``output``); pairing it otherwise would leave its readers without a pair."""

    def __init__(self, readers: Callable[[Node], list[tuple[Node, int]]]) -> None:
        self.readers = readers
        self.memo: dict[tuple[Node, int], object] = {}

    def signature(self, node: Node, depth: int) -> object:
        known = self.memo.get((node, depth))
        if known is not None:
            return known
        own: object = (node.op, node.target)
        if depth > 0:
            read = Counter(
                (position, self.signature(user, depth - 1)) for user, position in self.readers(node)
            )
            own = (own, frozenset(read.items()))
        self.memo[(node, depth)] = own
        return own


def _positions(user: Node, value: Node) -> list[int]:
    """Where ``value`` is among ``user``'s arguments (flattened)."""
    return [i for i, leaf in enumerate(_leaves((user.args, user.kwargs))) if leaf is value]


def _direct_readers(node: Node) -> list[tuple[Node, int]]:
    return [(user, p) for user in node.users for p in _positions(user, node)]


class _Matcher:
    """The state of step 2: the original nodes still queued, the pairs made so far."""

    def __init__(self, original: Graph, program: StreamProgram, compute: set[Node]) -> None:
        self.program = program
        self.compute = compute
        self.original = original
        self.queued: dict[object, deque[Node]] = {}
        self.first: dict[object, Node] = {}
        # The same by canonical keys, where an input is named by the first original node
        # equal to it: the fallback when a node's own key finds nothing, because an input
        # of it was paired with another of equal values (three views of one hidden state,
        # read by q, k and v: a view paired with its twin left q's projection unpaired).
        self.canonical: dict[Node, Node] = {}
        self.loosely: dict[object, deque[Node]] = {}
        self.keys: dict[Node, tuple[object, object]] = {}
        own = _placeholders(original.nodes)
        first_loosely: dict[object, Node] = {}
        for node in original.nodes:
            if node.op != "output":
                key = _key(node, _waited_value, own)
                self.queued.setdefault(key, deque()).append(node)
                self.first.setdefault(key, node)
                loose = _key(node, self.canon, own)
                self.canonical[node] = first_loosely.setdefault(loose, node)
                self.loosely.setdefault(loose, deque()).append(node)
                self.keys[node] = (key, loose)
        self.named = {n.name: n for n in original.nodes}
        self.pair_of: dict[Node, Node] = {}  # scheduled -> original
        self.twins: dict[Node, Node] = {}
        self.unpaired: set[Node] = set()
        self.original_readers = _Readers(_direct_readers)
        self.scheduled_readers = _Readers(self._compute_readers)

    def _compute_readers(self, node: Node) -> list[tuple[Node, int]]:
        """The compute nodes (and ``output``) that read ``node``, through the stream ops that
        pass it on, each with the position of the value among its arguments."""
        found = []
        passthrough = self.program.passthrough
        for user in node.users:
            if passthrough.get(user) is node:
                found += [(u, p) for u, p in _direct_readers(user) if u is not user]
            elif user in self.compute or user is self.program.output:
                found += [(user, p) for p in _positions(user, node)]
        return found

    def source(self, node: Node) -> Node:
        """The scheduled value a scheduled input is: through the stream ops that pass a value
        on, and through ``wait_tensor``s."""
        passthrough = self.program.passthrough
        seen = 0
        while node in passthrough and seen <= len(passthrough):  # a cycle would never end
            node, seen = passthrough[node], seen + 1
        return _waited_value(node)

    def resolve(self, node: Node) -> object:
        """The original node a scheduled input stands for, or `_UNPAIRED`."""
        return self.pair_of.get(self.source(node), _UNPAIRED)

    def canon(self, node: Node) -> Node:
        """The first original node equal to the original value ``node`` is."""
        value = _waited_value(node)
        return self.canonical.get(value, value)

    def _resolve_canon(self, node: Node) -> object:
        found = self.pair_of.get(self.source(node))
        return _UNPAIRED if found is None else self.canon(found)

    def _pair(self, node: Node, waiting: deque[Node]) -> None:
        taken = self.pair_of[node] = self._take(node, waiting)
        key, loose = self.keys[taken]
        for queue in (self.queued[key], self.loosely[loose]):
            if taken in queue:
                queue.remove(taken)

    def visit(self, node: Node, placeholders: dict[Node, int]) -> None:
        key = _key(node, self.resolve, placeholders)
        waiting = self.queued.get(key)
        if waiting:
            self._pair(node, waiting)
        elif key in self.first:  # another node already took the one it repeats
            self.twins[node] = self.first[key]
            self.unpaired.add(node)
        else:
            loose = self.loosely.get(_key(node, self._resolve_canon, placeholders))
            if loose:
                self._pair(node, loose)
            elif not self._rewired(node, key):
                self.unpaired.add(node)

    def _take(self, node: Node, waiting: deque[Node]) -> Node:
        """Of the queued original nodes equal to ``node``, the one of its name if it is read
        as ``node`` is (`_Readers`), else the first one read so, else the one of its name,
        else the first one.  Every candidate computes what ``node`` computes from the same
        values, so a name only chooses among equals: it keeps each layer's constant with its
        own layer where the readers, two levels down, look alike in every layer.  Names
        choose only among nodes that write nothing: equal writes pair in host order, which
        `verify`'s orderings then check."""
        if len(waiting) > 1:
            want = self.scheduled_readers.signature(node, _DEPTH)
            named = self.named.get(node.name)
            if named is None or named not in waiting or not _writes_nothing(named):
                named = None
            read_alike = [c for c in waiting if self.original_readers.signature(c, _DEPTH) == want]
            pool = read_alike or list(waiting)
            fitting = [c for c in pool if self._fits(node, c)]
            if fitting:
                pool = fitting
            elif not read_alike:
                pool = []
            chosen = named if named in pool or not pool else pool[0]
            if chosen is not None:
                waiting.remove(chosen)
                return chosen
        return waiting.popleft()

    def _fits(self, node: Node, candidate: Node) -> bool:
        """Whether every reader of ``node`` (and every reader of those, `_DEPTH` levels)
        whose other inputs are all paired reads ``candidate``'s as it does: with the same op,
        at the same place, beside the same values.  Two empty buffers are equal until
        written: the one the scheduled graph fills from ``a`` stands for the original one
        filled from ``a``, whatever its name or place; two layers' equal constants are told
        apart by their layers' weights, two readers down (the readers' ops alone,
        `_Readers`, tell neither)."""
        wanted = _reach(node, self._compute_readers, self.source, self.resolve)
        wanted = Counter({k: n for k, n in wanted.items() if not _holds_unpaired(k)})
        if not wanted:
            return True
        own = _reach(candidate, _direct_readers, _waited_value, _waited_value)
        return all(own[key] >= count for key, count in wanted.items())

    def _rewired(self, node: Node, key: object) -> bool:
        """Pair ``node``, which reads an unpaired value, with the first queued original node
        equal to it everywhere else; False when it reads none, when one is neither an extra
        node nor one of another graph (both reported on their own), or when no such original
        node is queued."""
        loose = [v for v in map(self.source, node.all_input_nodes) if v not in self.pair_of]
        if not loose or any(v not in self.unpaired and v in self.program.stream_of for v in loose):
            return False
        taken = set(self.pair_of.values())
        for candidate in self.original.nodes:
            if candidate.op != node.op or candidate in taken:
                continue
            own = _key(candidate, _waited_value, {})
            if _agrees(key, own):
                self.pair_of[node] = candidate
                for queue in (self.queued[own], self.loosely[self.keys[candidate][1]]):
                    if candidate in queue:
                        queue.remove(candidate)
                return True
        return False


def _reach(
    start: Node,
    readers: Callable[[Node], list[tuple[Node, int]]],
    source: Callable[[Node], Node],
    resolve: Callable[[Node], object],
) -> Counter[object]:
    """The keys of the readers of ``start``, `_DEPTH` levels down: ``start`` stands as
    `_SELF` in its readers' keys, a reader as its own key in its readers' keys, and every
    other input as ``resolve`` gives it (``source`` says which value an input is)."""
    found: Counter[object] = Counter()
    level: list[tuple[Node, object]] = [(start, _SELF)]
    for _ in range(_DEPTH):
        below: list[tuple[Node, object]] = []
        for value, marker in level:
            for user, _ in readers(value):

                def named(v: Node, value: Node = value, marker: object = marker) -> object:
                    return marker if source(v) is value else resolve(v)

                key = _key(user, named, {})
                found[key] += 1
                below.append((user, ("read by", key)))
        level = below
    return found


def _writes_nothing(node: Node) -> bool:
    """Whether ``node``'s op is known to write no tensor and touch no state outside."""
    info = op_info(node)
    if info is None:
        return node.op in ("placeholder", "get_attr")
    info = node_info(node, info)
    return not (info.writes or info.unknown or info.world or info.side_effect)


def _agrees(scheduled: object, original: object) -> bool:
    """``scheduled`` equals ``original`` except where it holds `_UNPAIRED`."""
    if scheduled is _UNPAIRED:
        return True
    if isinstance(scheduled, tuple) and isinstance(original, tuple):
        return len(scheduled) == len(original) and all(
            _agrees(s, o) for s, o in zip(scheduled, original, strict=True)
        )
    return bool(scheduled == original)


def match_nodes(original: Graph, program: StreamProgram) -> NodeMatch:
    """Pair ``original``'s nodes with the compute nodes of ``program`` (the module docstring
    has the algorithm)."""
    compute = {st.node for st in program.steps if st.kind == "compute"}
    compute.discard(program.output)
    matcher = _Matcher(original, program, compute)
    ordered = _late_sources(
        [n for n in inputs_first(program.output.graph).nodes if n in compute], matcher.source
    )
    placeholders = _placeholders(ordered)
    for node in ordered:
        matcher.visit(node, placeholders)
    pairs = {o: s for s, o in matcher.pair_of.items()}
    before_output = next(n for n in reversed(original.nodes) if n.op == "output")
    pairs[before_output] = program.output
    missing = tuple(n for n in original.nodes if n not in pairs)
    host = {st.node: i for i, st in enumerate(program.steps)}
    extras = tuple(sorted(matcher.unpaired, key=host.__getitem__))
    wrong = _wrong_returns(before_output, program.output, matcher.resolve)
    return NodeMatch(pairs, missing, extras, matcher.twins, wrong)


def paired_in_host_order(
    original: Graph, wanted: list[Node], pairs: Mapping[Node, Node]
) -> list[Node]:
    """The scheduled nodes paired with ``wanted`` (original nodes, in their order), except
    that equal nodes (one op on the same values: two all-reduces of one tensor) take their
    places in ``wanted`` in the scheduled graph's host order: swapping them changes neither
    a value nor the order of operations every rank issues.  Equal means reading the same
    nodes, not equal ones: two ``empty`` buffers are equal only until written."""
    own = _placeholders(original.nodes)
    keys = {n: _key(n, _waited_value, own) for n in wanted}
    paired = [n for n in wanted if n in pairs]
    if not paired:
        return []
    host = {n: i for i, n in enumerate(pairs[paired[0]].graph.nodes)}
    queues: dict[object, list[Node]] = {}
    for node in paired:
        queues.setdefault(keys[node], []).append(pairs[node])
    ordered = {k: deque(sorted(q, key=host.__getitem__)) for k, q in queues.items()}
    return [ordered[keys[node]].popleft() for node in paired]


def _late_sources(ordered: list[Node], source: Callable[[Node], Node]) -> list[Node]:
    """``ordered`` with each node that reads nothing (``empty``, ``scalar_tensor``) moved to
    just before its first reader, after the reader's other inputs.  A buffer is told from
    an equal one by what its readers write into it: an engine allocates its buffers first
    and fills them later from values computed in between, which must be paired first."""
    held: dict[Node, None] = {}
    found: list[Node] = []
    for node in ordered:
        if node.op == "call_function" and not node.all_input_nodes:
            held[node] = None
            continue
        for value in node.all_input_nodes:
            value = source(value)
            if value in held:
                del held[value]
                found.append(value)
        found.append(node)
    return found + list(held)


def _wrong_returns(
    before: Node, after: Node, resolve: Callable[[Node], object]
) -> tuple[tuple[Node, Node], ...]:
    """The values ``after`` (the scheduled output) returns where ``before`` returns others;
    an unpaired value is reported where it is made."""
    want, got = _leaves(before.args), _leaves(after.args)
    wrong = []
    for o, s in zip(want, got, strict=False):
        if not isinstance(o, Node) or not isinstance(s, Node):
            continue
        stands_for = resolve(s)
        if stands_for is not _UNPAIRED and stands_for is not _waited_value(o):
            wrong.append((o, s))
    if not wrong and len(want) != len(got):
        wrong.append((before, after))
    return tuple(wrong)


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return [value]

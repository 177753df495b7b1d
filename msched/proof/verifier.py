"""`msched.verify`: prove a scheduled graph race-free, or say exactly what is missing.

Why: a scheduler that rebuilds a graph with stream ops can drop a wait, leave a capture after
``output`` or forget a ``record_stream``, and nothing fails on CPU.  `verify` reads the
scheduled graph the way the GPU would run it and checks every ordering the program needs.

Algorithm:

1. Read the graph in host order (`msched.proof.interpreter.interpret`).  Nodes after ``output``
   never run: each is an ``after-output`` violation and takes no further part.  A node that
   uses a node of another graph is a ``missing-node`` violation (its code reads an undefined
   name).
2. Stamp every node that runs with the happens-before engine every reader shares
   (`msched.proof.clocks.clocks_of`): one vector clock per stream; a ``wait_event`` joins
   the latest earlier ``record_event`` of its event (``unrecorded-event`` when there is
   none).  Graph inputs are ready on stream 0 only, so an auxiliary stream must join stream 0
   before its first node (a ``race`` otherwise).
3. The orderings the program needs come from the original graph's `msched.analysis.dag.Dag`
   (nodes paired by what they compute and read, never by name: `msched.proof.matching`;
   ``missing-node`` / ``duplicate-node`` / ``extra-node`` when the node sets differ, and
   ``missing-node`` for a value ``output`` returns in another's place) or, without
   ``original``, from the same rules applied to the scheduled host order.  Every compute
   node that runs is ordered: a node that is not in ``original`` takes its dependencies on
   the others (and the exit's on it) from the scheduled host order.  An edge ``u -> v``
   holds when ``u`` happens before ``v``; otherwise it is a ``race`` (hazard ``data``,
   ``raw``, ``war`` or ``waw``) or, into ``output``, ``exit-not-joined``.
4. ``output`` happens after the last write of every storage and after every node whose
   value nobody uses (``exit-not-joined``), whether or not the original's Dag says so.
5. The collectives (`msched.proof.collective_order`): consecutive ones ordered by
   happens-before and, with ``original`` (without: the order the collectives' ``meta
   ["msched_issue"]`` states, as Inductor's kernel order does), issued in its order
   (``collective-order``); no use
   of an asynchronous collective's tensors before its wait (``race``).
6. A tensor used on another stream than the one that allocated it needs a ``record_stream``
   for the using stream (``missing-record-stream``); storages of graph inputs never do.
   Only the uses `msched.analysis.lifetimes` finds unsafe need one (work on its stream that
   may allocate -- not a view, ``getitem``, ``wait_tensor`` or stream op -- could take the
   block before the use ends): the emitter's rule, so both agree.

Cost: O(nodes + edges) dictionary work plus O(streams) per wait.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache, partial

from torch.fx import Graph, GraphModule, Node

from msched._text import counted
from msched._torch_internals import node_inputs
from msched.analysis._graphcheck import check_acyclic
from msched.analysis.collectives import collectives_in
from msched.analysis.dag import (
    COLLECTIVE,
    DATA,
    RAW,
    WAR,
    WAW,
    Dag,
    build_dag,
    exit_dependencies,
    host_order_dependencies,
)
from msched.analysis.effects import Effects
from msched.analysis.lifetimes import allocates
from msched.analysis.nodes import INPUT_OPS, graph_of
from msched.errors import ScheduleVerificationError
from msched.limits import check_flag, check_num_streams
from msched.proof.capture import CAPTURE_KINDS, capture_faults
from msched.proof.clocks import Clocks, clocks_of
from msched.proof.collective_order import COLLECTIVE_KINDS, collective_faults, stated_order
from msched.proof.dialects import Dialect, describe_key
from msched.proof.interpreter import interpret
from msched.proof.matching import match_nodes, paired_in_host_order
from msched.proof.program import Step, StreamProgram
from msched.proof.record_streams import check_record_streams, scheduled_effects

VIOLATION_KINDS = (
    "after-output",
    "missing-node",
    "duplicate-node",
    "extra-node",
    "bad-stream",
    "unrecorded-event",
    "race",
    "exit-not-joined",
    "missing-record-stream",
    *COLLECTIVE_KINDS,
    *CAPTURE_KINDS,
)
HAZARDS = ("data", "raw", "war", "waw")
# A pair with several reasons is named by the most specific one: a mutating op both reads and
# writes its target, so two captures of one buffer are RAW and WAW; call that a WAW.
_HAZARD_BITS = ((DATA, "data"), (WAW, "waw"), (RAW, "raw"), (WAR, "war"))


@dataclass(frozen=True)
class Violation:
    """One thing wrong with a schedule.

    ``kind`` is one of `VIOLATION_KINDS`; ``nodes`` names the nodes involved (the earlier one
    first for races); ``hazard`` is set for races (one of `HAZARDS`); ``streams`` are the
    streams of ``nodes`` where they have one; ``message`` says what is wrong and what to do.
    """

    kind: str
    nodes: tuple[str, ...]
    message: str
    hazard: str | None = None
    streams: tuple[int, ...] = ()

    def __str__(self) -> str:
        tag = f"{self.kind}/{self.hazard}" if self.hazard else self.kind
        return f"[{tag}] {self.message}"


@dataclass(frozen=True)
class Report:
    """The result of `verify`: ``ok`` when ``violations`` is empty.

    ``legend`` says, for a graph of another engine, which of its streams and events the
    numbers in the messages stand for (``stream 1 = PyTorch stream table index 2``)."""

    violations: tuple[Violation, ...]
    num_streams: int
    num_nodes: int
    legend: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.violations

    def of_kind(self, kind: str) -> tuple[Violation, ...]:
        """The violations of one kind, in the order they were found."""
        return tuple(v for v in self.violations if v.kind == kind)

    def raise_if_failed(self) -> None:
        """Raise `msched.ScheduleVerificationError` listing every violation, if any."""
        if self.violations:
            raise ScheduleVerificationError(str(self), report=self)

    def __str__(self) -> str:
        where = f"{counted(self.num_nodes, 'node')} on {counted(self.num_streams, 'stream')}"
        if self.ok:
            return f"schedule verified: no violation ({where})"
        lines = [f"schedule has {counted(len(self.violations), 'violation')} ({where}):"]
        lines += [f"  {v}" for v in self.violations]
        if self.legend:
            lines.append(f"  where {'; '.join(self.legend)}")
        return "\n".join(lines)


class _Found:
    """Collects violations; a pair is reported at most once."""

    def __init__(self) -> None:
        self.items: list[Violation] = []
        self.pairs: set[tuple[Node, Node]] = set()
        self._position: dict[Node, int] | None = None

    def position(self, clocks: Clocks) -> dict[Node, int]:
        if self._position is None:
            self._position = {n: i for i, n in enumerate(clocks.order)}
        return self._position

    def add(
        self,
        kind: str,
        nodes: Iterable[str],
        message: str,
        hazard: str | None = None,
        streams: tuple[int, ...] = (),
    ) -> None:
        self.items.append(Violation(kind, tuple(nodes), message, hazard, streams))


def verify(
    gm: GraphModule | Graph,
    original: GraphModule | Graph | None = None,
    dialect: Dialect | str | None = None,
    *,
    num_streams: int | None = None,
    cuda_graph: bool = False,
) -> Report:
    """Check that the scheduled graph ``gm`` runs every node of ``original`` race-free.

    ``original`` is the unscheduled graph (``Schedule.original``); without it, the orderings
    are inferred from ``gm``'s own host order.  ``dialect`` says which ops are the stream ops:
    None (the default) detects them (`msched.Dialect.detect`: msched's own unless the graph
    has another dialect's), or a `msched.Dialect`, a built-in name (``"msched"``,
    ``"trtllm"``, ``"torch"``, ``"autodeploy"``) or an op namespace that defines them
    (`msched.proof.dialects.as_dialect`).  With ``num_streams`` (an int in
    ``1..msched.MAX_STREAMS``), stream ids outside ``range(num_streams)`` are ``bad-stream``
    violations.  Raises `msched.InvalidGraphError` for graphs that cannot be read (a cycle;
    see also `msched.proof.interpreter.interpret`) and `msched.InvalidArgumentError` for bad
    arguments.

    Kinds (`VIOLATION_KINDS`): ``after-output``, ``missing-node`` (an original node the schedule
    dropped, or an input from another graph), ``duplicate-node`` (an original node repeated),
    ``extra-node`` (a compute node that is not in ``original``: a scheduler may add stream
    ops only), ``bad-stream``, ``unrecorded-event``, ``race`` (with ``hazard``),
    ``exit-not-joined``, ``missing-record-stream`` and ``collective-order`` (two consecutive
    collectives not ordered by happens-before, or issued in another order than the
    original's; a use of a collective's tensors before its wait is a ``race``).  Extra and
    duplicate nodes are ordered too: their dependencies on the other nodes come from the
    scheduled host order.

    With ``cuda_graph=True`` the program must also be capturable as a CUDA graph on the
    caller's stream (`msched.proof.capture`): ``capture-sync`` (the host synchronizes inside),
    ``capture-fork`` (a side stream works before it joined the capture, or a capturing stream
    waits on an event recorded outside it) and ``capture-join`` (a side stream not rejoined
    before ``output``, used or not).  These come on top of the other kinds.
    """
    check_flag(cuda_graph, "cuda_graph")
    graph, before = _checked_arguments(gm, original, num_streams)
    program = interpret(graph, dialect)
    found = _Found()
    _check_after_output(program, found)
    _check_foreign_inputs(program, found)
    clocks = clocks_of(program, max(program.num_streams, num_streams or 0))
    _check_walk(program, clocks, found)
    _check_stream_ids(program, num_streams, found)

    @cache
    def scheduled() -> Effects:  # read at most once: the orderings and the collectives share it
        return scheduled_effects(graph, program.passthrough)

    expected: list[Node] | None = None  # the original's collectives, as scheduled nodes
    if before is None:
        effects = scheduled()
        _check_orderings(_host_order_rules(effects, clocks), clocks, effects, None, found)
        root: Mapping[Node, Node] = effects.root
        may_allocate: Callable[[Node], bool] = partial(allocates, effects=effects)
        expected = stated_order(clocks.order)
    else:
        root, match, known = _check_against_original(before, scheduled, program, clocks, found)
        expected = paired_in_host_order(before, [c.node for c in collectives_in(before)], match)
        may_allocate = _allocating(match, known, scheduled)
    for issue in collective_faults(clocks, expected, scheduled, found.pairs):
        found.add(issue.kind, issue.nodes, issue.message, issue.hazard, issue.streams)
    check_record_streams(program, clocks, root, may_allocate, found.add)
    if cuda_graph:
        for fault in capture_faults(program, clocks):
            found.add(fault.kind, fault.nodes, fault.message, streams=fault.streams)
    legend = _legend(program, found.items)
    return Report(tuple(found.items), clocks.num_streams, len(clocks.order), legend)


def _legend(program: StreamProgram, violations: list[Violation]) -> tuple[str, ...]:
    """What the stream and event numbers that ``violations`` name stand for (only those)."""
    said = " ".join(v.message for v in violations)
    named = {int(n) for n in re.findall(r"\bstreams? (\d+)", said)}
    named |= {s for v in violations for s in v.streams}
    events = {int(n) for n in re.findall(r"\bevents? (\d+)", said)}
    streams = [
        f"stream {s} = {describe_key(k, 'stream')}"
        for s, k in program.stream_keys.items()
        if s in named
    ]
    return tuple(
        streams
        + [
            f"event {e} = {describe_key(k, 'event')}"
            for e, k in program.event_keys.items()
            if e in events
        ]
    )


def _checked_arguments(
    gm: GraphModule | Graph, original: GraphModule | Graph | None, num_streams: int | None
) -> tuple[Graph, Graph | None]:
    """The graphs of ``gm`` and ``original``, after checking the arguments of `verify`."""
    graph = graph_of(gm)
    before = graph_of(original) if original is not None else None
    if num_streams is not None:
        check_num_streams(num_streams)
    check_acyclic(graph)
    if before is not None:
        check_acyclic(before, "the original graph")
    return graph, before


def _check_after_output(program: StreamProgram, found: _Found) -> None:
    seen_output = False
    reported: set[Node] = set()
    for step in program.steps:
        if seen_output and step.node not in reported:
            reported.add(step.node)
            found.add(
                "after-output",
                [step.node.name],
                f"`{step.node.name}` comes after output and never runs: move it before output",
            )
        seen_output = seen_output or step.node is program.output


def _check_foreign_inputs(program: StreamProgram, found: _Found) -> None:
    """A node that uses a node of another graph reads a name its code never defines."""
    members = program.stream_of  # every node of the graph
    for step in program.steps:
        for arg in node_inputs(step.node):  # torch.fx's dict of the node's inputs
            if arg not in members:
                found.add(
                    "missing-node",
                    [arg.name, step.node.name],
                    f"`{step.node.name}` uses `{arg.name}`, which is not a node of this graph: "
                    "calling the module fails with NameError; use this graph's own node",
                )


def _check_stream_ids(program: StreamProgram, num_streams: int | None, found: _Found) -> None:
    if program.stream_of[program.output] != 0:
        s = program.stream_of[program.output]
        found.add(
            "bad-stream",
            [program.output.name],
            f"output is issued on stream {s}, not on the caller's stream 0: before output, "
            f"switch back to stream 0 and wait there for an event recorded after stream {s}'s "
            "last node",
            streams=(s,),
        )
    if num_streams is None:
        return
    for step in program.steps:
        if step.to_stream is not None and step.to_stream >= num_streams:
            found.add(
                "bad-stream",
                [step.node.name],
                f"`{step.node.name}` names stream {step.to_stream}, but the schedule has "
                f"{counted(num_streams, 'stream')} (0..{num_streams - 1}): use a stream in range",
                streams=(step.to_stream,),
            )


def _check_walk(program: StreamProgram, clocks: Clocks, found: _Found) -> None:
    """Report what the happens-before walk found, in host order: waits on events not recorded
    before them, and auxiliary streams that start without joining stream 0."""
    if not clocks.unrecorded_waits and not clocks.unjoined_starts:
        return
    waits = set(clocks.unrecorded_waits)
    starts = set(clocks.unjoined_starts)
    for step in program.steps:
        if step.kind == "wait_event" and step in waits:
            _unrecorded(clocks, step, found)
        elif step.node in starts:
            _unjoined_start(step.node, step.stream, found)


def _unjoined_start(node: Node, s: int, found: _Found) -> None:
    found.add(
        "race",
        [node.name],
        f"stream {s} starts with `{node.name}` without joining stream 0, where graph inputs "
        f"and the caller's earlier work are ready: record an event on stream 0 and wait on it "
        f"on stream {s} before `{node.name}`",
        hazard="data",
        streams=(s,),
    )


def _unrecorded(clocks: Clocks, wait: Step, found: _Found) -> None:
    later = clocks.later_record(wait)
    where = (
        f"it is first recorded later, by `{later.node.name}`" if later else "it is never recorded"
    )
    name, s = wait.node.name, wait.stream
    found.add(
        "unrecorded-event",
        [name],
        f"`{name}` on stream {s} waits for event {wait.event}, but {where}: record the event "
        "(after the work to wait for) before waiting on it",
        streams=(s,),
    )


def _host_order_rules(effects: Effects, clocks: Clocks) -> dict[Node, dict[Node, int]]:
    """The dependencies the host order of the scheduled graph (of ``effects``) implies."""
    passthrough = clocks.program.passthrough
    forwarding = {node: None for node in passthrough if node.users}
    deps = host_order_dependencies(clocks.order, effects, clocks.output, forwarding)
    if passthrough:
        _see_through(deps, passthrough)
    return deps


def _see_through(deps: dict[Node, dict[Node, int]], passthrough: Mapping[Node, Node]) -> None:
    """A use of a stream op that passes a value through is a use of that value."""
    for edges in deps.values():
        for u in [u for u in edges if u in passthrough]:
            source = passthrough[u]
            edges[source] = edges.get(source, 0) | edges.pop(u)


def _check_orderings(
    preds: dict[Node, dict[Node, int]],
    clocks: Clocks,
    effects: Effects,
    match: dict[Node, Node] | None,
    found: _Found,
    skip: int = 0,
) -> None:
    """Report every dependency ``u -> v`` whose ``u`` does not happen before ``v``.

    ``preds`` and ``effects`` are keyed by the nodes of the graph that defines the orderings;
    ``match`` maps them to the scheduled nodes (None: they are the scheduled nodes).  An edge
    whose every reason is in the bit mask ``skip`` is not checked.
    """
    keep = ~skip
    stamp = clocks.stamp
    if match is None:
        match = {n: n for n in clocks.order}
    get = match.get
    for v_key, deps in preds.items():
        v = get(v_key)
        if v is None or v not in stamp:
            continue
        sv, kv, clock = stamp[v]
        for u_key, mask in deps.items():
            u = get(u_key)
            if u is None or not mask & keep:
                continue
            at_u = stamp.get(u)
            if at_u is None:
                continue
            su, ku = at_u[0], at_u[1]
            if (ku < kv) if su == sv else (clock[su] >= ku):
                continue
            _report_ordering(u_key, v_key, mask & keep, (u, v), clocks, effects, found)


def _report_ordering(
    u_key: Node,
    v_key: Node,
    mask: int,
    pair: tuple[Node, Node],
    clocks: Clocks,
    effects: Effects,
    found: _Found,
) -> None:
    u, v = pair
    if pair in found.pairs or (u.op in INPUT_OPS and v in clocks.unjoined_starts):
        return
    found.pairs.add(pair)
    su, sv = clocks.stamp[u].stream, clocks.stamp[v].stream
    if v.op == "output":
        found.add(
            "exit-not-joined",
            [u.name, v.name],
            f"output on stream {sv} does not wait for `{u.name}` on stream {su}: record an "
            f"event after it and wait on it before output",
            streams=(su, sv),
        )
        return
    hazard = next((name for bit, name in _HAZARD_BITS if mask & bit), "data")
    message = _race_message(hazard, u_key, v_key, pair, clocks, effects, found)
    found.add("race", [u.name, v.name], message, hazard=hazard, streams=(su, sv))


def _race_message(
    hazard: str,
    u_key: Node,
    v_key: Node,
    pair: tuple[Node, Node],
    clocks: Clocks,
    effects: Effects,
    found: _Found,
) -> str:
    """The message of a race ``u -> v``: what ``v`` does, why it is unordered, the fix."""
    u, v = pair
    su, sv = clocks.stamp[u].stream, clocks.stamp[v].stream
    what = _what(hazard, u_key, v_key, effects)
    position = found.position(clocks)
    if position[u] > position[v]:
        fix = f"issue `{u.name}` before `{v.name}`" + (
            f", record an event after it and wait on it on stream {sv}" if su != sv else ""
        )
        return (
            f"`{v.name}` on stream {sv} {what}, but `{u.name}` (stream {su}) is issued after "
            f"it, against program order: {fix}"
        )
    what += "" if hazard == "data" else ","  # close the clause before the next one
    if u.op in INPUT_OPS:
        return (
            f"`{v.name}` on stream {sv} {what} before stream {sv} has joined stream 0, where "
            f"graph inputs are ready: wait on an event recorded on stream 0 before `{v.name}`"
        )
    return (
        f"`{v.name}` on stream {sv} {what} without waiting for `{u.name}` on stream {su}: "
        f"record an event after `{u.name}` and wait on it on stream {sv} before `{v.name}`"
    )


def _what(hazard: str, u: Node, v: Node, effects: Effects) -> str:
    """What ``v`` does that needs ``u`` first, naming the storage they share (a clause the
    caller punctuates)."""
    if hazard == "data":
        return f"uses `{u.name}`"
    if hazard == "raw":
        shared = _shared(effects.writes.get(u, ()), effects.reads.get(v, ()))
        return f"reads {shared}, which `{u.name}` writes"
    if hazard == "war":
        shared = _shared(effects.reads.get(u, ()), effects.writes.get(v, ()))
        return f"writes {shared}, which `{u.name}` reads"
    shared = _shared(effects.writes.get(u, ()), effects.writes.get(v, ()))
    return f"writes {shared} after `{u.name}` writes it"


def _shared(a: tuple[Node, ...], b: tuple[Node, ...]) -> str:
    common = [n.name for n in a if n in b]
    if not common:
        return "the world outside the graph (both have side effects)"
    return ", ".join(f"`{name}`" for name in common)


def _check_against_original(
    before: Graph,
    scheduled: Callable[[], Effects],
    program: StreamProgram,
    clocks: Clocks,
    found: _Found,
) -> tuple[Mapping[Node, Node], dict[Node, Node], Effects]:
    """Steps 3 and 4 with ``original``: its Dag's orderings, then those of the extra nodes
    (``scheduled`` gives the scheduled graph's effects, read only when there are some).

    Returns the storage root of every scheduled node, for the record_stream check, the
    scheduled node paired with each original node, and the original's effects.
    """
    dag = build_dag(before)
    match, extras = _paired_nodes(before, program, found)
    exits = {dag.output: exit_dependencies(dag.nodes, dag.effects, dag.output)}
    # The collective chain is `collective_faults`'s to check.
    _check_orderings(dag.preds, clocks, dag.effects, match, found, skip=COLLECTIVE)
    _check_orderings(exits, clocks, dag.effects, match, found)
    root = _mapped_roots(dag, match)
    if extras:
        root = _check_extra_nodes(scheduled(), clocks, extras, root, found)
    return root, match, dag.effects


def _allocating(
    match: Mapping[Node, Node], known: Effects, scheduled: Callable[[], Effects]
) -> Callable[[Node], bool]:
    """Whether a scheduled node may allocate: read from the effects of the original node it
    stands for (``known``), or, for a node that is not in the original, the scheduled
    graph's."""
    original_of = {s: o for o, s in match.items()}

    def may_allocate(node: Node) -> bool:
        source = original_of.get(node)
        if source is None:
            return allocates(node, scheduled())
        return allocates(source, known)

    return may_allocate


def _paired_nodes(
    before: Graph, program: StreamProgram, found: _Found
) -> tuple[dict[Node, Node], tuple[Node, ...]]:
    """Pair the original nodes with the scheduled ones by what they compute
    (`msched.proof.matching`); report missing, duplicate and extra nodes and values returned
    in another's place.  Returns the pairs and the scheduled nodes that are not in them."""
    match = match_nodes(before, program)
    for node in match.missing:
        found.add(
            "missing-node",
            [node.name],
            f"`{node.name}` of the original graph is not in the scheduled graph (no node "
            "computes it from the same values): the schedule dropped or changed it; emit it "
            "before output",
        )
    for extra in match.extras:
        twin = match.twins.get(extra)
        if twin is None:
            _extra_node(extra, found)
        else:
            found.add(
                "duplicate-node",
                [twin.name, extra.name],
                f"`{extra.name}` repeats `{twin.name}` of the original graph, which must run "
                f"exactly once: remove `{extra.name}`",
            )
    for want, got in match.wrong_returns:
        _wrong_return(want, got, match.pairs.get(want), found)
    return match.pairs, match.extras


def _wrong_return(want: Node, got: Node, right: Node | None, found: _Found) -> None:
    fix = f"return `{right.name}`, which computes it" if right is not None else "return it"
    found.add(
        "missing-node",
        [want.name, got.name],
        f"output returns `{got.name}` where the original returns `{want.name}`, and `{got.name}` "
        f"computes another value (as two equal-looking nodes swapped across a write do): {fix}",
    )


def _extra_node(node: Node, found: _Found) -> None:
    found.add(
        "extra-node",
        [node.name],
        f"`{node.name}` is not in the original graph (no original node computes the same from "
        "the same values): the schedule added or changed it, and a schedule may add only "
        "stream ops; remove it (or schedule the graph that contains it)",
    )


def _check_extra_nodes(
    effects: Effects,
    clocks: Clocks,
    extras: tuple[Node, ...],
    root: dict[Node, Node],
    found: _Found,
) -> dict[Node, Node]:
    """Order the nodes that are not in the original like the rest (step 3 without original,
    restricted to the dependencies that involve them, exit edges included).

    Returns ``root`` extended by the storage roots of the extra nodes.
    """
    deps = _host_order_rules(effects, clocks)
    extra = set(extras)
    involved = {
        v: {u: mask for u, mask in preds.items() if u in extra} if v not in extra else preds
        for v, preds in deps.items()
    }
    _check_orderings(involved, clocks, effects, None, found)
    own = effects.root
    return {**root, **{n: root.get(own[n], own[n]) for n in extras if n in own}}


def _mapped_roots(dag: Dag, match: dict[Node, Node]) -> dict[Node, Node]:
    """Scheduled node -> the scheduled node that is its storage root in the original graph."""
    root = dag.effects.root
    return {s: match.get(root[o], s) for o, s in match.items()}

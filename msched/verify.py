"""`msched.verify`: prove a scheduled graph race-free, or say exactly what is missing.

Why: a scheduler that rebuilds a graph with stream ops can drop a wait, leave a capture after
``output`` or forget a ``record_stream``, and nothing fails on CPU.  `verify` reads the
scheduled graph the way the GPU would run it and checks every ordering the program needs.

Algorithm:

1. Read the graph in host order (`msched.streams.interpret`).  Nodes after ``output`` never
   run: each is an ``after-output`` violation and takes no further part.
2. Walk the host order with one vector clock per stream.  Compute node ``k`` of stream ``s``
   gets the stamp ``(s, k)``; ``record_event`` snapshots the clock of its stream and
   ``wait_event`` joins the last snapshot of that event (``unrecorded-event`` when there is
   none).  Graph inputs carry the stamp ``(0, 0)``: they are ready on stream 0 only, so an
   auxiliary stream must join stream 0 before its first node.
3. The orderings the program needs come from the original graph's `msched.dag.Dag` (nodes
   matched by name; ``missing-node`` / ``duplicate-node`` when the node sets differ) or, without
   ``original``, from the same rules applied to the scheduled host order.  An edge ``u -> v``
   holds when ``v``'s clock has seen ``u``'s stamp; otherwise it is a ``race`` (hazard
   ``data``, ``raw``, ``war`` or ``waw``) or, into ``output``, ``exit-not-joined``.
4. A tensor produced on one stream and used on another needs a ``record_stream`` for the
   using stream (``missing-record-stream``), unless its storage is a graph input.

Cost: O(nodes + edges) dictionary work plus O(streams) per wait.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torch.fx import Graph, GraphModule, Node
from torch.fx.node import map_arg

from msched.dag import DATA, RAW, WAR, WAW, Dag, _add_read_edges, _add_write_edges, build_dag
from msched.effects import Effects, compute_effects, produces_tensor
from msched.errors import InvalidArgumentError, ScheduleVerificationError
from msched.streams import Dialect, StreamProgram, graph_of, interpret

KINDS = (
    "after-output",
    "missing-node",
    "duplicate-node",
    "bad-stream",
    "unrecorded-event",
    "race",
    "exit-not-joined",
    "missing-record-stream",
)
HAZARDS = ("data", "raw", "war", "waw")
_INPUT_OPS = ("placeholder", "get_attr")
_HAZARD_BITS = ((DATA, "data"), (RAW, "raw"), (WAR, "war"), (WAW, "waw"))


@dataclass(frozen=True)
class Violation:
    """One thing wrong with a schedule.

    ``kind`` is one of `KINDS`; ``nodes`` names the nodes involved (the earlier one first for
    races); ``hazard`` is set for races (one of `HAZARDS`); ``streams`` are the streams of
    ``nodes`` where they have one; ``message`` says what is wrong and what to do.
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
    """The result of `verify`: ``ok`` when ``violations`` is empty."""

    violations: tuple[Violation, ...]
    num_streams: int
    num_nodes: int

    @property
    def ok(self) -> bool:
        return not self.violations

    def of_kind(self, kind: str) -> tuple[Violation, ...]:
        """The violations of one kind, in the order they were found."""
        return tuple(v for v in self.violations if v.kind == kind)

    def raise_if_failed(self) -> None:
        """Raise `msched.ScheduleVerificationError` listing every violation, if any."""
        if self.violations:
            raise ScheduleVerificationError(str(self))

    def __str__(self) -> str:
        where = f"{self.num_nodes} nodes on {self.num_streams} stream(s)"
        if self.ok:
            return f"schedule verified: no violation ({where})"
        lines = [f"schedule has {len(self.violations)} violation(s) ({where}):"]
        lines += [f"  {v}" for v in self.violations]
        return "\n".join(lines)


# A node's stamp: (stream, sequence number on it, the stream's clock at its last join).
Stamp = tuple[int, int, tuple[int, ...]]
_INPUT_STAMP: Stamp = (0, 0, ())


@dataclass(frozen=True)
class Clocks:
    """Happens-before over the nodes that run (host order up to and including ``output``).

    ``stamp[n]`` is ``(stream, k, clock)``: ``n`` is the ``k``-th compute node of ``stream``
    and ``clock`` is that stream's vector clock after its last wait before ``n``.  Graph
    inputs have ``(0, 0, ())``.  ``order`` lists the nodes that run, stream ops excluded.
    """

    stamp: dict[Node, Stamp]
    order: tuple[Node, ...]
    num_streams: int

    def happens_before(self, u: Node, v: Node) -> bool:
        """Whether ``u`` is ordered before ``v`` on the GPU (both must have run)."""
        su, ku, _ = self.stamp[u]
        sv, kv, clock = self.stamp[v]
        if su == sv:
            return ku < kv
        return len(clock) > su and clock[su] >= ku


class _Found:
    """Collects violations; a pair is reported at most once."""

    def __init__(self) -> None:
        self.items: list[Violation] = []
        self.pairs: set[tuple[Node, Node]] = set()

    def add(self, kind: str, nodes: Iterable[str], message: str, **extra: object) -> None:
        self.items.append(Violation(kind, tuple(nodes), message, **extra))  # type: ignore[arg-type]


def verify(
    gm: GraphModule | Graph,
    original: GraphModule | Graph | None = None,
    dialect: Dialect | None = None,
    *,
    num_streams: int | None = None,
) -> Report:
    """Check that the scheduled graph ``gm`` runs every node of ``original`` race-free.

    ``original`` is the unscheduled graph (``Schedule.original``); without it, the orderings
    are inferred from ``gm``'s own host order.  ``dialect`` says which ops are the stream ops
    (default: ``torch.ops.msched.*``).  With ``num_streams``, stream ids outside
    ``range(num_streams)`` are ``bad-stream`` violations.  Raises `msched.InvalidGraphError`
    for graphs that cannot be read (see `msched.streams.interpret`) and
    `msched.InvalidArgumentError` for arguments of the wrong type.
    """
    graph = graph_of(gm)
    before = graph_of(original) if original is not None else None
    _check_num_streams(num_streams)
    program = interpret(graph, dialect)
    found = _Found()
    _check_after_output(program, found)
    width = max(program.num_streams, num_streams or 0)
    clocks = run_clocks(program, width, found)
    _check_stream_ids(program, num_streams, found)
    if before is None:
        effects = compute_effects(graph)
        deps = host_order_dependencies(clocks.order, effects, program.output)
        _check_orderings(deps, clocks, effects, None, found)
        root_name = {n: effects.root[n].name for n in clocks.order}
    else:
        dag = build_dag(before)
        match = _match_nodes(dag, graph, clocks, found)
        _check_orderings(dag.preds, clocks, dag.effects, match, found)
        root_name = _mapped_roots(dag, match)
    _check_record_streams(program, clocks, root_name, found)
    return Report(tuple(found.items), width, len(clocks.order))


def _check_num_streams(num_streams: object) -> None:
    if num_streams is None:
        return
    if isinstance(num_streams, bool) or not isinstance(num_streams, int) or num_streams < 1:
        raise InvalidArgumentError(f"num_streams must be an int >= 1 or None, got {num_streams!r}")


def _check_after_output(program: StreamProgram, found: _Found) -> None:
    seen_output = False
    for step in program.steps:
        if seen_output:
            found.add(
                "after-output",
                [step.node.name],
                f"`{step.node.name}` comes after output and never runs: move it before output",
            )
        seen_output = seen_output or step.node is program.output


def _check_stream_ids(program: StreamProgram, num_streams: int | None, found: _Found) -> None:
    if program.stream_of[program.output] != 0:
        s = program.stream_of[program.output]
        found.add(
            "bad-stream",
            ["output"],
            f"output is issued on stream {s}, not on the caller's stream 0: "
            "switch back to stream 0 (set_stream(0)) before output",
            streams=(s,),
        )
    if num_streams is None:
        return
    for step in program.steps:
        if step.kind in ("set_stream", "record_stream") and step.arg is not None:
            if step.arg >= num_streams:
                found.add(
                    "bad-stream",
                    [step.node.name],
                    f"`{step.node.name}` names stream {step.arg}, but the schedule has "
                    f"{num_streams} stream(s) (0..{num_streams - 1}): use a stream in range",
                    streams=(step.arg,),
                )

"""Running a scheduled graph the way its streams may run: an adversarial executor and a timeline.

Why: on CPU every stream op is a no-op and a scheduled graph runs in host order, so a missing
wait never shows.  `execute` runs the compute nodes in an order that respects *only* what the
stream ops guarantee (program order per stream, plus record/wait edges), chosen to be as
unhelpful as the guarantees allow, so a missing wait becomes a wrong number.  `simulate` gives
the timeline of the same streams under a cost model.

Both read the graph with `msched.proof.dialects.interpret`; nodes after ``output`` never run.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import Graph, GraphModule, Interpreter, Node
from torch.utils._pytree import tree_map

from msched.analysis._graphcheck import check_acyclic
from msched.analysis.cost import CostModel, DefaultCostModel, check_cost_model, checked_cost
from msched.analysis.effects import compute_effects
from msched.errors import InvalidArgumentError
from msched.proof.dialects import Dialect, StreamProgram, graph_of, interpret
from msched.proof.verifier import host_order_dependencies
from msched.scheduling.assign import lower_bound

ORDERS = ("late-aux", "early-aux", "random")
_INPUT_OPS = ("placeholder", "get_attr")


@dataclass(frozen=True)
class HappensBefore:
    """The happens-before relation of a scheduled graph as an explicit DAG.

    ``nodes`` are the compute nodes that run (graph inputs excluded, ``output`` included),
    in host order; ``preds[n]`` are the nodes ``n`` directly happens after: the previous node
    of its stream and the nodes whose completion the waits before ``n`` observe.
    """

    nodes: tuple[Node, ...]
    preds: dict[Node, tuple[Node, ...]]
    stream: dict[Node, int]
    output: Node


def happens_before(program: StreamProgram) -> HappensBefore:
    """Build the `HappensBefore` DAG of a program read by `msched.proof.dialects.interpret`.

    A ``record_event`` stands for the last node of its stream plus everything that stream has
    waited for since (pending joins); a ``wait_event`` hands those to the next node of the
    waiting stream.  A wait on an event never recorded waits for nothing, as on a GPU.
    """
    last: dict[int, Node] = {}
    pending: dict[int, list[Node]] = {}
    events: dict[int, tuple[Node, ...]] = {}
    nodes: list[Node] = []
    preds: dict[Node, tuple[Node, ...]] = {}
    stream: dict[Node, int] = {}
    for step in program.steps:
        s = step.stream
        if step.kind == "compute":
            node = step.node
            if node.op in _INPUT_OPS:
                continue
            before = [last[s]] if s in last else []
            before += pending.pop(s, [])
            preds[node] = tuple(dict.fromkeys(before))
            stream[node] = s
            last[s] = node
            nodes.append(node)
            if node is program.output:
                break
        elif step.kind == "record_event":
            mine = [last[s]] if s in last else []
            events[step.arg] = tuple(mine + pending.get(s, []))  # type: ignore[index]
        elif step.kind == "wait_event":
            pending.setdefault(s, []).extend(events.get(step.arg, ()))  # type: ignore[arg-type]
    return HappensBefore(tuple(nodes), preds, stream, program.output)


def _pull(
    target: Node, preds: dict[Node, tuple[Node, ...]], done: set[Node], seq: list[Node]
) -> None:
    """Append ``target`` to ``seq`` after every not-yet-done node it happens after."""
    if target in done:
        return
    stack: list[tuple[Node, Iterator[Node]]] = [(target, iter(preds[target]))]
    while stack:
        node, it = stack[-1]
        for p in it:
            if p not in done:
                stack.append((p, iter(preds[p])))
                break
        else:
            stack.pop()
            done.add(node)
            seq.append(node)


def _demand_order(hb: HappensBefore, first: list[Node]) -> list[Node]:
    """Run ``first`` in order, each only once what it happens after has run; then the rest."""
    done: set[Node] = set()
    seq: list[Node] = []
    for node in first:
        _pull(node, hb.preds, done, seq)
    for node in hb.nodes:
        _pull(node, hb.preds, done, seq)
    return seq


def _random_order(hb: HappensBefore, seed: int) -> list[Node]:
    rng = random.Random(seed)
    waiting = {n: len(hb.preds[n]) for n in hb.nodes}
    succs: dict[Node, list[Node]] = {n: [] for n in hb.nodes}
    for node in hb.nodes:
        for p in hb.preds[node]:
            succs[p].append(node)
    ready = [n for n in hb.nodes if not waiting[n]]
    seq: list[Node] = []
    while ready:
        i = rng.randrange(len(ready))
        ready[i], ready[-1] = ready[-1], ready[i]
        node = ready.pop()
        seq.append(node)
        for succ in succs[node]:
            waiting[succ] -= 1
            if not waiting[succ]:
                ready.append(succ)
    return seq


def run_order(hb: HappensBefore, order: str, seed: int = 0) -> list[Node]:
    """The order `execute` runs the nodes of ``hb`` in (see `execute` for ``order``)."""
    if order == "late-aux":
        main = [n for n in hb.nodes if hb.stream[n] == 0 or n is hb.output]
        return _demand_order(hb, main[: main.index(hb.output) + 1])
    if order == "early-aux":
        aux = [n for n in hb.nodes if hb.stream[n] != 0 and n is not hb.output]
        return _demand_order(hb, aux)
    if order == "random":
        return _random_order(hb, seed)
    raise InvalidArgumentError(f"order must be one of {', '.join(ORDERS)}; got {order!r}")


@dataclass(frozen=True)
class Execution:
    """What `execute` observed.

    ``output`` is the value ``output`` returned, cloned when it was produced (work that the
    exit does not wait for cannot change it afterwards); ``inputs_at_output`` are clones of
    the inputs at that moment; ``order`` names the nodes in the order they ran (``output``
    included) and ``after_output`` those that ran after it.  The inputs passed to `execute`
    hold their final contents, as after calling the module.
    """

    output: Any
    inputs_at_output: tuple[Any, ...]
    order: tuple[str, ...]
    after_output: tuple[str, ...]


def _clone(value: Any) -> Any:
    return tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, value)


def _garbage(value: Any) -> Any:
    """What a read of a value that was not written yet sees: NaN (or -1) of the right shape."""

    def fill(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        bad = float("nan") if v.is_floating_point() or v.is_complex() else -1
        return torch.full_like(v, bad)

    return tree_map(fill, value)


class _Runner(Interpreter):
    """Runs single nodes of ``gm`` on demand, reading unwritten values as garbage."""

    def __init__(self, gm: GraphModule, program: StreamProgram, inputs: Sequence[Any]) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.program = program
        self.inputs = tuple(inputs)
        self._host_values: dict[Node, Any] | None = None
        self.early: dict[Node, Any] = {}  # node -> garbage handed out before it ran
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(self.inputs):
            raise InvalidArgumentError(
                f"the graph has {len(placeholders)} inputs "
                f"({', '.join(n.name for n in placeholders)}), got {len(self.inputs)}"
            )
        self.env.update(zip(placeholders, self.inputs, strict=True))
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                self.env[node] = self.fetch_attr(str(node.target))

    def _host_order_values(self) -> dict[Node, Any]:
        """Values of a plain host-order run on cloned inputs, to shape the garbage.

        It runs on a copy of the module (so ``call_module`` nodes update the copy's buffers,
        not the real ones) with the random-number state restored afterwards, so the real run
        sees each update and each random draw once.
        """
        if self._host_values is None:
            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
            with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if cuda else []):
                other = Interpreter(copy.deepcopy(self.module), garbage_collect_values=False)
                other.env = {n: _clone(v) for n, v in self.env.items()}
                for node in happens_before(self.program).nodes:
                    if node is not self.program.output:
                        other.env[node] = other.run_node(node)
            self._host_values = other.env
        return self._host_values

    def step(self, node: Node) -> Any:
        for value in node.all_input_nodes:
            if value not in self.env:
                self.env[value] = self.early[value] = _garbage(self._host_order_values()[value])
        result = self.run_node(node)
        early = self.early.pop(node, None)
        if isinstance(early, torch.Tensor) and isinstance(result, torch.Tensor):
            early.copy_(result)  # the late write lands in the memory the early reader saw
        self.env[node] = result
        return result


def execute(
    gm: GraphModule,
    *inputs: Any,
    order: str = "late-aux",
    seed: int = 0,
    dialect: Dialect | str | None = None,
) -> Execution:
    """Run the compute nodes of the scheduled ``gm`` on ``inputs`` in an adversarial order.

    The order respects only happens-before from the stream ops, not host order:

    - ``"late-aux"``: stream 0 runs greedily; a node of an auxiliary stream runs only when
      something on stream 0 (``output`` included) must wait for it, and everything ``output``
      does not wait for runs after ``output``;
    - ``"early-aux"``: the auxiliary streams run greedily, stream 0 only when they need it;
    - ``"random"``: a uniformly random ready node at each step, from ``seed``.

    A value read before its producer ran reads as NaN (the producer's later write still lands
    in that memory).  Stream ops themselves are not run.  Returns an `Execution`.  A cyclic
    graph is an `msched.InvalidGraphError` naming the cycle; nothing runs then.
    """
    if not isinstance(gm, GraphModule):
        raise InvalidArgumentError(
            f"execute expects a torch.fx.GraphModule, got {type(gm).__name__}"
        )
    check_acyclic(gm.graph)
    program = interpret(gm, dialect)
    hb = happens_before(program)
    sequence = run_order(hb, order, seed)
    runner = _Runner(gm, program, inputs)
    output: Any = None
    at_output: tuple[Any, ...] = ()
    ran: list[str] = []
    after: list[str] = []
    produced = False
    for node in sequence:
        value = runner.step(node)
        if node is hb.output:
            output, at_output, produced = _clone(value), _clone(inputs), True
        elif produced:
            after.append(node.name)
        ran.append(node.name)
    return Execution(output, tuple(at_output), tuple(ran), tuple(after))


@dataclass(frozen=True)
class Timeline:
    """When every compute node runs when each stream issues its work as soon as it may.

    ``nodes`` are the compute nodes that run, in host order (graph inputs and ``output``
    excluded); ``stream``, ``start`` and ``end`` are keyed by them.  ``makespan`` is the end
    of the last node or the time ``output`` is reached, whichever is later.  The lower bound
    is ``max(critical_path, total_cost / num_streams)``, the critical path taken over the
    dependencies of the host order (`msched.verify.host_order_dependencies`).
    """

    nodes: tuple[Node, ...]
    stream: dict[Node, int]
    start: dict[Node, float]
    end: dict[Node, float]
    num_streams: int
    makespan: float
    critical_path: float
    total_cost: float

    @property
    def lower_bound(self) -> float:
        return lower_bound(self.critical_path, self.total_cost, self.num_streams)

    def intervals(self) -> list[tuple[Node, int, float, float]]:
        """``(node, stream, start, end)`` for every node, sorted by start, then stream."""
        rows = [(n, self.stream[n], self.start[n], self.end[n]) for n in self.nodes]
        return sorted(rows, key=lambda r: (r[2], r[1]))


def simulate(
    gm: GraphModule | Graph,
    cost_model: CostModel | None = None,
    dialect: Dialect | str | None = None,
) -> Timeline:
    """The `Timeline` of the scheduled ``gm`` under ``cost_model`` (`msched.DefaultCostModel`).

    1. Read the host order; each stream keeps the time it is free.
    2. A compute node starts when its stream is free and ends ``cost`` later; a
       ``record_event`` stamps the event with its stream's time; a ``wait_event`` moves its
       stream's time to at least that stamp (waits on unrecorded events wait for nothing).
    3. ``output`` is reached at stream 0's (its stream's) time after its waits.

    Raises `msched.InvalidGraphError` for a cyclic graph and `msched.InvalidArgumentError`
    for a cost model without ``cost(node)`` or one that gives a bad cost.
    """
    graph = graph_of(gm)
    check_cost_model(cost_model)
    check_acyclic(graph)
    model = cost_model or DefaultCostModel()
    program = interpret(graph, dialect)
    clock = [0.0] * program.num_streams
    events: dict[int, float] = {}
    nodes: list[Node] = []
    stream: dict[Node, int] = {}
    start: dict[Node, float] = {}
    end: dict[Node, float] = {}
    reached = 0.0
    for step in program.steps:
        s = step.stream
        if step.kind == "compute":
            node = step.node
            if node is program.output:
                reached = clock[s]
                break
            if node.op in _INPUT_OPS:
                continue
            nodes.append(node)
            stream[node], start[node] = s, clock[s]
            end[node] = clock[s] = clock[s] + _cost(model, node)
        elif step.kind == "record_event":
            events[step.arg] = clock[s]  # type: ignore[index]
        elif step.kind == "wait_event":
            clock[s] = max(clock[s], events.get(step.arg, 0.0))  # type: ignore[arg-type]
    critical, total = _critical_path(graph, program, nodes, model)
    makespan = max([reached, *end.values()])
    return Timeline(
        tuple(nodes), stream, start, end, program.num_streams, makespan, critical, total
    )


def _cost(model: CostModel, node: Node) -> float:
    return checked_cost(model, node, model.cost(node))


def _critical_path(
    graph: Graph, program: StreamProgram, nodes: list[Node], model: CostModel
) -> tuple[float, float]:
    """Longest cost path over the host-order dependencies, and the total cost."""
    order = [s.node for s in program.steps if s.kind == "compute" and s.node.op in _INPUT_OPS]
    order += nodes + [program.output]
    preds = host_order_dependencies(order, compute_effects(graph), program.output)
    finish: dict[Node, float] = {}
    total = 0.0
    for node in order:
        c = 0.0 if node.op in _INPUT_OPS or node is program.output else _cost(model, node)
        total += c
        finish[node] = c + max((finish[d] for d in preds[node] if d in finish), default=0.0)
    return max(finish.values(), default=0.0), total

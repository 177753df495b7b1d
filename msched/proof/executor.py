"""`msched.execute`: run a scheduled graph in the worst order its stream ops allow.

Why: on CPU every stream op is a no-op and a scheduled graph runs in host order, so a missing
wait never shows.  `execute` runs the compute nodes in an order that respects *only* what the
stream ops guarantee (program order per stream, plus record/wait edges, as
`msched.proof.clocks.Clocks.predecessors` gives them), chosen to be as unhelpful as the
guarantees allow, so a missing wait becomes a wrong number.  (The timeline of the same
streams under a cost model is `msched.simulate`, in `msched.proof.timeline`.)

The graph is read with `msched.proof.dialects.interpret`; nodes after ``output`` never run.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Interpreter, Node

from msched._torch_internals import tree_map
from msched.analysis._graphcheck import check_acyclic
from msched.errors import InvalidArgumentError
from msched.proof.clocks import Clocks, clocks_of
from msched.proof.dialects import Dialect, interpret

ORDERS = ("late-aux", "early-aux", "random")


def _pull(
    target: Node, preds: dict[Node, tuple[Node, ...]], done: set[Node], sequence: list[Node]
) -> None:
    """Append ``target`` to ``sequence`` after every not-yet-done node it happens after."""
    if target in done:
        return
    stack: list[tuple[Node, Iterator[Node]]] = [(target, iter(preds[target]))]
    while stack:
        node, unvisited = stack[-1]
        for pred in unvisited:
            if pred not in done:
                stack.append((pred, iter(preds[pred])))
                break
        else:
            stack.pop()
            done.add(node)
            sequence.append(node)


def _demand_order(preds: dict[Node, tuple[Node, ...]], first: list[Node]) -> list[Node]:
    """Run ``first`` in order, each only once what it happens after has run; then the rest
    (the keys of ``preds``, in host order)."""
    done: set[Node] = set()
    sequence: list[Node] = []
    for node in first:
        _pull(node, preds, done, sequence)
    for node in preds:
        _pull(node, preds, done, sequence)
    return sequence


def _random_order(preds: dict[Node, tuple[Node, ...]], seed: int) -> list[Node]:
    """A uniformly random ready node at each step (from ``seed``)."""
    rng = random.Random(seed)
    unfinished = {n: len(before) for n, before in preds.items()}  # preds not yet run
    succs: dict[Node, list[Node]] = {n: [] for n in preds}
    for node, before in preds.items():
        for pred in before:
            succs[pred].append(node)
    ready = [n for n in preds if not unfinished[n]]
    sequence: list[Node] = []
    while ready:
        i = rng.randrange(len(ready))
        ready[i], ready[-1] = ready[-1], ready[i]
        node = ready.pop()
        sequence.append(node)
        for succ in succs[node]:
            unfinished[succ] -= 1
            if not unfinished[succ]:
                ready.append(succ)
    return sequence


def run_order(clocks: Clocks, order: str, seed: int = 0) -> list[Node]:
    """The order `execute` runs the nodes of ``clocks`` in (see `execute` for ``order``):
    every compute node that runs but the graph inputs, ``output`` included."""
    preds, stamp, output = clocks.predecessors, clocks.stamp, clocks.output
    if order == "late-aux":
        main = [n for n in preds if stamp[n].stream == 0 or n is output]
        return _demand_order(preds, main[: main.index(output) + 1])
    if order == "early-aux":
        aux = [n for n in preds if stamp[n].stream != 0 and n is not output]
        return _demand_order(preds, aux)
    if order == "random":
        return _random_order(preds, seed)
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

    def __init__(self, gm: GraphModule, clocks: Clocks, inputs: Sequence[Any]) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.clocks = clocks
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
                for node in self.clocks.predecessors:  # what runs, in host order
                    if node is not self.clocks.output:
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
    clocks = clocks_of(interpret(gm, dialect))
    sequence = run_order(clocks, order, seed)
    return _run(_Runner(gm, clocks, inputs), sequence, clocks.output, inputs)


def _run(runner: _Runner, sequence: list[Node], output: Node, inputs: tuple[Any, ...]) -> Execution:
    """Run ``sequence`` one node at a time; what ``output`` returns, and the inputs then, are
    cloned when it runs."""
    returned: Any = None
    at_output: tuple[Any, ...] = ()
    ran: list[str] = []
    after: list[str] = []
    produced = False
    for node in sequence:
        value = runner.step(node)
        if node is output:
            returned, at_output, produced = _clone(value), _clone(inputs), True
        elif produced:
            after.append(node.name)
        ran.append(node.name)
    return Execution(returned, tuple(at_output), tuple(ran), tuple(after))

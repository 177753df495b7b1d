"""`msched.execute`: run a scheduled graph in the worst order its stream ops allow.

Why: on CPU every stream op is a no-op and a scheduled graph runs in host order, so a missing
wait never shows.  `execute` runs the compute nodes in an order that respects *only* what the
stream ops guarantee (program order per stream, plus record/wait edges, as
`msched.proof.clocks.Clocks.predecessors` gives them), chosen to be as unhelpful as the
guarantees allow, so a missing wait becomes a wrong number.  (The timeline of the same
streams under a cost model is `msched.simulate`, in `msched.proof.timeline`.)

The graph is read with `msched.proof.interpreter.interpret`; nodes after ``output`` never run.

The caching allocator is adversarial too: a tensor read on another stream and freed on its
own stream before that stream waited for the read, without ``record_stream`` for the reading
stream (`msched.proof.record_streams.unrecorded_uses`, what ``missing-record-stream``
reports), is overwritten with garbage when the first node of its stream after the free that
may allocate runs before the read, as if it took the block.

``order="search"`` tries many such orders (every auxiliary stream late in turn, every one
early in turn, seeded random ones) against a reference run and stops at the first that gives
other numbers, so a race that some order shows is shown.  A node that fails on the garbage a
race handed it (an index out of range) ends the run as a finding, ``Execution.failure``,
instead of an exception from the kernel.

Collectives run as they come in the order, inside the caller's process group: every order
respects happens-before, and a schedule that verifies orders each collective after the one
before it (the Dag's ``collective`` chain, emitted as stream order or an event), so every
order issues them in the original order, alike on every rank; a ``wait_tensor`` runs after
its collective (its data dependency).  An order depends only on the graph and the seed, so
the ranks agree; only ``order="search"``, which stops at the first order that differs (or a
run that fails on garbage), can stop after different trials on different ranks when a race
shows on one rank only, and the ranks then wait for each other: on ranks, search only
schedules that verify.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch
from torch.fx import GraphModule, Interpreter, Node

from msched._torch_internals import storage_id, tree_flatten, tree_map
from msched.analysis._graphcheck import check_acyclic
from msched.analysis.lifetimes import allocates
from msched.errors import InvalidArgumentError
from msched.limits import positive_int
from msched.proof.clocks import Clocks, clocks_of
from msched.proof.dialects import Dialect
from msched.proof.interpreter import interpret
from msched.proof.program import StreamProgram
from msched.proof.record_streams import scheduled_effects, unrecorded_uses

ORDERS = ("late-aux", "early-aux", "random", "search")
T = TypeVar("T")

#: How many seeded random orders ``order="search"`` tries after the stream-by-stream ones.
SEARCH_SEEDS = 32


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
    """The order `execute` runs the nodes of ``clocks`` in (see `execute` for ``order``, but
    ``"search"``, which tries several): every compute node that runs but the graph inputs,
    ``output`` included."""
    preds, stamp = clocks.predecessors, clocks.stamp
    if order == "late-aux":
        return _late(clocks, lambda n: stamp[n].stream != 0)
    if order == "early-aux":
        aux = [n for n in preds if stamp[n].stream != 0 and n is not clocks.output]
        return _demand_order(preds, aux)
    if order == "random":
        return _random_order(preds, seed)
    raise InvalidArgumentError(f"order must be one of {', '.join(ORDERS)}; got {order!r}")


def _late(clocks: Clocks, late: Any) -> list[Node]:
    """The nodes for which ``late(node)`` holds run only when another needs them (``output``
    included), the others greedily in host order up to ``output``."""
    preds, output = clocks.predecessors, clocks.output
    eager = [n for n in preds if n is output or not late(n)]
    return _demand_order(preds, eager[: eager.index(output) + 1])


def _auxiliary_streams(clocks: Clocks) -> list[int]:
    return sorted({clocks.stamp[n].stream for n in clocks.predecessors} - {0})


def search_orders(
    clocks: Clocks, seed: int = 0, seeds: int = SEARCH_SEEDS
) -> Iterator[tuple[str, list[Node]]]:
    """The orders ``order="search"`` tries, each once, named: ``late-aux``, ``early-aux``,
    every auxiliary stream late in turn (the other streams greedy), every one early in turn,
    then ``seeds`` random orders from ``seed`` on."""
    preds, stamp, output = clocks.predecessors, clocks.stamp, clocks.output
    seen: set[tuple[Node, ...]] = set()
    candidates: list[tuple[str, Any]] = [
        ("late-aux", lambda: run_order(clocks, "late-aux")),
        ("early-aux", lambda: run_order(clocks, "early-aux")),
    ]
    for s in _auxiliary_streams(clocks):
        candidates.append((f"stream {s} late", lambda s=s: _late(clocks, _on(stamp, s))))
    for s in _auxiliary_streams(clocks):
        first = [n for n in preds if stamp[n].stream == s and n is not output]
        candidates.append((f"stream {s} early", lambda first=first: _demand_order(preds, first)))
    for k in range(seeds):
        candidates.append((f"random seed {seed + k}", lambda k=k: _random_order(preds, seed + k)))
    for name, make in candidates:
        sequence = make()
        if tuple(sequence) not in seen:
            seen.add(tuple(sequence))
            yield name, sequence


def _on(stamp: dict[Node, Any], stream: int) -> Any:
    return lambda node: stamp[node].stream == stream


@dataclass(frozen=True)
class Execution:
    """What `execute` observed.

    ``output`` is the value ``output`` returned, cloned when it was produced (work that the
    exit does not wait for cannot change it afterwards); ``inputs_at_output`` are clones of
    the inputs at that moment; ``order`` names the nodes in the order they ran (``output``
    included) and ``after_output`` those that ran after it.  The inputs passed to `execute`
    hold their final contents, as after calling the module.

    ``strategy`` names the order that ran (``"late-aux"``, ``"stream 2 late"``, ``"random
    seed 3"``).  ``failure`` says, when a node failed on garbage a race handed it, which
    node and how (``"the race made the graph fail at node index_select: IndexError: ..."``);
    the run stopped there, and ``output`` is None unless ``output`` had run.  With
    ``order="search"``: ``differs`` is whether the order that ran gave other numbers than the
    reference (or failed), and ``tried`` names every order tried, in order; both are None
    otherwise.
    """

    output: Any
    inputs_at_output: tuple[Any, ...]
    order: tuple[str, ...]
    after_output: tuple[str, ...]
    strategy: str = ""
    failure: str | None = None
    differs: bool | None = None
    tried: tuple[str, ...] | None = None


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


#: The nodes that may take a block freed too early: node -> (storage, its last user on
#: another stream) for each storage whose block ``node`` may get before that user ran.
Reuses = dict[Node, list[tuple[Node, Node]]]


def block_reuses(gm: GraphModule, program: StreamProgram, clocks: Clocks) -> Reuses:
    """Where the caching allocator may hand out a block still read on another stream: each
    cross-stream use with neither ``record_stream`` nor its storage kept alive until its
    stream joined the use (`msched.proof.record_streams.unrecorded_uses`, the rule
    ``missing-record-stream`` reports), at the first node of the storage's stream after its
    free that may allocate."""
    effects = scheduled_effects(gm.graph, program.passthrough)
    found: Reuses = {}
    for use in unrecorded_uses(program, clocks, effects.root, lambda n: allocates(n, effects)):
        if use.reuser is not None and use.last is not None:
            found.setdefault(use.reuser, []).append((use.root, use.last))
    return found


def _overwrite(value: Any) -> None:
    """Fill every tensor of ``value`` with garbage in place (NaN, or -1): another tensor now
    lives in its memory."""
    for leaf in tree_flatten(value)[0]:
        if isinstance(leaf, torch.Tensor):
            bad = float("nan") if leaf.is_floating_point() or leaf.is_complex() else -1
            with torch.no_grad():
                leaf.fill_(bad)


class _Runner(Interpreter):
    """Runs single nodes of ``gm`` on demand, reading unwritten values as garbage."""

    def __init__(
        self,
        gm: GraphModule,
        clocks: Clocks,
        inputs: Sequence[Any],
        host_values: dict[Node, Any] | None = None,
        reuses: Reuses | None = None,
    ) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self.clocks = clocks
        self.inputs = tuple(inputs)
        self._host_values = host_values  # shared by the runs of one search
        self.early: dict[Node, Any] = {}  # node -> garbage handed out before it ran
        self.handed_garbage = False
        self.reuses = reuses or {}
        self.ran: set[Node] = set()
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
        for storage, last in self.reuses.get(node, ()):
            if last not in self.ran and storage in self.env:
                _overwrite(self.env[storage])  # the block is ``node``'s now
                self.handed_garbage = True
        self.ran.add(node)
        for value in node.all_input_nodes:
            if value not in self.env:
                self.env[value] = self.early[value] = _garbage(self._host_order_values()[value])
                self.handed_garbage = True
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
    seeds: int = SEARCH_SEEDS,
    original: GraphModule | None = None,
) -> Execution:
    """Run the compute nodes of the scheduled ``gm`` on ``inputs`` in an adversarial order.

    The order respects only happens-before from the stream ops, not host order:

    - ``"late-aux"``: stream 0 runs greedily; a node of an auxiliary stream runs only when
      something on stream 0 (``output`` included) must wait for it, and everything ``output``
      does not wait for runs after ``output``;
    - ``"early-aux"``: the auxiliary streams run greedily, stream 0 only when they need it;
    - ``"random"``: a uniformly random ready node at each step, from ``seed``;
    - ``"search"``: the orders of `search_orders` (late-aux, early-aux, each auxiliary stream
      late in turn, each early in turn, ``seeds`` random orders from ``seed``), each on the
      inputs as given, until one gives other numbers than the reference: ``output`` and the
      inputs when ``output`` is produced, compared exactly (NaN equals NaN) with a run of
      ``original`` (the unscheduled graph, when given) or else of ``gm`` in host order.  The
      run returned is that order's (``differs=True``), or late-aux's when none differs.

    A value read before its producer ran reads as NaN (-1 for integers; the producer's later
    write still lands in that memory).  A storage read on another stream whose block the
    caching allocator may hand out before that read (freed on its own stream with neither
    ``record_stream`` for the reading stream nor a wait for the read before the free: what
    ``missing-record-stream`` reports) is overwritten with the same garbage when the node
    that may take the block runs first.  A node that raises after such a read ends the run
    with `Execution.failure` naming it; an error without garbage is raised.  Stream ops
    themselves are not run.  A cyclic graph is an `msched.InvalidGraphError` naming the
    cycle; nothing runs then.
    """
    if not isinstance(gm, GraphModule):
        raise InvalidArgumentError(
            f"execute expects a torch.fx.GraphModule, got {type(gm).__name__}"
        )
    check_acyclic(gm.graph)
    program = interpret(gm, dialect)
    clocks = clocks_of(program)
    reuses = block_reuses(gm, program, clocks)
    if order == "search":
        positive_int(seeds, "seeds")
        return _search(gm, clocks, inputs, seed, seeds, original, reuses)
    sequence = run_order(clocks, order, seed)
    runner = _Runner(gm, clocks, inputs, reuses=reuses)
    return _run(runner, sequence, clocks.output, inputs, order)


def _run(
    runner: _Runner, sequence: list[Node], output: Node, inputs: tuple[Any, ...], strategy: str
) -> Execution:
    """Run ``sequence`` one node at a time; what ``output`` returns, and the inputs then, are
    cloned when it runs.  A node that fails on garbage stops the run (`Execution.failure`)."""
    returned: Any = None
    at_output: tuple[Any, ...] | None = None
    ran: list[str] = []
    after: list[str] = []
    for node in sequence:
        try:
            value = runner.step(node)
        except Exception as error:
            if not runner.handed_garbage:
                raise
            failure = f"the race made the graph fail at node {node.name}: {_one_line(error)}"
            at = tuple(_clone(inputs)) if at_output is None else at_output
            return Execution(returned, at, tuple(ran), tuple(after), strategy, failure)
        if node is output:
            returned, at_output = _clone(value), tuple(_clone(inputs))
        elif at_output is not None:
            after.append(node.name)
        ran.append(node.name)
    return Execution(returned, at_output or (), tuple(ran), tuple(after), strategy)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:200]}"


def _search(
    gm: GraphModule,
    clocks: Clocks,
    inputs: tuple[Any, ...],
    seed: int,
    seeds: int,
    original: GraphModule | None,
    reuses: Reuses,
) -> Execution:
    """`execute` with ``order="search"``: each trial runs on the inputs and module state as
    given (put back after it, random state included); the chosen order then runs for real."""
    state = _State([inputs, gm, original])
    want = state.trial(_reference, gm, clocks, inputs, original)
    host_values = _Runner(gm, clocks, inputs)._host_order_values()
    tried: list[str] = []
    chosen: tuple[str, list[Node]] | None = None
    for name, sequence in search_orders(clocks, seed, seeds):
        tried.append(name)
        runner = _Runner(gm, clocks, inputs, host_values, reuses)
        run = state.trial(_run, runner, sequence, clocks.output, inputs, name)
        if run.failure is not None or not same_values(want, (run.output, run.inputs_at_output)):
            chosen = (name, sequence)
            break
    name, sequence = chosen or ("late-aux", run_order(clocks, "late-aux"))
    runner = _Runner(gm, clocks, inputs, host_values, reuses)
    run = _run(runner, sequence, clocks.output, inputs, name)
    return replace(run, differs=chosen is not None, tried=tuple(tried))


def _reference(
    gm: GraphModule, clocks: Clocks, inputs: tuple[Any, ...], original: GraphModule | None
) -> tuple[Any, tuple[Any, ...]]:
    """What a correct run gives: ``output`` and the inputs after it (``original``'s, or
    ``gm`` run in host order)."""
    if original is not None:
        return _clone(original(*inputs)), tuple(_clone(inputs))
    run = _run(_Runner(gm, clocks, inputs), list(clocks.predecessors), clocks.output, inputs, "")
    return run.output, run.inputs_at_output


def same_values(a: Any, b: Any) -> bool:
    """Whether two results hold the same values (nested alike): tensors of one shape and
    dtype equal element by element (NaN equals NaN), anything else by ``==``."""
    left, left_spec = tree_flatten(a)
    right, right_spec = tree_flatten(b)
    if left_spec != right_spec:
        return False
    return all(_same_leaf(x, y) for x, y in zip(left, right, strict=True))


def _same_leaf(x: Any, y: Any) -> bool:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        both_nan = x.isnan() & y.isnan() if x.is_floating_point() else False
        return bool(((x == y) | both_nan).all())
    return bool(x == y)


class _State:
    """The memory a run can write (every tensor storage of the inputs and of the modules'
    state), and the random-number state: `trial` runs something and puts them back."""

    def __init__(self, holders: list[Any]) -> None:
        storages: dict[int, torch.UntypedStorage] = {}
        for tensor in _tensors_of(holders):
            try:
                storages.setdefault(storage_id(tensor), tensor.untyped_storage())
            except Exception:  # a tensor without storage of its own: nothing to put back
                continue
        self.saved = [(s, s.clone()) for s in storages.values()]

    def trial(self, body: Callable[..., T], *args: Any) -> T:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        try:
            with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if cuda else []):
                return body(*args)
        finally:
            for storage, saved in self.saved:
                storage.copy_(saved)


def _tensors_of(holders: list[Any]) -> Iterator[torch.Tensor]:
    """The tensors in ``holders``: inputs (nested containers) and modules' parameters,
    buffers and tensor attributes."""
    for holder in holders:
        if isinstance(holder, torch.nn.Module):
            yield from holder.parameters()
            yield from holder.buffers()
            for module in holder.modules():
                yield from (v for v in vars(module).values() if isinstance(v, torch.Tensor))
        elif holder is not None:
            yield from (v for v in tree_flatten(holder)[0] if isinstance(v, torch.Tensor))

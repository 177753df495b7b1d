"""Hypothesis strategies for testing schedulers: random FX graphs with storage hazards.

Needs ``hypothesis`` (the ``test`` extra); ``import msched`` does not import this module::

    import msched.testing.strategies as mst

    @given(mst.graphs(), mst.stream_counts())
    def test_my_scheduler(gm, num_streams):
        inputs = mst.example_inputs(gm)
        ...

Generated graphs work on ``[4, 4]`` float tensors and mix: matmuls and elementwise ops;
reads through views of inputs (``aten.slice`` / ``aten.select``); in-place writes into views
of inputs (``aten.copy_``), in-place updates of intermediates (``aten.add_`` / ``aten.mul_``)
and Eagle3-style captures into a ``dest`` input (``msched::inplace_slice_copy``), none of
which is returned; and later reads of what was written.  They also mix the node kinds that
graphs traced from model code have (``torch.fx.symbolic_trace``): ``call_method`` nodes, pure
(``x.mul(y)``, ``x.neg()``) and in place (``x.mul_(y)``, ``x.copy_(y)``); ``call_module``
nodes of the root module's ``nn.Linear``, ``nn.ReLU`` and ``nn.ReLU(inplace=True)``;
``getattr`` views (``x.T``, ``x.mT``) read or written through; ``out=`` calls
(``torch.mul(a, b, out=c)``); and a buffer ``buf`` of the root module that every access
reads or writes through a ``get_attr`` node of its own.  Placeholders carry ``meta["val"]``
(a ``meta``-device tensor of their shape), which `example_inputs` reads.

Graphs with ``buf`` change it when they run: restore it (``gm.load_state_dict``) between
runs that must start from the same state.

Drawn graphs are `GeneratedGraph` modules: Hypothesis prints a falsifying example's graph as its
code (as drawn) with the root module's submodules and buffers, not as ``Generated()``.
`check_schedule` is the whole property check in one call that needs no pytest fixture, so
it works inside ``@given``::

    @given(mst.graphs(), mst.stream_counts())
    def test_my_scheduler(gm, num_streams):
        mst.check_schedule(gm, num_streams, scheduler=my_pass, dialect="myeng")
"""

from __future__ import annotations

import builtins
import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st
from torch.fx import Graph, GraphModule, Node
from torch.fx.node import Argument

import msched.models.reference_ops  # noqa: F401  (registers msched::inplace_slice_copy)
from msched._text import counted
from msched.proof.dialects import Dialect
from msched.proof.executor import execute, same_values
from msched.scheduling.pipeline import Schedule
from msched.testing.checks import Scheduler, SchedulerFailure, copy_module, schedule_and_verify

__all__ = [
    "OPS",
    "GeneratedGraph",
    "check_schedule",
    "example_inputs",
    "graphs",
    "stream_counts",
]

aten = torch.ops.aten
SIZE = 4
OPS = (
    "mm", "add", "mul", "tanh", "read_view", "copy_into_input", "update", "capture",
    "method", "method_inplace", "module", "getattr_view", "out", "buffer",
)  # fmt: skip
_PURE_METHODS = ("mul", "add", "sub", "neg")
_INPLACE_METHODS = ("mul_", "add_", "copy_")
_MODULES = ("lin", "relu", "relu_inplace")


#: The ``GraphModule.meta`` key of a drawn graph's code as drawn (deep copies keep it).
DRAWN_CODE_META = "msched_drawn_code"


class GeneratedGraph(GraphModule):
    """A graph `graphs` drew; its ``repr`` (what Hypothesis prints in a falsifying example) is
    its code as drawn (``meta[DRAWN_CODE_META]``), after a line naming the root module's
    submodules and buffers."""

    def __repr__(self) -> str:
        drawn = self.meta.get(DRAWN_CODE_META)
        return drawn if isinstance(drawn, str) else _describe(self)


def _describe(gm: GraphModule) -> str:
    parts = [f"{name}={module!r}" for name, module in gm.named_children()]
    parts += [f"{name}: {list(t.shape)}" for name, t in gm.named_buffers()]
    state = f"  # state: {', '.join(parts)}" if parts else ""
    return f"GeneratedGraph({len(gm.graph.nodes)} nodes){state}\n{gm.code.strip()}\n"


@dataclass
class _Builder:
    """The graph being drawn and the values its next node can use."""

    graph: Graph = field(default_factory=Graph)
    root: torch.nn.Module = field(default_factory=torch.nn.Module)
    inputs: list[Node] = field(default_factory=list)  # writable placeholders
    readable: list[Node] = field(default_factory=list)  # [SIZE, SIZE] inputs and results
    results: list[Node] = field(default_factory=list)  # [SIZE, SIZE] op outputs (not views)
    dest: Node | None = None
    slots: int = 0
    buffer: str | None = None  # the writable buffer of ``root``; each access is a get_attr

    def writable(self, draw: st.DrawFn) -> Node:
        """Something a write may target: an input, an op result, or (a new ``get_attr`` of)
        the buffer.  Never ``dest`` (captures only) nor ``w`` (read only)."""
        kinds = [k for k, ok in (("input", self.inputs), ("result", self.results),
                                 ("buffer", self.buffer)) if ok]  # fmt: skip
        kind = draw(st.sampled_from(kinds))
        if kind == "buffer":
            return self.graph.get_attr(self.buffer)  # type: ignore[arg-type]
        return draw(st.sampled_from(self.inputs if kind == "input" else self.results))

    def module(self, name: str) -> str:
        """The qualified name of submodule ``name`` of ``root`` (added on first use)."""
        if not hasattr(self.root, name):
            self.root.add_module(name, _make_module(name))
        return name

    def placeholder(self, name: str, *shape: int) -> Node:
        node = self.graph.placeholder(name)
        node.meta["val"] = torch.empty(*shape, device="meta")
        return node

    def call(self, target: object, *args: object) -> Node:
        return self.graph.call_function(target, args)  # type: ignore[arg-type]


def _view(
    draw: st.DrawFn, b: _Builder, base: Node, like: Node | None = None
) -> tuple[Node, Node | None]:
    """A column slice or a row of ``base``; the same view of ``like`` when given.

    Without ``like`` (a view to read) the slice is one column wide, so it broadcasts.
    """
    if draw(st.booleans()):
        lo = draw(st.integers(0, SIZE - 1))
        hi = draw(st.integers(lo + 1, SIZE)) if like is not None else lo + 1
        twin = b.call(aten.slice.Tensor, like, 1, lo, hi) if like is not None else None
        return b.call(aten.slice.Tensor, base, 1, lo, hi), twin
    row = draw(st.integers(0, SIZE - 1))
    twin = b.call(aten.select.int, like, 0, row) if like is not None else None
    return b.call(aten.select.int, base, 0, row), twin


def _make_module(name: str) -> torch.nn.Module:
    if name == "lin":  # fixed weights, without touching the global random generator
        lin = torch.nn.utils.skip_init(torch.nn.Linear, SIZE, SIZE)
        with torch.no_grad():
            lin.weight.copy_(torch.eye(SIZE) * 0.5 + 0.1)
            lin.bias.copy_(torch.linspace(-0.2, 0.2, SIZE))
        return lin.requires_grad_(False)
    return torch.nn.ReLU(inplace=name == "relu_inplace")


def _add_result(b: _Builder, node: Node) -> None:
    b.readable.append(node)
    b.results.append(node)


def _draw_op(draw: st.DrawFn, b: _Builder, op: str) -> None:
    pick = st.sampled_from(b.readable)
    if op == "mm":
        _add_result(b, b.call(aten.mm.default, draw(pick), draw(pick)))
    elif op in ("add", "mul"):
        target = aten.add.Tensor if op == "add" else aten.mul.Tensor
        _add_result(b, b.call(target, draw(pick), draw(pick)))
    elif op == "tanh":
        _add_result(b, b.call(aten.tanh.default, draw(pick)))
    elif op == "read_view":
        view, _ = _view(draw, b, draw(pick))
        _add_result(b, b.call(aten.mul.Tensor, draw(pick), view))
    elif op == "copy_into_input" and b.inputs:
        view, src = _view(draw, b, draw(st.sampled_from(b.inputs)), like=draw(pick))
        b.call(aten.copy_.default, view, src)
    elif op == "update" and b.results:
        target = aten.add_.Tensor if draw(st.booleans()) else aten.mul_.Tensor
        b.call(target, draw(st.sampled_from(b.results)), draw(pick))
    elif op == "capture" and b.dest is not None:
        _capture(draw, b, draw(pick))
    elif op in _TRACED_OPS and (op != "buffer" or b.buffer is not None):
        _TRACED_OPS[op](draw, b)
    else:
        _add_result(b, b.call(aten.sub.Tensor, draw(pick), draw(pick)))


def _method(draw: st.DrawFn, b: _Builder) -> None:
    """``x.mul(y)`` / ``x.add(y)`` / ``x.sub(y)`` / ``x.neg()`` (``call_method``, pure)."""
    pick = st.sampled_from(b.readable)
    name = draw(st.sampled_from(_PURE_METHODS))
    args = (draw(pick),) if name == "neg" else (draw(pick), draw(pick))
    _add_result(b, b.graph.call_method(name, args))


def _method_inplace(draw: st.DrawFn, b: _Builder) -> None:
    """``t.mul_(y)`` / ``t.add_(y)`` / ``t.copy_(y)`` on a writable ``t``, or on a view of it."""
    pick = st.sampled_from(b.readable)
    name = draw(st.sampled_from(_INPLACE_METHODS))
    target, src = b.writable(draw), draw(pick)
    if draw(st.booleans()):
        target, twin = _view(draw, b, target, like=src)
        assert twin is not None  # a view of ``src`` shaped like the view of ``target``
        src = twin
    b.graph.call_method(name, (target, src))


def _module(draw: st.DrawFn, b: _Builder) -> None:
    """``self.lin(x)`` / ``self.relu(x)`` / ``self.relu_inplace(t)`` (``call_module``)."""
    name = b.module(draw(st.sampled_from(_MODULES)))
    if name == "relu_inplace":
        target = b.writable(draw)
        b.readable.append(b.graph.call_module(name, (target,)))  # an alias of ``target``
    else:
        _add_result(b, b.graph.call_module(name, (draw(st.sampled_from(b.readable)),)))


def _getattr_view(draw: st.DrawFn, b: _Builder) -> None:
    """``x.T`` / ``x.mT`` (``getattr`` nodes): read with a matmul, or written in place.

    The operand of a write is a fresh ``tanh``: torch refuses an in-place op whose operand
    overlaps the transposed target only partly (``t.T.mul_(t)``).
    """
    attr = draw(st.sampled_from(("T", "mT")))
    pick = st.sampled_from(b.readable)
    if draw(st.booleans()):
        view = b.call(builtins.getattr, b.writable(draw), attr)
        operand = b.call(aten.tanh.default, draw(pick))
        b.graph.call_method(draw(st.sampled_from(("mul_", "add_"))), (view, operand))
    else:
        view = b.call(builtins.getattr, draw(pick), attr)
        _add_result(b, b.call(aten.mm.default, view, draw(pick)))


_OUT_FUNCTIONS: tuple[Callable[..., Any], ...] = (torch.mul, torch.add)


def _out(draw: st.DrawFn, b: _Builder) -> None:
    """``torch.mul(a, b, out=c)`` / ``torch.add(a, b, out=c)`` into a writable ``c``."""
    pick = st.sampled_from(b.readable)
    fn: Callable[..., Any] = draw(st.sampled_from(_OUT_FUNCTIONS))
    args, out = (draw(pick), draw(pick)), b.writable(draw)
    b.readable.append(b.graph.call_function(fn, args, {"out": out}))  # an alias of ``out``


def _buffer(draw: st.DrawFn, b: _Builder) -> None:
    """A read of ``buf`` or an in-place write to it, through a ``get_attr`` of its own."""
    pick = st.sampled_from(b.readable)
    access = b.graph.get_attr(b.buffer)  # type: ignore[arg-type]
    if draw(st.booleans()):
        _add_result(b, b.call(aten.mul.Tensor, access, draw(pick)))
    elif draw(st.booleans()):
        b.call(aten.add_.Tensor, access, draw(pick))
    else:
        b.graph.call_method("mul_", (access, draw(pick)))


_TRACED_OPS = {
    "method": _method,
    "method_inplace": _method_inplace,
    "module": _module,
    "getattr_view": _getattr_view,
    "out": _out,
    "buffer": _buffer,
}


def _capture(draw: st.DrawFn, b: _Builder, src: Node) -> None:
    j = draw(st.integers(0, b.slots - 1))
    start, end = j * SIZE, (j + 1) * SIZE
    op = torch.ops.msched.inplace_slice_copy.default
    if draw(st.booleans()):
        kwargs: dict[str, Argument] = {"dest": b.dest, "src": src, "start": start, "end": end}
        b.graph.create_node("call_function", op, (), kwargs, name="capture")
    else:
        b.graph.create_node("call_function", op, (b.dest, src, start, end), name="capture")


@st.composite
def graphs(
    draw: st.DrawFn,
    min_nodes: int = 1,
    max_nodes: int = 16,
    max_inputs: int = 3,
    ops: tuple[str, ...] = OPS,
) -> GraphModule:
    """A random `GraphModule` of ``min_nodes``..``max_nodes`` drawn ops (views not counted).

    ``ops`` restricts the kinds of nodes drawn (see `OPS`).  Inputs are ``x0``.. (written
    in place, directly or through views), optionally ``dest`` (written only by captures), a
    ``get_attr`` weight ``w`` (read only) and, when ``ops`` has ``"buffer"``, a buffer
    ``buf`` (read and written, each access through a ``get_attr`` node of its own; the root
    module holds it, so restore it between runs that must agree).
    """
    b = _Builder()
    for i in range(draw(st.integers(1, max_inputs))):
        node = b.placeholder(f"x{i}", SIZE, SIZE)
        b.inputs.append(node)
        b.readable.append(node)
    if "capture" in ops and draw(st.booleans()):
        b.slots = draw(st.integers(1, 3))
        b.dest = b.placeholder("dest", SIZE, SIZE * b.slots)
    if draw(st.booleans()):
        b.root.register_buffer("w", torch.eye(SIZE) * 0.5 + 0.1)
        b.readable.append(b.graph.get_attr("w"))
    if "buffer" in ops and draw(st.booleans()):
        b.buffer = "buf"
        b.root.register_buffer("buf", torch.linspace(-1.0, 1.0, SIZE * SIZE).view(SIZE, SIZE))
        b.readable.append(b.graph.get_attr("buf"))
    for op in draw(st.lists(st.sampled_from(ops), min_size=min_nodes, max_size=max_nodes)):
        _draw_op(draw, b, op)
    returned = (
        draw(st.lists(st.sampled_from(b.results), max_size=3, unique=True)) if b.results else []
    )
    b.graph.output(tuple(returned) if returned else b.call(aten.clone.default, b.readable[-1]))
    gm = GeneratedGraph(b.root, b.graph, "Generated")
    gm.meta[DRAWN_CODE_META] = _describe(gm)  # as drawn, whatever a test does to gm later
    return gm


def stream_counts() -> st.SearchStrategy[int]:
    """Stream counts worth testing: 1 (no stream ops), a few, and more than the graph needs."""
    return st.sampled_from([1, 2, 3, 4, 8])


def example_inputs(gm: GraphModule, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Fresh random inputs for ``gm``, shaped by its placeholders' ``meta["val"]``."""
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta["val"]
            inputs.append(torch.randn(*val.shape, generator=gen, dtype=val.dtype) * 0.5)
    return tuple(inputs)


def check_schedule(
    gm: GraphModule,
    num_streams: int,
    *,
    inputs: Sequence[Any] | None = None,
    scheduler: Scheduler | None = None,
    dialect: Dialect | str | None = None,
    seeds: int = 8,
) -> Schedule:
    """Schedule ``gm``, prove the schedule and run it; the check of a property test.

    Usable anywhere, ``@given`` included (no pytest fixture).  Steps, each failing with an
    ``AssertionError`` that says what went wrong, ends with the graph's code, and leaves
    Hypothesis to shrink:

    1. run an unscheduled copy of ``gm`` on ``inputs`` (default `example_inputs`; copied for
       every run, views of one buffer stay views): the expected output, inputs and state;
    2. schedule ``gm`` on ``num_streams`` streams with ``scheduler`` (default
       `msched.schedule`; any ``scheduler(gm, num_streams) -> GraphModule | None``) and
       `msched.verify` it against the copy, read in ``dialect`` (None: detected);
    3. `msched.execute` it with ``order="search"`` (``seeds`` random orders) against the
       unscheduled graph: no order may give other numbers;
    4. call the scheduled module: the expected output, inputs and module state.

    Returns the `msched.Schedule`.  ``gm``'s module state is that of one run at the end.
    """
    given = tuple(example_inputs(gm)) if inputs is None else tuple(inputs)
    where = f"\nthe graph, on {counted(num_streams, 'stream')}:\n{_describe(copy_module(gm))}"
    state = _state(gm)
    expected_inputs = copy.deepcopy(given)
    expected = copy_module(gm)(*expected_inputs)
    expected_state = _state(gm)
    gm.load_state_dict(state)
    check = schedule_and_verify(gm, num_streams, scheduler=scheduler, dialect=dialect)
    if isinstance(check, SchedulerFailure) or check.failure is not None:
        raise AssertionError(f"{check.failure}{where}")
    sched = check.schedule
    _check_execute(sched, check.dialect, copy.deepcopy(given), seeds, where)
    gm.load_state_dict(state)
    fresh = copy.deepcopy(given)
    got = sched.gm(*fresh)
    for what, value, want in (
        ("its output", got, expected),
        ("the inputs after it", fresh, expected_inputs),
        ("the module state after it", _state(sched.gm), expected_state),
    ):
        if not same_values(value, want):
            raise AssertionError(f"calling the scheduled module changes {what}{where}")
    return sched


def _check_execute(
    sched: Schedule, dialect: Dialect | None, inputs: tuple[Any, ...], seeds: int, where: str
) -> None:
    """`msched.execute` of the schedule in every order ``search`` tries: none may differ."""
    state = _state(sched.gm)
    run = execute(
        sched.gm, *inputs, order="search", seeds=seeds, dialect=dialect, original=sched.original
    )
    sched.gm.load_state_dict(state)
    if run.differs:
        what = run.failure or "gives other numbers than the unscheduled graph"
        raise AssertionError(
            f"msched.execute in the order {run.strategy!r} (of {', '.join(run.tried or ())}): "
            f"{what}; ran {', '.join(run.order)}{where}"
        )


def _state(gm: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in gm.state_dict().items()}

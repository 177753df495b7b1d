"""Assertion helpers for scheduled graphs.

Each helper takes the scheduled ``GraphModule`` and the nodes to check (nodes of the scheduled
graph, of its original, or their names: nodes are matched by name, which `msched.schedule`
keeps).  A failure names the node and the stream it is issued on and shows the lines of the
scheduled graph around the problem, with their streams (`msched.testing.checks.excerpt`).
Each takes ``dialect``: the `msched.Dialect` (or a dialect name) of the graph's stream ops;
``None``, the default, is the dialect configured for the running test (its ``msched_dialect``
fixture: ``--msched-dialect``, the ini option ``msched_dialect`` or a ``conftest.py``
override), else the one detected from the graph's ops; a graph msched made (`msched.trace_streams`,
an Inductor kernel order, `msched.schedule`) is read in its own dialect
(`msched.testing.checks.resolve_dialect`).  A graph with ops that look like
stream ops but that the dialect does not read raises `msched.UnreadStreamOpsError` naming them.
The checks themselves are the plain functions of `msched.testing.checks`.

A failure raises an ``AssertionError`` built here (`_fail`), not an ``assert`` statement: its
message says what is wrong and nothing else.  pytest does not rewrite this module, so it adds
no ``where False = ...`` introspection of the helper's own calls, and ``__tracebackhide__``
keeps the helper's frames out of the traceback: the failure points at the test's line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch.fx import GraphModule, Node

from msched._text import agreeing, counted, listed
from msched.analysis.cost import CostModel
from msched.analysis.nodes import node_named
from msched.proof.capture import CAPTURE_KINDS
from msched.proof.dialects import Dialect
from msched.proof.interpreter import interpret
from msched.proof.verifier import verify
from msched.scheduling.pipeline import Schedule
from msched.testing.checks import (
    capture_columns,
    excerpt,
    exit_joins,
    resolve_dialect,
    streams_of,
    violation_message,
    written_inputs,
)
from msched.testing.memory_checks import check_limit, memory_problem
from pytest_msched._reading import configured_dialect, plugin_hint


def _fail(message: str) -> NoReturn:
    """Fail the running test with ``message`` alone (see the module docstring)."""
    __tracebackhide__ = True
    raise AssertionError(message)


@plugin_hint()
def _reading(gm: GraphModule, dialect: Dialect | str | None) -> Dialect:
    """The dialect ``gm`` is read in: ``dialect``, else its own for a graph msched made,
    else the running test's, else detected (`msched.testing.checks.resolve_dialect`).

    The graph is read in it at once, also by helpers whose check does not need its streams:
    stream ops the dialect cannot read fail every helper (`msched.UnreadStreamOpsError`)."""
    read = resolve_dialect(gm, dialect, configured=configured_dialect())
    interpret(gm, read)
    return read


def _node(gm: GraphModule, node: Node | str) -> Node:
    """``node`` or the node of its name in ``gm`` (`msched.InvalidArgumentError` if none)."""
    return node_named(gm, node if isinstance(node, str) else node.name, "the scheduled graph")


def _output(gm: GraphModule) -> Node:
    return next(n for n in gm.graph.nodes if n.op == "output")


def _where(gm: GraphModule, node: Node, dialect: Dialect) -> str:
    stream = streams_of(gm, dialect).get(node)
    return f"{node.name} (stream {stream})" if stream is not None else node.name


def _subject(gm: GraphModule, nodes: Sequence[Node], dialect: Dialect) -> str:
    """``capture_1 (stream 0)``, ``capture_1 (stream 0) and capture_3 (stream 1)``."""
    return listed(_where(gm, n, dialect) for n in nodes)


def assert_captures_precede_output(
    gm: GraphModule, captures: Iterable[Node | str], dialect: Dialect | str | None = None
) -> None:
    """Every capture is emitted before ``output``, so recompiled code runs it.

    A capture emitted after ``output`` ends up after ``return`` in the generated code and
    silently never runs (the Eagle3 bug this project exists for).
    """
    __tracebackhide__ = True
    read = _reading(gm, dialect)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    nodes = [_node(gm, c) for c in captures]
    late = [n for n in nodes if order[n] > order[_output(gm)]]
    if late:
        one = len(late) == 1
        _fail(
            f"{_subject(gm, late, read)} {agreeing(len(late), 'is', 'are')} emitted after "
            f"output: in the recompiled module {'it follows' if one else 'they follow'} "
            f"`return` and never {agreeing(len(late), 'runs', 'run')}: move "
            f"{'it' if one else 'them'} before output\n"
            + excerpt(gm, [*late, _output(gm)], dialect=read)
        )


def _assignment_line(code: list[str], name: str) -> int | None:
    for i, line in enumerate(code):
        if line.strip().startswith(f"{name} = "):
            return i
    return None


def _return_line(code: list[str]) -> int:
    return next(i for i, line in enumerate(code) if line.strip().startswith("return"))


def _check_code_order(gm: GraphModule, nodes: list[Node], dialect: Dialect) -> None:
    __tracebackhide__ = True
    code = gm.code.splitlines()
    ret = _return_line(code)
    lines = {n: _assignment_line(code, n.name) for n in nodes}
    missing = [n for n in nodes if lines[n] is None]
    if missing:
        _fail(
            f"{_subject(gm, missing, dialect)} "
            f"{agreeing(len(missing), 'does', 'do')} not appear in the generated code\n"
            + excerpt(gm, missing, dialect=dialect)
        )
    late = [n for n in nodes if (lines[n] or 0) > ret]
    if late:
        _fail(
            f"{_subject(gm, late, dialect)} {agreeing(len(late), 'comes', 'come')} after "
            f"`return` in the recompiled code and never {agreeing(len(late), 'runs', 'run')}: "
            f"move {agreeing(len(late), 'it', 'them')} before output\n"
            + "\n".join(f"    {code[i]}" for i in sorted({ret, *(lines[n] or 0 for n in late)}))
            + "\n"
            + excerpt(gm, [*late, _output(gm)], dialect=dialect)
        )


@dataclass(frozen=True)
class _Region:
    """The columns of a graph input (the tensor passed for it) that a capture writes."""

    capture: Node
    input_name: str
    tensor: torch.Tensor
    columns: slice

    def read(self) -> torch.Tensor:
        return self.tensor[..., self.columns].clone()

    def __str__(self) -> str:
        return f"{self.input_name}[..., {self.columns.start}:{self.columns.stop}]"


def _regions(gm: GraphModule, nodes: list[Node], inputs: Sequence[Any]) -> list[_Region]:
    """The columns of every graph input each node writes (as msched's effects see it)."""
    __tracebackhide__ = True
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = written_inputs(gm, nodes)
    unknown = [n.name for n, written in found.items() if not written]
    if unknown:
        _fail(
            f"{listed(unknown)} {agreeing(len(unknown), 'writes', 'write')} no graph input that "
            "this helper can find (it checks the placeholders msched's effects say a node "
            "writes: its schema, registered mutations)"
        )
    return [
        _Region(n, dest.name, inputs[placeholders.index(dest)], capture_columns(n))
        for n, written in found.items()
        for dest in written
    ]


def _check_writes(
    gm: GraphModule, nodes: list[Node], inputs: Sequence[Any], dialect: Dialect
) -> None:
    """Run ``gm``: each node must change (one of) the regions it writes."""
    __tracebackhide__ = True
    regions = _regions(gm, nodes, inputs)
    before = [r.read() for r in regions]
    gm(*inputs)
    changed = {r.capture for r, old in zip(regions, before, strict=True) if not _same(r, old)}
    unwritten = [r for r in regions if r.capture not in changed]
    if unwritten:
        _fail(_unwritten_message(gm, unwritten, dialect))


def _same(region: _Region, before: torch.Tensor) -> bool:
    return torch.equal(region.read(), before)


def _unwritten_message(gm: GraphModule, unwritten: list[_Region], dialect: Dialect) -> str:
    captures = list(dict.fromkeys(r.capture for r in unwritten))
    return (
        "\n".join(
            f"{_where(gm, c, dialect)} did not write "
            + " or ".join(str(r) for r in unwritten if r.capture is c)
            + " when the module ran"
            for c in captures
        )
        + "\n"
        + excerpt(gm, captures, dialect=dialect)
    )


def assert_survives_recompile(
    gm: GraphModule,
    captures: Iterable[Node | str],
    inputs: Sequence[Any] | None = None,
    dialect: Dialect | str | None = None,
) -> None:
    """``gm.recompile()``; each capture's line precedes ``return``; running it writes them.

    With ``inputs`` (in placeholder order), the module is run once on them and each
    capture's columns ``[start:end]`` of the graph input it writes (the whole input when the
    op has no ``start``/``end``) must differ from what they held before the run; pass a
    buffer whose contents differ from the captured values (zeros, as
    ``DecoderStack.example_inputs()`` does).  The written input is the placeholder msched's
    effects say the capture writes (its schema, or `msched.register_mutation`); when they
    name several (an op msched cannot see into writes every tensor it receives), one of
    them must change.
    """
    __tracebackhide__ = True
    read = _reading(gm, dialect)
    nodes = [_node(gm, c) for c in captures]
    gm.recompile()
    _check_code_order(gm, nodes, read)
    if inputs is not None:
        _check_writes(gm, nodes, inputs, read)


def assert_exit_waits_on(
    gm: GraphModule, node: Node | str, dialect: Dialect | str | None = None
) -> None:
    """``output`` happens after ``node``: stream 0 has joined it before the graph returns.

    That is, ``node`` is emitted before ``output`` and, if it runs on an auxiliary stream,
    stream 0 waits on an event recorded after it (directly or through other streams).
    """
    __tracebackhide__ = True
    read = _reading(gm, dialect)
    target = _node(gm, node)
    out = _output(gm)
    if not exit_joins(gm, target, read):
        _fail(
            f"output on stream {streams_of(gm, read).get(out, 0)} does not wait for "
            f"{_where(gm, target, read)}: record an event after it and wait on it before "
            "output\n" + excerpt(gm, [target, out], dialect=read)
        )


def assert_race_free(
    gm: GraphModule, original: GraphModule, dialect: Dialect | str | None = None
) -> None:
    """`msched.verify` finds no violation in ``gm`` against the unscheduled ``original``
    (``gm`` read in ``dialect``; ``None``: the running test's dialect, else detected)."""
    __tracebackhide__ = True
    read = _reading(gm, dialect)
    report = verify(gm, original=original, dialect=read)
    if not report.ok:
        _fail(violation_message(gm, report, read))


def assert_capture_safe(gm: GraphModule, dialect: Dialect | str | None = None) -> None:
    """``gm`` can be captured as a CUDA graph on the caller's stream and replayed:
    `msched.verify` with ``cuda_graph=True`` finds none of the capture faults
    (`msched.proof.capture.CAPTURE_KINDS`: ``capture-sync``, a host synchronization inside;
    ``capture-fork``, a side stream that works before it joined the capture;
    ``capture-join``, a side stream not rejoined before ``output``).

    Races are `assert_race_free`'s business; this checks only what capture adds.
    """
    __tracebackhide__ = True
    read = _reading(gm, dialect)
    report = verify(gm, dialect=read, cuda_graph=True)
    faults = [v for v in report.violations if v.kind in CAPTURE_KINDS]
    if faults:
        _fail(
            f"{counted(len(faults), 'CUDA-graph capture fault')}:\n"
            + "\n".join(f"  {v}" for v in faults)
            + "\n"
            + excerpt(gm, [n for v in faults for n in v.nodes], dialect=read)
        )


def assert_peak_memory(
    gm_or_sched: GraphModule | Schedule,
    at_most: int | float,
    *,
    original: GraphModule | None = None,
    example_inputs: Sequence[Any] | None = None,
    cost_model: CostModel | None = None,
    dialect: Dialect | str | None = None,
) -> None:
    """The schedule's ``reserved_bound`` (`msched.peak_memory`: what the caching allocator
    may hold under any timing) is at most ``at_most``: bytes (an int), or a ratio (a float
    >= 1.0) of the original order's, the original being ``Schedule.original`` or
    ``original=``.  Sizes come from the graph's fake values, else from ``example_inputs``.
    A failure gives both figures, the ratio and each stream pool's bound.
    """
    __tracebackhide__ = True
    check_limit(at_most)
    if isinstance(gm_or_sched, Schedule):
        gm = gm_or_sched.gm
        if original is None and isinstance(at_most, float):
            original = gm_or_sched.original
    else:
        gm = gm_or_sched
    read = _reading(gm, dialect)
    problem = memory_problem(
        gm,
        at_most,
        original=original,
        example_inputs=example_inputs,
        cost_model=cost_model,
        dialect=read,
    )
    if problem is not None:
        _fail(problem)

"""Assertion helpers for scheduled graphs, rewritten by pytest (see ``pytest_msched/__init__``).

Each helper takes the scheduled ``GraphModule`` and the nodes to check (nodes of the scheduled
graph, of its original, or their names: nodes are matched by name, which `msched.schedule`
keeps).  A failure names the node and the stream it is issued on and shows the lines of the
scheduled graph around the problem, with their streams (see `pytest_msched._excerpt`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node

from msched.proof.dialects import interpret
from msched.proof.verifier import run_clocks, verify
from pytest_msched._excerpt import excerpt, streams_of


def _node(gm: GraphModule, node: Node | str) -> Node:
    name = node if isinstance(node, str) else node.name
    for candidate in gm.graph.nodes:
        if candidate.name == name:
            return candidate
    raise LookupError(f"no node named {name!r} in the scheduled graph")


def _output(gm: GraphModule) -> Node:
    return next(n for n in gm.graph.nodes if n.op == "output")


def _where(gm: GraphModule, node: Node) -> str:
    stream = streams_of(gm).get(node)
    return f"{node.name} (stream {stream})" if stream is not None else node.name


def assert_captures_precede_output(gm: GraphModule, captures: Iterable[Node | str]) -> None:
    """Every capture is emitted before ``output``, so recompiled code runs it.

    A capture emitted after ``output`` ends up after ``return`` in the generated code and
    silently never runs (the Eagle3 bug this project exists for).
    """
    __tracebackhide__ = True
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    nodes = [_node(gm, c) for c in captures]
    late = [n for n in nodes if order[n] > order[_output(gm)]]
    assert not late, (
        ", ".join(_where(gm, n) for n in late)
        + " is emitted after output: in the recompiled module it follows `return` and never "
        "runs\n" + excerpt(gm, [*late, _output(gm)])
    )


def _assignment_line(code: list[str], name: str) -> int | None:
    for i, line in enumerate(code):
        if line.strip().startswith(f"{name} = "):
            return i
    return None


def _return_line(code: list[str]) -> int:
    return next(i for i, line in enumerate(code) if line.strip().startswith("return"))


def _check_code_order(gm: GraphModule, nodes: list[Node]) -> None:
    __tracebackhide__ = True
    code = gm.code.splitlines()
    ret = _return_line(code)
    lines = {n: _assignment_line(code, n.name) for n in nodes}
    missing = [n for n in nodes if lines[n] is None]
    assert not missing, (
        ", ".join(_where(gm, n) for n in missing)
        + " does not appear in the generated code\n"
        + excerpt(gm, missing)
    )
    late = [n for n in nodes if (lines[n] or 0) > ret]
    assert not late, (
        ", ".join(_where(gm, n) for n in late)
        + " comes after `return` in the recompiled code and never runs:\n"
        + "\n".join(f"    {code[i]}" for i in sorted({ret, *(lines[n] or 0 for n in late)}))
        + "\n"
        + excerpt(gm, [*late, _output(gm)])
    )


def _bound_args(node: Node) -> dict[str, Any]:
    schema = getattr(node.target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    bound = dict(zip(names, node.args, strict=False))
    bound.update(node.kwargs)
    return bound


def _written_input(node: Node) -> tuple[Node, slice] | None:
    """The graph input a capture writes and the columns it writes (last dimension)."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    bound = _bound_args(node)
    for arg in schema.arguments:
        target = bound.get(arg.name)
        written = arg.alias_info is not None and arg.alias_info.is_write
        if written and isinstance(target, Node) and target.op == "placeholder":
            return target, slice(bound.get("start"), bound.get("end"))
    return None


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
    __tracebackhide__ = True
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    found = {n: _written_input(n) for n in nodes}
    unknown = [n.name for n, where in found.items() if where is None]
    assert not unknown, (
        ", ".join(unknown) + " writes no graph input that this helper can find (it checks ops "
        "whose schema marks a placeholder argument as written)"
    )
    return [
        _Region(n, dest.name, inputs[placeholders.index(dest)], columns)
        for n, (dest, columns) in ((n, w) for n, w in found.items() if w is not None)
    ]


def _check_writes(gm: GraphModule, nodes: list[Node], inputs: Sequence[Any]) -> None:
    __tracebackhide__ = True
    regions = _regions(gm, nodes, inputs)
    before = [r.read() for r in regions]
    gm(*inputs)
    unwritten = [r for r, old in zip(regions, before, strict=True) if torch.equal(r.read(), old)]
    assert not unwritten, (
        "\n".join(
            f"{_where(gm, r.capture)} did not write {r} when the module ran" for r in unwritten
        )
        + "\n"
        + excerpt(gm, [r.capture for r in unwritten])
    )


def assert_survives_recompile(
    gm: GraphModule, captures: Iterable[Node | str], inputs: Sequence[Any] | None = None
) -> None:
    """``gm.recompile()``; each capture's line precedes ``return``; running it writes them.

    With ``inputs`` (in placeholder order), the module is run once on them and each
    capture's columns ``[start:end]`` of the graph input it writes (the whole input when the
    op has no ``start``/``end``) must differ from what they held before the run; pass a
    buffer whose contents differ from the captured values (zeros, as
    ``DecoderStack.example_inputs()`` does).
    """
    __tracebackhide__ = True
    nodes = [_node(gm, c) for c in captures]
    gm.recompile()
    _check_code_order(gm, nodes)
    if inputs is not None:
        _check_writes(gm, nodes, inputs)


def _exit_joins(gm: GraphModule, node: Node) -> bool:
    """Whether ``output`` happens after ``node`` (the happens-before of `msched.verify`)."""
    program = interpret(gm)
    clocks = run_clocks(program, program.num_streams)
    return node in clocks.stamp and clocks.happens_before(node, program.output)


def assert_exit_waits_on(gm: GraphModule, node: Node | str) -> None:
    """``output`` happens after ``node``: stream 0 has joined it before the graph returns.

    That is, ``node`` is emitted before ``output`` and, if it runs on an auxiliary stream,
    stream 0 waits on an event recorded after it (directly or through other streams).
    """
    __tracebackhide__ = True
    target = _node(gm, node)
    out = _output(gm)
    assert _exit_joins(gm, target), (
        f"output on stream {streams_of(gm).get(out, 0)} does not wait for "
        f"{_where(gm, target)}: record an event after it and wait on it before output\n"
        + excerpt(gm, [target, out])
    )


def assert_race_free(gm: GraphModule, original: GraphModule) -> None:
    """`msched.verify` finds no violation in ``gm`` against the unscheduled ``original``."""
    __tracebackhide__ = True
    report = verify(gm, original=original)
    involved = [n for v in report.violations for n in v.nodes]
    assert report.ok, f"{report}\n" + excerpt(gm, involved)

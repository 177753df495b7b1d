"""A schedule read back from a picture of it: what `msched.pictures.text.read_text` and
`msched.pictures.json_doc.read_json` return, and what they build it with.

A `ParsedSchedule` is a stream program with one FX node per line of the text (one per entry of
the JSON), so `msched.proof.clocks` runs on it as on the graph it was printed from: its
records and waits get the names the text printed (`msched.pictures.naming`), and
`msched.pictures.diff` compares two of them in schedule terms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torch.fx import Graph, Node

from msched.analysis.nodes import INPUT_OPS
from msched.errors import InvalidArgumentError
from msched.pictures.naming import event_names
from msched.proof.clocks import Clocks, clocks_of
from msched.proof.program import Step, StreamProgram
from msched.proof.summary import Summarized, Summary

__all__ = ["ParsedSchedule", "ProgramBuilder"]

_IDENT = re.compile(r"(?<![\w.'\"])([A-Za-z_]\w*)(?!\s*=[^=])(?![\w'\"])")


def _marker(*args: Any) -> None:
    """The target of the nodes of a parsed program (never called)."""


@dataclass(frozen=True)
class ParsedSchedule(Summarized[str]):
    """A schedule read back from its canonical text or JSON.

    ``summary`` is its header (`msched.proof.summary.Summary`), the times as printed;
    ``program`` is its stream program with one FX node per line (`msched.proof.clocks` runs
    on it); ``name_of`` the node name (compute and host-only nodes) or stream-op label of each
    of its nodes; ``record_name[r]`` the stable name of record ``r`` and ``binding[w]`` the
    record wait ``w`` binds to (`msched.proof.clocks.Clocks.binding`, also for waits after
    ``output``: the record they would bind to); ``text`` the right-hand side of each compute
    or host-only node's line (``aten.mm.default(a, b)``) and the tensor of each
    ``record_stream`` (None when read from JSON, which keeps neither) and ``reads`` the nodes
    a compute node names as arguments; ``memory`` the header's memory line after
    ``# memory `` (None: the text has none, or it is JSON).
    """

    summary: Summary[str]
    program: StreamProgram
    clocks: Clocks
    name_of: dict[Node, str]
    record_name: dict[Node, str]
    binding: dict[Node, Node | None]
    text: dict[Node, str | None]
    reads: dict[Node, tuple[Node, ...]]
    memory: str | None = None

    @property
    def steps(self) -> tuple[Step, ...]:
        return self.program.steps

    def compute(self) -> dict[str, Step]:
        """Every compute step (graph inputs and ``output`` included) by node name; host-only
        nodes (stream ops that do nothing on a stream) are not compute."""
        return {self.name_of[s.node]: s for s in self.steps if s.kind == "compute"}


class ProgramBuilder:
    """The steps of a parsed program, one FX node each, added in host order; `finish` makes
    the `ParsedSchedule`.  ``where`` in each call names the line (or entry) in errors."""

    def __init__(self) -> None:
        self.graph = Graph()
        self.steps: list[Step] = []
        self.name_of: dict[Node, str] = {}
        self.text: dict[Node, str | None] = {}
        self.by_name: dict[str, Node] = {}
        self.output: Node | None = None
        self.pending_reads: dict[Node, list[str]] = {}

    def compute(self, name: str, stream: int, op: str, text: str | None, where: str) -> None:
        """A node of the graph: ``op`` is its FX op (``placeholder``, ``get_attr``, ``output``;
        anything else is a call), ``text`` the right-hand side of its line."""
        node = self._named(name, op, where)
        if text is not None:
            self.pending_reads[node] = _argument_names(text)
        self.text[node] = text
        self.steps.append(Step(node, "compute", stream))

    def host(self, name: str, stream: int, text: str | None, where: str) -> None:
        """A host-only node: a stream op that does nothing on a stream (its dialect reads no
        action in it), issued while ``stream`` is current."""
        node = self._named(name, "call_function", where)
        self.text[node] = text
        self.steps.append(Step(node, "host", stream))

    def _named(self, name: str, op: str, where: str) -> Node:
        if name in self.by_name:
            raise InvalidArgumentError(f"{where}: node {name!r} appears twice")
        if op == "output":
            if self.output is not None:
                raise InvalidArgumentError(f"{where}: a second output")
            node = self.graph.create_node("output", "output", (None,))
            self.output = node
        else:
            op = op if op in INPUT_OPS else "call_function"
            node = self.graph.create_node(op, _marker if op == "call_function" else name)
        node.name = name  # as the text has it (FX would make some names unique otherwise)
        self.by_name[name] = node
        self.name_of[node] = name
        return node

    def stream_op(
        self, kind: str, stream: int, label: str, event: int | None = None, **more: Any
    ) -> Node:
        """A stream op's step; ``label`` is how diff names it."""
        node = self.graph.create_node("call_function", _marker)
        self.name_of[node] = label
        self.steps.append(Step(node, kind, stream, event, **more))
        return node

    def finish(self, head: Summary[str], where: str, memory: str | None = None) -> ParsedSchedule:
        """The schedule of the steps so far; ``where`` names it when it has no output;
        ``memory`` is the header's memory line, if any."""
        program, reads = self._program(head.num_streams, where)
        clocks = clocks_of(program)
        names = event_names(program, clocks)
        by_record_name = {name: record.node for record, name in names.records.items()}
        binding: dict[Node, Node | None] = {}
        for step in program.steps:
            if step.kind == "wait_event" or (step.kind == "synchronize" and step.event is not None):
                name = names.waits.get(step)
                binding[step.node] = by_record_name.get(name) if name is not None else None
        return ParsedSchedule(
            head,
            program=program,
            clocks=clocks,
            name_of=self.name_of,
            record_name={record.node: name for record, name in names.records.items()},
            binding=binding,
            text=self.text,
            reads=reads,
            memory=memory,
        )

    def _program(
        self, num_streams: int, where: str
    ) -> tuple[StreamProgram, dict[Node, tuple[Node, ...]]]:
        if self.output is None:
            raise InvalidArgumentError(f"{where}: no output line")
        highest = 0
        for step in self.steps:
            for stream in (step.stream, step.to_stream):
                if stream is not None and not 0 <= stream < num_streams:
                    raise InvalidArgumentError(
                        f"{where}: {self.name_of[step.node]} names stream {stream}, but the "
                        f"header declares {num_streams} streams (0 to {num_streams - 1})"
                    )
                highest = max(highest, stream or 0)
        stream_of = {s.node: s.stream for s in self.steps}
        program = StreamProgram(tuple(self.steps), stream_of, highest + 1, self.output)
        reads = {
            node: tuple(self.by_name[n] for n in names if n in self.by_name)
            for node, names in self.pending_reads.items()
        }
        return program, reads


def _argument_names(rhs: str) -> list[str]:
    """The identifiers ``rhs`` uses as values (``aten.mm.default(a, b)`` -> ``a``, ``b``;
    ``x.mul(y)`` -> ``x``, ``y``; keyword names and op names left out)."""
    if rhs == "input" or rhs.startswith("self."):
        return []
    head, paren, args = rhs.partition("(")
    found = [head.split(".")[0]] if paren and "." in head else []  # x.mul(y) reads x
    found += _IDENT.findall(args if paren else rhs)
    return list(dict.fromkeys(found))

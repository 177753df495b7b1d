"""The ``msched`` command: ``demo``, ``schedule``, ``svg``, ``explain`` and ``diff``.

``demo``, ``schedule``, ``svg`` and ``explain`` build a synthetic decoder stack
(`msched.models.decoders.decoder_stack`), or load the user's own graph (``--graph``:
`load_graph`), schedule it with `msched.schedule` and read the result with
`msched.pictures` (the renderers, and `msched.pictures.explain` for ``explain``).
``diff`` compares two schedules, each a file (canonical text or JSON) or such a stack
(`msched.pictures.diff`), and exits 0 when they are the same, 1 when they differ.  Wrong
arguments, any `msched.MschedError` and a file that cannot be read or written print one line
(``msched <command>: error: ...``) to stderr and exit with status 2; a graph that fails
verification exits with status 1.  Progress goes to stderr, only when it is a terminal and
the graph is big, so piped output stays clean.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, NoReturn, TextIO

import torch
from torch.fx import GraphModule, Node

import msched
from msched.analysis.cost import CostModel, DefaultCostModel, RooflineCostModel, op_category
from msched.analysis.nodes import node_named
from msched.errors import (
    InvalidArgumentError,
    MschedError,
    ScheduleVerificationError,
    UsageError,
)
from msched.limits import MAX_STREAMS, check_num_streams, positive_int
from msched.models.decoders import DecoderStack, capture_layer_problems, decoder_stack
from msched.pictures.diff import ParsedSchedule, parse_schedule, parsed, schedule_diff
from msched.pictures.dot import render_dot
from msched.pictures.explain import explain_lines
from msched.pictures.json_doc import render_json
from msched.pictures.labels import format_number
from msched.pictures.svg import render_svg
from msched.pictures.text import render_text, step_text
from msched.pictures.trace import render_perfetto
from msched.pictures.view import View, host_index, joining_wait, view_of
from msched.proof.program import Step
from msched.proof.verifier import Report
from msched.scheduling.pipeline import Schedule

FORMATS = ("text", "json", "dot", "trace", "svg")
_RENDERERS = {
    "text": render_text,
    "json": render_json,
    "dot": render_dot,
    "trace": render_perfetto,
    "svg": render_svg,
}
_PROGRESS_NODES = 2000  # below this a run takes well under a second: no progress needed


@dataclass(frozen=True)
class StackOptions:
    """The decoder stack a command builds and how it is scheduled: the stack options of
    ``schedule``, ``svg``, ``explain`` and each side of ``diff``, every default in one place."""

    layers: int = 12
    captures: tuple[int, ...] = (1, 5, 11)
    moe: bool = False
    streams: int = 3
    cost: str = "table"


DEFAULT_STACK = StackOptions()
STACK_OPTIONS = tuple(f.name for f in fields(StackOptions))
COST_MODELS = ("table", "roofline")
# The demo's stack is the default stack with MoE blocks, on 1, 2 and 3 streams.
DEMO_LAYERS, DEMO_CAPTURES = DEFAULT_STACK.layers, DEFAULT_STACK.captures
DEMO_STREAMS, DEMO_LANE_LAYER = (1, 2, 3), 5


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``msched schedule: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


# ---------------------------------------------------------------------------------------------
# Arguments.


def _integer(text: str, check: Callable[[int], int]) -> int:
    """``text`` as an int that passes ``check`` (an `msched.limits` validator)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    try:
        return check(value)
    except InvalidArgumentError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _layer_count(text: str) -> int:
    return _integer(text, lambda value: positive_int(value, "layers"))


def _stream_count(text: str) -> int:
    return _integer(text, check_num_streams)


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer numbers such as 1,5,11, got {text!r}"
        ) from None
    if any(layer < 0 for layer in layers):
        raise argparse.ArgumentTypeError(f"layer numbers start at 0, got {text!r}")
    return layers


def _layer_text(layers: Sequence[int]) -> str:
    return ",".join(map(str, layers))


def _and(numbers: Sequence[int]) -> str:
    """``1, 5 and 11``."""
    *head, last = map(str, numbers)
    return f"{', '.join(head)} and {last}" if head else last


def _add_stack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--graph",
        metavar="SPEC",
        help="your own graph instead of a decoder stack: module:function (returning a "
        "GraphModule, or (module, example inputs)) or a file saved with torch.save (.pt) or "
        "torch.export.save (.pt2)",
    )
    p.add_argument(
        "--layers", type=_layer_count, help=f"decoder layers (default {DEFAULT_STACK.layers})"
    )
    p.add_argument(
        "--captures",
        type=_layer_list,
        metavar="A,B,C",
        help="0-based layers whose hidden state is captured "
        f"(default {_layer_text(DEFAULT_STACK.captures)})",
    )
    p.add_argument("--moe", action="store_true", help="MoE feed-forward blocks (routed ∥ shared)")
    p.add_argument(
        "--streams",
        type=_stream_count,
        default=DEFAULT_STACK.streams,
        metavar="S",
        help=f"number of streams, 1..{MAX_STREAMS}; stream 0 is the caller's "
        f"(default {DEFAULT_STACK.streams})",
    )
    p.add_argument(
        "--cost",
        choices=COST_MODELS,
        default=DEFAULT_STACK.cost,
        help="cost model: op table (default) or roofline estimate from shapes",
    )


def build_parser() -> _Parser:
    """The ``msched`` argument parser, with one subparser per command."""
    parser = _Parser(prog="msched", description="Multi-stream scheduling of torch.fx graphs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help=f"schedule the reference {DEMO_LAYERS}-layer MoE stack on {_and(DEMO_STREAMS)} "
        "streams",
        description=f"Schedule a {DEMO_LAYERS}-layer MoE decoder stack with Eagle3 captures at "
        f"layers {_and(DEMO_CAPTURES)} on {_and(DEMO_STREAMS)} streams, verify each schedule "
        "and show where the captures run.",
    )
    demo.add_argument(
        "--out", type=Path, metavar="DIR", help="also write SVG, trace, DOT, JSON, text"
    )
    sched = sub.add_parser(
        "schedule",
        help="schedule a decoder stack and print it in one format",
        description="Schedule a decoder stack and write the scheduled graph in one format.",
    )
    _add_stack_args(sched)
    sched.add_argument(
        "--format", choices=FORMATS, default="text", help="output format (default text)"
    )
    sched.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write here, not to stdout"
    )
    svg = sub.add_parser(
        "svg",
        help="draw a schedule as an SVG Gantt chart",
        description="Schedule a decoder stack or your own graph (--graph) and draw it as an "
        "SVG Gantt chart; with --as-is, draw a graph that is already scheduled (read in "
        "the dialect its stream ops are detected in).",
    )
    _add_stack_args(svg)
    svg.add_argument(
        "--as-is", action="store_true", help="draw --graph as it is, without scheduling it"
    )
    svg.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here, not stdout")
    explain = sub.add_parser(
        "explain",
        help="why a node is on its stream and why each wait before it exists",
        description="Explain the placement of NODE: its stream, the waits before it and the "
        "dependency (data, raw, war, waw, exit) behind each, and who waits for it.",
    )
    _add_stack_args(explain)
    explain.add_argument("node", metavar="NODE", help="node name, for example capture_11")
    sub.add_parser(
        "diff",
        help="what changed between two schedules (files or stacks), in schedule terms",
        description=DIFF_DESCRIPTION,
        add_help=False,  # `msched diff` parses its own arguments: _diff_parser
    )
    return parser


DIFF_DESCRIPTION = (
    "Compare schedule A with schedule B and print what changed in schedule terms: nodes "
    "added (+), removed (-) or moved to another stream (~), the waits and records around "
    "them, waits and records added or removed, then the counts and makespan before -> after. "
    "Each side is a file (a snapshot or `msched schedule --format text` output, or "
    "`--format json` output) or a decoder stack given by the options of `msched schedule`. "
    "Exit status: 0 same schedule, 1 different, 2 bad input."
)
DIFF_EPILOG = """\
forms:
  msched diff A.txt B.txt                        two files (text or JSON)
  msched diff A.txt --layers 12 --captures 0,1,5,11 --moe --streams 3
                                                 a file, then a stack
  msched diff --layers 12 --moe --streams 2 vs --streams 3
                                                 two stacks: after "vs", the options that
                                                 differ (the rest is taken from the left)
  msched diff A.txt vs --captures 0,1,5,11       "vs" also separates a file from a stack
"""


def _diff_parser() -> _Parser:
    """The parser of one side of ``msched diff`` (files, stack options)."""
    p = _Parser(
        prog="msched diff",
        usage="msched diff A B | A [stack options] | [stack options] vs [stack options]",
        description=textwrap.fill(DIFF_DESCRIPTION, 79),
        epilog=DIFF_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="a schedule as text or JSON")
    default = DEFAULT_STACK
    p.add_argument("--layers", type=_layer_count, help=f"decoder layers (default {default.layers})")
    p.add_argument(
        "--captures",
        type=_layer_list,
        metavar="A,B,C",
        help=f"captured layers (default {_layer_text(default.captures)})",
    )
    p.add_argument(
        "--moe",
        action=argparse.BooleanOptionalAction,
        help=f"MoE feed-forward blocks (default: {'yes' if default.moe else 'no'})",
    )
    p.add_argument(
        "--streams", type=_stream_count, metavar="S", help=f"streams (default {default.streams})"
    )
    p.add_argument("--cost", choices=COST_MODELS, help=f"cost model (default {default.cost})")
    return p


def _given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The stack options given on the command line (those argparse left at None are not)."""
    return {k: getattr(args, k) for k in STACK_OPTIONS if getattr(args, k, None) is not None}


def stack_options(given: dict[str, Any], base: StackOptions = DEFAULT_STACK) -> StackOptions:
    """``base`` with the options ``given``; a capture layer beyond the stack or given twice is
    a `UsageError` (`capture_layer_problems` is the check)."""
    stack = replace(base, **given)
    beyond, repeated = capture_layer_problems(stack.layers, stack.captures)
    if beyond:
        raise UsageError(
            f"capture layer {', '.join(map(str, beyond))} is beyond the stack: "
            f"layers are 0..{stack.layers - 1}"
        )
    if repeated:
        raise UsageError(f"capture layers repeat: {_layer_text(stack.captures)}")
    return stack


# ---------------------------------------------------------------------------------------------
# Progress.


class Progress:
    """Stage messages on stderr, only when it is a terminal and the graph is big."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.t0 = time.perf_counter()

    @classmethod
    def for_layers(cls, layers: int, moe: bool) -> Progress:
        estimated_nodes = layers * (45 if moe else 40)
        tty = sys.stderr.isatty()
        return cls(sys.stderr, tty and estimated_nodes >= _PROGRESS_NODES)

    def step(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.t0
            self.stream.write(f"\r\x1b[K[{elapsed:6.1f}s] {message}")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


# ---------------------------------------------------------------------------------------------
# Building and scheduling.


@dataclass(frozen=True)
class Scheduled:
    """One scheduled stack: the stack, its schedule and the cost model used."""

    stack: DecoderStack | None  # None for a graph of the user's (--graph)
    schedule: Schedule
    cost_model: CostModel


def _named_cost_model(name: str) -> CostModel:
    """The cost model ``--cost NAME`` names (`COST_MODELS`)."""
    return RooflineCostModel() if name == "roofline" else DefaultCostModel()


def _cost_model(name: str, stack: DecoderStack) -> CostModel:
    if name == "roofline":
        _propagate_shapes(stack)  # the roofline model reads shapes
    return _named_cost_model(name)


def _propagate_shapes(stack: DecoderStack) -> None:
    """Fill ``node.meta["val"]`` with fake tensors so the roofline model sees shapes."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from msched._torch_internals import fake_tensor_mode

    # Weights are real buffers of the module; only the inputs are converted.
    mode = fake_tensor_mode(allow_non_fake_inputs=True)
    FakeTensorProp(stack.gm, mode=mode).propagate(*stack.example_inputs())


def build_and_schedule(
    layers: int,
    captures: Sequence[int],
    moe: bool,
    streams: int,
    cost: str = "table",
    progress: Progress | None = None,
) -> Scheduled:
    """Build a decoder stack and schedule it (the shared first half of every command)."""
    progress = progress or Progress(sys.stderr, False)
    progress.step(f"building a {layers}-layer decoder stack")
    stack = decoder_stack(layers, tuple(captures), moe=moe)
    model = _cost_model(cost, stack)
    progress.step(f"scheduling {len(stack.gm.graph.nodes)} nodes on {streams} streams")
    sched = msched.schedule(stack.gm, streams, model)
    return Scheduled(stack, sched, model)


def build_stack(stack: StackOptions, progress: Progress | None = None) -> Scheduled:
    """`build_and_schedule` of a `StackOptions`."""
    return build_and_schedule(
        stack.layers, stack.captures, stack.moe, stack.streams, stack.cost, progress
    )


def verify_schedule(sched: Schedule) -> Report:
    """`msched.verify` of a schedule against its original graph."""
    return msched.verify(sched.gm, original=sched.original)


# ---------------------------------------------------------------------------------------------
# demo (explain's questions live in msched.pictures.explain)


@dataclass(frozen=True)
class _DemoRow:
    streams: int
    run: Scheduled
    ok: bool
    problems: tuple[str, ...]


def _demo_rows(progress: Progress) -> list[_DemoRow]:
    rows = []
    for streams in DEMO_STREAMS:
        stack = replace(DEFAULT_STACK, moe=True, streams=streams)
        run = build_stack(stack, progress)
        progress.step(f"verifying the {streams}-stream schedule")
        report = verify_schedule(run.schedule)
        problems = tuple(f"{x.kind}: {x.message}" for x in report.violations)
        rows.append(_DemoRow(streams, run, bool(report.ok), problems))
    return rows


def _table_lines(rows: list[_DemoRow]) -> list[str]:
    base = rows[0].run.schedule.makespan
    head = (
        "streams",
        "nodes",
        "events",
        "waits",
        "makespan",
        "lower bound",
        "speed-up",
        "verified",
    )
    lines = ["  ".join(f"{h:>11}" if i >= 5 else f"{h:>8}" for i, h in enumerate(head))]
    for row in rows:
        s = row.run.schedule
        cells = (
            row.streams,
            len(s.gm.graph.nodes),
            s.num_events,
            s.num_waits,
            format_number(s.makespan),
            format_number(s.lower_bound),
            f"{base / s.makespan:.2f}x" if s.makespan else "-",
            "ok" if row.ok else f"FAILED ({len(row.problems)})",
        )
        lines.append("  ".join(f"{c:>11}" if i >= 5 else f"{c:>8}" for i, c in enumerate(cells)))
    return lines


def _layer_members(run: Scheduled, layer: int) -> set[str]:
    """Names of the ops of decoder layer ``layer`` (its weights left out), capture included."""
    assert run.stack is not None
    layer_of = run.stack.layer_of
    nodes = run.schedule.gm.graph.nodes
    return {n.name for n in nodes if n.op == "call_function" and layer_of.get(n.name) == layer}


def _layer_steps(v: View, members: set[str]) -> list[Step]:
    """The host-order steps of a layer: its compute nodes, the waits right before them and
    the records right after them (on their stream)."""
    steps = v.program.steps
    keep: list[Step] = []
    last_compute: dict[int, bool] = {}
    pending: dict[int, list[Step]] = {}
    for step in steps:
        s = step.stream
        if step.kind == "compute":
            inside = step.node.name in members
            if inside:
                keep += pending.get(s, [])
                keep.append(step)
            pending[s], last_compute[s] = [], inside
        elif step.kind == "record_event" and last_compute.get(s):
            keep.append(step)
        elif step.kind == "wait_event":
            pending.setdefault(s, []).append(step)
    return keep


def _compact_lines(v: View, steps: list[Step]) -> list[str]:
    """Lane lines for the demo: compute nodes with kind and times, records and waits; a run of
    elementwise ops on one stream is folded into one line."""
    lines: list[str] = []
    run: list[Node] = []

    def flush() -> None:
        if run:
            s = v.program.stream_of[run[0]]
            many = f"{run[0].name} .. {run[-1].name}  ({len(run)} elementwise ops)"
            lines.append(f"s{s} | {'  ' * s}{run[0].name if len(run) == 1 else many}")
            run.clear()

    for step in steps:
        node = step.node
        if step.kind in ("set_stream", "record_stream"):
            continue
        if step.kind == "compute" and op_category(node) == "other":
            if run and v.program.stream_of[run[0]] != step.stream:
                flush()
            run.append(node)
            continue
        flush()
        text = step_text(step, v.names)
        if step.kind == "compute":
            times = f"{format_number(v.start[node])}-{format_number(v.finish[node])}"
            text = f"{node.name}  ({op_category(node)}, {times})"
        lines.append(f"s{step.stream} | {'  ' * step.stream}{text}")
    flush()
    return lines


def _capture_lines(rows: list[_DemoRow]) -> list[str]:
    """One line per (stream count, capture): its stream, host position and the joining wait."""
    lines = ["streams  capture     stream  host step  steps before output  joined on stream 0 by"]
    for row in rows:
        v = view_of(row.run.schedule)
        out_at = host_index(v, v.program.output)
        assert row.run.stack is not None
        for cap in row.run.stack.captures:
            at, s = host_index(v, cap), v.program.stream_of[cap]
            wait = joining_wait(v, cap, 0)
            if s == 0:
                join = "(runs on stream 0)"
            elif wait is None:
                join = "NOTHING: output does not wait for it"
            else:
                join = f"{step_text(wait, v.names)} ({wait.node.name})"
            where = f"{at:>4}/{out_at:<4}  {out_at - at:>19}"
            lines.append(f"{row.streams:>7}  {cap.name:<10}  {s:>6}  {where}  {join}")
    return lines


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path``; an OS error is a `UsageError` naming the path and why."""
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror or error}") from None


def _make_directory(path: Path) -> None:
    """Create ``path`` and its parents; an OS error is a `UsageError` naming the path."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot create directory {path}: {error.strerror or error}") from None


def _write_pictures(out: Path, rows: list[_DemoRow]) -> list[Path]:
    _make_directory(out)
    suffixes = {"text": "txt", "json": "json", "dot": "dot", "trace": "trace.json", "svg": "svg"}
    written = []
    for row in rows:
        for fmt, suffix in suffixes.items():
            path = out / f"demo-{row.streams}streams.{suffix}"
            _write_text(path, _RENDERERS[fmt](row.run.schedule, row.run.cost_model))
            written.append(path)
    return written


def cmd_demo(args: argparse.Namespace, stdout: TextIO) -> int:
    if args.out is not None:
        _make_directory(args.out)  # fail before the scheduling work, not after it
    rows = _demo_rows(Progress(sys.stderr, False))
    last = rows[-1]
    last_view = view_of(last.run.schedule)
    layer = _layer_steps(last_view, _layer_members(last.run, DEMO_LANE_LAYER))
    caps = ", ".join(map(str, DEMO_CAPTURES))
    lines = [
        f"msched demo: {DEMO_LAYERS}-layer MoE decoder stack, Eagle3 captures of layers {caps} "
        "(the last layer included), table cost model",
        "",
        *_table_lines(rows),
        "",
        f"Layer {DEMO_LANE_LAYER} on {last.streams} streams, host order (lane and indentation = "
        "stream; s0 is the caller's stream):",
        *_compact_lines(last_view, layer),
        "",
        "Captures, relative to output (host step / step of output):",
        *_capture_lines(rows[1:]),
    ]
    for row in rows:
        lines += [f"{row.streams} streams: {p}" for p in row.problems]
    if args.out is not None:
        written = _write_pictures(args.out, rows)
        lines += ["", f"wrote {len(written)} files to {args.out} (demo-3streams.svg, ...)"]
    stdout.write("\n".join(lines) + "\n")
    return 0 if all(row.ok for row in rows) else 1


# ---------------------------------------------------------------------------------------------
# schedule, explain, main


def _run_for(args: argparse.Namespace) -> Scheduled:
    if args.graph is not None:
        _refuse_stack_options(args)
        gm = load_graph(args.graph)
        model = _named_cost_model(args.cost)
        return Scheduled(None, msched.schedule(gm, args.streams, model), model)
    stack = stack_options(_given_options(args))
    progress = Progress.for_layers(stack.layers, stack.moe)
    try:
        return build_stack(stack, progress)
    finally:
        progress.done()


def _refuse_stack_options(args: argparse.Namespace) -> None:
    given = [f"--{k}" for k in ("layers", "captures") if getattr(args, k) is not None]
    given += ["--moe"] if args.moe else []
    if given:
        raise UsageError(f"--graph schedules your graph: {', '.join(given)} describe a stack")


def _write_output(args: argparse.Namespace, text: str, stdout: TextIO) -> None:
    if args.output is None:
        stdout.write(text)
    else:
        _write_text(args.output, text)


def cmd_schedule(args: argparse.Namespace, stdout: TextIO) -> int:
    run = _run_for(args)
    _write_output(args, _RENDERERS[args.format](run.schedule, run.cost_model), stdout)
    return 0


def cmd_svg(args: argparse.Namespace, stdout: TextIO) -> int:
    if args.as_is:
        if args.graph is None:
            raise UsageError("--as-is draws your graph as it is: give it with --graph")
        _refuse_stack_options(args)
        if Path(args.graph).is_file() and Path(args.graph).suffix != ".pt2":
            raise UsageError(
                f"--as-is cannot draw {args.graph}: a GraphModule saved with torch.save is "
                "traced again from its code when loaded, and that drops every stream op (their "
                "arguments are constants); save a scheduled graph with torch.export.save (.pt2)"
            )
        model = _named_cost_model(args.cost)
        _write_output(args, render_svg(load_graph(args.graph), model), stdout)
        return 0
    run = _run_for(args)
    _write_output(args, render_svg(run.schedule, run.cost_model), stdout)
    return 0


def cmd_explain(args: argparse.Namespace, stdout: TextIO) -> int:
    run = _run_for(args)
    where = "the scheduled graph"
    if run.stack is not None:
        where += f" (captures: {', '.join(c.name for c in run.stack.captures) or 'none'})"
    node = node_named(run.schedule.gm, args.node, where)
    stdout.write("\n".join(explain_lines(run.schedule, node, run.cost_model)) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------
# Your own graph (--graph)

GRAPH_SPEC_HELP = (
    "give --graph as module:function (a function of no arguments returning a "
    "torch.fx.GraphModule, or a tuple (module or function, example inputs) that is captured "
    "with Dynamo) or as a file: a GraphModule saved with torch.save (.pt) or an "
    "ExportedProgram saved with torch.export.save (.pt2)"
)


def load_graph(spec: str) -> GraphModule:
    """The graph ``--graph SPEC`` names (see `GRAPH_SPEC_HELP`); a bad spec is a `UsageError`
    that says what went wrong and what is accepted."""
    path = Path(spec)
    if path.is_file():
        return _graph_from_file(path)
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(
            f"--graph {spec}: no such file, and not module:function; {GRAPH_SPEC_HELP}"
        )
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # as ``python -m`` does: your own modules import
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise UsageError(
            f"--graph {spec}: cannot import {module_name}: "
            f"{type(error).__name__}: {_one_line(error)}"
        ) from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise UsageError(f"--graph {spec}: {module_name} has no function {attribute}")
    try:
        value = function()
    except Exception as error:
        raise UsageError(f"--graph {spec}: calling it raised {type(error).__name__}: "
                         f"{_one_line(error)}") from None  # fmt: skip
    return _graph_from_value(value, f"--graph {spec}")


def _graph_from_value(value: Any, where: str) -> GraphModule:
    """A GraphModule as it is, or ``(fn, example_inputs)`` captured with Dynamo."""
    if isinstance(value, GraphModule):
        return value
    if isinstance(value, tuple) and len(value) == 2 and callable(value[0]):
        fn, inputs = value
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        from msched.compile.tracing import trace_streams

        return trace_streams(fn, *inputs)
    raise UsageError(
        f"{where} returned {type(value).__name__}; return a torch.fx.GraphModule or a tuple "
        "(module or function, example inputs)"
    )


def _exported_module(program: Any) -> GraphModule:
    """The runnable module of an ExportedProgram, without the guard call torch adds (an
    opaque submodule that would be read as unknown code touching every input)."""
    try:
        module = program.module(check_guards=False)
    except TypeError:  # a torch whose module() takes no such option
        module = program.module()
    assert isinstance(module, GraphModule)
    return module


def _graph_from_file(path: Path) -> GraphModule:
    """A GraphModule from ``torch.export.save`` (``.pt2``) or ``torch.save`` (a pickle)."""
    try:
        if path.suffix == ".pt2":
            return _exported_module(torch.export.load(path))
        value = torch.load(path, weights_only=False)
    except Exception as error:
        raise UsageError(f"--graph {path}: cannot load it: {_one_line(error)}; "
                         f"{GRAPH_SPEC_HELP}") from None  # fmt: skip
    if not isinstance(value, GraphModule):
        raise UsageError(
            f"--graph {path} holds a {type(value).__name__}, not a torch.fx.GraphModule; "
            f"{GRAPH_SPEC_HELP}"
        )
    return value


# ---------------------------------------------------------------------------------------------
# diff


@dataclass(frozen=True)
class _DiffSide:
    """One side of ``msched diff``: a file, or a stack."""

    file: Path | None
    stack: StackOptions | None


def _diff_sides(argv: Sequence[str]) -> tuple[_DiffSide, _DiffSide]:
    """Split ``msched diff``'s arguments into its two sides (see `DIFF_EPILOG`)."""
    argv = list(argv)
    if argv.count("vs") > 1:
        raise UsageError("'vs' separates two schedules: give it once")
    parser = _diff_parser()
    if "vs" in argv:
        k = argv.index("vs")
        left = _one_side(parser.parse_args(argv[:k]), None, "before 'vs'")
        return left, _one_side(parser.parse_args(argv[k + 1 :]), left.stack, "after 'vs'")
    args = parser.parse_args(argv)
    options = _given_options(args)
    if len(args.files) == 2 and not options:
        return _DiffSide(Path(args.files[0]), None), _DiffSide(Path(args.files[1]), None)
    if len(args.files) == 1 and options:
        return _DiffSide(Path(args.files[0]), None), _DiffSide(None, stack_options(options))
    if len(args.files) > 2 or (len(args.files) == 2 and options):
        raise UsageError("give two schedules: two files, a file and stack options, or 'vs'")
    raise UsageError(
        "give two schedules: A B (files), A --layers ... (a file and a stack), or "
        "[stack options] vs [stack options]"
    )


def _one_side(args: argparse.Namespace, base: StackOptions | None, where: str) -> _DiffSide:
    options = _given_options(args)
    if len(args.files) > 1 or (args.files and options):
        raise UsageError(f"{where}: give one file or stack options, not both")
    if args.files:
        return _DiffSide(Path(args.files[0]), None)
    return _DiffSide(None, stack_options(options, base or DEFAULT_STACK))


def _read_side(side: _DiffSide) -> ParsedSchedule:
    if side.file is not None:
        try:
            text = side.file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            why = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
            raise UsageError(f"cannot read {side.file}: {why or error}") from None
        return parse_schedule(text, str(side.file))
    assert side.stack is not None
    run = build_stack(side.stack)
    return parsed(run.schedule, run.cost_model)


def cmd_diff(argv: Sequence[str], stdout: TextIO) -> int:
    a_side, b_side = _diff_sides(argv)
    lines = schedule_diff(_read_side(a_side), _read_side(b_side))
    if lines:
        stdout.write("\n".join(lines) + "\n")
    return 1 if lines else 0


_COMMANDS = {"demo": cmd_demo, "schedule": cmd_schedule, "explain": cmd_explain, "svg": cmd_svg}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``msched`` command; returns the exit status (2 for bad arguments and for any
    `msched.MschedError` but a failed verification, which is 1; ``diff``: 1 when the two
    schedules differ)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "diff":
        return _run("diff", lambda: cmd_diff(argv[1:], sys.stdout))
    args = parser.parse_args(argv)
    return _run(args.command, lambda: _COMMANDS[args.command](args, sys.stdout))


def _run(command: str, body: Callable[[], int]) -> int:
    sub_prog = f"msched {command}"
    try:
        return body()
    except (UsageError, InvalidArgumentError) as exc:
        sys.stderr.write(f"{sub_prog}: error: {_one_line(exc)}\n")
        return 2
    except ScheduleVerificationError as exc:
        sys.stderr.write(f"{sub_prog}: {type(exc).__name__}: {_one_line(exc)}\n")
        return 1
    except MschedError as exc:
        sys.stderr.write(f"{sub_prog}: error: {type(exc).__name__}: {_one_line(exc)}\n")
        return 2


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())

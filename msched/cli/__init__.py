"""The ``msched`` command: ``demo``, ``schedule``, ``svg``, ``explain``, ``diff`` and
``example``.

``demo``, ``schedule``, ``svg`` and ``explain`` build a synthetic decoder stack
(`msched.models.decoders.decoder_stack`), or load the user's own graph (``--graph``:
`msched.models.loading.load_graph`), schedule it with `msched.schedule` and read the result with
`msched.pictures` (the renderers, and `msched.pictures.explain` for ``explain``).
``diff`` compares two schedules, each a file (canonical text or JSON) or such a stack
(`msched.pictures.diff`), and exits 0 when they are the same, 1 when they differ.
``--dialect`` reads the stream ops of the user's graph (``--graph``, a ``.pt2`` side of
``diff``), and ``--as-is`` shows a graph that is already scheduled without scheduling it;
an `msched.UnreadStreamOpsError` raised while a command runs advises ``--dialect``
(`msched.errors.dialect_hint`).  Wrong
arguments, any `msched.MschedError` and a file that cannot be read or written print one line
(``msched <command>: error: ...``) to stderr and exit with status 2; a graph that fails
verification exits with status 1.  Progress goes to stderr, only when it is a terminal and
the graph is big, so piped output stays clean.

This module parses the command line, runs ``demo``, ``schedule``, ``svg`` and ``explain`` and
turns errors into exit statuses; the words of the command line (the parser, the argument types,
the stack options) are `msched.cli.options`, building and scheduling a stack `msched.cli.stack`,
and the arguments of ``diff`` `msched.cli.diff`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from torch.fx import GraphModule

import msched
from msched._text import listed
from msched.analysis.cost import CostModel
from msched.analysis.nodes import node_named
from msched.cli.diff import DIFF_DESCRIPTION, cmd_diff
from msched.cli.example import add_example_parser, cmd_example
from msched.cli.options import (
    CLI_DIALECT_HINT,
    Parser,
    StackOptions,
    add_stack_args,
    dialect_option,
    given_options,
    stack_options,
)
from msched.cli.stack import Progress, Scheduled, build_stack, named_cost_model
from msched.compile.interfaces import report as interface_report
from msched.errors import (
    InvalidArgumentError,
    MschedError,
    ScheduleVerificationError,
    UsageError,
    dialect_hint,
    one_line,
)
from msched.models.decoders import DecoderStack
from msched.models.loading import load_graph
from msched.pictures.demo import (
    DEMO_CAPTURES,
    DEMO_LAYERS,
    DEMO_STREAMS,
    DemoRow,
    demo_lines,
    demo_pictures,
)
from msched.pictures.dot import render_dot
from msched.pictures.explain import explain_lines
from msched.pictures.json_doc import render_json
from msched.pictures.svg import render_svg
from msched.pictures.text import render_text
from msched.pictures.trace import render_perfetto
from msched.proof.dialects import Dialect
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


def build_parser() -> Parser:
    """The ``msched`` argument parser, with one subparser per command."""
    parser = Parser(prog="msched", description="Multi-stream scheduling of torch.fx graphs.")
    parser.add_argument("--version", action="version", version=f"msched {msched.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help=f"schedule the reference {DEMO_LAYERS}-layer MoE stack on {listed(DEMO_STREAMS)} "
        "streams",
        description=f"Schedule a {DEMO_LAYERS}-layer MoE decoder stack with Eagle3 captures at "
        f"layers {listed(DEMO_CAPTURES)} on {listed(DEMO_STREAMS)} streams, verify each schedule "
        "and show where the captures run.",
    )
    demo.add_argument(
        "--out", type=Path, metavar="DIR", help="also write SVG, trace, DOT, JSON, text"
    )
    sched = sub.add_parser(
        "schedule",
        help="schedule a decoder stack and print it in one format",
        description="Schedule a decoder stack or your own graph (--graph) and write the "
        "scheduled graph in one format; with --as-is, write a graph that is already scheduled.",
    )
    add_stack_args(sched)
    sched.add_argument(
        "--format", choices=FORMATS, default="text", help="output format (default text)"
    )
    sched.add_argument(
        "--as-is", action="store_true", help="print --graph as it is, without scheduling it"
    )
    sched.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write here, not to stdout"
    )
    svg = sub.add_parser(
        "svg",
        help="draw a schedule as an SVG Gantt chart",
        description="Schedule a decoder stack or your own graph (--graph) and draw it as an "
        "SVG Gantt chart; with --as-is, draw a graph that is already scheduled (read in "
        "--dialect, else in the dialect its stream ops are detected in).",
    )
    add_stack_args(svg)
    svg.add_argument(
        "--as-is", action="store_true", help="draw --graph as it is, without scheduling it"
    )
    svg.add_argument("-o", "--output", type=Path, metavar="FILE", help="write here, not stdout")
    explain = sub.add_parser(
        "explain",
        help="why a node is on its stream and why each wait before it exists",
        description="Explain the placement of NODE: its stream, the waits before it and the "
        "dependency (data, raw, war, waw, exit) behind each, and who waits for it; with "
        "--as-is, in a graph that is already scheduled (--graph, by msched or another engine).",
    )
    add_stack_args(explain)
    explain.add_argument(
        "--as-is", action="store_true", help="explain --graph as it is, without scheduling it"
    )
    explain.add_argument("node", metavar="NODE", help="node name, for example capture_11")
    versions = sub.add_parser(
        "versions",
        help="which private torch interfaces msched reads answer as expected in this torch",
        description="Check every private torch and Inductor interface msched reads, in the "
        "installed torch, and run a probe of each group (trace_streams at each stage, an "
        "Inductor build on 2 streams): what changed, the file to change and its tests. "
        "Exit status 1 when one has changed.",
    )
    versions.add_argument(
        "--no-probes", action="store_true", help="presence only: no trace, no compile (fast)"
    )
    sub.add_parser(
        "diff",
        help="what changed between two schedules (files or stacks), in schedule terms",
        description=DIFF_DESCRIPTION,
        add_help=False,  # `msched diff` parses its own arguments: msched.cli.diff
    )
    # example: copies examples/downstream out (msched.cli.example)
    add_example_parser(sub)
    return parser


# ---------------------------------------------------------------------------------------------
# demo (its report: msched.pictures.demo)


def verify_schedule(sched: Schedule) -> Report:
    """`msched.verify` of a schedule against its original graph."""
    return msched.verify(sched.gm, original=sched.original)


def _demo_rows(progress: Progress) -> list[DemoRow]:
    rows = []
    for streams in DEMO_STREAMS:
        options = StackOptions(DEMO_LAYERS, DEMO_CAPTURES, moe=True, streams=streams)
        run = build_stack(options, progress)
        assert run.stack is not None
        progress.step(f"verifying the {streams}-stream schedule")
        report = verify_schedule(run.schedule)
        problems = tuple(f"{x.kind}: {x.message}" for x in report.violations)
        ok = bool(report.ok)
        row = DemoRow(streams, run.stack, run.schedule, run.cost_model, ok, problems)
        rows.append(row)
    return rows


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


def cmd_demo(args: argparse.Namespace, stdout: TextIO) -> int:
    if args.out is not None:
        _make_directory(args.out)  # fail before the scheduling work, not after it
    rows = _demo_rows(Progress(sys.stderr, False))
    lines = demo_lines(rows)
    if args.out is not None:
        pictures = demo_pictures(rows)
        for name, text in pictures.items():
            _write_text(args.out / name, text)
        lines += ["", f"wrote {len(pictures)} files to {args.out} (demo-3streams.svg, ...)"]
    stdout.write("\n".join(lines) + "\n")
    return 0 if all(row.ok for row in rows) else 1


# ---------------------------------------------------------------------------------------------
# schedule, explain, main


@dataclass(frozen=True)
class _Shown:
    """What a command shows: a schedule (or, ``--as-is``, the user's scheduled graph), the
    cost model that times it, the ``--dialect`` it is read in (None: detected) and the
    stack it was built from (None for ``--graph``)."""

    obj: Schedule | GraphModule
    cost_model: CostModel
    dialect: Dialect | None
    stack: DecoderStack | None = None


# What --as-is does in each command's words: (present tense, infinitive).
_AS_IS_VERBS = {
    "svg": ("draws", "draw"),
    "schedule": ("prints", "print"),
    "explain": ("explains", "explain"),
}


def _shown(args: argparse.Namespace) -> _Shown:
    # Before the graph loads: the module of a dialect may register the ops of its .pt2.
    dialect = dialect_option(args.dialect)
    if args.as_is:
        model = named_cost_model(args.cost)
        return _Shown(_graph_as_is(args), model, dialect)
    if args.graph is None and dialect is not None:
        raise UsageError(
            "--dialect reads the stream ops of your graph: give it with --graph (a decoder "
            "stack is scheduled in msched's own)"
        )
    run = _run_for(args)
    return _Shown(run.schedule, run.cost_model, dialect, run.stack)


def _graph_as_is(args: argparse.Namespace) -> GraphModule:
    """The graph of ``--graph`` for ``--as-is``: loaded, not scheduled."""
    does, do = _AS_IS_VERBS[args.command]
    if args.graph is None:
        raise UsageError(f"--as-is {does} your graph as it is: give it with --graph")
    _refuse_stack_options(args)
    if Path(args.graph).is_file() and Path(args.graph).suffix != ".pt2":
        raise UsageError(
            f"--as-is cannot {do} {args.graph}: a GraphModule saved with torch.save is "
            "traced again from its code when loaded, and that drops every stream op (their "
            "arguments are constants); save a scheduled graph with torch.export.save (.pt2)"
        )
    return load_graph(args.graph, msched.trace_streams)


def _run_for(args: argparse.Namespace) -> Scheduled:
    if args.graph is not None:
        _refuse_stack_options(args)
        gm = load_graph(args.graph, msched.trace_streams)
        model = named_cost_model(args.cost)
        return Scheduled(None, msched.schedule(gm, args.streams, model), model)
    stack = stack_options(given_options(args))
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
    shown = _shown(args)
    text = _RENDERERS[args.format](shown.obj, shown.cost_model, dialect=shown.dialect)
    _write_output(args, text, stdout)
    return 0


def cmd_svg(args: argparse.Namespace, stdout: TextIO) -> int:
    shown = _shown(args)
    _write_output(args, render_svg(shown.obj, shown.cost_model, dialect=shown.dialect), stdout)
    return 0


def cmd_explain(args: argparse.Namespace, stdout: TextIO) -> int:
    shown = _shown(args)
    where = "the scheduled graph"
    if shown.stack is not None:
        where += f" (captures: {', '.join(c.name for c in shown.stack.captures) or 'none'})"
    gm = shown.obj.gm if isinstance(shown.obj, Schedule) else shown.obj
    node = node_named(gm, args.node, where)
    lines = explain_lines(shown.obj, node, shown.cost_model, dialect=shown.dialect)
    stdout.write("\n".join(lines) + "\n")
    return 0


def cmd_versions(args: argparse.Namespace, stdout: TextIO) -> int:
    text, ok = interface_report(probes=not args.no_probes)
    stdout.write(text)
    return 0 if ok else 1


_COMMANDS = {
    "demo": cmd_demo,
    "schedule": cmd_schedule,
    "explain": cmd_explain,
    "svg": cmd_svg,
    "versions": cmd_versions,
    "example": cmd_example,
}


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
        with dialect_hint(CLI_DIALECT_HINT):  # an UnreadStreamOpsError names --dialect
            return body()
    except (UsageError, InvalidArgumentError) as exc:
        sys.stderr.write(f"{sub_prog}: error: {one_line(exc)}\n")
        return 2
    except ScheduleVerificationError as exc:
        sys.stderr.write(f"{sub_prog}: {type(exc).__name__}: {one_line(exc)}\n")
        return 1
    except MschedError as exc:
        sys.stderr.write(f"{sub_prog}: error: {type(exc).__name__}: {one_line(exc)}\n")
        return 2

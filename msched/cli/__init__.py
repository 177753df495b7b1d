"""The ``msched`` command: ``demo``, ``schedule``, ``svg``, ``explain`` and ``diff``.

``demo``, ``schedule``, ``svg`` and ``explain`` build a synthetic decoder stack
(`msched.models.decoders.decoder_stack`), or load the user's own graph (``--graph``:
`msched.models.loading.load_graph`), schedule it with `msched.schedule` and read the result with
`msched.pictures` (the renderers, and `msched.pictures.explain` for ``explain``).
``diff`` compares two schedules, each a file (canonical text or JSON) or such a stack
(`msched.pictures.diff`), and exits 0 when they are the same, 1 when they differ.  Wrong
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
from pathlib import Path
from typing import TextIO

import msched
from msched._text import listed
from msched.analysis.nodes import node_named
from msched.cli.diff import DIFF_DESCRIPTION, cmd_diff
from msched.cli.options import (
    Parser,
    StackOptions,
    add_stack_args,
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
    one_line,
)
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
        description="Schedule a decoder stack and write the scheduled graph in one format.",
    )
    add_stack_args(sched)
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
    add_stack_args(svg)
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
    add_stack_args(explain)
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
        model = named_cost_model(args.cost)
        _write_output(args, render_svg(load_graph(args.graph, msched.trace_streams), model), stdout)
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

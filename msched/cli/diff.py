"""``msched diff``: its arguments, split into two sides, each read as a schedule.

Each side is a file (canonical text or JSON, `msched.pictures.text.parse_schedule`; or a
scheduled graph saved with ``torch.export.save``, ``.pt2``, read as it is in ``--dialect``) or
a decoder stack given by stack options (`msched.cli.options`), built and scheduled
(`msched.cli.stack`);
"vs" separates two sides that are not two files (`DIFF_EPILOG`).  What changed between them is
`msched.pictures.diff.schedule_diff`.  ``msched diff`` parses its own arguments (`msched.cli.main`
hands it the rest of the command line), so that stack options can appear on both sides.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from msched.cli.options import (
    DEFAULT_STACK,
    Parser,
    StackOptions,
    add_dialect_arg,
    cost_option,
    dialect_option,
    given_options,
    layer_count,
    layer_list,
    layer_text,
    stack_options,
    stream_count,
)
from msched.cli.stack import build_stack, named_cost_model
from msched.compile.tracing import trace_streams
from msched.errors import UsageError
from msched.models.loading import load_graph
from msched.pictures.diff import schedule_diff
from msched.pictures.parsed import ParsedSchedule
from msched.pictures.text import parse_schedule, parsed

DIFF_DESCRIPTION = (
    "Compare schedule A with schedule B and print what changed in schedule terms: nodes "
    "added (+), removed (-) or moved to another stream (~), the waits and records around "
    "them, waits and records added or removed, then the counts and makespan before -> after. "
    "Each side is a file (a snapshot or `msched schedule --format text` output, or "
    "`--format json` output, or a scheduled graph saved with torch.export.save, .pt2, read "
    "in --dialect or the dialect detected from its stream ops) or a decoder stack given by "
    "the options of `msched schedule`. "
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
  msched diff A.pt2 B.pt2 --dialect myeng.streams:DIALECT
                                                 two scheduled graphs of an engine
  msched diff A.pt2 --dialect trtllm vs B.pt2 --dialect myeng.streams:DIALECT
                                                 each read in its own dialect
"""


def _diff_parser() -> Parser:
    """The parser of one side of ``msched diff`` (files, stack options)."""
    p = Parser(
        prog="msched diff",
        usage="msched diff A B | A [stack options] | [stack options] vs [stack options]",
        description=textwrap.fill(DIFF_DESCRIPTION, 79),
        epilog=DIFF_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="a schedule as text or JSON")
    default = DEFAULT_STACK
    p.add_argument("--layers", type=layer_count, help=f"decoder layers (default {default.layers})")
    p.add_argument(
        "--captures",
        type=layer_list,
        metavar="A,B,C",
        help=f"captured layers (default {layer_text(default.captures)})",
    )
    p.add_argument(
        "--moe",
        action=argparse.BooleanOptionalAction,
        help=f"MoE feed-forward blocks (default: {'yes' if default.moe else 'no'})",
    )
    p.add_argument(
        "--streams", type=stream_count, metavar="S", help=f"streams (default {default.streams})"
    )
    p.add_argument(
        "--cost",
        type=cost_option,
        metavar="table|roofline|FILE.json",
        help=f"cost model (default {default.cost})",
    )
    add_dialect_arg(p, "a .pt2 graph")
    return p


@dataclass(frozen=True)
class _DiffSide:
    """One side of ``msched diff``: a file, or a stack; ``dialect`` is the ``--dialect``
    text that reads it when it is a scheduled graph (``.pt2``)."""

    file: Path | None
    stack: StackOptions | None
    dialect: str | None = None
    cost: str | None = None  # the --cost that prices a .pt2 graph (a stack has its own)

    @property
    def graph(self) -> bool:
        return self.file is not None and self.file.suffix == ".pt2"


def _diff_sides(argv: Sequence[str]) -> tuple[_DiffSide, _DiffSide]:
    """Split ``msched diff``'s arguments into its two sides (see `DIFF_EPILOG`)."""
    argv = list(argv)
    if argv.count("vs") > 1:
        raise UsageError("'vs' separates two schedules: give it once")
    parser = _diff_parser()
    if "vs" in argv:
        k = argv.index("vs")
        left = _one_side(parser.parse_args(argv[:k]), None, "before 'vs'")
        right = _one_side(parser.parse_args(argv[k + 1 :]), left, "after 'vs'")
        return _checked_dialects(left, right)
    args = parser.parse_args(argv)
    options, dialect = given_options(args), args.dialect
    if len(args.files) == 2 and set(options) <= {"cost"}:
        a, b = (_DiffSide(Path(f), None, dialect, options.get("cost")) for f in args.files)
        return _checked_dialects(a, b)
    if len(args.files) == 1 and options:
        a = _DiffSide(Path(args.files[0]), None, dialect, options.get("cost"))
        return _checked_dialects(a, _DiffSide(None, stack_options(options), dialect))
    if len(args.files) > 2 or (len(args.files) == 2 and options):
        raise UsageError("give two schedules: two files, a file and stack options, or 'vs'")
    raise UsageError(
        "give two schedules: A B (files), A --layers ... (a file and a stack), or "
        "[stack options] vs [stack options]"
    )


def _one_side(args: argparse.Namespace, left: _DiffSide | None, where: str) -> _DiffSide:
    """One side of ``vs``; the side after it takes the stack options, the ``--dialect`` and
    the ``--cost`` it does not give from ``left``."""
    options = given_options(args)
    if len(args.files) > 1 or (args.files and not set(options) <= {"cost"}):
        raise UsageError(f"{where}: give one file or stack options, not both")
    dialect = args.dialect if args.dialect is not None or left is None else left.dialect
    cost = options.get("cost", left.cost if left is not None else None)
    if args.files:
        return _DiffSide(Path(args.files[0]), None, dialect, cost)
    base = left.stack if left is not None and left.stack is not None else DEFAULT_STACK
    return _DiffSide(None, stack_options(options, base), dialect)


def _checked_dialects(a: _DiffSide, b: _DiffSide) -> tuple[_DiffSide, _DiffSide]:
    """``a`` and ``b``; a ``--dialect`` given where no side is a graph is a `UsageError`
    (a schedule's text and a decoder stack have no stream ops to read)."""
    if not (a.graph or b.graph) and (a.dialect or b.dialect) is not None:
        raise UsageError(
            "--dialect reads the stream ops of a scheduled graph: give one saved with "
            "torch.export.save (.pt2) as a side"
        )
    for side in (a, b):
        if side.cost is not None and side.file is not None and not side.graph:
            raise UsageError(
                f"--cost prices a scheduled graph (.pt2) or a stack; {side.file} is a "
                "schedule's text, which keeps the costs it was written with"
            )
    return a, b


def _read_side(side: _DiffSide) -> ParsedSchedule:
    if side.graph:
        assert side.file is not None
        dialect = dialect_option(side.dialect)  # first: an engine's module registers its ops
        model = named_cost_model(side.cost) if side.cost is not None else None
        return parsed(load_graph(str(side.file), trace_streams), model, dialect=dialect)
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
    """``msched diff ARGV``: 0 when the two schedules are the same, 1 (and what changed, on
    ``stdout``) when they differ."""
    a_side, b_side = _diff_sides(argv)
    lines = schedule_diff(_read_side(a_side), _read_side(b_side))
    if lines:
        stdout.write("\n".join(lines) + "\n")
    return 1 if lines else 0

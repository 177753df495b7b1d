"""The words of the ``msched`` command line: the parser whose errors are one line, the argument
types, and the options of the decoder stack a command builds (`StackOptions`, every default in
`DEFAULT_STACK`).

Parsing only: building and scheduling the stack is `msched.cli.stack`.  A bad value is an
``argparse`` error (one line, exit status 2); a capture layer beyond the stack or given twice
is a `msched.UsageError` (`stack_options`), as is a ``--dialect`` that names no dialect
(`dialect_option`, read as the plugin reads its ``msched_dialect`` option:
`msched.proof.dialect_names`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NoReturn

from msched._text import agreeing, listed
from msched.errors import InvalidArgumentError, UsageError, one_line
from msched.limits import MAX_STREAMS, check_num_streams, positive_int
from msched.models.decoders import capture_layer_problems
from msched.models.loading import cwd_importable
from msched.proof.dialect_names import DIALECT_TEXT_HELP, dialect_from_text
from msched.proof.dialects import Dialect


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
COST_HELP = "table, roofline or a cost file saved by msched.MeasuredCostModel.save (FILE.json)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line: ``msched schedule: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


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


def layer_count(text: str) -> int:
    """``--layers``: a positive int."""
    return _integer(text, lambda value: positive_int(value, "layers"))


def stream_count(text: str) -> int:
    """``--streams``: an int in ``1..MAX_STREAMS`` (the error says so in the option's words,
    not in those of `msched.limits.check_num_streams`'s parameter)."""
    try:
        return check_num_streams(int(text))
    except (ValueError, InvalidArgumentError):
        raise argparse.ArgumentTypeError(
            f"expected a stream count from 1 to {MAX_STREAMS}, got {text!r}"
        ) from None


def cost_option(text: str) -> str:
    """``--cost``: a built-in model's name (`COST_MODELS`) or the path of a cost file that
    `msched.MeasuredCostModel.save` wrote (``.json``; read by `msched.cli.stack`)."""
    if text in COST_MODELS or text.endswith(".json"):
        return text
    raise argparse.ArgumentTypeError(f"expected {COST_HELP}, got {text!r}")


def layer_list(text: str) -> tuple[int, ...]:
    """``--captures``: comma-separated layer numbers, each 0 or more (an empty text: none)."""
    parts = text.split(",") if text.strip() else []
    try:
        layers = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer numbers such as 1,5,11, got {text!r}"
        ) from None
    if any(layer < 0 for layer in layers):
        raise argparse.ArgumentTypeError(f"layer numbers start at 0, got {text!r}")
    return layers


def layer_text(layers: Sequence[int]) -> str:
    """``1,5,11``: layers as ``--captures`` takes them."""
    return ",".join(map(str, layers))


def add_stack_args(p: argparse.ArgumentParser) -> None:
    """The stack options of ``schedule``, ``svg`` and ``explain``, ``--graph`` and the
    ``--dialect`` of its stream ops."""
    p.add_argument(
        "--graph",
        metavar="SPEC",
        help="your own graph instead of a decoder stack: module:function (returning a "
        "GraphModule, or (module, example inputs)) or a file saved with torch.save (.pt) or "
        "torch.export.save (.pt2)",
    )
    p.add_argument(
        "--layers", type=layer_count, help=f"decoder layers (default {DEFAULT_STACK.layers})"
    )
    p.add_argument(
        "--captures",
        type=layer_list,
        metavar="A,B,C",
        help="0-based layers whose hidden state is captured "
        f"(default {layer_text(DEFAULT_STACK.captures)})",
    )
    p.add_argument("--moe", action="store_true", help="MoE feed-forward blocks (routed ∥ shared)")
    p.add_argument(
        "--streams",
        type=stream_count,
        default=DEFAULT_STACK.streams,
        metavar="S",
        help=f"number of streams, 1..{MAX_STREAMS}; stream 0 is the caller's "
        f"(default {DEFAULT_STACK.streams})",
    )
    p.add_argument(
        "--cost",
        type=cost_option,
        default=DEFAULT_STACK.cost,
        metavar="table|roofline|FILE.json",
        help="cost model: op table (default), roofline estimate from shapes, or the costs "
        "measured on your hardware (msched.measure_costs), saved to FILE.json",
    )
    add_dialect_arg(p, "--graph")


DIALECT_METAVAR = "NAME|module:attr"
CLI_DIALECT_HINT = (
    f"pass --dialect {DIALECT_METAVAR} (a dialect name such as trtllm, or an op namespace "
    "with msched's four-op shape; or module:attr naming a msched.Dialect in your module)"
)
"""How `msched.UnreadStreamOpsError` says to give the dialect in a ``msched`` command."""


def add_dialect_arg(p: argparse.ArgumentParser, reads: str) -> None:
    """``--dialect``: the dialect of the stream ops of the graph that ``reads`` names."""
    p.add_argument(
        "--dialect",
        metavar=DIALECT_METAVAR,
        help=f"the dialect of the stream ops of {reads}: {DIALECT_TEXT_HELP} "
        "(default: detected from its ops)",
    )


def dialect_option(text: str | None) -> Dialect | None:
    """The `msched.Dialect` ``--dialect TEXT`` names (None when not given); a name that is
    no dialect, a module that does not import, a missing attribute or one that is no Dialect
    is a `UsageError` naming the option and saying what it takes.  The current directory is
    importable, as for ``--graph``."""
    if text is None:
        return None
    cwd_importable()
    try:
        return dialect_from_text(text)
    except InvalidArgumentError as error:
        raise UsageError(f"--dialect {text}: {one_line(error)}; give {DIALECT_TEXT_HELP}") from None


def given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The stack options given on the command line (those argparse left at None are not)."""
    return {k: getattr(args, k) for k in STACK_OPTIONS if getattr(args, k, None) is not None}


def stack_options(given: dict[str, Any], base: StackOptions = DEFAULT_STACK) -> StackOptions:
    """``base`` with the options ``given``; a capture layer beyond the stack or given twice is
    a `UsageError` (`capture_layer_problems` is the check)."""
    stack = replace(base, **given)
    beyond, repeated = capture_layer_problems(stack.layers, stack.captures)
    if beyond:
        layers = agreeing(len(beyond), "layer", "layers")
        raise UsageError(
            f"capture {layers} {listed(beyond)} {agreeing(len(beyond), 'is', 'are')} beyond "
            f"the stack: layers are 0..{stack.layers - 1}"
        )
    if repeated:
        raise UsageError(f"capture layers repeat: {layer_text(stack.captures)}")
    return stack

"""Options of the plugin and the stream counts a test runs with.

Every option has a command-line and an ini form; the command line wins, then the ini, then
the default.  Stream counts come from, in order of precedence: the ``multistream`` marker,
``--msched-streams``, the ini option ``msched_streams``, and `DEFAULT_STREAMS`.  Everything
here is computed from the config or a marker, so that every pytest-xdist worker computes the
same parametrization.

The scheduler under test (``--msched-scheduler`` / ``msched_scheduler``,
``package.module:function``) and the dialect of its stream ops (``--msched-dialect`` /
``msched_dialect``) are resolved once, in ``pytest_configure``: the scheduler's module is
imported first (it may be what registers the dialect's op namespace), then the dialect is
looked up.  A value that does not resolve is a `pytest.UsageError` naming the option and the
value.

This module imports msched (and so torch) only when a value is parsed or settings are
resolved, so that a pytest-xdist controller, which runs no test, need not import torch
(`pytest_msched._session.MschedSession.install`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

if TYPE_CHECKING:
    from msched.proof.dialects import Dialect
    from msched.testing.checks import Scheduler

DEFAULT_STREAMS: tuple[int, ...] = (2, 3)
VERIFY_MODES: tuple[str, ...] = ("strict", "off")
MARKER = "multistream"
MARKER_HELP = (
    "multistream(streams=[2, 3]): run the test once per stream count, as test[streams2], "
    "test[streams3], ...; the count is the num_streams fixture (default: --msched-streams, "
    "then the msched_streams ini option, then 2,3)"
)
# The built-in dialects by name (`msched.Dialect.named`), spelled out so that the help needs
# no import of msched (tests/plugin/test_own_scheduler.py checks them against msched's).
BUILT_IN_DIALECTS: tuple[str, ...] = ("msched", "trtllm", "torch", "autodeploy")
T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """The session-wide settings of the plugin, resolved once in ``pytest_configure``.

    Each is the command-line value, else the ini value, else the default: ``streams``
    (`DEFAULT_STREAMS`); ``verify``, ``"strict"`` (the default) or ``"off"``; ``dump_dir``,
    where the graphs of failing tests are written (``None``, the default: nowhere);
    ``scheduler``, the default of the ``msched_scheduler`` fixture (`msched.schedule`);
    ``dialect``, the default of the ``msched_dialect`` fixture (``None``: detect);
    ``cuda_graph``, whether ``schedule_graph`` also checks that the schedule can be captured
    as a CUDA graph (``msched.verify(..., cuda_graph=True)``; default False);
    ``memory_budget``, the ``memory_budget`` of ``schedule_graph`` (a ratio >= 1.0 of the
    original order's ``reserved_bound``; ``None``, the default: no budget).
    """

    streams: tuple[int, ...]
    verify: str
    dump_dir: Path | None
    scheduler: Scheduler
    dialect: Dialect | None = None
    cuda_graph: bool = False
    memory_budget: float | None = None


def add_options(parser: pytest.Parser) -> None:
    """Register the ``--msched-*`` options and their ini forms (``msched_*``)."""
    group = parser.getgroup("msched", "multi-stream schedules (pytest-msched)")
    group.addoption(
        "--msched-streams",
        dest="msched_streams",
        default=None,
        type=_streams_argument,
        metavar="N,N,...",
        help="stream counts of multistream tests without streams=[...] (default: ini "
        "msched_streams, then 2,3)",
    )
    group.addoption(
        "--msched-verify",
        dest="msched_verify",
        default=None,
        choices=VERIFY_MODES,
        help="strict: schedule_graph fails the test when msched.verify finds a violation; "
        "off: do not verify (default: ini msched_verify, then strict)",
    )
    group.addoption(
        "--msched-dump",
        dest="msched_dump",
        default=None,
        metavar="DIR",
        help="write DOT and Perfetto trace JSON of the graphs scheduled by failing tests to DIR "
        "(default: ini msched_dump; an empty DIR writes nothing)",
    )
    group.addoption(
        "--msched-scheduler",
        dest="msched_scheduler",
        default=None,
        metavar="MODULE:FUNCTION",
        help="the scheduler schedule_graph tests, scheduler(gm, num_streams) -> GraphModule | "
        "None, as package.module:function (default: ini msched_scheduler, then msched.schedule)",
    )
    group.addoption(
        "--msched-dialect",
        dest="msched_dialect",
        default=None,
        metavar="NAME",
        help="the stream ops of the scheduled graphs: a built-in dialect "
        f"({', '.join(BUILT_IN_DIALECTS)}), an op namespace with "
        "set_stream/record_event/wait_event/record_stream, or "
        "package.module:attribute naming a msched.Dialect (default: ini msched_dialect, then "
        "detected from each graph's ops)",
    )
    group.addoption(
        "--msched-cuda-graph",
        dest="msched_cuda_graph",
        default=None,
        nargs="?",
        const="on",
        metavar="on|off",
        help="on: schedule_graph also fails a schedule that cannot be captured as a CUDA graph "
        "(msched.verify(..., cuda_graph=True): capture-sync, capture-fork, capture-join); "
        "the flag alone means on (default: ini msched_cuda_graph, then off)",
    )
    group.addoption(
        "--msched-memory-budget",
        dest="msched_memory_budget",
        default=None,
        metavar="RATIO",
        help="schedule_graph keeps each schedule's reserved_bound within RATIO (>= 1.0) times "
        "the original order's: msched.schedule(..., memory_budget=RATIO), and another "
        "scheduler's result is checked against it; none: no budget (default: ini "
        "msched_memory_budget, then none)",
    )
    parser.addini(
        "msched_streams",
        "stream counts of multistream tests, e.g. 2,3 (overridden by --msched-streams)",
        default="",
    )
    parser.addini("msched_verify", "strict or off (overridden by --msched-verify)", default="")
    parser.addini(
        "msched_dump",
        "directory for the graphs of failing tests, relative to the rootdir (overridden by "
        "--msched-dump)",
        default="",
    )
    parser.addini(
        "msched_scheduler",
        "the scheduler under test, package.module:function (overridden by --msched-scheduler)",
        default="",
    )
    parser.addini(
        "msched_dialect",
        f"the dialect of the scheduled graphs: {', '.join(BUILT_IN_DIALECTS)}, an op "
        "namespace or package.module:attribute (overridden by --msched-dialect)",
        default="",
    )
    parser.addini(
        "msched_memory_budget",
        "the memory budget of schedule_graph, a ratio >= 1.0 of the original order's "
        "reserved_bound, or none (overridden by --msched-memory-budget)",
        default="",
    )
    parser.addini(
        "msched_cuda_graph",
        "on: schedule_graph also checks the CUDA-graph capture rules (overridden by "
        "--msched-cuda-graph)",
        default="",
    )


#: The words ``--msched-cuda-graph`` and the ini option ``msched_cuda_graph`` take.
CUDA_GRAPH_WORDS = {"on": True, "true": True, "yes": True, "1": True}
CUDA_GRAPH_WORDS |= {"off": False, "false": False, "no": False, "0": False}


def parse_cuda_graph(text: str) -> bool:
    """``on`` / ``off`` (or true/false, yes/no, 1/0, any case); `ValueError` otherwise."""
    word = text.strip().lower()
    if word not in CUDA_GRAPH_WORDS:
        raise ValueError("expected on or off")
    return CUDA_GRAPH_WORDS[word]


def parse_memory_budget(text: str) -> float | None:
    """A ratio >= 1.0 (`msched.scheduling.budget.check_memory_budget`), or ``none``;
    `ValueError` otherwise."""
    from msched.errors import InvalidArgumentError
    from msched.scheduling.budget import check_memory_budget

    word = text.strip().lower()
    if word == "none":
        return None
    try:
        return check_memory_budget(float(word))
    except ValueError:
        raise ValueError("expected a ratio >= 1.0, e.g. 1.25, or none") from None
    except InvalidArgumentError:
        raise ValueError(
            "expected a ratio >= 1.0 of the original order's memory, or none"
        ) from None


def parse_streams(value: object) -> tuple[int, ...]:
    """Check a list of stream counts; raise `ValueError` saying what is expected when bad.

    A valid value is a non-empty list or tuple of distinct stream counts, each an int in
    ``1..msched.MAX_STREAMS`` (`msched.limits.check_num_streams`; bools are not ints).
    """
    from msched.errors import InvalidArgumentError
    from msched.limits import check_num_streams

    usage = "expected a list of distinct stream counts >= 1, e.g. [2, 3]"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValueError(usage)
    for count in value:
        try:
            check_num_streams(count)
        except InvalidArgumentError as error:
            raise ValueError(f"{usage} ({error})") from None
    if len(set(value)) != len(value):
        raise ValueError(usage + " (a count is repeated)")
    return tuple(value)


def parse_streams_text(text: str) -> tuple[int, ...]:
    """Parse ``"2,3,4"`` (commas and/or spaces) into ``(2, 3, 4)``; see `parse_streams`."""
    parts = text.replace(",", " ").split()
    try:
        counts = [int(p) for p in parts]
    except ValueError:
        raise ValueError("expected stream counts separated by commas, e.g. 2,3") from None
    return parse_streams(counts)


def parse_verify_mode(text: str) -> str:
    """``"strict"`` or ``"off"``; anything else raises `ValueError`."""
    if text not in VERIFY_MODES:
        raise ValueError(f"expected one of {', '.join(VERIFY_MODES)}")
    return text


def _streams_argument(text: str) -> tuple[int, ...]:
    try:
        return parse_streams_text(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}; got {text!r}") from None


def _ini(config: pytest.Config, name: str, parse: Callable[[str], T]) -> T | None:
    """The ini option ``name`` parsed, ``None`` when unset; bad values → `pytest.UsageError`."""
    text = str(config.getini(name)).strip()
    if not text:
        return None
    try:
        return parse(text)
    except ValueError as error:
        raise pytest.UsageError(f"ini option {name}: {error}; got {text!r}") from None


def parse_scheduler(text: str) -> Scheduler:
    """The callable ``package.module:function`` names; `ValueError` when there is none."""
    from msched._text import articled
    from msched.errors import InvalidArgumentError
    from msched.proof.dialect_names import import_attribute

    try:
        scheduler = import_attribute(text, "function")
    except InvalidArgumentError as error:
        raise ValueError(str(error)) from None
    if not callable(scheduler):
        raise ValueError(
            f"{text.strip()} is {articled(type(scheduler).__name__)}, not a callable "
            "scheduler(gm, num_streams)"
        )
    return scheduler


def parse_dialect(text: str) -> Dialect:
    """The `msched.Dialect` ``text`` names: ``package.module:attribute`` (a Dialect), a
    built-in dialect name or an op namespace with the stream ops; `ValueError` otherwise
    (`msched.proof.dialect_names.dialect_from_text`, as ``msched --dialect`` reads it)."""
    from msched.errors import InvalidArgumentError
    from msched.proof.dialect_names import DIALECT_TEXT_HELP, dialect_from_text

    try:
        return dialect_from_text(text)
    except InvalidArgumentError as error:
        raise ValueError(f"{error}; give {DIALECT_TEXT_HELP}") from None


def check_dump_dir(path: Path) -> Path:
    """``path`` if a dump can be written there; `ValueError` saying why not otherwise.

    The directory need not exist (it is made on the first dump), but the nearest part of the
    path that exists must be a directory this process may write to: a regular file or a
    read-only directory would otherwise turn the first failing test into an internal error.
    """
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is a file, not a directory")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"cannot make the directory {path}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        if existing == path:
            raise ValueError(f"the directory {path} is not writable")
        raise ValueError(f"cannot make the directory {path}: {existing} is not writable")
    return path


def _dump_dir(config: pytest.Config) -> Path | None:
    """``--msched-dump`` (relative to the current directory), else the ini's ``msched_dump``
    (relative to the rootdir, as pytest's ``cache_dir``), checked; ``None``: no dumps."""
    text = config.getoption("msched_dump")
    if text is None:
        return _ini(
            config, "msched_dump", lambda t: check_dump_dir((config.rootpath / t).resolve())
        )
    return _resolved(
        config, "msched_dump", lambda t: check_dump_dir(Path(t).resolve()) if t else None
    )


def _resolved(config: pytest.Config, name: str, parse: Callable[[str], T]) -> T | None:
    """``--<name>`` if given, else the ini option ``name``, parsed; ``None`` when neither is
    set.  A value ``parse`` rejects is a `pytest.UsageError` naming the option and value."""
    text = config.getoption(name)
    if text is None:
        return _ini(config, name, parse)
    try:
        return parse(text)
    except ValueError as error:
        option = "--" + name.replace("_", "-")
        raise pytest.UsageError(f"{option}: {error}; got {text!r}") from None


OPTION_NAMES = (
    "msched_streams",
    "msched_verify",
    "msched_dump",
    "msched_scheduler",
    "msched_dialect",
    "msched_cuda_graph",
    "msched_memory_budget",
)


def options_given(config: pytest.Config) -> bool:
    """Whether any msched option is set, on the command line or in the ini file."""
    return any(
        config.getoption(name) is not None or str(config.getini(name)).strip()
        for name in OPTION_NAMES
    )


def resolve_settings(config: pytest.Config) -> Settings:
    """Compute the `Settings`: the command line, else the ini, else the default.

    Every value is checked here, in ``pytest_configure`` (on a pytest-xdist controller before
    its workers start): a bad one is a `pytest.UsageError` naming the option and the value.
    The scheduler is resolved (its module imported) before the dialect.
    """
    import msched

    streams = config.getoption("msched_streams")
    if streams is None:
        streams = _ini(config, "msched_streams", parse_streams_text)
    verify = config.getoption("msched_verify") or _ini(config, "msched_verify", parse_verify_mode)
    dump_dir = _dump_dir(config)
    scheduler = _resolved(config, "msched_scheduler", parse_scheduler)
    dialect = _resolved(config, "msched_dialect", parse_dialect)
    cuda_graph = _resolved(config, "msched_cuda_graph", parse_cuda_graph)
    memory_budget = _resolved(config, "msched_memory_budget", parse_memory_budget)
    return Settings(
        streams=streams or DEFAULT_STREAMS,
        verify=verify or "strict",
        dump_dir=dump_dir,
        scheduler=scheduler or msched.schedule,
        dialect=dialect,
        cuda_graph=bool(cuda_graph),
        memory_budget=memory_budget,
    )

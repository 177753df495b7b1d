"""`MschedSession`: everything the plugin keeps for one pytest run, in ``config.stash``.

One object per process holds the `Settings` (command line, ini, defaults), the statistics of
the graphs ``schedule_graph`` made (`SessionStats`, for the terminal summary), the schedules
of the running tests (for ``--msched-dump``) and the compiled decoders ``traced_decoder``
shares.  The hooks in `pytest_msched.plugin` and the fixtures call its methods.

Under pytest-xdist every worker sends its records to the controller as plain tuples
(`SessionStats.to_wire`, through ``config.workeroutput``) and the controller merges them
(`SessionStats.merge_wire`), so the summary, printed by the controller only, counts every
graph of the run exactly once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_msched import _params
from pytest_msched._options import Settings, options_given, resolve_settings
from pytest_msched._pytest_internals import distributes, is_xdist_worker, node_output, worker_output
from pytest_msched._reading import ReadingContext, plugin_hint, reading_in
from pytest_msched.snapshot import indexed_snapshot_report

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from msched.analysis.cost import CostModel
    from msched.proof.dialects import Dialect
    from msched.testing import checks
    from msched.testing.traced import TracedDecoder

WORKER_OUTPUT_KEY = "msched_stats"
DUMPS_OUTPUT_KEY = "msched_dumps"


@dataclass(frozen=True)
class GraphRecord:
    """One graph scheduled by ``schedule_graph`` (or, ``traced``, traced by the
    ``trace_streams`` fixture); ``violations`` is None when not verified.

    ``num_streams`` is the stream count the test asked for (``3`` in ``test[streams3]``; the
    streams of a traced graph); ``used`` the streams that run a node of the scheduled graph
    (None: not known), ``test`` the node id of the test that scheduled it; ``memory`` and
    ``original_memory`` the ``reserved_bound`` (`msched.peak_memory`) of the scheduled graph
    and of the graph it was given, in bytes (None: its nodes carry no sizes).
    """

    num_streams: int
    num_events: int
    num_waits: int
    violations: int | None
    traced: bool = False
    used: int | None = None
    test: str = ""
    memory: int | None = None
    original_memory: int | None = None

    @classmethod
    def of(cls, check: checks.ScheduleCheck, requested: int, test: str) -> GraphRecord:
        sched, report = check.schedule, check.report
        violations = None if report is None else len(report.violations)
        used = _streams_used(check)
        memory, original = _memory_of(check)
        return cls(
            requested,
            sched.num_events,
            sched.num_waits,
            violations,
            False,
            used,
            test,
            memory,
            original,
        )

    @property
    def lazy(self) -> bool:
        """Whether the scheduler used fewer streams than it was asked for."""
        return not self.traced and self.used is not None and self.used < self.num_streams


def _streams_used(check: checks.ScheduleCheck) -> int | None:
    """The streams on which some node of the scheduled graph runs (stream ops aside)."""
    from msched.errors import MschedError
    from msched.proof.interpreter import interpret

    try:
        program = interpret(check.schedule.gm, check.dialect)
    except MschedError:
        return None
    inputs = ("placeholder", "get_attr", "output")
    return len({s.stream for s in program.compute_steps if s.node.op not in inputs})


def _memory_of(check: checks.ScheduleCheck) -> tuple[int | None, int | None]:
    """The ``reserved_bound`` of the scheduled graph and of its original; None where the
    nodes carry no sizes or the original is not kept."""
    from msched.errors import MschedError
    from msched.proof.memory import sized_memory

    sched = check.schedule
    memory = sized_memory(sched.gm, dialect=check.dialect)
    if memory is None:
        return None, None
    try:
        original = sized_memory(sched.original)
    except MschedError:  # read back without its original
        original = None
    return memory.reserved_bound, None if original is None else original.reserved_bound


@dataclass(frozen=True)
class SessionStats:
    """Every `GraphRecord` of this process (and, on the controller, of every xdist worker)."""

    records: list[GraphRecord] = field(default_factory=list)

    def add(self, record: GraphRecord) -> None:
        self.records.append(record)

    def to_wire(self) -> list[tuple[Any, ...]]:
        """The records as plain tuples that execnet can send."""
        return [dataclasses.astuple(r) for r in self.records]

    def merge_wire(self, data: list[Any] | None) -> None:
        """Add the records a worker sent with `to_wire` (nothing when it sent none)."""
        for item in data or ():
            self.add(GraphRecord(*item))

    def summary_lines(self) -> list[str]:
        """The lines of the terminal summary; empty when no graph was scheduled."""
        scheduled = [r for r in self.records if not r.traced]
        traced = [r for r in self.records if r.traced]
        lines: list[str] = []
        if scheduled:
            per_count = Counter(r.num_streams for r in scheduled)
            counts = ", ".join(f"streams{n}: {per_count[n]}" for n in sorted(per_count))
            unverified = sum(r.violations is None for r in scheduled)
            violations = sum(r.violations or 0 for r in scheduled)
            lines += [
                f"graphs scheduled: {len(scheduled)} ({counts})",
                f"total waits: {sum(r.num_waits for r in scheduled)}",
                f"violations: {violations}",
            ]
            if unverified:
                lines[-1] += f" ({_counted(unverified, 'graph')} not verified: --msched-verify=off)"
            lines += _lazy_lines(scheduled)
            lines += _memory_lines(scheduled)
        if traced:
            streams = max(r.num_streams for r in traced)
            waits = sum(r.num_waits for r in traced)
            lines.append(
                f"graphs traced (trace_streams): {len(traced)}, up to "
                f"{_counted(streams, 'stream')}, {_counted(waits, 'wait')}"
            )
        return lines


def _memory_lines(scheduled: list[GraphRecord]) -> list[str]:
    """The summary line of the memory the schedules hold under any timing against their
    unscheduled graphs: the largest ratio and its test; nothing when no graph had sizes."""
    sized = [r for r in scheduled if r.memory is not None]
    if not sized:
        return []
    peak = max(r.memory or 0 for r in sized)
    line = f"peak memory (reserved under any timing): up to {_mib(peak)}"
    ratios = [
        (r.memory / r.original_memory, r.test)
        for r in sized
        if r.memory is not None and r.original_memory
    ]
    if ratios:
        ratio, test = max(ratios, key=lambda x: (x[0], x[1]))
        line += f", at most {ratio:.2f}x the unscheduled graph's ({test})"
    unsized = len(scheduled) - len(sized)
    return [line + (f"; {_counted(unsized, 'graph')} without sizes" if unsized else "")]


def _counted(count: int, noun: str) -> str:
    """``1 graph``, ``2 graphs``: `msched._text.counted`, which this module cannot import (the
    xdist controller writes the summary and must not import msched, which imports torch)."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


#: Tests named on the summary's line of schedulers that used fewer streams than asked for.
LAZY_SHOWN = 10


def _lazy_lines(scheduled: list[GraphRecord]) -> list[str]:
    """The summary line naming the tests whose scheduler left requested streams unused."""
    lazy = sorted((r for r in scheduled if r.lazy), key=lambda r: r.test)
    if not lazy:
        return []
    shown = [f"{r.test} ({r.used} of {r.num_streams})" for r in lazy[:LAZY_SHOWN]]
    more = len(lazy) - LAZY_SHOWN
    return [
        f"fewer streams used than requested: {_counted(len(lazy), 'graph')}: {', '.join(shown)}"
        + (f", and {more} more" if more > 0 else "")
    ]


_SESSION_KEY = pytest.StashKey["MschedSession"]()


class MschedSession:
    """The plugin's state for one pytest process; `install` it, then reach it with `of`.

    ``workeroutput`` is pytest-xdist's dict of a worker process (``None`` elsewhere).
    ``settings`` are resolved when first used: at once in a process that runs tests, and
    only if something asks on a pytest-xdist controller without msched options (it runs no
    test, and resolving imports msched and torch, a second of start-up before the workers
    start).
    """

    def __init__(
        self,
        config: pytest.Config,
        settings: Settings | None = None,
        workeroutput: dict[str, Any] | None = None,
    ) -> None:
        self._config = config
        if settings is not None:
            self.settings = settings
        self.stats = SessionStats()
        self.workeroutput = workeroutput
        self._schedules: dict[str, list[checks.ScheduleCheck]] = {}  # per test id, to teardown
        self.dumps: list[tuple[str, list[str]]] = []  # (test id, files) of every dump written
        self.broken_workers: list[str] = []  # xdist workers that ended with an internal error
        self._traced: dict[Any, TracedDecoder] = {}

    @cached_property
    def settings(self) -> Settings:
        return resolve_settings(self._config)

    @classmethod
    def install(cls, config: pytest.Config) -> MschedSession:
        """Resolve the settings of ``config`` (unless it is an xdist controller with no msched
        option: see the class) and keep the new session in its stash."""
        workeroutput = worker_output(config)
        lazy = _is_xdist_controller(config) and not options_given(config)
        settings = None if lazy else resolve_settings(config)
        session = cls(config, settings, workeroutput)
        config.stash[_SESSION_KEY] = session
        return session

    @staticmethod
    def of(config: pytest.Config) -> MschedSession:
        return config.stash[_SESSION_KEY]

    def parametrize(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize ``num_streams`` of one test function (`pytest_msched._params`)."""
        _params.parametrize(metafunc, self.settings.streams)

    def schedule_graph(
        self,
        nodeid: str,
        gm: GraphModule,
        num_streams: int,
        cost_model: CostModel | None,
        scheduler: checks.Scheduler | None = None,
        dialect: Dialect | str | None = None,
        example_inputs: Sequence[Any] | None = None,
    ) -> checks.ScheduleCheck | checks.SchedulerFailure:
        """Schedule ``gm`` with ``scheduler`` (None: `msched.schedule`) and, unless ``verify``
        is off, verify it (read in ``dialect``, the configured one, unless msched made the
        result; see `msched.testing.checks.resolve_dialect`), with the capture rules when
        ``cuda_graph`` is on, for the test ``nodeid``; count
        it in the summary and keep it for a dump.  With a memory budget
        (``msched_memory_budget``) `msched.schedule` keeps within it (sizes from the graph or
        ``example_inputs``) and another scheduler's result is checked against it.

        A scheduler that raises or returns something that cannot be read gives the
        `msched.testing.checks.SchedulerFailure` naming it (nothing is counted then).
        """
        from msched.testing import checks

        strict = self.settings.verify == "strict"
        with plugin_hint():
            check = checks.schedule_and_verify(
                gm,
                num_streams,
                cost_model,
                strict=strict,
                scheduler=scheduler,
                dialect=dialect,
                cuda_graph=self.settings.cuda_graph,
                memory_budget=self.settings.memory_budget,
                example_inputs=example_inputs,
            )
        if isinstance(check, checks.SchedulerFailure):
            return check
        self.stats.add(GraphRecord.of(check, num_streams, nodeid))
        self._schedules.setdefault(nodeid, []).append(check)
        return check

    @contextlib.contextmanager
    def reading(self, request: pytest.FixtureRequest | None = None) -> Iterator[None]:
        """While this runs, `configured_dialect` is the dialect of the test of ``request``
        (of the session when None), as `ReadingContext` says."""
        with reading_in(ReadingContext(self._settings_dialect, request)):
            yield

    def _settings_dialect(self) -> Dialect | None:
        return self.settings.dialect

    def traced_decoder(self, num_streams: int, kwargs: dict[str, Any]) -> TracedDecoder:
        """`trace_decoder` once per stream count and arguments (when they are hashable):
        compiling a 12-layer decoder takes seconds."""
        from msched.testing.traced import trace_decoder

        key = _cache_key(num_streams, kwargs)
        if key is None:
            return trace_decoder(num_streams, **kwargs)
        if key not in self._traced:
            self._traced[key] = trace_decoder(num_streams, **kwargs)
        return self._traced[key]

    def after_report(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """Dump the graphs of a failed call (with a dump directory); forget them at teardown."""
        if report.when == "call" and report.failed and self.settings.dump_dir is not None:
            self._dump_failed(item.nodeid, self.settings.dump_dir, report)
        if report.when == "teardown":
            self._schedules.pop(item.nodeid, None)

    def _dump_failed(self, nodeid: str, directory: Path, report: pytest.TestReport) -> None:
        """`dump` the test's graphs and say where in its report (an ``msched dump`` section);
        a dump that cannot be written is said there too, and the test stays failed."""
        try:
            written = self.dump(nodeid, directory)
        except OSError as error:
            report.sections.append(("msched dump", f"could not write the dump: {error}"))
            return
        if written:
            self.dumps.append((nodeid, [str(path) for path in written]))
            lines = "\n".join(f"  {path}" for path in written)
            report.sections.append(("msched dump", f"wrote to {directory}:\n{lines}"))

    def dump(self, nodeid: str, directory: Path) -> list[Path]:
        """Write DOT, trace JSON and SVG of every graph test ``nodeid`` scheduled; return the
        files.

        Files are ``<nodeid>.<k>.dot``, ``<nodeid>.<k>.trace.json`` and ``<nodeid>.<k>.svg``
        (``k`` counts the graphs of the test from 0).  The SVG draws the violations
        `msched.verify` finds in the graph now in red (`msched.pictures.svg.render_svg`'s
        ``highlight``).  A graph that cannot be rendered (a sabotaged one, say) gets
        ``<nodeid>.<k>.error.txt`` with the reason instead.  The graph is drawn as it is now
        (after whatever the test did to it), with the times of its `Schedule`.
        """
        written: list[Path] = []
        checked = self._schedules.get(nodeid, ())
        if checked:
            directory.mkdir(parents=True, exist_ok=True)
        for k, check in enumerate(checked):
            stem = f"{_file_stem(nodeid)}.{k}"
            for suffix, text in _renderings(check).items():
                path = directory / (stem + suffix)
                path.write_text(text, encoding="utf-8")
                written.append(path)
        return written

    @contextlib.contextmanager
    def finishing(self, session: pytest.Session) -> Iterator[None]:
        """Around the other plugins' ``pytest_sessionfinish``: syrupy finds unused snapshots
        with `pytest_msched.snapshot.IndexedSnapshotReport` (linear, not quadratic); then, on
        an xdist worker, `publish`; on the controller, a worker that ended with an internal
        error fails the run (`broken_workers`)."""
        with indexed_snapshot_report():
            yield
        self.publish()
        if self.broken_workers and session.exitstatus in _NOT_FAILED_BY_ERROR:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR

    def publish(self) -> None:
        """On an xdist worker, hand this worker's records and dumps to the controller."""
        if self.workeroutput is not None:
            self.workeroutput[WORKER_OUTPUT_KEY] = self.stats.to_wire()
            self.workeroutput[DUMPS_OUTPUT_KEY] = self.dumps

    def collect(self, node: Any) -> None:
        """On the xdist controller, merge the records and dumps of a worker (``node``) that
        shut down, and note it in `broken_workers` when it ended with an internal error: the
        controller must not finish such a run with exit status 0."""
        output = node_output(node)
        self.stats.merge_wire(output.get(WORKER_OUTPUT_KEY))
        self.dumps += [(nodeid, list(files)) for nodeid, files in output.get(DUMPS_OUTPUT_KEY, ())]
        if output.get("exitstatus") == pytest.ExitCode.INTERNAL_ERROR:
            name = getattr(getattr(node, "gateway", None), "id", None) or str(node)
            self.broken_workers.append(f"pytest-xdist worker {name} had an internal error")

    def write_summary(self, reporter: pytest.TerminalReporter) -> None:
        """Print the msched section of the terminal summary (controller or plain run only)."""
        if self.workeroutput is not None:
            return
        lines = self.stats.summary_lines() + self._dump_lines() + self._broken_lines()
        if lines:
            reporter.write_sep("-", "msched summary")
            for line in lines:
                reporter.write_line(line)

    def _dump_lines(self) -> list[str]:
        """Where the dumps of failing tests were written: each test, then its files."""
        if not self.dumps:
            return []
        lines = [f"dumps of failing tests: {sum(len(paths) for _, paths in self.dumps)} files"]
        for nodeid, paths in sorted(self.dumps):
            lines += [f"  {nodeid}:", *(f"    {path}" for path in paths)]
        return lines

    def _broken_lines(self) -> list[str]:
        return [f"{worker}: the run fails (exit status 3)" for worker in self.broken_workers]


#: Exit statuses a worker's internal error turns into `pytest.ExitCode.INTERNAL_ERROR`.
_NOT_FAILED_BY_ERROR = (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)


def _is_xdist_controller(config: pytest.Config) -> bool:
    """Whether this process hands tests to pytest-xdist workers (``-n``) and runs none."""
    if is_xdist_worker(config):
        return False
    if config.option.collectonly:  # xdist collects in the controller then
        return False
    return distributes(config)


def _cache_key(num_streams: int, kwargs: dict[str, Any]) -> Any:
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()))
    try:
        hash(items)
    except TypeError:
        return None
    return (num_streams, items)


def _file_stem(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")


def _renderings(check: checks.ScheduleCheck) -> dict[str, str]:
    """The dump files of one graph by suffix, or the reason it could not be drawn."""
    from msched.pictures.dot import render_dot
    from msched.pictures.svg import render_svg
    from msched.pictures.trace import render_perfetto

    sched = check.schedule
    try:
        svg = render_svg(sched, highlight=[v.nodes for v in _violations(check)])
        return {".dot": render_dot(sched), ".trace.json": render_perfetto(sched), ".svg": svg}
    except Exception as error:  # a dump must never turn a failing test into an error
        return {".error.txt": f"could not render the scheduled graph: {error!r}\n"}


def _violations(check: checks.ScheduleCheck) -> tuple[Any, ...]:
    """The violations `msched.verify` finds in the graph as it is now (the test may have
    changed it after ``schedule_graph``), else those found when it was scheduled."""
    import msched

    sched = check.schedule
    try:
        return msched.verify(sched.gm, original=sched.original, dialect=check.dialect).violations
    except Exception:  # no original, or a graph that cannot be read: what was found then
        return () if check.report is None else check.report.violations

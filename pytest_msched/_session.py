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
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_msched import _params
from pytest_msched._options import Settings, options_given, resolve_settings
from pytest_msched._pytest_internals import distributes, is_xdist_worker, node_output, worker_output
from pytest_msched.snapshot import indexed_snapshot_report

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from msched import Schedule
    from msched.analysis.cost import CostModel
    from msched.compile.traced import TracedDecoder
    from msched.proof.dialects import Dialect
    from msched.testing import checks

WORKER_OUTPUT_KEY = "msched_stats"


@dataclass(frozen=True)
class GraphRecord:
    """One graph scheduled by ``schedule_graph`` (or, ``traced``, traced by the
    ``trace_streams`` fixture); ``violations`` is None when not verified."""

    num_streams: int
    num_events: int
    num_waits: int
    violations: int | None
    traced: bool = False

    @classmethod
    def of(cls, check: checks.ScheduleCheck) -> GraphRecord:
        sched, report = check.schedule, check.report
        violations = None if report is None else len(report.violations)
        return cls(sched.num_streams, sched.num_events, sched.num_waits, violations)


@dataclass(frozen=True)
class SessionStats:
    """Every `GraphRecord` of this process (and, on the controller, of every xdist worker)."""

    records: list[GraphRecord] = field(default_factory=list)

    def add(self, record: GraphRecord) -> None:
        self.records.append(record)

    def to_wire(self) -> list[tuple[int, int, int, int | None, bool]]:
        """The records as plain tuples that execnet can send."""
        return [
            (r.num_streams, r.num_events, r.num_waits, r.violations, r.traced) for r in self.records
        ]

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
                lines[-1] += f" ({unverified} graphs not verified: --msched-verify=off)"
        if traced:
            streams = max(r.num_streams for r in traced)
            waits = sum(r.num_waits for r in traced)
            lines.append(
                f"graphs traced (trace_streams): {len(traced)}, up to {streams} streams, "
                f"{waits} waits"
            )
        return lines


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
        self._schedules: dict[str, list[Schedule]] = {}  # per test node id, until teardown
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
    ) -> checks.ScheduleCheck | checks.SchedulerFailure:
        """Schedule ``gm`` with ``scheduler`` (None: `msched.schedule`) and, unless ``verify``
        is off, verify it (read in ``dialect``; None: detected) for the test ``nodeid``; count
        it in the summary and keep it for a dump.

        A scheduler that raises or returns something that cannot be read gives the
        `msched.testing.checks.SchedulerFailure` naming it (nothing is counted then).
        """
        from msched.testing import checks

        strict = self.settings.verify == "strict"
        check = checks.schedule_and_verify(
            gm, num_streams, cost_model, strict=strict, scheduler=scheduler, dialect=dialect
        )
        if isinstance(check, checks.SchedulerFailure):
            return check
        self.stats.add(GraphRecord.of(check))
        self._schedules.setdefault(nodeid, []).append(check.schedule)
        return check

    def traced_decoder(self, num_streams: int, kwargs: dict[str, Any]) -> TracedDecoder:
        """`trace_decoder` once per stream count and arguments (when they are hashable):
        compiling a 12-layer decoder takes seconds."""
        from msched.compile.traced import trace_decoder

        key = _cache_key(num_streams, kwargs)
        if key is None:
            return trace_decoder(num_streams, **kwargs)
        if key not in self._traced:
            self._traced[key] = trace_decoder(num_streams, **kwargs)
        return self._traced[key]

    def after_report(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """Dump the graphs of a failed call (with a dump directory); forget them at teardown."""
        if report.when == "call" and report.failed and self.settings.dump_dir is not None:
            self.dump(item.nodeid, self.settings.dump_dir)
        if report.when == "teardown":
            self._schedules.pop(item.nodeid, None)

    def dump(self, nodeid: str, directory: Path) -> list[Path]:
        """Write DOT and trace JSON of every graph test ``nodeid`` scheduled; return the files.

        Files are ``<nodeid>.<k>.dot`` and ``<nodeid>.<k>.trace.json`` (``k`` counts the graphs
        of the test from 0).  A graph that cannot be rendered (a sabotaged one, say) gets
        ``<nodeid>.<k>.error.txt`` with the reason instead.  The graph is drawn as it is now
        (after whatever the test did to it), with the times of its `Schedule`.
        """
        written: list[Path] = []
        directory.mkdir(parents=True, exist_ok=True)
        for k, sched in enumerate(self._schedules.get(nodeid, ())):
            stem = f"{_file_stem(nodeid)}.{k}"
            for suffix, text in _renderings(sched).items():
                path = directory / (stem + suffix)
                path.write_text(text, encoding="utf-8")
                written.append(path)
        return written

    @contextlib.contextmanager
    def finishing(self) -> Iterator[None]:
        """Around the other plugins' ``pytest_sessionfinish``: syrupy finds unused snapshots
        with `pytest_msched.snapshot.IndexedSnapshotReport` (linear, not quadratic); then, on
        an xdist worker, `publish`."""
        with indexed_snapshot_report():
            yield
        self.publish()

    def publish(self) -> None:
        """On an xdist worker, hand this worker's records to the controller."""
        if self.workeroutput is not None:
            self.workeroutput[WORKER_OUTPUT_KEY] = self.stats.to_wire()

    def collect(self, node: Any) -> None:
        """On the xdist controller, merge the records of a worker (``node``) that shut down."""
        output = node_output(node)
        self.stats.merge_wire(output.get(WORKER_OUTPUT_KEY))

    def write_summary(self, reporter: pytest.TerminalReporter) -> None:
        """Print the msched section of the terminal summary (controller or plain run only)."""
        lines = [] if self.workeroutput is not None else self.stats.summary_lines()
        if lines:
            reporter.write_sep("-", "msched summary")
            for line in lines:
                reporter.write_line(line)


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


def _renderings(sched: Schedule) -> dict[str, str]:
    """The dump files of one graph by suffix, or the reason it could not be drawn."""
    from msched.pictures.dot import render_dot
    from msched.pictures.trace import render_trace

    try:
        return {".dot": render_dot(sched), ".trace.json": render_trace(sched)}
    except Exception as error:  # a dump must never turn a failing test into an error
        return {".error.txt": f"could not render the scheduled graph: {error!r}\n"}

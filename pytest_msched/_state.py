"""Session state of the plugin: what was scheduled, the terminal summary, xdist, dumps.

`SessionStats` lives in ``config.stash[STATS_KEY]``.  Under pytest-xdist every worker sends
its records to the controller as plain tuples (`SessionStats.to_wire`, through
``config.workeroutput``) and the controller merges them (`SessionStats.merge_wire`), so the
summary, printed by the controller only, counts every graph of the run exactly once.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from torch.fx import GraphModule

from msched import Schedule, schedule
from msched.analysis.cost import CostModel
from msched.pictures.render import render_dot, render_trace
from msched.proof.verifier import verify
from pytest_msched._excerpt import excerpt

WORKER_OUTPUT_KEY = "msched_stats"


@dataclass(frozen=True)
class GraphRecord:
    """One graph scheduled by ``schedule_graph``; ``violations`` is None when not verified."""

    num_streams: int
    num_events: int
    num_waits: int
    violations: int | None


@dataclass(frozen=True)
class SessionStats:
    """Every `GraphRecord` of this process (and, on the controller, of every xdist worker)."""

    records: list[GraphRecord] = field(default_factory=list)

    def add(self, record: GraphRecord) -> None:
        self.records.append(record)

    def to_wire(self) -> list[tuple[int, int, int, int | None]]:
        """The records as plain tuples that execnet can send."""
        return [(r.num_streams, r.num_events, r.num_waits, r.violations) for r in self.records]

    def merge_wire(self, data: list[Any] | None) -> None:
        """Add the records a worker sent with `to_wire` (nothing when it sent none)."""
        for item in data or ():
            self.add(GraphRecord(*item))

    def summary_lines(self) -> list[str]:
        """The lines of the terminal summary; empty when no graph was scheduled."""
        if not self.records:
            return []
        per_count = Counter(r.num_streams for r in self.records)
        counts = ", ".join(f"streams{n}: {per_count[n]}" for n in sorted(per_count))
        unverified = sum(r.violations is None for r in self.records)
        violations = sum(r.violations or 0 for r in self.records)
        lines = [
            f"graphs scheduled: {len(self.records)} ({counts})",
            f"total waits: {sum(r.num_waits for r in self.records)}",
            f"violations: {violations}",
        ]
        if unverified:
            lines[-1] += f" ({unverified} graphs not verified: --msched-verify=off)"
        return lines


STATS_KEY = pytest.StashKey[SessionStats]()
SCHEDULES_KEY = pytest.StashKey[list[Schedule]]()


def schedule_and_verify(
    gm: GraphModule,
    num_streams: int,
    cost_model: CostModel | None,
    strict: bool,
    stats: SessionStats,
) -> tuple[Schedule, str | None]:
    """`msched.schedule` ``gm``; with ``strict``, `msched.verify` it against the original.

    Records the graph in ``stats`` and returns the schedule and, when verification found
    violations, a failure message: the report and the lines around the nodes involved.
    """
    sched = schedule(gm, num_streams, cost_model)
    report = verify(sched.gm, original=sched.original) if strict else None
    violations = None if report is None else len(report.violations)
    stats.add(GraphRecord(num_streams, sched.num_events, sched.num_waits, violations))
    if report is None or report.ok:
        return sched, None
    involved = [n for v in report.violations for n in v.nodes]
    return sched, f"msched.verify found violations in the schedule:\n{report}\n" + excerpt(
        sched.gm, involved
    )


def is_worker(config: pytest.Config) -> bool:
    """True in a pytest-xdist worker process."""
    return hasattr(config, "workerinput")


def publish_worker_stats(config: pytest.Config) -> None:
    """On an xdist worker, hand this worker's records to the controller."""
    output = getattr(config, "workeroutput", None)
    if output is not None:
        output[WORKER_OUTPUT_KEY] = config.stash[STATS_KEY].to_wire()


def collect_worker_stats(config: pytest.Config, node: Any) -> None:
    """On the xdist controller, merge the records of a worker that has shut down."""
    output = getattr(node, "workeroutput", None) or {}
    config.stash[STATS_KEY].merge_wire(output.get(WORKER_OUTPUT_KEY))


def write_summary(config: pytest.Config, reporter: pytest.TerminalReporter) -> None:
    """Print the msched section of the terminal summary (controller or plain run only)."""
    if is_worker(config):
        return
    lines = config.stash[STATS_KEY].summary_lines()
    if lines:
        reporter.write_sep("-", "msched summary")
        for line in lines:
            reporter.write_line(line)


def _file_stem(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")


def dump_schedules(item: pytest.Item, directory: Path) -> list[Path]:
    """Write DOT and trace JSON of every graph ``item`` scheduled; return the files written.

    Files are ``<nodeid>.<k>.dot`` and ``<nodeid>.<k>.trace.json`` (``k`` counts the graphs
    of the test from 0).  A graph that cannot be rendered (a sabotaged one, say) gets
    ``<nodeid>.<k>.error.txt`` with the reason instead.  The graph is drawn as it is now
    (after whatever the test did to it), with the times of its `Schedule`.
    """
    written: list[Path] = []
    directory.mkdir(parents=True, exist_ok=True)
    schedules = item.stash[SCHEDULES_KEY] if SCHEDULES_KEY in item.stash else []
    for k, sched in enumerate(schedules):
        stem = directory / f"{_file_stem(item.nodeid)}.{k}"
        try:
            files = {".dot": render_dot(sched), ".trace.json": render_trace(sched)}
        except Exception as error:  # a dump must never turn a failing test into an error
            files = {".error.txt": f"could not render the scheduled graph: {error!r}\n"}
        for suffix, text in files.items():
            path = stem.with_name(stem.name + suffix)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written

"""The plugin shows a schedule's memory (issue 42, part 3): in the snapshot header and the
summary; a snapshot written before the header had its memory line still matches, and
``--snapshot-update`` adds the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_msched._session import GraphRecord, SessionStats
from pytest_msched.snapshot import ScheduledGraphExtension, without_memory_line

SUITE = """
import pytest


@pytest.mark.multistream
def test_stack(decoder_stack, schedule_graph, graph_snapshot):
    sched = schedule_graph(decoder_stack(n_layers=2, capture_layers=(1,)).gm)
    assert sched == graph_snapshot
"""
SNAPSHOT = "test_stack[streams2].msched.txt"


def test_the_summary_names_the_largest_memory_ratio() -> None:
    stats = SessionStats()
    stats.add(
        GraphRecord(2, 1, 1, 0, test="t.py::a[streams2]", memory=4 << 20, original_memory=2 << 20)
    )
    stats.add(
        GraphRecord(3, 1, 1, 0, test="t.py::a[streams3]", memory=6 << 20, original_memory=2 << 20)
    )
    stats.add(GraphRecord(3, 1, 1, 0, test="t.py::b[streams3]"))  # no sizes
    controller = SessionStats()
    controller.merge_wire(stats.to_wire())
    assert controller.summary_lines()[-1] == (
        "peak memory (reserved under any timing): up to 6.00 MiB, at most 3.00x the "
        "unscheduled graph's (t.py::a[streams3]); 1 graph without sizes"
    )
    unsized = SessionStats()
    unsized.add(GraphRecord(2, 1, 1, 0))
    assert not any("memory" in line for line in unsized.summary_lines())


def test_a_snapshot_without_the_memory_line_matches_unless_updating() -> None:
    text = "# msched text format 2\n# streams 2, events 0, waits 0\n# makespan 1, lower bound 1\n"
    new = text + "# memory allocated 1 KiB, reserved 2 MiB, bound 2 MiB\ns0 | output(x)\n"
    old = text + "s0 | output(x)\n"
    assert without_memory_line(new) == old and without_memory_line(old) == old
    extension = ScheduledGraphExtension()
    assert extension.matches(serialized_data=new, snapshot_data=old)
    assert extension.matches(serialized_data=new, snapshot_data=new)
    other = new.replace("2 MiB", "4 MiB")
    assert not extension.matches(serialized_data=other, snapshot_data=new)
    assert not extension.matches(serialized_data=new.replace("x)", "y)"), snapshot_data=old)


def test_old_snapshots_pass_and_snapshot_update_adds_the_memory_line(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nmsched_streams = 2\n")
    pytester.makepyfile(test_memory=SUITE)
    created = pytester.runpytest("--snapshot-update")
    created.assert_outcomes(passed=1)
    created.stdout.fnmatch_lines(
        ["*peak memory (reserved under any timing): up to *, at most *x the unscheduled*"]
    )
    path = Path(pytester.path, "__snapshots__", "test_memory", SNAPSHOT)
    written = path.read_text()
    assert written.splitlines()[3].startswith("# memory allocated ")

    path.write_text(without_memory_line(written))  # as msched wrote it before
    old = pytester.runpytest("-v")
    old.assert_outcomes(passed=1)
    old.stdout.fnmatch_lines(["*1 snapshot passed*"])
    assert "# memory" not in path.read_text()

    pytester.runpytest("--snapshot-update").assert_outcomes(passed=1)
    assert path.read_text() == written


def test_stacks_that_differ_by_seed_share_their_sizes_others_do_not() -> None:
    from msched.models.decoders import decoder_stack
    from pytest_msched.fixtures import _sized, _sizes_key

    def sized(**kwargs: object):
        return _sized(decoder_stack(**kwargs), _sizes_key((), kwargs))  # type: ignore[arg-type]

    first, second = (
        sized(n_layers=2, capture_layers=(1,), seed=1),
        sized(n_layers=2, capture_layers=(1,), seed=2),
    )
    for a, b in zip(first.gm.graph.nodes, second.gm.graph.nodes, strict=True):
        assert a.meta.get("val") is b.meta.get("val")  # reused, not propagated again
    wider = sized(n_layers=2, capture_layers=(1,), hidden=16)
    assert wider.gm.graph.find_nodes(op="placeholder")[0].meta["val"].shape == (4, 16)

"""The plugin at downstream scale (issue 16): unused-snapshot bookkeeping, xdist, fixtures.

A downstream suite has hundreds of parametrized snapshot tests in one module.  syrupy matches
every snapshot file against every test that ran; `pytest_msched.snapshot.IndexedSnapshotReport`
asks about the few tests an index finds.  These tests check that syrupy's behaviour is kept
(unused snapshots fail the run, ``--snapshot-update`` deletes them, also under ``-n 2``), that
snapshots of tests that did not pass are kept, and, by counting calls rather than timing, that
the matching is linear.  No test here measures time (``benchmarks/bench_plugin.py`` does).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import msched
from msched.models.decoders import decoder_stack
from msched.pictures.text import render_text
from msched.testing import checks
from pytest_msched import assert_exit_waits_on

# The inner suites do not use hypothesis; its plugin costs a second in each xdist process.
WITHOUT_HYPOTHESIS = ("-p", "no:hypothesispytest")

SUITE = """
import pytest

from pytest_msched import assert_exit_waits_on

SEEDS = {seeds}


@pytest.mark.multistream(streams=[2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_stack(decoder_stack, schedule_graph, graph_snapshot, seed):
    stack = decoder_stack(n_layers=2, capture_layers=(0, 1), hidden=4, tokens=2, seed=seed)
    sched = schedule_graph(stack.gm)
    assert_exit_waits_on(sched.gm, stack.captures[-1])
    if seed in {fail_before_assert}:
        raise RuntimeError("fails before its snapshot assertion")
    assert sched == graph_snapshot
"""


def _write(pytester: pytest.Pytester, seeds: range | list[int], fail: tuple[int, ...] = ()) -> Path:
    pytester.makepyfile(test_stacks=SUITE.format(seeds=list(seeds), fail_before_assert=set(fail)))
    return pytester.path / "__snapshots__" / "test_stacks"


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.msched.txt"))


def _files(seeds: range | list[int]) -> list[str]:
    return sorted(f"test_stack[streams{n}-{seed}].msched.txt" for n in (2, 3) for seed in seeds)


def test_unused_snapshots_fail_the_run_and_update_deletes_them(pytester: pytest.Pytester) -> None:
    snapshots = _write(pytester, range(3))
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=6)
    assert _names(snapshots) == _files(range(3))

    # Seed 2 is gone: its two snapshots are unused.  (With a test path on the command line
    # syrupy ignores a single-file snapshot that no test which ran could own.)
    _write(pytester, range(2))
    unused = pytester.runpytest()
    unused.assert_outcomes(passed=4)
    unused.stdout.fnmatch_lines(["*4 snapshots passed. 2 snapshots unused.*"])
    assert unused.ret == 1
    assert _names(snapshots) == _files(range(3))

    warned = pytester.runpytest("--snapshot-warn-unused")
    warned.stdout.fnmatch_lines(["*2 snapshots unused.*"])
    assert warned.ret == 0

    deleted = pytester.runpytest("--snapshot-update")
    deleted.stdout.fnmatch_lines(["*2 unused snapshots deleted.*"])
    assert _names(snapshots) == _files(range(2))
    assert pytester.runpytest().ret == 0


@pytest.mark.slow
def test_update_under_xdist_keeps_the_snapshots_of_every_worker(
    pytester: pytest.Pytester,
) -> None:
    """Each worker runs some of the tests; only the controller, which has every worker's
    report, decides what is unused."""
    snapshots = _write(pytester, range(4))
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=8)
    _write(pytester, [0, 1, 3])

    result = pytester.runpytest_subprocess("-n", "2", "--snapshot-update", *WITHOUT_HYPOTHESIS)
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*6 snapshots passed. 2 unused snapshots deleted.*"])
    assert _names(snapshots) == _files([0, 1, 3])


def test_snapshots_of_tests_that_fail_before_asserting_are_kept(
    pytester: pytest.Pytester,
) -> None:
    """syrupy keeps the snapshots of skipped tests only: with a test that fails before its
    assertion, ``--snapshot-update`` would delete the reviewed snapshot."""
    snapshots = _write(pytester, range(2))
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=4)

    _write(pytester, range(2), fail=(1,))
    plain = pytester.runpytest("test_stacks.py")
    plain.assert_outcomes(passed=2, failed=2)
    plain.stdout.no_fnmatch_line("*unused*")
    updated = pytester.runpytest("test_stacks.py", "--snapshot-update")
    updated.assert_outcomes(passed=2, failed=2)
    updated.stdout.no_fnmatch_line("*deleted*")
    assert _names(snapshots) == _files(range(2))


def test_snapshots_of_tests_a_stopped_session_did_not_run_are_kept(
    pytester: pytest.Pytester,
) -> None:
    snapshots = _write(pytester, range(3))
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=6)

    _write(pytester, range(3), fail=(0,))
    stopped = pytester.runpytest("test_stacks.py", "-x", "--snapshot-update")
    stopped.assert_outcomes(failed=1)
    stopped.stdout.no_fnmatch_line("*deleted*")
    assert _names(snapshots) == _files(range(3))


COUNTING_CONFTEST = """
import pytest
from syrupy.extensions.single_file import SingleFileSnapshotExtension

CALLS = []
_match = SingleFileSnapshotExtension.matches_test_location.__func__


def _counted(cls, *, test_location, snapshot_location):
    CALLS.append(snapshot_location)
    return _match(cls, test_location=test_location, snapshot_location=snapshot_location)


SingleFileSnapshotExtension.matches_test_location = classmethod(_counted)


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"matches_test_location calls: {len(CALLS)}")
"""


def test_each_snapshot_file_is_matched_against_its_own_test_only(
    pytester: pytest.Pytester,
) -> None:
    """Counting, not timing: with a test path on the command line, syrupy alone asks about
    every (file, test) pair of the module, about tests² / 2 questions (800 here); the index
    about each file's own test."""
    _write(pytester, range(20))
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=40)
    pytester.makeconftest(COUNTING_CONFTEST)
    result = pytester.runpytest_subprocess("test_stacks.py", *WITHOUT_HYPOTHESIS)
    result.stdout.fnmatch_lines(["*40 snapshots passed.*"])
    calls = int(result.stdout.str().split("matches_test_location calls: ")[1].split()[0])
    assert calls <= 2 * 40, calls


TORCH_ON_THE_CONTROLLER = """
import sys


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):
        with open("controller.txt", "w") as f:
            f.write(str("torch" in sys.modules))
"""


def test_the_xdist_controller_does_not_import_torch(pytester: pytest.Pytester) -> None:
    """It runs no test: importing torch there (a second) only delays the workers' start."""
    _write(pytester, range(2))
    pytester.makeconftest(TORCH_ON_THE_CONTROLLER)
    args = ("test_stacks.py", "-n", "2", "--snapshot-update", *WITHOUT_HYPOTHESIS)
    result = pytester.runpytest_subprocess(*args)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["graphs scheduled: 4 (streams2: 2, streams3: 2)"])
    assert (pytester.path / "controller.txt").read_text() == "False"


# Fixtures that do no work a test does not use --------------------------------------------------


@pytest.fixture
def codegen_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every graph whose Python code torch.fx generates from now on."""
    calls: list[str] = []
    generate = torch.fx.Graph.python_code

    def counted(graph: torch.fx.Graph, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(graph.owning_module, "__class__", type(None)).__name__)
        return generate(graph, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", counted)
    return calls


def test_a_scheduled_and_verified_stack_generates_code_only_when_run(
    codegen_calls: list[str],
) -> None:
    """Building, scheduling, verifying, a helper and the snapshot text read graphs only; the
    code of the scheduled module is generated when it runs, the reference's when asked."""
    stack = decoder_stack(n_layers=4, capture_layers=(1, 3))
    check = checks.schedule_and_verify(stack.gm, 3)
    assert isinstance(check, checks.ScheduleCheck) and check.report is not None
    assert check.report.ok
    assert_exit_waits_on(check.schedule.gm, stack.captures[-1])
    assert render_text(check.schedule).startswith("# msched text format 2\n# streams 3")
    assert codegen_calls == []

    x, dest = stack.example_inputs()
    out = check.schedule.gm(x, dest)
    assert codegen_calls == ["DecoderStack"]
    ref_out, ref_dest = stack.reference()
    assert codegen_calls == ["DecoderStack", "DecoderStackReference"]
    assert torch.equal(out, ref_out) and torch.equal(dest, ref_dest)
    assert "msched_set_stream(" in check.schedule.gm.code


def test_every_stack_has_a_graph_of_its_own() -> None:
    first, second = (decoder_stack(n_layers=2, capture_layers=(0, 1), seed=3) for _ in "ab")
    before = [n.format_node() for n in second.gm.graph.nodes]
    msched.schedule(first.gm, 2)
    first.gm.graph.erase_node(first.captures[-1])
    first.gm.recompile()
    assert [n.format_node() for n in second.gm.graph.nodes] == before
    # The reference is the unscheduled stack, whatever happened to ``gm``.
    out, dest = first.reference()
    assert torch.equal(out, second.gm(*second.example_inputs()))
    assert torch.equal(dest, second.reference()[1]) and dest.abs().sum() > 0

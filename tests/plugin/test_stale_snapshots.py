"""Stale ``.msched.txt`` snapshots are found whatever the test paths of the run (issue 21).

A renamed test leaves its snapshot behind.  syrupy finds it for a bare ``pytest`` only: with
a directory or file argument it skips a single-file snapshot no test that ran owns, unless
the test module itself is gone, and every test of ``schedule_graph`` is parametrized (no
unparametrized test of the module owns the module's files).  For ``.msched.txt`` files
`pytest_msched.snapshot.IndexedSnapshotReport` also checks a file whose test module was
collected whole (a test of it collected, no ``::`` argument naming one of its tests); what
belongs to tests that were collected but not selected (``-k``, ``-m``) is kept.
"""

from __future__ import annotations

import pytest

MODULE = """
import pytest

from pytest_msched import ScheduledGraphExtension

pytestmark = pytest.mark.parametrize("n", [2])


def test_{name}(snapshot, n):
    assert "schedule {name}" == snapshot.use_extension(ScheduledGraphExtension)


def test_keep(snapshot, n):
    assert "schedule keep" == snapshot.use_extension(ScheduledGraphExtension)


@pytest.mark.heavy
def test_slow(snapshot, n):
    assert "schedule slow" == snapshot.use_extension(ScheduledGraphExtension)
"""


def _write(pytester: pytest.Pytester, a: str, b: str) -> None:
    tests = pytester.path / "tests"
    tests.mkdir(exist_ok=True)
    (tests / "test_a.py").write_text(MODULE.format(name=a))
    (tests / "test_b.py").write_text(MODULE.format(name=b))


def _snapshots(pytester: pytest.Pytester) -> list[str]:
    root = pytester.path / "tests" / "__snapshots__"
    return sorted(str(p.relative_to(root)) for p in root.glob("*/*.msched.txt"))


def _renamed(pytester: pytest.Pytester, b: str = "b_old") -> list[str]:
    """Snapshots of ``test_a_old`` and ``test_b_old``, then ``test_a_old`` renamed to
    ``test_a_new`` (and ``test_b_old`` to ``b``); returns the files before the rename."""
    pytester.makeini("[pytest]\nmarkers = heavy\n")
    _write(pytester, "a_old", "b_old")
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=6)
    _write(pytester, "a_new", b)
    new = ["tests/test_a.py::test_a_new", f"tests/test_b.py::test_{b}"]
    pytester.runpytest(*new, "--snapshot-update").assert_outcomes(passed=2)
    return _snapshots(pytester)


A_OLD = "test_a/test_a_old[2].msched.txt"
B_OLD = "test_b/test_b_old[2].msched.txt"
SLOW_A = "test_a/test_slow[2].msched.txt"


@pytest.mark.parametrize("paths", [[], ["tests"], ["tests/test_a.py"]], ids=["bare", "dir", "file"])
def test_a_renamed_tests_snapshot_is_unused_with_any_paths(
    pytester: pytest.Pytester, paths: list[str]
) -> None:
    before = _renamed(pytester)
    assert A_OLD in before
    unused = pytester.runpytest(*paths)
    unused.stdout.fnmatch_lines(["*1 snapshot unused.*"])
    assert unused.ret == pytest.ExitCode.TESTS_FAILED
    deleted = pytester.runpytest(*paths, "--snapshot-update")
    deleted.stdout.fnmatch_lines(["*1 unused snapshot deleted.*"])
    assert _snapshots(pytester) == [s for s in before if s != A_OLD]
    assert pytester.runpytest(*paths).ret == pytest.ExitCode.OK


def test_a_file_argument_deletes_the_snapshots_of_that_file_only(
    pytester: pytest.Pytester,
) -> None:
    before = _renamed(pytester, b="b_new")
    assert {A_OLD, B_OLD} <= set(before)
    pytester.runpytest("tests/test_a.py", "--snapshot-update").stdout.fnmatch_lines(
        ["*1 unused snapshot deleted.*"]
    )
    assert _snapshots(pytester) == [s for s in before if s != A_OLD]
    pytester.runpytest("tests", "--snapshot-update").stdout.fnmatch_lines(
        ["*1 unused snapshot deleted.*"]
    )
    assert _snapshots(pytester) == [s for s in before if s not in (A_OLD, B_OLD)]


def test_a_test_id_argument_deletes_nothing(pytester: pytest.Pytester) -> None:
    """``path::test`` collects one test of the module: its other files are not in scope."""
    before = _renamed(pytester)
    result = pytester.runpytest("tests/test_a.py::test_keep[2]", "--snapshot-update")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*deleted*")
    assert _snapshots(pytester) == before


@pytest.mark.parametrize(
    ("paths", "stale_deleted"), [([], True), (["tests"], False)], ids=["bare", "dir"]
)
def test_snapshots_of_deselected_tests_are_kept(
    pytester: pytest.Pytester, paths: list[str], stale_deleted: bool
) -> None:
    """``-k 'not heavy'`` deselects ``test_slow`` by its marker; syrupy matches ``-k`` against
    snapshot names only, so alone it would delete the snapshot of a test that still exists.
    A stale snapshot the expression matches is deleted without paths; with paths syrupy
    keeps it (it also wants a ``::`` part of an argument to match the name)."""
    before = _renamed(pytester)
    result = pytester.runpytest(*paths, "-k", "not heavy", "--snapshot-update")
    result.assert_outcomes(passed=4, deselected=2)
    deleted = {A_OLD} if stale_deleted else set()
    assert _snapshots(pytester) == [s for s in before if s not in deleted]

"""A downstream repository with an engine of its own design, tested the way its README says.

The engine is `tests.plugin.myeng` (string-named events, a stream-wide ``join``, its own
capture op, its own pass with three bugs), copied into ``pytester``'s directory as
``myeng.py``.  Its tests call every helper *without* ``dialect=``: the dialect comes from the
configuration only, an ini file or a ``conftest.py``.  Each run is a subprocess (the engine
registers its ops once per process), serially and under ``-n 2``:

- on the correct schedule every helper passes (read in the engine's dialect, no
  ``[extra-node]`` per stream op), and the snapshot shows the engine's streams;
- each bug fails exactly the checks that can see it, naming the node;
- a scheduler that used fewer streams than requested is named in the summary, and the
  summary and snapshot header count the requested streams;
- without a configured dialect nothing passes: every check says which ops it cannot read and
  how to configure the dialect.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pytest_msched._reading import configured_dialect

# Registers the engine's ops in this process before any in-process inner run imports it.
from tests.plugin import myeng  # noqa: F401

ENGINE = Path(__file__).with_name("myeng.py")
WITHOUT_HYPOTHESIS = ("-p", "no:hypothesispytest")
BUGS = ("clean", "after_output", "no_join", "war")

TESTS = """
import copy

import pytest

import myeng
from pytest_msched import (
    assert_captures_precede_output,
    assert_exit_waits_on,
    assert_race_free,
    assert_survives_recompile,
)

pytestmark = pytest.mark.multistream(streams=[3])


@pytest.fixture(params=["clean", "after_output", "no_join", "war"])
def bug(request, monkeypatch):
    monkeypatch.setattr(myeng, "BUG", None if request.param == "clean" else request.param)
    return request.param


@pytest.fixture
def scheduled(bug, msched_scheduler, num_streams):
    gm = myeng.model()
    original = copy.deepcopy(gm)
    return msched_scheduler(gm, num_streams) or gm, original


def test_schedule_graph(bug, schedule_graph):
    schedule_graph(myeng.model())


def test_captures_precede_output(scheduled):
    gm, _ = scheduled
    assert_captures_precede_output(gm, myeng.stashes(gm))


def test_exit_waits_on(scheduled):
    gm, _ = scheduled
    for stash in myeng.stashes(gm):
        assert_exit_waits_on(gm, stash)


def test_race_free(scheduled):
    assert_race_free(*scheduled)


def test_survives_recompile(scheduled):
    gm, _ = scheduled
    assert_survives_recompile(gm, myeng.stashes(gm), inputs=myeng.inputs())


def test_snapshot(schedule_graph, graph_snapshot):
    sched = schedule_graph(myeng.model())
    assert sched.gm == graph_snapshot


def test_lazy(schedule_graph, graph_snapshot, monkeypatch):
    monkeypatch.setattr(myeng, "LAZY", True)
    assert schedule_graph(myeng.model()) == graph_snapshot
"""

CONFTEST = """
import pytest

import myeng


@pytest.fixture(scope="session")
def msched_scheduler():
    return myeng.schedule


@pytest.fixture
def msched_dialect():
    return myeng.DIALECT
"""

INI = "[pytest]\npythonpath = .\nmsched_scheduler = myeng:schedule\n"

#: (test, bug) -> what its failure says; every other test passes.
FAILURES = {
    ("test_schedule_graph", "after_output"): r"\[after-output\] `stash_default_2` comes after",
    ("test_captures_precede_output", "after_output"): (
        r"stash_default_2 \(stream 1\) is emitted after output"
    ),
    ("test_exit_waits_on", "after_output"): r"does not wait for stash_default_2",
    ("test_race_free", "after_output"): r"\[after-output\] `stash_default_2`",
    ("test_survives_recompile", "after_output"): r"stash_default_2 .*comes after `return`",
    ("test_schedule_graph", "no_join"): (
        r"\[exit-not-joined\] output on stream 0 does not wait for `stash_default_2` on stream 1"
    ),
    ("test_exit_waits_on", "no_join"): (
        r"output on stream 0 does not wait for stash_default_2 \(stream 1\)"
    ),
    ("test_race_free", "no_join"): r"\[exit-not-joined\] .*`stash_default_2` on stream 1",
    ("test_schedule_graph", "war"): (
        r"\[race/war\] `scale__default` on stream 0 writes `mm`, which `stash_default` reads"
    ),
    ("test_race_free", "war"): r"\[race/war\] `scale__default` on stream 0 writes `mm`",
}


def _repository(pytester: pytest.Pytester, form: str) -> None:
    shutil.copy(ENGINE, pytester.path / "myeng.py")
    pytester.makepyfile(test_engine=TESTS)
    if form == "conftest":
        pytester.makeconftest(CONFTEST)
        pytester.makeini("[pytest]\npythonpath = .\n")
    elif form == "ini":
        pytester.makeini(INI + "msched_dialect = myeng:DIALECT\n")
    else:  # the scheduler only: its stream ops are read in no dialect
        pytester.makeini(INI)


def _sections(result: pytest.RunResult) -> dict[str, str]:
    """The text under FAILURES of each failed test, by ``test[params]``."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in result.outlines:
        header = re.fullmatch(r"_{3,} (\S+) _{3,}", line)
        if header is not None:
            current = sections.setdefault(header.group(1), [])
        elif re.fullmatch(r"=+ .* =+|-+ msched summary -+", line):
            current = None
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in sections.items()}


def _key(test_id: str) -> tuple[str, str]:
    name, _, params = test_id.partition("[")
    bug = next((b for b in BUGS if b in params), "")
    return name, bug


@pytest.mark.parametrize("form", ["ini", "conftest"])
@pytest.mark.parametrize(
    "workers",
    [pytest.param((), id="serial"), pytest.param(("-n", "2"), id="n2", marks=pytest.mark.slow)],
)
def test_every_helper_catches_every_bug_in_the_configured_dialect(
    pytester: pytest.Pytester, form: str, workers: tuple[str, ...]
) -> None:
    _repository(pytester, form)
    result = pytester.runpytest_subprocess(*workers, "--snapshot-update", *WITHOUT_HYPOTHESIS)
    sections = _sections(result)
    assert {_key(t) for t in sections} == set(FAILURES), sorted(sections)
    for test_id, text in sections.items():
        pattern = FAILURES[_key(test_id)]
        assert re.search(pattern, text), f"no /{pattern}/ in the failure of {test_id}:\n{text}"
    result.assert_outcomes(passed=4 * 5 + 2 - len(FAILURES), failed=len(FAILURES))
    assert "extra-node" not in result.stdout.str()
    # Point 5: counts by the streams asked for, and the lazy scheduler named.
    result.stdout.fnmatch_lines(
        [
            "graphs scheduled: 6 (streams3: 6)",
            "fewer streams used than requested: 1 graph: test_engine.py::test_lazy[[]streams3[]]"
            " (2 of 3)",
        ]
    )
    snapshots = pytester.path / "__snapshots__" / "test_engine"
    clean = (snapshots / "test_snapshot[streams3].msched.txt").read_text()
    lazy = (snapshots / "test_lazy[streams3].msched.txt").read_text()
    for text in (clean, lazy):
        assert text.startswith("# msched text format 2\n# streams 3, ")
    assert re.search(r"^s2 \|     stash_default_1 = myeng\.stash\.default\(", clean, re.M)
    assert "s2 |" not in lazy  # the lazy pass left stream 2 idle


def test_without_a_dialect_nothing_passes_and_every_check_says_why(
    pytester: pytest.Pytester,
) -> None:
    _repository(pytester, "scheduler-only")
    result = pytester.runpytest_subprocess(*WITHOUT_HYPOTHESIS)
    outcomes = result.parseoutcomes()
    assert "passed" not in outcomes, outcomes
    sections = _sections(result)
    assert len(sections) == 4 * 5 + 2
    for test_id, text in sections.items():
        assert "look like stream ops but the msched dialect does not read them" in text, test_id
        # Every graph has switches; the join is named where the pass emitted one (not no_join).
        assert "myeng::switch" in text and "msched_dialect = package.module:DIALECT" in text
        assert ("myeng::join" in text) == ("no_join" not in test_id), test_id
    assert "extra-node" not in result.stdout.str()


def test_each_test_reads_in_its_own_dialect_and_nothing_outlives_the_run(
    pytester: pytest.Pytester,
) -> None:
    """The session's dialect outside tests (session fixtures), the test's ``msched_dialect``
    fixture inside (a ``conftest.py`` override wins over the ini), and after the inner run
    this test's own again (none: detect)."""
    pytester.makeini("[pytest]\nmsched_dialect = tests.plugin.myeng:DIALECT\n")
    pytester.makeconftest(
        """
        import pytest

        import msched
        from pytest_msched._reading import configured_dialect

        SEEN = {}


        @pytest.fixture(scope="session")
        def early():
            SEEN["session"] = configured_dialect().label


        @pytest.fixture
        def msched_dialect(request):
            return "trtllm" if "override" in request.node.name else msched.Dialect()
        """
    )
    pytester.makepyfile(
        test_reading="""
        import conftest
        from pytest_msched._reading import configured_dialect


        def test_session(early):
            assert conftest.SEEN["session"] == "myeng"


        def test_override():
            assert configured_dialect().label == "trtllm"


        def test_plain():
            assert configured_dialect().label == "msched"
        """
    )
    pytester.runpytest("-p", "no:randomly").assert_outcomes(passed=3)
    assert configured_dialect() is None

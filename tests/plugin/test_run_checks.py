"""A run that cannot do what its options ask stops at once; dumps say where they are (issue 21).

Every option value is checked in ``pytest_configure`` (on a pytest-xdist controller, before
its workers start): a dump directory that is a file, or cannot be made, is a usage error
(exit 4) naming the option, instead of an internal error at the first failing test that
pytest-xdist could finish with exit status 0.  An exception in a hook of ours on a worker
fails the run.  The dumps of a failing test are named in its report and in the terminal
summary, and include an SVG with the violations drawn in red.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import msched
from pytest_msched._options import DEFAULT_STREAMS, Settings
from pytest_msched._session import MschedSession

WITHOUT_HYPOTHESIS = ("-p", "no:hypothesispytest")

FAILING = """
import pytest

pytestmark = pytest.mark.multistream(streams=[2])


def test_fails(decoder_stack, schedule_graph):
    schedule_graph(decoder_stack(n_layers=1, capture_layers=(0,), hidden=4, tokens=2).gm)
    assert False, "the test's own failure"


def test_passes():
    pass
"""

# The exit of a correct schedule loses its last wait: verify finds exit-not-joined only when
# the dump re-reads the graph as the test left it.
EXIT_WAIT_DELETED = """
import pytest
import torch

from pytest_msched import assert_exit_waits_on


def delete_last_wait(gm):
    ops = torch.ops.msched
    waiting = [
        n
        for n in gm.graph.nodes
        if n.target is ops.wait_event.default
        or (n.target is ops.set_stream.default and len(n.args) > 1)
    ]
    last = waiting[-1]
    if last.target is ops.wait_event.default:
        gm.graph.erase_node(last)
    else:
        kept = list(last.args[1][:-1])
        last.args = (last.args[0], kept) if kept else (last.args[0],)
    gm.recompile()


@pytest.mark.multistream(streams=[2])
def test_exit_wait_deleted(decoder_stack, schedule_graph):
    stack = decoder_stack(n_layers=4, capture_layers=(1, 3))
    sched = schedule_graph(stack.gm)
    delete_last_wait(sched.gm)
    assert_exit_waits_on(sched.gm, stack.captures[-1])
"""

STEM = "test_exit.py_test_exit_wait_deleted_streams2.0"


@pytest.mark.parametrize(
    ("ini", "cli", "message"),
    [
        (None, "--msched-dump=FILE", "ERROR: --msched-dump: */FILE is a file, not a directory;"),
        (
            None,
            "--msched-dump=FILE/sub",
            "ERROR: --msched-dump: cannot make the directory */FILE/sub: */FILE is a file; "
            "got 'FILE/sub'",
        ),
        ("msched_dump = FILE", None, "ERROR: ini option msched_dump: */FILE is a file, not a*"),
    ],
)
def test_a_dump_path_that_cannot_be_a_directory_is_a_usage_error(
    pytester: pytest.Pytester, ini: str | None, cli: str | None, message: str
) -> None:
    (pytester.path / "FILE").write_text("not a directory\n")
    if ini is not None:
        pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_fails=FAILING)
    result = pytester.runpytest(*([cli] if cli else []))
    result.stderr.fnmatch_lines([message + "*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (pytester.path / "FILE").read_text() == "not a directory\n"


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_dump_directory_is_a_usage_error(pytester: pytest.Pytester) -> None:
    locked = pytester.path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        pytester.makepyfile(test_fails=FAILING)
        result = pytester.runpytest("--msched-dump=locked/dumps")
    finally:
        locked.chmod(0o700)
    result.stderr.fnmatch_lines(["ERROR: --msched-dump: cannot make the directory *"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_a_dump_path_that_is_a_file_fails_the_run_under_xdist(pytester: pytest.Pytester) -> None:
    """The controller checks the value before its workers start."""
    (pytester.path / "FILE").write_text("")
    pytester.makepyfile(test_fails=FAILING)
    result = pytester.runpytest_subprocess("-n", "2", "--msched-dump=FILE", *WITHOUT_HYPOTHESIS)
    result.stderr.fnmatch_lines(["ERROR: --msched-dump: */FILE is a file, not a directory*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


BROKEN_HOOK = """
from pytest_msched._session import MschedSession


def _broken(self, item, report):
    raise RuntimeError("an injected bug in a hook of pytest-msched")


MschedSession.after_report = _broken
"""


@pytest.mark.parametrize(
    "xdist",
    [pytest.param(False, id="serial"), pytest.param(True, id="xdist", marks=pytest.mark.slow)],
)
def test_an_exception_in_a_hook_of_ours_fails_the_run(
    pytester: pytest.Pytester, xdist: bool
) -> None:
    pytester.makeconftest(BROKEN_HOOK)
    pytester.makepyfile(test_fails=FAILING.replace('assert False, "the test\'s own failure"', ""))
    args = ("-n", "2", *WITHOUT_HYPOTHESIS) if xdist else ()
    result = pytester.runpytest_subprocess(*args)
    result.stdout.fnmatch_lines(["*RuntimeError: an injected bug in a hook of pytest-msched*"])
    assert result.ret not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)


def test_a_worker_that_had_an_internal_error_fails_the_run(pytestconfig: pytest.Config) -> None:
    """Whatever pytest-xdist makes of a worker's internal error, the controller does not end
    the run with exit status 0 and says why in the summary."""
    settings = Settings(DEFAULT_STREAMS, "strict", None, msched.schedule)
    session = MschedSession(pytestconfig, settings)
    worker = SimpleNamespace(workeroutput={"exitstatus": 3}, gateway=SimpleNamespace(id="gw1"))
    healthy = SimpleNamespace(workeroutput={"exitstatus": 0}, gateway=SimpleNamespace(id="gw0"))
    pytest_session = SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    session.collect(healthy)
    with session.finishing(pytest_session):  # type: ignore[arg-type]
        pass
    assert pytest_session.exitstatus == pytest.ExitCode.OK
    session.collect(worker)
    with session.finishing(pytest_session):  # type: ignore[arg-type]
        pass
    assert pytest_session.exitstatus == pytest.ExitCode.INTERNAL_ERROR
    assert session._broken_lines() == [
        "pytest-xdist worker gw1 had an internal error: the run fails (exit status 3)"
    ]


def _dump_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.parametrize(
    "xdist",
    [pytest.param(False, id="serial"), pytest.param(True, id="xdist", marks=pytest.mark.slow)],
)
def test_the_paths_of_dumps_are_printed(pytester: pytest.Pytester, xdist: bool) -> None:
    pytester.makepyfile(test_exit=EXIT_WAIT_DELETED)
    args = ("-n", "2", *WITHOUT_HYPOTHESIS) if xdist else ()
    result = pytester.runpytest_subprocess("--msched-dump=dumps", *args)
    result.assert_outcomes(failed=1)
    dumps = (pytester.path / "dumps").resolve()
    files = [f"{dumps / STEM}{suffix}" for suffix in (".dot", ".trace.json", ".svg")]
    result.stdout.fnmatch_lines(
        ["*- msched dump -*", f"wrote to {dumps}:", *(f"  {f}" for f in files)]
    )
    result.stdout.fnmatch_lines(
        [
            "*- msched summary -*",
            "dumps of failing tests: 3 files",
            "  test_exit.py::test_exit_wait_deleted[[]streams2[]]:",
            *(f"    {f}" for f in files),
        ]
    )
    assert _dump_files(dumps) == sorted(Path(f).name for f in files)


def test_the_dumped_svg_draws_the_violation_in_red(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_exit=EXIT_WAIT_DELETED)
    pytester.runpytest("--msched-dump=dumps").assert_outcomes(failed=1)
    svg = (pytester.path / "dumps" / f"{STEM}.svg").read_text()
    assert svg.startswith("<svg")
    # exit-not-joined names the capture and output: both outlined, one dashed red line.
    assert svg.count('class="violation"') == 2
    assert svg.count('class="violationlink"') == 1
    assert "<title>capture_3, output</title>" in svg


def test_a_dump_that_cannot_be_written_is_said_and_the_test_stays_failed(
    pytester: pytest.Pytester,
) -> None:
    """The directory is checked when the run starts; a test that puts a file there later
    gets a line in its report, not an internal error."""
    pytester.makepyfile(
        test_fails=FAILING.replace(
            "    assert False",
            "    import pathlib\n    pathlib.Path('dumps').write_text('')\n    assert False",
        )
    )
    result = pytester.runpytest("--msched-dump=dumps")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*- msched dump -*", "could not write the dump: *dumps*"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    assert result.ret == pytest.ExitCode.TESTS_FAILED

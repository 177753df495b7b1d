"""A downstream repository's view of the plugin: fixtures, helpers, snapshots, xdist, sabotage.

``DOWNSTREAM`` is the kind of test an inference engine would write for its Eagle3 decoder:
12 layers, captures of layers 1, 5 and 11 (the last one is what a scheduler used to drop).
The snapshot lifecycle runs in-process; the xdist runs are subprocesses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

DOWNSTREAM = """
import pytest
import torch

from pytest_msched import (
    assert_captures_precede_output,
    assert_exit_waits_on,
    assert_race_free,
    assert_survives_recompile,
)

{cost_model}


@pytest.mark.multistream
def test_eagle3_decoder(decoder_stack, schedule_graph, graph_snapshot):
    stack = decoder_stack(n_layers=12, capture_layers=(1, 5, 11))
    sched = schedule_graph(stack.gm, cost_model=COST_MODEL)
    assert_captures_precede_output(sched.gm, stack.captures)
    for capture in stack.captures:
        assert_exit_waits_on(sched.gm, capture)
    assert_race_free(sched.gm, sched.original)
    x, dest = stack.example_inputs()
    assert_survives_recompile(sched.gm, stack.captures, inputs=(x, dest))
    assert torch.equal(dest, stack.reference()[1])
    assert sched == graph_snapshot
"""

DEFAULT_COST = "COST_MODEL = None"
# Expensive captures: the scheduler places them differently, so the snapshots change.
EXPENSIVE_CAPTURES = """
import msched

class ExpensiveCaptures(msched.DefaultCostModel):
    def cost(self, node):
        return 40.0 if node.name.startswith("capture") else super().cost(node)

COST_MODEL = ExpensiveCaptures()
"""
# The inner suites do not use hypothesis; its plugin costs a second in each xdist process.
WITHOUT_HYPOTHESIS = ("-p", "no:hypothesispytest")
SNAPSHOT_NAMES = [
    "test_eagle3_decoder[streams2].msched.txt",
    "test_eagle3_decoder[streams3].msched.txt",
]
SUMMARY = [
    "*- msched summary -*",
    "graphs scheduled: 2 (streams2: 1, streams3: 1)",
    "total waits: *",
    "violations: 0",
]


def _write_downstream(pytester: pytest.Pytester, cost_model: str = DEFAULT_COST) -> Path:
    pytester.makepyfile(test_downstream=DOWNSTREAM.format(cost_model=cost_model))
    return pytester.path / "__snapshots__" / "test_downstream"


def _snapshots(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.glob("*"))}


def test_snapshot_lifecycle(pytester: pytest.Pytester) -> None:
    snapshots = _write_downstream(pytester)

    missing = pytester.runpytest()
    missing.assert_outcomes(failed=2)
    missing.stdout.fnmatch_lines(["*2 snapshots failed*"])

    created = pytester.runpytest("--snapshot-update", "-v")
    created.assert_outcomes(passed=2)
    created.stdout.fnmatch_lines(["*2 snapshots generated*"])
    written = _snapshots(snapshots)
    assert sorted(written) == SNAPSHOT_NAMES
    assert written[SNAPSHOT_NAMES[1]].startswith("# msched text format 2\n# streams 3, events ")
    assert "capture_11 = msched.inplace_slice_copy" in written[SNAPSHOT_NAMES[1]]

    again = pytester.runpytest("-v")
    again.assert_outcomes(passed=2)
    again.stdout.fnmatch_lines(SUMMARY)
    again.stdout.fnmatch_lines(["*2 snapshots passed*"])
    assert _snapshots(snapshots) == written

    _write_downstream(pytester, EXPENSIVE_CAPTURES)
    changed = pytester.runpytest("-vv")
    changed.assert_outcomes(failed=2)
    changed.stdout.fnmatch_lines(
        [
            "*test_eagle3_decoder[[]streams2[]]*",
            "E       assert [[]+ received[]] == [[]- snapshot[]]",
            "E         @@ -1,* +1,* @@",
            "E         - # streams 2, events *, waits *",
            "E         + # streams 2, events *, waits *",
            "E         @@ -* +* @@",
            "E         [-+] s[0-2] | *",
        ]
    )
    assert _snapshots(snapshots) == written


@pytest.mark.slow
def test_xdist_same_ids_and_snapshots(pytester: pytest.Pytester) -> None:
    """Under ``-n 2 --snapshot-update`` the suite passes with the serial ids and snapshots.

    One xdist run checks both acceptance points: with ``--snapshot-update`` syrupy still
    compares first, so "2 snapshots passed" (nothing updated, generated or deleted) means each
    worker rendered exactly the serially written text, and the files must survive although
    each worker ran only some of the tests.
    """
    snapshots = _write_downstream(pytester)
    pytester.runpytest("--snapshot-update").assert_outcomes(passed=2)
    serial = _snapshots(snapshots)

    args = ("-n", "2", "-v", "--snapshot-update", *WITHOUT_HYPOTHESIS)
    parallel = pytester.runpytest_subprocess(*args)
    parallel.assert_outcomes(passed=2)
    for test_id in ("streams2", "streams3"):
        parallel.stdout.fnmatch_lines([f"*PASSED *::test_eagle3_decoder[[]{test_id}[]]*"])
    parallel.stdout.fnmatch_lines(SUMMARY)
    parallel.stdout.fnmatch_lines(["*snapshot report summary*", "2 snapshots passed."])
    for word in ("updated", "generated", "deleted", "unused"):
        parallel.stdout.no_fnmatch_line(f"*snapshot* {word}*")
    assert parallel.stdout.str().count("msched summary") == 1
    assert _snapshots(snapshots) == serial


SABOTAGE = """
import pytest
import torch

import msched
from pytest_msched import (
    assert_captures_precede_output,
    assert_exit_waits_on,
    assert_race_free,
    assert_survives_recompile,
)


def move_last_capture_after_output(stack, sched):
    sched.gm.graph.output_node().append(stack.captures[-1])
    sched.gm.recompile()


def delete_wait_before_output(gm):
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
    else:  # a switch that waits: drop its last event
        kept = list(last.args[1][:-1])
        last.args = (last.args[0], kept) if kept else (last.args[0],)
    gm.recompile()


@pytest.fixture
def scheduled(decoder_stack, schedule_graph):
    stack = decoder_stack(n_layers=4, capture_layers=(1, 3))
    return stack, schedule_graph(stack.gm)


pytestmark = pytest.mark.multistream(streams=[2])


def test_capture_after_output(scheduled):
    stack, sched = scheduled
    move_last_capture_after_output(stack, sched)
    assert_captures_precede_output(sched.gm, stack.captures)


def test_capture_after_return(scheduled):
    stack, sched = scheduled
    move_last_capture_after_output(stack, sched)
    assert_survives_recompile(sched.gm, stack.captures, inputs=stack.example_inputs())


def test_exit_wait_deleted(scheduled):
    stack, sched = scheduled
    delete_wait_before_output(sched.gm)
    assert_exit_waits_on(sched.gm, stack.captures[-1])


def test_exit_wait_deleted_race(scheduled):
    stack, sched = scheduled
    delete_wait_before_output(sched.gm)
    assert_race_free(sched.gm, sched.original)


def test_schedule_graph_verifies(decoder_stack, schedule_graph, monkeypatch):
    def broken_schedule(gm, num_streams, cost_model=None):
        sched = msched.schedule(gm, num_streams, cost_model)
        delete_wait_before_output(sched.gm)
        return sched

    monkeypatch.setattr("msched.testing.checks.schedule", broken_schedule)
    schedule_graph(decoder_stack(n_layers=4, capture_layers=(1, 3)).gm)
"""

SABOTAGE_MESSAGES = {
    "test_capture_after_output": [
        "E       AssertionError: capture_3 (stream 0) is emitted after output: in the recompiled "
        "module it follows `return` and never runs: move it before output",
        "E         > s0 | output(mul_tensor_*)",
        "E         > s0 | capture_3 = msched.inplace_slice_copy.default(dest=dest, *)",
    ],
    "test_capture_after_return": [
        "E       AssertionError: capture_3 (stream 0) comes after `return` in the recompiled code*",
        "E               return mul_tensor_*",
        "E               capture_3 = torch.ops.msched.inplace_slice_copy.default(*",
    ],
    "test_exit_wait_deleted": [
        "E       AssertionError: output on stream 0 does not wait for capture_3 (stream 1): *",
        "E         > s1 |   capture_3 = msched.inplace_slice_copy.default(*",
        "E         > s0 | output(mul_tensor_*)",
    ],
    "test_exit_wait_deleted_race": [
        "E       AssertionError: schedule has 1 violation (* nodes on 2 streams):",
        "E         [[]exit-not-joined[]] output on stream 0 does not wait for `capture_3` on "
        "stream 1*",
        "E         > s1 |   capture_3 = msched.inplace_slice_copy.default(*",
    ],
    "test_schedule_graph_verifies": [
        "msched.verify found violations in the schedule:",
        "  [[]exit-not-joined[]] output on stream 0 does not wait for `capture_3` on stream 1*",
        "  > s1 |   capture_3 = msched.inplace_slice_copy.default(*",
    ],
}


def test_sabotaged_schedules_fail_naming_capture_and_stream(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sabotage=SABOTAGE)
    result = pytester.runpytest("--msched-dump=dumps")
    result.assert_outcomes(failed=5)
    for name, lines in SABOTAGE_MESSAGES.items():
        result.stdout.fnmatch_lines([f"*_ {name}[[]streams2[]] _*", *lines])
    result.stdout.fnmatch_lines(["graphs scheduled: 5 (streams2: 5)", "violations: 1"])
    dumped = sorted(p.name for p in (pytester.path / "dumps").iterdir())
    assert dumped == sorted(
        f"test_sabotage.py_{name}_streams2.0{suffix}"
        for name in SABOTAGE_MESSAGES
        for suffix in (".dot", ".svg", ".trace.json")
    )
    assert (pytester.path / "dumps" / dumped[0]).read_text().startswith("digraph")


def test_verify_off_skips_verification(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_sabotage=SABOTAGE)
    result = pytester.runpytest("--msched-verify=off", "-k", "schedule_graph_verifies")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["violations: 0 (1 graph not verified: --msched-verify=off)"])


@pytest.mark.parametrize(
    ("ini", "cli", "verified", "dump_dir"),
    [
        pytest.param("msched_verify = off", [], False, None, id="ini-verify-off"),
        pytest.param("msched_verify = off", ["--msched-verify=strict"], True, None, id="cli-wins"),
        pytest.param("msched_verify = strict", ["--msched-verify=off"], False, None, id="cli-off"),
        pytest.param("msched_dump = ini_dumps", [], True, "ini_dumps", id="ini-dump"),
        pytest.param(
            "msched_dump = ini_dumps", ["--msched-dump=cli_dumps"], True, "cli_dumps", id="cli-dump"
        ),
        pytest.param("msched_dump = ini_dumps", ["--msched-dump="], True, None, id="cli-no-dump"),
    ],
)
def test_verify_and_dump_ini_options_yield_to_the_command_line(
    pytester: pytest.Pytester, ini: str, cli: list[str], verified: bool, dump_dir: str | None
) -> None:
    pytester.makeini(f"[pytest]\n{ini}\n")
    pytester.makepyfile(test_sabotage=SABOTAGE)
    result = pytester.runpytest("-k", "schedule_graph_verifies", *cli)
    if verified:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["msched.verify found violations in the schedule:"])
        result.stdout.fnmatch_lines(["violations: 1"])
    else:
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(["violations: 0 (1 graph not verified: --msched-verify=off)"])
    dumps = sorted(p.name for p in pytester.path.iterdir() if p.name.endswith("_dumps"))
    assert dumps == ([dump_dir] if dump_dir else [])
    if dump_dir:
        files = sorted(p.name for p in (pytester.path / dump_dir).iterdir())
        stem = "test_sabotage.py_test_schedule_graph_verifies_streams2.0"
        assert files == [f"{stem}.dot", f"{stem}.svg", f"{stem}.trace.json"]


def test_ini_dump_directory_is_relative_to_the_rootdir(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmsched_dump = dumps\n")
    pytester.makepyfile(test_sabotage=SABOTAGE)
    (pytester.path / "sub").mkdir()
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(pytester.path / "sub")
        result = pytester.runpytest(str(pytester.path), "-k", "schedule_graph_verifies")
    result.assert_outcomes(failed=1)
    assert [p.name for p in (pytester.path / "dumps").iterdir()]
    assert not (pytester.path / "sub" / "dumps").exists()

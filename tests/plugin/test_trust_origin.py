"""Trust, round two: an engine repository reads every graph in the dialect it was made in.

The repository is the one of ``test_trust`` (the `tests.plugin.myeng` engine, its pass and
its dialect in the ini) plus what a real one also has: its model's own stream code checked
with the ``trace_streams`` fixture (PyTorch's ``torch`` dialect, at the Dynamo and AOT stages
and as Inductor's kernel order), a test that runs msched's own scheduler and a snapshot of
each.  The configured ``msched_dialect`` is the default for graphs that do not say otherwise;
a graph msched made is read in its own.  Green with ``pytest tests``, ``--snapshot-update``
and ``-n 2``; a graph of the engine's stream ops read in msched's dialect is still an error.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ENGINE = Path(__file__).with_name("myeng.py")
WITHOUT_HYPOTHESIS = ("-p", "no:hypothesispytest")
INI = (
    "[pytest]\npythonpath = .\ntestpaths = tests\nmsched_scheduler = myeng:schedule\n"
    "msched_dialect = myeng:DIALECT\n"
)

TESTS = """
import copy

import pytest
import torch

import msched
import myeng
from msched.models.decoders import decoder_stack
from pytest_msched import (
    assert_capture_safe,
    assert_exit_waits_on,
    assert_race_free,
    assert_survives_recompile,
)

side = torch.Stream(device="cpu")


def model_stream_code(x, buf):
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        buf.copy_(x * 2)
    caller.wait_stream(side)
    return x + 1


def joined(x):
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x.relu() * 2
    caller.wait_stream(side)
    return y + 1


def _copy(gm):
    return next(n for n in gm.graph.nodes if "copy" in n.name)


@pytest.mark.multistream(streams=[3])
def test_engine_pass(schedule_graph, graph_snapshot):
    sched = schedule_graph(myeng.model())
    assert sched.gm == graph_snapshot


@pytest.mark.multistream(streams=[3])
def test_engine_helpers(msched_scheduler, num_streams):
    gm = myeng.model()
    original = copy.deepcopy(gm)
    msched_scheduler(gm, num_streams)
    assert_race_free(gm, original)
    for stash in myeng.stashes(gm):
        assert_exit_waits_on(gm, stash)
    assert_capture_safe(gm)
    # Still read in the engine's dialect only because it is configured: in msched's, an error.
    with pytest.raises(msched.UnreadStreamOpsError, match="myeng::switch"):
        assert_race_free(gm, original, dialect=msched.Dialect())


def test_traced_model(trace_streams, graph_snapshot):
    gm = trace_streams(model_stream_code, torch.randn(4), torch.zeros(4))
    assert_exit_waits_on(gm, _copy(gm))
    assert_capture_safe(gm)
    assert msched.verify(gm).ok
    assert gm == graph_snapshot


def test_traced_model_after_aot(trace_streams):
    # No snapshot: AOT numbers the getitems of control_deps differently from one process
    # to the next (what ran there before), so its text is not stable across xdist workers.
    gm = trace_streams(model_stream_code, torch.randn(4), torch.zeros(4), stage="aot")
    assert_exit_waits_on(gm, _copy(gm))
    assert_capture_safe(gm)


def test_traced_kernel_order(trace_streams, graph_snapshot):
    gm = trace_streams(joined, torch.randn(4), stage="inductor")
    assert_capture_safe(gm)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    for kernel in output.all_input_nodes:
        assert_exit_waits_on(gm, kernel)
    assert gm == graph_snapshot


@pytest.mark.multistream(streams=[2])
def test_msched_scheduler_in_an_engine_repository(schedule_graph, graph_snapshot):
    stack = decoder_stack(4, (1, 3))
    sched = schedule_graph(stack.gm)
    for capture in stack.captures:
        assert_exit_waits_on(sched.gm, capture.name)
    assert_survives_recompile(sched.gm, [c.name for c in stack.captures])
    assert sched.gm == graph_snapshot


@pytest.fixture
def msched_scheduler(request):
    if "msched_scheduler_in" in request.node.name:
        return msched.schedule
    return myeng.schedule
"""


def _repository(pytester: pytest.Pytester) -> None:
    shutil.copy(ENGINE, pytester.path / "myeng.py")
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_model.py").write_text(TESTS)
    pytester.makeini(INI)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*args, *WITHOUT_HYPOTHESIS, "-p", "no:randomly")


def test_an_engine_repository_reads_each_graph_in_its_own_dialect(
    pytester: pytest.Pytester,
) -> None:
    _repository(pytester)
    passed = 6
    _run(pytester, "tests", "--snapshot-update").assert_outcomes(passed=passed)
    snapshots = pytester.path / "tests" / "__snapshots__" / "test_model"
    texts = {p.name: p.read_text() for p in sorted(snapshots.iterdir())}
    assert len(texts) == 4, sorted(texts)
    assert "myeng.stash.default(" in texts["test_engine_pass[streams3].msched.txt"]
    traced = texts["test_traced_model.msched.txt"]
    assert "# streams 2," in traced and "copy_" in traced
    assert "= kernel(reads=" in texts["test_traced_kernel_order.msched.txt"]
    assert (
        "msched.inplace_slice_copy"
        in texts["test_msched_scheduler_in_an_engine_repository[streams2].msched.txt"]
    )
    _run(pytester, "tests").assert_outcomes(passed=passed)
    result = _run(pytester, "tests", "-n", "2")
    result.assert_outcomes(passed=passed)
    result.stdout.fnmatch_lines(["graphs scheduled: 2 (streams2: 1, streams3: 1)"])

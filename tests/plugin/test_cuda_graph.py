"""The plugin and CUDA-graph capture: the ``msched_cuda_graph`` option (ini and command line)
makes ``schedule_graph`` check the capture rules; the helper ``assert_capture_safe``."""

from __future__ import annotations

import re

import pytest

TESTS = """
import torch

import msched
from msched.models.decoders import decoder_stack
from pytest_msched import assert_capture_safe


def stack_with(op):
    stack = decoder_stack(4, (1, 3))
    graph = stack.gm.graph
    x = next(n for n in graph.nodes if n.op == "placeholder")
    out = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(out):
        graph.create_node("call_function", op, (x,), name="host_read")
    stack.gm.recompile()
    return stack.gm


def test_a_host_sync_in_the_model(schedule_graph):
    schedule_graph(stack_with(torch.ops.aten.nonzero.default))


def test_a_device_only_op_in_the_model(schedule_graph):
    schedule_graph(stack_with(torch.ops.aten.relu.default))


def test_helper_on_the_schedule(schedule_graph):
    sched = schedule_graph(decoder_stack(4, (1, 3)).gm)
    assert_capture_safe(sched.gm)


def test_helper_on_a_host_read():
    gm = stack_with(torch.ops.aten._local_scalar_dense.default)
    msched.schedule(gm, 2)
    assert_capture_safe(gm)
"""


@pytest.mark.parametrize(
    ("ini", "args", "capture"),
    [
        (None, (), False),
        ("msched_cuda_graph = on", (), True),
        ("msched_cuda_graph = true", ("--msched-cuda-graph=off",), False),
        (None, ("--msched-cuda-graph",), True),
        ("msched_cuda_graph = off", ("--msched-cuda-graph=yes",), True),
    ],
    ids=["default", "ini", "cli-off-wins", "flag", "cli-on-wins"],
)
def test_msched_cuda_graph_makes_schedule_graph_check_capture(
    pytester: pytest.Pytester, ini: str | None, args: tuple[str, ...], capture: bool
) -> None:
    pytester.makeini("[pytest]\n" + (ini or "") + "\n")
    pytester.makepyfile(test_capture=TESTS)
    result = pytester.runpytest("-p", "no:randomly", *args)
    # Streams 2 and 3 for each schedule_graph test; the helper on a host read fails always.
    failed = 3 if capture else 1
    result.assert_outcomes(passed=7 - failed, failed=failed)
    # The failure sections only: under a CI variable (CI, BUILD_NUMBER) pytest repeats each
    # failure's whole message in its short test summary.
    out = result.stdout.str().split("short test summary info")[0]
    assert re.search(r"\[capture-sync\] `host_read` \(aten::_local_scalar_dense, stream \d\)", out)
    synced = re.findall(
        r"\[capture-sync\] `host_read` \(aten::nonzero, stream \d\) has an output", out
    )
    assert len(synced) == (2 if capture else 0)


@pytest.mark.parametrize(
    ("ini", "cli", "message"),
    [
        (None, "--msched-cuda-graph=maybe", "ERROR: --msched-cuda-graph: expected on or off*"),
        ("msched_cuda_graph = 2", None, "ERROR: ini option msched_cuda_graph: expected on or off*"),
    ],
)
def test_bad_msched_cuda_graph_values_are_usage_errors(
    pytester: pytest.Pytester, ini: str | None, cli: str | None, message: str
) -> None:
    pytester.makeini("[pytest]\n" + (ini or "") + "\n")
    pytester.makepyfile("def test_it():\n    pass\n")
    result = pytester.runpytest(*([cli] if cli else []))
    result.stderr.fnmatch_lines([message])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_the_help_lists_the_option(pytester: pytest.Pytester) -> None:
    text = " ".join(pytester.runpytest("--help").stdout.str().split())
    assert "--msched-cuda-graph=[on|off]" in text or "--msched-cuda-graph [on|off]" in text
    assert "msched_cuda_graph (string): on: schedule_graph also checks the CUDA-graph" in text

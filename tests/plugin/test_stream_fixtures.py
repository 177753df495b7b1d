"""The ``trace_streams`` fixture: a model's own stream code verified inside a downstream test."""

from __future__ import annotations

import pytest

MODEL_TESTS = """
import pytest
import torch
import msched

side = torch.Stream(device="cpu")


def shared_expert(x, join):
    caller = torch.accelerator.current_stream()
    side.wait_stream(caller)
    with side:
        y = x.relu() * 2
    if join:
        caller.wait_stream(side)
    return y + 1


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
def test_joined(trace_streams, stage):
    gm = trace_streams(lambda x: shared_expert(x, True), torch.randn(4), stage=stage)
    assert msched.verify(gm).ok


def test_not_joined(trace_streams):
    gm = trace_streams(lambda x: shared_expert(x, False), torch.randn(4))
    report = msched.verify(gm)
    assert report.ok, str(report)


def test_untraceable(trace_streams):
    trace_streams(lambda x: torch._dynamo.graph_break() or x, torch.randn(4))
"""


def test_trace_streams_fixture_traces_counts_and_fails_clearly(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MODEL_TESTS)
    result = pytester.runpytest("-p", "pytest_msched.stream_fixtures", "-v")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*race*`add` on stream 0 uses `y` without waiting*",
            "*trace_streams: cannot trace * in one graph: Unsupported*",
            "*graphs traced (trace_streams): 3, up to 2 streams, 5 waits*",
        ]
    )


@pytest.mark.slow
def test_the_fixture_reads_inductors_final_order(trace_streams) -> None:
    import torch

    import msched
    from msched.compile.kernel_order import kernel_names

    side = torch.Stream(device="cpu")

    def joined(x):
        caller = torch.accelerator.current_stream()
        side.wait_stream(caller)
        with side:
            y = x.relu() * 2
        caller.wait_stream(side)
        return y + 1

    gm = trace_streams(joined, torch.randn(4), stage="inductor")
    assert kernel_names(gm) and msched.verify(gm).ok

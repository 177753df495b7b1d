"""The plugin and memory: the ``msched_memory_budget`` option (ini and command line) that
``schedule_graph`` honours, and the helper ``assert_peak_memory`` (issue 42, part 2)."""

from __future__ import annotations

import pytest

TESTS = """
import functools

import pytest

import msched
from msched.models.decoders import decoder_stack
from pytest_msched import assert_peak_memory

KW = dict(n_layers=2, capture_layers=(0, 1), hidden=64, tokens=32)


def test_within_the_original_memory(schedule_graph):
    stack = decoder_stack(**KW)
    inputs = stack.example_inputs()
    sched = schedule_graph(stack.gm, example_inputs=inputs)
    assert_peak_memory(sched, at_most=1.0, example_inputs=inputs)
"""

OTHER_SCHEDULER = """
import pytest

import msched


def unbudgeted(gm, num_streams):
    msched.schedule(gm, num_streams)


@pytest.fixture(scope="session")
def msched_scheduler():
    return unbudgeted
"""

OTHER_TEST = """
from msched.models.decoders import decoder_stack


def test_another_scheduler(schedule_graph):
    stack = decoder_stack(n_layers=2, capture_layers=(0, 1), hidden=64, tokens=32)
    schedule_graph(stack.gm, example_inputs=stack.example_inputs())
"""


@pytest.mark.parametrize(
    ("ini", "args", "within"),
    [
        (None, (), False),
        ("msched_memory_budget = 1.0", (), True),
        ("msched_memory_budget = 3", ("--msched-memory-budget=1",), True),
        ("msched_memory_budget = 1.0", ("--msched-memory-budget=none",), False),
    ],
    ids=["default", "ini", "cli-wins", "cli-none-wins"],
)
def test_msched_memory_budget_makes_schedule_graph_keep_within_it(
    pytester: pytest.Pytester, ini: str | None, args: tuple[str, ...], within: bool
) -> None:
    pytester.makeini("[pytest]\n" + (ini or "") + "\n")
    pytester.makepyfile(test_budget=TESTS)
    result = pytester.runpytest("-p", "no:randomly", *args)
    if within:
        result.assert_outcomes(passed=2)
        return
    result.assert_outcomes(failed=2)  # streams 2 and 3: 2x and 3x the original's pools
    out = " ".join(result.stdout.str().split("short test summary info")[0].split())
    assert "the schedule may reserve 4.00 MiB (4194304 bytes) under some timing" in out
    assert "(reserved_bound, 2.000 x the original's), over at_most 1 x the original" in out
    assert "pools: stream 0: 2.00 MiB (2097152 bytes), stream 1: 2.00 MiB" in out


def test_another_scheduler_over_the_budget_fails_the_test(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmsched_memory_budget = 1.5\n")
    pytester.makeconftest(OTHER_SCHEDULER)
    pytester.makepyfile(test_other=OTHER_TEST)
    result = pytester.runpytest("-p", "no:randomly", "--msched-streams=2")
    result.assert_outcomes(failed=1)
    out = " ".join(result.stdout.str().split("short test summary info")[0].split())
    assert "the scheduler conftest.unbudgeted breaks msched_memory_budget=1.5: the" in out
    assert "2.000 x the original's" in out


@pytest.mark.parametrize(
    ("ini", "cli", "message"),
    [
        (None, "--msched-memory-budget=0.5", "ERROR: --msched-memory-budget: expected a ratio*"),
        ("msched_memory_budget = lots", None, "ERROR: ini option msched_memory_budget: expected*"),
    ],
)
def test_bad_msched_memory_budget_values_are_usage_errors(
    pytester: pytest.Pytester, ini: str | None, cli: str | None, message: str
) -> None:
    pytester.makeini("[pytest]\n" + (ini or "") + "\n")
    pytester.makepyfile("def test_it():\n    pass\n")
    result = pytester.runpytest(*([cli] if cli else []))
    result.stderr.fnmatch_lines([message])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_the_help_lists_the_option(pytester: pytest.Pytester) -> None:
    text = " ".join(pytester.runpytest("--help").stdout.str().split())
    assert "--msched-memory-budget=RATIO" in text or "--msched-memory-budget RATIO" in text
    assert "msched_memory_budget (string): the memory budget of schedule_graph" in text


HELPER = """
import pytest

import msched
from msched.models.decoders import decoder_stack
from pytest_msched import assert_peak_memory

KW = dict(n_layers=2, capture_layers=(0, 1), hidden=64, tokens=32)
MIB = 1024 * 1024


def scheduled(streams):
    stack = decoder_stack(**KW)
    return msched.schedule(stack.gm, streams), stack.example_inputs()


def test_bytes_pass():
    sched, inputs = scheduled(2)
    assert_peak_memory(sched.gm, at_most=4 * MIB, example_inputs=inputs)


def test_bytes_fail():
    sched, inputs = scheduled(2)
    assert_peak_memory(sched.gm, at_most=3 * MIB, example_inputs=inputs)


def test_ratio_pass():
    sched, inputs = scheduled(3)
    assert_peak_memory(sched, at_most=3.0, example_inputs=inputs)


def test_ratio_against_an_original_given():
    sched, inputs = scheduled(1)
    assert_peak_memory(sched.gm, at_most=1.0, original=sched.original, example_inputs=inputs)


def test_ratio_fail():
    sched, inputs = scheduled(3)
    assert_peak_memory(sched, at_most=2.5, example_inputs=inputs)


def test_a_ratio_needs_the_original():
    sched, inputs = scheduled(2)
    with pytest.raises(msched.InvalidArgumentError, match="pass a msched.Schedule"):
        assert_peak_memory(sched.gm, at_most=1.0, example_inputs=inputs)


def test_bad_limits():
    sched, inputs = scheduled(2)
    for bad in (0.5, -1, True, "1"):
        with pytest.raises(msched.InvalidArgumentError, match="at_most is bytes"):
            assert_peak_memory(sched, at_most=bad, example_inputs=inputs)


def test_sizes_are_needed():
    sched, _ = scheduled(2)
    with pytest.raises(msched.InvalidArgumentError, match="example_inputs"):
        assert_peak_memory(sched.gm, at_most=4 * MIB)
"""


def test_assert_peak_memory_passes_and_fails_readably(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_helper=HELPER)
    result = pytester.runpytest("-p", "no:randomly")
    result.assert_outcomes(passed=6, failed=2)
    out = " ".join(result.stdout.str().split("short test summary info")[0].split())
    assert (
        "AssertionError: the schedule may reserve 4.00 MiB (4194304 bytes) under some timing "
        "(reserved_bound), over at_most 3.00 MiB (3145728 bytes)" in out
    )
    assert (
        "(reserved_bound, 3.000 x the original's), over at_most 2.5 x the original order's "
        "2.00 MiB (2097152 bytes) = 5.00 MiB (5242880 bytes)" in out
    )
    assert "fewer streams or msched.schedule(..., memory_budget=...) lower it" in out

"""A failing assertion helper says what is wrong, in correct English, and nothing else.

Each helper fails in a pytest subprocess (as in a downstream repository, where pytest loads
the plugin from its entry point), with one offender and with two where it takes several:
the failure is the helper's message alone, with verbs and nouns that agree with the number
of offenders, at the test's line; no ``where False = ...`` or ``assert not [...]`` from
assertion rewriting, and no line of the helper's own code.
"""

from __future__ import annotations

import re

import pytest

INNER = """
import pytest
import torch

import msched
from msched.models.decoders import decoder_stack
from pytest_msched import (
    assert_capture_safe,
    assert_captures_precede_output,
    assert_exit_waits_on,
    assert_peak_memory,
    assert_race_free,
    assert_survives_recompile,
)


@pytest.fixture
def scheduled():
    stack = decoder_stack(4, (1, 3))
    return stack, msched.schedule(stack.gm, 2)


def after_output(sched, names):
    out = sched.gm.graph.output_node()
    for node in [n for n in sched.gm.graph.nodes if n.name in names][::-1]:
        out.append(node)
    sched.gm.recompile()


def without_last_wait(gm):
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


def with_host_reads(count):
    gm = decoder_stack(4, (1, 3)).gm
    x = next(n for n in gm.graph.nodes if n.op == "placeholder")
    with gm.graph.inserting_before(gm.graph.output_node()):
        for i in range(count):
            gm.graph.create_node(
                "call_function", torch.ops.aten._local_scalar_dense.default, (x,), name=f"read_{i}"
            )
    gm.recompile()
    msched.schedule(gm, 2)
    return gm


CAPTURES = {1: ["capture_3"], 2: ["capture_1", "capture_3"]}


@pytest.mark.parametrize("count", [1, 2])
def test_captures_precede_output(scheduled, count):
    stack, sched = scheduled
    after_output(sched, CAPTURES[count])
    assert_captures_precede_output(sched.gm, stack.captures)


@pytest.mark.parametrize("count", [1, 2])
def test_survives_recompile(scheduled, count):
    stack, sched = scheduled
    after_output(sched, CAPTURES[count])
    assert_survives_recompile(sched.gm, stack.captures)


@pytest.mark.parametrize("count", [1, 2])
def test_survives_recompile_writes_nothing(scheduled, count):
    stack, sched = scheduled
    pure = [n.name for n in sched.gm.graph.nodes if n.name.startswith("mm_default")][:count]
    assert_survives_recompile(sched.gm, pure, inputs=stack.example_inputs())


def test_exit_waits_on(scheduled):
    stack, sched = scheduled
    without_last_wait(sched.gm)
    assert_exit_waits_on(sched.gm, stack.captures[-1])


@pytest.mark.parametrize("count", [1, 2])
def test_race_free(scheduled, count):
    stack, sched = scheduled
    after_output(sched, CAPTURES[count])
    assert_race_free(sched.gm, sched.original)


@pytest.mark.parametrize("count", [1, 2])
def test_capture_safe(count):
    assert_capture_safe(with_host_reads(count))


def test_peak_memory(scheduled):
    stack, sched = scheduled
    assert_peak_memory(sched, 1, example_inputs=stack.example_inputs())
"""

#: test id -> the first line of its failure (after ``E       AssertionError: ``), fnmatch.
MESSAGES = {
    "test_captures_precede_output[1]": (
        "capture_3 (stream ?) is emitted after output: in the recompiled module it follows "
        "`return` and never runs: move it before output"
    ),
    "test_captures_precede_output[2]": (
        "capture_1 (stream ?) and capture_3 (stream ?) are emitted after output: in the "
        "recompiled module they follow `return` and never run: move them before output"
    ),
    "test_survives_recompile[1]": (
        "capture_3 (stream ?) comes after `return` in the recompiled code and never runs: "
        "move it before output"
    ),
    "test_survives_recompile[2]": (
        "capture_1 (stream ?) and capture_3 (stream ?) come after `return` in the recompiled "
        "code and never run: move them before output"
    ),
    "test_survives_recompile_writes_nothing[1]": (
        "mm_default writes no graph input that this helper can find *"
    ),
    "test_survives_recompile_writes_nothing[2]": (
        "mm_default and mm_default_2 write no graph input that this helper can find *"
    ),
    "test_exit_waits_on": (
        "output on stream 0 does not wait for capture_3 (stream 1): record an event after it "
        "and wait on it before output"
    ),
    "test_race_free[1]": "schedule has 1 violation (* nodes on 2 streams):",
    "test_race_free[2]": "schedule has 2 violations (* nodes on 2 streams):",
    "test_capture_safe[1]": "1 CUDA-graph capture fault:",
    "test_capture_safe[2]": "2 CUDA-graph capture faults:",
    "test_peak_memory": (
        "the schedule may reserve * under some timing (reserved_bound), over at_most "
        "0.00 MiB (1 byte)"
    ),
}
#: What assertion rewriting or a visible helper frame would add to a failure.
NOISE = [
    "*where False =*",
    "*where True =*",
    "*assert not *",
    "*AssertionError: assert *",
    "*exit_joins(*",
    "*_fail(*",
    "*raise AssertionError*",
    "*pytest_msched/assertions.py*",
]


def _sections(lines: list[str]) -> dict[str, list[str]]:
    """The lines of each test's section under FAILURES, by test id."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in lines:
        header = re.fullmatch(r"_{3,} (\S+) _{3,}", line)
        if header is not None:
            current = sections.setdefault(header.group(1), [])
        elif re.fullmatch(r"=+ .* =+", line):
            current = []
        else:
            current.append(line)
    return sections


def test_each_helper_fails_with_its_message_alone(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:hypothesispytest", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=len(MESSAGES))
    sections = _sections(result.outlines)
    assert sorted(sections) == sorted(MESSAGES)
    for test_id, message in MESSAGES.items():
        section = pytest.LineMatcher(sections[test_id])
        section.fnmatch_lines(
            [f"E       AssertionError: {message}", "test_inner.py:*: AssertionError"]
        )
    for noise in NOISE:
        result.stdout.no_fnmatch_line(noise)


def test_the_section_reader() -> None:
    lines = ["____ test_a ____", "E   x", "____ test_b[1] ____", "y", "==== 1 failed ====", "z"]
    assert _sections(lines) == {"test_a": ["E   x"], "test_b[1]": ["y"]}

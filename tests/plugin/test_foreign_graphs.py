"""Graphs another engine's pass scheduled, with its own stream ops and capture op, read by the
plain functions behind the plugin: ``decoder_stack(capture_op=...)``, the helpers,
`schedule_and_verify` with a foreign scheduler, and the snapshot text (no pytest inside
pytest here; `test_own_scheduler` runs the fixtures and options).

The engine is `tests.plugin.foreign`: msched's schedule with its stream ops rewritten into
the ``msched_plugin_eng`` namespace.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.fx import GraphModule

import msched
from msched.models.decoders import CAPTURE_SCHEMA, DecoderStack, decoder_stack
from msched.pictures.dot import render_dot
from msched.pictures.text import render_text
from msched.testing.checks import (
    ScheduleCheck,
    SchedulerFailure,
    run_scheduler,
    schedule_and_verify,
    scheduler_name,
)
from pytest_msched import (
    ScheduledGraphExtension,
    assert_captures_precede_output,
    assert_exit_waits_on,
    assert_race_free,
    assert_survives_recompile,
)
from tests.plugin import foreign

FOREIGN_OP = "msched_plugin_eng.inplace_slice_copy.default"


def _stack(**kwargs: object) -> DecoderStack:
    arguments: dict[str, object] = {"n_layers": 2, "capture_layers": (0, 1)}
    return decoder_stack(**{**arguments, **kwargs, "capture_op": foreign.CAPTURE})  # type: ignore[arg-type]


def _check(gm: GraphModule, num_streams: int, **kwargs: object) -> ScheduleCheck:
    """`schedule_and_verify` of a scheduler that works: a `ScheduleCheck`."""
    check = schedule_and_verify(gm, num_streams, **kwargs)  # type: ignore[arg-type]
    assert isinstance(check, ScheduleCheck), check
    return check


def _stream_ops(gm: GraphModule) -> list[str]:
    targets = (*foreign.STREAM_OPS, *foreign.STREAM_OPS.values())
    return [n.name for n in gm.graph.nodes if n.target in targets]


@pytest.fixture
def scheduled() -> tuple[DecoderStack, msched.Schedule]:
    """A foreign schedule on 2 streams of a stack whose captures are the foreign op."""
    stack = _stack()
    check = _check(stack.gm, 2, scheduler=foreign.schedule_in_place)
    assert check.report is not None and check.report.ok, check.failure
    return stack, check.schedule


# --- decoder_stack(capture_op=...) ------------------------------------------------------------


@pytest.mark.parametrize("capture_kwargs", [True, False], ids=["kwargs", "positional"])
@pytest.mark.parametrize(
    "op",
    [foreign.CAPTURE, torch.ops.msched_plugin_eng.inplace_slice_copy],
    ids=["overload", "packet"],
)
def test_decoder_stack_captures_with_the_given_op(op: object, capture_kwargs: bool) -> None:
    stack = _stack(capture_kwargs=capture_kwargs) if op is foreign.CAPTURE else None
    stack = stack or decoder_stack(
        n_layers=2, capture_layers=(0, 1), capture_op=op, capture_kwargs=capture_kwargs
    )
    targets = {n.target for n in stack.gm.graph.nodes if n.name.startswith("capture")}
    assert targets == {foreign.CAPTURE}
    assert [c.target for c in stack.captures] == [foreign.CAPTURE] * 2
    msched_stack = decoder_stack(n_layers=2, capture_layers=(0, 1), capture_kwargs=capture_kwargs)
    out, dest = stack.reference()
    expected_out, expected_dest = msched_stack.reference()
    assert torch.equal(out, expected_out)
    assert torch.equal(dest, expected_dest)
    assert dest.abs().sum() > 0  # the captures ran


@pytest.mark.parametrize(
    ("op", "problem"),
    [
        pytest.param(foreign.RETURNING_CAPTURE, r"it must return nothing", id="returns"),
        pytest.param(foreign.UNDECLARED_CAPTURE, r"it must write dest", id="no-write"),
        pytest.param(torch.ops.aten.add.Tensor, r"its arguments are not", id="arguments"),
        pytest.param(42, r"must be a torch op", id="not-an-op"),
    ],
)
def test_decoder_stack_rejects_a_capture_op_of_another_schema(op: object, problem: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=problem) as raised:
        decoder_stack(capture_op=op)
    assert CAPTURE_SCHEMA in str(raised.value)


# --- the helpers on a foreign graph -------------------------------------------------------------


def test_helpers_pass_on_a_correct_foreign_schedule(
    scheduled: tuple[DecoderStack, msched.Schedule],
) -> None:
    stack, sched = scheduled
    assert _stream_ops(sched.gm), "the foreign pass added no stream ops"
    for dialect in (None, foreign.DIALECT, foreign.NAMESPACE):
        assert_captures_precede_output(sched.gm, stack.captures, dialect=dialect)
        for capture in stack.captures:
            assert_exit_waits_on(sched.gm, capture, dialect=dialect)
        assert_race_free(sched.gm, sched.original, dialect=dialect)
        x, dest = stack.example_inputs()
        assert_survives_recompile(sched.gm, stack.captures, inputs=(x, dest), dialect=dialect)
        assert torch.equal(dest, stack.reference()[1])


def test_capture_after_output_names_its_foreign_stream(
    scheduled: tuple[DecoderStack, msched.Schedule],
) -> None:
    stack, sched = scheduled
    sched.gm.graph.output_node().append(stack.captures[-1])
    sched.gm.recompile()
    with pytest.raises(AssertionError) as raised:
        assert_captures_precede_output(sched.gm, stack.captures)
    # After output the current stream is 0 again: the stream is read from the foreign ops
    # (a graph that cannot be read shows no stream and "s?" lanes).
    message = str(raised.value)
    assert message.startswith("capture_1 (stream 0) is emitted after output")
    assert f"  > s0 | capture_1 = {FOREIGN_OP}(" in message
    assert "  > s0 | output(" in message


def test_exit_without_wait_is_caught_in_the_foreign_dialect(
    scheduled: tuple[DecoderStack, msched.Schedule],
) -> None:
    stack, sched = scheduled
    waits = [n for n in sched.gm.graph.nodes if n.target is foreign.WAIT]
    sched.gm.graph.erase_node(waits[-1])
    sched.gm.recompile()
    with pytest.raises(AssertionError, match=r"output on stream 0 does not wait for capture_1 "):
        assert_exit_waits_on(sched.gm, "capture_1")
    with pytest.raises(AssertionError, match=r"\[exit-not-joined\] .*`capture_1` on stream 1"):
        assert_race_free(sched.gm, sched.original)
    # Read in msched's dialect, the foreign stream ops are no stream ops msched knows.
    with pytest.raises(msched.InvalidGraphError, match="msched_plugin_eng::"):
        assert_exit_waits_on(sched.gm, "capture_1", dialect="msched")


# --- schedule_and_verify / run_scheduler with a foreign scheduler ------------------------------


@pytest.mark.parametrize(
    "scheduler", [foreign.schedule_in_place, foreign.schedule_copy], ids=["in-place", "copy"]
)
def test_a_foreign_scheduler_is_read_back_against_a_copy_of_its_input(scheduler) -> None:
    stack = _stack()
    names = [n.name for n in stack.gm.graph.nodes]
    check = _check(stack.gm, 2, scheduler=scheduler)
    sched = check.schedule
    assert check.report is not None and check.report.ok
    assert check.dialect == foreign.DIALECT
    assert (
        sched.gm is stack.gm if scheduler is foreign.schedule_in_place else sched.gm is not stack.gm
    )
    assert _stream_ops(sched.gm)
    assert [n.name for n in sched.original.graph.nodes] == names
    assert not _stream_ops(sched.original)
    assert sched.num_streams == 2
    assert sched.num_waits == sum(n.target is foreign.WAIT for n in sched.gm.graph.nodes)
    assert {sched.stream_of(c.name) for c in stack.captures} <= {0, 1}


def test_verification_names_what_the_foreign_scheduler_got_wrong() -> None:
    check = _check(_stack().gm, 2, scheduler=foreign.schedule_without_exit_wait)
    assert check.failure is not None
    lines = check.failure.splitlines()
    assert lines[0] == "msched.verify found violations in the schedule:"
    assert any("[exit-not-joined]" in line and "`capture_1` on stream 1" in line for line in lines)
    assert any(line.startswith(f"  > s1 |   capture_1 = {FOREIGN_OP}(") for line in lines)
    unverified = _check(_stack().gm, 2, strict=False, scheduler=foreign.schedule_without_exit_wait)
    assert unverified.report is None and unverified.failure is None


def test_verification_checks_the_stream_count_the_scheduler_was_given() -> None:
    def one_stream_too_many(gm: GraphModule, num_streams: int) -> GraphModule:
        return foreign.schedule_copy(gm, num_streams + 1)

    check = _check(_stack(n_layers=4).gm, 2, scheduler=one_stream_too_many)
    assert check.report is not None
    assert "bad-stream" in {v.kind for v in check.report.violations}


def test_a_scheduler_returning_a_schedule_is_taken_at_its_word() -> None:
    stack = _stack()
    adapter = functools.partial(msched.schedule, exit_edges=True)
    check = _check(stack.gm, 2, scheduler=adapter)
    assert check.schedule.gm is stack.gm
    assert check.schedule.assignment is not None  # msched's own Schedule, not a read-back one
    assert check.report is not None and check.report.ok


def test_a_scheduler_that_raises_is_named_with_its_traceback() -> None:
    def exploding(gm: GraphModule, num_streams: int) -> None:
        raise RuntimeError("no streams today")

    outcome = schedule_and_verify(_stack().gm, 3, scheduler=exploding)
    assert isinstance(outcome, SchedulerFailure)
    name = f"{__name__}.test_a_scheduler_that_raises_is_named_with_its_traceback.<locals>.exploding"
    assert outcome.failure.startswith(
        f"the scheduler {name} raised RuntimeError scheduling the graph on 3 streams: "
        "no streams today\n"
    )
    assert 'raise RuntimeError("no streams today")' in outcome.failure
    assert "run_scheduler" not in outcome.failure  # the traceback starts in the scheduler


def test_a_scheduler_returning_something_else_is_named() -> None:
    outcome = run_scheduler(foreign.not_a_scheduler_result, _stack().gm, 2)
    assert outcome == SchedulerFailure(
        "the scheduler tests.plugin.foreign.not_a_scheduler_result returned str; a scheduler "
        "returns the scheduled torch.fx.GraphModule, or None when it rewrote the one it was given"
    )


def test_scheduler_names() -> None:
    assert scheduler_name(msched.schedule) == "msched.scheduling.pipeline.schedule"
    assert scheduler_name(foreign.schedule_copy) == "tests.plugin.foreign.schedule_copy"
    adapter = functools.partial(foreign.schedule_copy, num_streams=2)
    assert scheduler_name(adapter) == (
        "functools.partial(tests.plugin.foreign.schedule_copy, num_streams=2)"
    )


# --- pictures of foreign graphs ----------------------------------------------------------------


def _body(text: str) -> list[str]:
    """The lines of a snapshot text after its header, with the foreign capture op renamed
    and msched's ``switch, wait @a @b`` lines written as the plain four ops' ``wait @a``,
    ``wait @b`` (the foreign namespace has no switch that waits)."""
    lines = []
    for line in text.splitlines()[3:]:
        lane, _, body = line.partition("| ")
        indent = body[: len(body) - len(body.lstrip())]
        if body.lstrip().startswith("switch, wait "):
            names = body.lstrip()[len("switch, wait ") :].split()
            lines += [f"{lane}| {indent}wait {name}" for name in names]
        else:
            lines.append(line.replace(FOREIGN_OP, "msched.inplace_slice_copy.default"))
    return lines


def test_foreign_graphs_snapshot_and_draw_as_msched_reads_them(
    scheduled: tuple[DecoderStack, msched.Schedule],
) -> None:
    _, sched = scheduled
    extension = ScheduledGraphExtension()
    text = extension.serialize(sched.gm)
    assert text == extension.serialize(sched) == render_text(msched.read_schedule(sched.gm))
    assert text.startswith("# msched text format 2\n# streams 2, events ")
    assert f"capture_1 = {FOREIGN_OP}(" in text
    # Streams, records and waits read the same as msched's own schedule of the same graph.
    own = msched.schedule(decoder_stack(n_layers=2, capture_layers=(0, 1)).gm, 2)
    assert _body(text) == _body(render_text(own))
    assert render_dot(sched).startswith("digraph")

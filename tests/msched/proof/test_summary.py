"""`msched.proof.summary`: every type that shows a schedule's summary holds the one `Summary`."""

from __future__ import annotations

import pytest

import msched
from msched.models.decoders import decoder_stack
from msched.pictures.labels import format_number
from msched.pictures.text import parse_schedule, render_text
from msched.pictures.view import view_of
from msched.proof.interpreter import interpret
from msched.proof.summary import Summary


@pytest.mark.parametrize("streams", [1, 3])
def test_schedule_view_and_text_show_one_summary(streams: int) -> None:
    sched = msched.schedule(decoder_stack(3, (1, 2)).gm, streams)
    s = sched.summary
    assert (sched.num_streams, sched.num_events, sched.num_waits) == (
        s.num_streams,
        s.num_events,
        s.num_waits,
    )
    assert (sched.makespan, sched.lower_bound) == (s.makespan, s.lower_bound)
    assert view_of(sched).summary == s
    printed = parse_schedule(render_text(sched)).summary
    assert printed == Summary(
        s.num_streams,
        s.num_events,
        s.num_waits,
        format_number(s.makespan),
        format_number(s.lower_bound),
    )


def test_a_graph_shows_its_timeline_summary() -> None:
    gm = decoder_stack(3, (1, 2)).gm
    sched = msched.schedule(gm, 3)
    timeline = msched.simulate(gm)
    program = interpret(gm)
    assert timeline.summary == Summary(
        program.num_streams,
        program.num_events,
        program.num_waits,
        timeline.makespan,
        timeline.lower_bound,
    )
    assert (timeline.num_events, timeline.num_waits) == (sched.num_events, sched.num_waits)
    assert view_of(gm).summary == timeline.summary
    assert msched.read_schedule(gm).summary == timeline.summary

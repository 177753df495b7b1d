"""The pictures and ``explain`` show collectives, their waits and the communication between."""

from __future__ import annotations

import json

import msched
from msched.analysis.nodes import node_named
from msched.pictures.explain import explain_lines
from msched.pictures.svg import CATEGORY_COLOURS, render_svg
from msched.pictures.trace import trace_data
from msched.testing.decoders import decoder_stack

from ..sharded_graphs import two_microbatches


def test_explain_names_the_group_the_wait_and_the_chain() -> None:
    sched = msched.schedule(two_microbatches(), 2)
    ar_a = explain_lines(sched, node_named(sched.gm, "ar_a"))
    stream = sched.stream_of(node_named(sched.gm, "wait_a"))
    assert ar_a[2] == (
        f"  collective all_reduce of group 0, asynchronous: completes at wait_a (stream {stream})"
    )
    assert any(line.startswith("    collective dependency: ar_b") for line in ar_a)
    wait_a = explain_lines(sched, node_named(sched.gm, "wait_a"))
    assert wait_a[2] == "  waits for ar_a (stream 0): its result is ready after it"


def test_svg_and_perfetto_draw_each_communication_from_issue_to_wait() -> None:
    sched = msched.schedule(two_microbatches(), 2)
    svg = render_svg(sched)
    bars = [line for line in svg.splitlines() if 'class="comm"><title>' in line]
    assert len(bars) == 2 and "ar_a (all_reduce, group 0): communication" in bars[0]
    events = [e for e in trace_data(sched)["traceEvents"] if e.get("cat") == "comm"]
    assert [(e["ph"], e["name"]) for e in events if e["ph"] == "b"] == [
        ("b", "ar_a communication"),
        ("b", "ar_b communication"),
    ]
    begin, end = (next(e for e in events if e["ph"] == p and e["id"] == 1) for p in "be")
    assert begin["args"] == {"collective": "all_reduce, group 0", "wait": "wait_a"}
    assert end["ts"] > begin["ts"]
    json.dumps(events)  # plain data


def test_pictures_without_collectives_have_no_communication() -> None:
    sched = msched.schedule(decoder_stack(2, (1,)).gm, 2)
    assert "comm" not in render_svg(sched)
    assert not [e for e in trace_data(sched)["traceEvents"] if e.get("cat") == "comm"]


def test_explain_widens_the_reasons_column_for_collective() -> None:
    """ "collective" is 10 characters: the reasons column of that block grows to fit it, so
    the last column starts at one place on every row."""
    sched = msched.schedule(two_microbatches(), 2)
    deps = explain_lines(sched, node_named(sched.gm, "ar_b"))
    rows = [next(line for line in deps if line.startswith(f"  {n} ")) for n in ("ar_a", "lin1_b")]
    assert "  collective " in rows[0] and "  data " in rows[1]
    starts = {row.index(how) for row, how in zip(rows, ("collective", "data"), strict=True)}
    ends = {len(row) - len(row.split(maxsplit=4)[4]) for row in rows}
    assert len(starts) == 1 and len(ends) == 1, rows


def test_collectives_have_a_colour_and_a_legend_entry_only_where_there_are_some() -> None:
    sched = msched.schedule(two_microbatches(), 2)
    svg = render_svg(sched)
    assert f'fill="{CATEGORY_COLOURS["comm"]}"/>' in svg and ">comm</text>" in svg
    plain = msched.schedule(decoder_stack(2, (0, 1)).gm, 2)
    assert ">comm</text>" not in render_svg(plain)

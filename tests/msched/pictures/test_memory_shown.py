"""The memory of a schedule, shown wherever the schedule is shown (issue 42, part 3).

The canonical text's header has a ``# memory`` line when the graph's nodes carry sizes (none,
and no error, when they do not); the reader takes texts with and without it and ``msched
diff`` reports a change of it; the Perfetto trace has a counter track per stream pool; the
SVG a memory band; ``msched demo``'s table and ``msched explain`` the peaks.
"""

from __future__ import annotations

import json

import pytest

import msched
from msched.models.decoders import decoder_stack
from msched.pictures import render_json, render_perfetto, render_svg, render_text
from msched.pictures.diff import schedule_diff
from msched.pictures.text import MEMORY_PREFIX, parse_schedule
from msched.proof.memory import format_bytes


@pytest.fixture(scope="module")
def sized() -> msched.Schedule:
    """A 2-stream schedule of a stack whose nodes carry their sizes."""
    return msched.schedule(decoder_stack(4, (1, 3), hidden=64, tokens=32).with_sizes().gm, 2)


def _without_memory(text: str) -> str:
    return "".join(line for line in text.splitlines(True) if not line.startswith(MEMORY_PREFIX))


def test_format_bytes_is_exact_in_the_largest_unit() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(512) == "512 B"
    assert format_bytes(3584) == "3.5 KiB"
    assert format_bytes(24 * 2**20) == "24 MiB"
    assert format_bytes(3 * 2**29) == "1.5 GiB"


def test_the_header_shows_the_peaks_of_peak_memory(sized: msched.Schedule) -> None:
    lines = render_text(sized).splitlines()
    m = msched.peak_memory(sized.gm)
    expected = (
        f"# memory allocated {format_bytes(m.allocated)}, reserved {format_bytes(m.reserved)}, "
        f"bound {format_bytes(m.reserved_bound)}"
    )
    assert lines[3] == expected
    assert lines[4].startswith("s0 | ")
    assert parse_schedule("\n".join(lines)).memory == expected[len(MEMORY_PREFIX) :]


def test_the_json_carries_the_peaks_and_reads_as_the_text(sized: msched.Schedule) -> None:
    doc = json.loads(render_json(sized))
    m = msched.peak_memory(sized.gm)
    assert doc["memory"] == {
        "allocated": m.allocated,
        "reserved": m.reserved,
        "reserved_bound": m.reserved_bound,
        "baseline": m.baseline,
        "per_stream": {"0": m.per_stream[0], "1": m.per_stream[1]},
        "per_stream_bound": {"0": m.per_stream_bound[0], "1": m.per_stream_bound[1]},
    }
    text = render_text(sized)
    assert parse_schedule(render_json(sized)).memory == parse_schedule(text).memory
    assert schedule_diff(parse_schedule(render_json(sized)), parse_schedule(text)) == []
    del doc["memory"]  # a document written before the field existed
    assert parse_schedule(json.dumps(doc)).memory is None


def test_a_graph_without_sizes_shows_no_memory_and_renders() -> None:
    sched = msched.schedule(decoder_stack(2, (1,)).gm, 2)
    text = render_text(sched)
    assert MEMORY_PREFIX not in text
    assert json.loads(render_json(sched))["memory"] is None
    assert parse_schedule(text).memory is None
    assert "memory" not in render_svg(sched)
    assert '"ph": "C"' not in render_perfetto(sched)


def test_a_text_without_the_memory_line_reads_as_the_same_schedule(sized: msched.Schedule) -> None:
    text = render_text(sized)
    old = parse_schedule(_without_memory(text))
    new = parse_schedule(text)
    assert old.memory is None
    assert schedule_diff(old, new) == [] and schedule_diff(new, old) == []


def test_msched_diff_reports_a_change_of_memory(sized: msched.Schedule) -> None:
    text = render_text(sized)
    lines = text.splitlines(True)
    assert lines[3].startswith(MEMORY_PREFIX)
    changed = lines[:3] + [lines[3].replace("bound ", "bound 1", 1)] + lines[4:]
    bound = lines[3].split("bound ")[1].strip()
    diff = schedule_diff(parse_schedule(text), parse_schedule("".join(changed)))
    assert len(diff) == 1
    assert diff[0].endswith(f"memory: bound {bound} → 1{bound}")


def test_the_trace_has_a_counter_track_per_stream_pool(sized: msched.Schedule) -> None:
    doc = json.loads(render_perfetto(sized))
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"memory s0 pool", "memory s1 pool"}
    m = sized.memory
    for stream in (0, 1):
        values = [
            e["args"]["reserved bytes"] for e in counters if e["name"] == f"memory s{stream} pool"
        ]
        assert values == sorted(values)  # segments are never released
        assert values[-1] == m.per_stream[stream]
    assert doc["otherData"]["memory_reserved_bound"] == m.reserved_bound


def test_the_svg_has_a_memory_band(sized: msched.Schedule) -> None:
    svg = render_svg(sized)
    assert svg.count('<g class="memory">') == 1
    assert 'class="memreserved"' in svg and 'class="memallocated"' in svg
    assert f"bound {format_bytes(sized.memory.reserved_bound)}" in svg


def test_explain_shows_the_peak_and_the_memory_after_the_node(sized: msched.Schedule) -> None:
    from msched.pictures.explain import explain_lines

    node = next(n for n in sized.gm.graph.nodes if n.name.startswith("mm"))
    lines = explain_lines(sized, node)
    at = lines.index("Memory (msched.peak_memory):")
    assert lines[at + 1].startswith("  peak: allocated ")
    assert lines[at + 2].startswith(f"  after {node.name}: ")

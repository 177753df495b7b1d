"""Tests of `msched.pictures`: canonical text, JSON, DOT, Perfetto trace and SVG."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter

import pytest

import msched
from msched import pictures
from msched.analysis.nodes import node_named
from msched.models.decoders import decoder_stack
from msched.pictures.labels import format_number
from msched.pictures.view import event_of, exit_waits, host_index, joining_wait, view_of
from msched.proof.interpreter import interpret

_SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def sched() -> msched.Schedule:
    stack = decoder_stack(3, (0, 2), moe=True)
    return msched.schedule(stack.gm, 3)


def _compute_nodes(s: msched.Schedule) -> list:
    return [st.node for st in interpret(s.gm).compute_steps]


# --- text ------------------------------------------------------------------------------------


def test_text_header_lines_then_one_line_per_node_with_output_last(sched: msched.Schedule) -> None:
    lines = pictures.render_text(sched).splitlines()
    assert lines[0] == "# msched text format 2"
    assert lines[1] == f"# streams 3, events {sched.num_events}, waits {sched.num_waits}"
    assert lines[2] == (
        f"# makespan {format_number(sched.makespan)}, "
        f"lower bound {format_number(sched.lower_bound)}"
    )
    # One line per step, set_stream folded into the lane column unless it waits (then it is
    # one line with its waits); the records of a switch are lines of their own, on the old lane.
    all_steps = interpret(sched.gm).steps

    def waits_of_switch(i: int) -> bool:  # step i is a wait of the switch right before it
        return (
            i > 0
            and all_steps[i - 1].node is all_steps[i].node
            and (all_steps[i - 1].kind in ("set_stream", "wait_event"))
        )

    steps = [
        s
        for i, s in enumerate(all_steps)
        if (s.kind == "set_stream" and i + 1 < len(all_steps) and waits_of_switch(i + 1))
        or (s.kind != "set_stream" and not (s.kind == "wait_event" and waits_of_switch(i)))
    ]
    assert any(s.kind == "record_event" and s.node.target is msched.ops.set_stream for s in steps)
    assert len(lines) == 3 + len(steps)
    assert lines[-1].startswith("s0 | output(")
    for line, step in zip(lines[3:], steps, strict=True):
        assert line.startswith(f"s{step.stream} | " + "  " * step.stream)


def test_text_shows_every_record_wait_and_record_stream(sched: msched.Schedule) -> None:
    text = pictures.render_text(sched)
    kinds = Counter(s.kind for s in interpret(sched.gm).steps)
    assert text.count(" record @") == kinds["record_event"]
    assert text.count(" @") - text.count(" record @") == kinds["wait_event"]
    assert text.count("switch, wait @") == sum(
        1 for n in sched.gm.graph.nodes if n.target is msched.ops.set_stream and len(n.args) > 1
    )
    assert text.count("record_stream(") == kinds["record_stream"]
    assert "set_stream" not in text  # folded into the lane column
    assert "s1 |   capture_0 = msched.inplace_slice_copy.default(dest=dest" in text


def test_text_of_a_schedule_equals_the_text_of_its_module(sched: msched.Schedule) -> None:
    # The module's header comes from msched.simulate; a snapshot must not depend on whether
    # the test compared the Schedule or the GraphModule.
    assert pictures.render_text(sched) == pictures.render_text(sched.gm)


def test_text_of_one_stream_has_no_stream_ops() -> None:
    stack = decoder_stack(2, (1,))
    text = pictures.render_text(msched.schedule(stack.gm, 1))
    assert text.startswith("# msched text format 2\n# streams 1, events 0, waits 0\n")
    body = text.splitlines()[3:]
    assert all(line.startswith("s0 | ") for line in body)
    assert not any(" record " in line or " wait " in line for line in body)


def test_format_number_has_no_float_noise() -> None:
    assert format_number(12.0) == "12"
    assert format_number(0.1 + 0.2) == "0.3"
    assert format_number(1 / 3) == "0.333333"


def test_render_rejects_what_is_not_a_schedule_or_module() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="list"):
        pictures.render_text([])  # type: ignore[arg-type]


_SCRIPT = """
import json, msched
from msched import pictures
from msched.models.decoders import decoder_stack
s = msched.schedule(decoder_stack(3, (0, 2), moe=True).gm, 3)
formats = ("text", "json", "perfetto", "svg", "dot")
print(json.dumps({f: getattr(pictures, "render_" + f)(s) for f in formats}))
"""


@pytest.fixture(scope="module")
def two_processes() -> list[dict[str, str]]:
    """Every format rendered by two fresh processes with different hash seeds."""
    outs = []
    for seed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, check=True
        )
        outs.append(json.loads(done.stdout))
    return outs


@pytest.mark.parametrize("fmt", ["text", "json", "perfetto", "svg", "dot"])
def test_every_format_is_byte_identical_across_processes_and_hash_seeds(
    two_processes: list[dict[str, str]], sched: msched.Schedule, fmt: str
) -> None:
    first, second = (out[fmt] for out in two_processes)
    assert first == second
    assert first == getattr(pictures, f"render_{fmt}")(sched)


# --- json ------------------------------------------------------------------------------------


def test_json_round_trips_and_describes_the_schedule(sched: msched.Schedule) -> None:
    text = pictures.render_json(sched)
    data = json.loads(text)
    assert json.dumps(data, indent=2) + "\n" == text
    names = [n["name"] for n in data["nodes"]]  # a switch that waits: an entry per action
    assert list(dict.fromkeys(names)) == [n.name for n in sched.gm.graph.nodes]
    assert len(names) == len(interpret(sched.gm).steps)
    a = sched.assignment
    for entry, step in zip(data["nodes"], interpret(sched.gm).steps, strict=True):
        node = node_named(sched.gm, entry["name"])
        assert entry["stream"] == step.stream  # a switch's records: the old stream
        assert entry["stream"] == sched.stream_of(node) or entry["kind"] == "record_event"
        if node in a.order:
            assert (entry["start"], entry["end"]) == (a.start[node], a.finish[node])
    assert (data["streams"], data["num_events"], data["num_waits"]) == (
        3,
        sched.num_events,
        sched.num_waits,
    )
    assert data["makespan"] == sched.makespan


def test_json_events_pair_each_record_with_its_waits(sched: msched.Schedule) -> None:
    data = json.loads(pictures.render_json(sched))
    kinds: dict[str, set[tuple[str, object]]] = {}
    for n in data["nodes"]:  # a switch that waits has an entry per action
        kinds.setdefault(n["name"], set()).add((n["kind"], n.get("arg")))
    waits = 0
    for event in data["events"]:
        assert ("record_event", event["event"]) in kinds[event["record"]["node"]]
        for wait in event["waits"]:
            assert ("wait_event", event["event"]) in kinds[wait["node"]]
            assert wait["time"] >= event["record"]["time"]
            waits += 1
    assert waits == sched.num_waits
    assert len({e["event"] for e in data["events"]}) == sched.num_events


# --- trace -----------------------------------------------------------------------------------


def test_trace_has_one_named_track_per_stream_with_complete_events(sched: msched.Schedule) -> None:
    events = json.loads(pictures.render_perfetto(sched))["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert names == {0: "stream 0 (caller)", 1: "stream 1", 2: "stream 2"}
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["tid"] for e in slices} == {0, 1, 2}
    by_name = {e["name"]: e for e in slices if e["cat"] not in ("sync",)}
    for node in _compute_nodes(sched):
        if node.op in ("placeholder", "get_attr"):
            continue
        assert by_name[node.name]["tid"] == sched.stream_of(node)
        if node.op != "output":
            assert by_name[node.name]["ts"] == sched.assignment.start[node]
    assert all(e["dur"] >= 0 for e in slices)


def test_trace_flows_pair_every_record_with_each_of_its_waits(sched: msched.Schedule) -> None:
    events = json.loads(pictures.render_perfetto(sched))["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == ends.keys()
    assert len(ends) == sched.num_waits
    markers = {(e["tid"], e["ts"], e["name"]) for e in events if e["ph"] == "X"}
    for flow_id, s in starts.items():
        f = ends[flow_id]
        assert s["name"] == f["name"] and f["bp"] == "e" and f["ts"] >= s["ts"]
        assert (s["tid"], s["ts"], f"record {s['name']}") in markers
        assert (f["tid"], f["ts"], f"wait {f['name']}") in markers
    order = [e["ts"] for e in events if "ts" in e]
    assert order == sorted(order)


# --- dot -------------------------------------------------------------------------------------


def test_dot_is_accepted_by_graphviz_with_a_cluster_per_stream(sched: msched.Schedule) -> None:
    graphviz = pytest.importorskip("graphviz")
    text = pictures.render_dot(sched)
    graphviz.Source(text)
    for s in range(3):
        assert f"subgraph cluster_s{s} {{" in text
    for capture in ("capture_0", "capture_2"):
        assert f'"{capture}" -> "output" [label="exit"' in text
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        ET.fromstring(done.stdout)


# --- svg -------------------------------------------------------------------------------------


def test_svg_parses_with_one_lane_per_stream_and_a_box_per_costly_node(
    sched: msched.Schedule,
) -> None:
    root = ET.fromstring(pictures.render_svg(sched))
    rects = list(root.iter(f"{_SVG}rect"))
    lanes = [r for r in rects if r.get("class") == "lane"]
    assert [r.get("data-stream") for r in lanes] == ["0", "1", "2"]
    titles = [t.text or "" for t in root.iter(f"{_SVG}title")]
    a = sched.assignment
    for node in a.order:
        if a.finish[node] > a.start[node]:
            assert any(t.startswith(f"{node.name} = ") for t in titles), node.name
    texts = {t.text for t in root.iter(f"{_SVG}text")}
    assert {"capture_0", "capture_2"} <= texts
    assert "stream 0 (caller)" in texts


def test_svg_highlight_outlines_each_group_and_links_its_first_node_to_the_others(
    sched: msched.Schedule,
) -> None:
    plain = ET.fromstring(pictures.render_svg(sched))
    assert not [r for r in plain.iter(f"{_SVG}rect") if r.get("class") == "violation"]
    groups = [("capture_0", "output"), ("capture_2",), ("no_such_node",)]
    root = ET.fromstring(pictures.render_svg(sched, highlight=groups))
    outlined = [r for r in root.iter(f"{_SVG}rect") if r.get("class") == "violation"]
    titles = [r.find(f"{_SVG}title").text for r in outlined]  # type: ignore[union-attr]
    assert titles == ["capture_0, output", "capture_0, output", "capture_2"]
    links = [e for e in root.iter(f"{_SVG}line") if e.get("class") == "violationlink"]
    assert len(links) == 1  # capture_0 -> output; a group of one or of unknown names has none

    def centre(rect: ET.Element) -> tuple[float, float]:
        x, y = float(rect.get("x", "nan")), float(rect.get("y", "nan"))
        return x + float(rect.get("width", "nan")) / 2, y + float(rect.get("height", "nan")) / 2

    ends = [
        (float(links[0].get(f"x{k}", "nan")), float(links[0].get(f"y{k}", "nan"))) for k in "12"
    ]
    assert ends == [pytest.approx(centre(r), abs=0.11) for r in outlined[:2]]


def test_each_capture_is_joined_on_stream_0_before_output(sched: msched.Schedule) -> None:
    v = view_of(sched)
    out_at = host_index(v, v.program.output)
    for capture in ("capture_0", "capture_2"):
        node = node_named(sched.gm, capture)
        wait = joining_wait(v, node, 0)
        assert wait is not None
        assert host_index(v, node) < host_index(v, wait.node) < out_at


def test_a_sabotaged_graph_still_renders_with_the_capture_after_output() -> None:
    stack = decoder_stack(3, (0, 2), moe=True)
    msched.schedule(stack.gm, 3)
    capture = stack.captures[-1]
    stack.gm.graph.output_node().append(capture)  # what a data-edge-only scheduler did
    lines = pictures.render_text(stack.gm).splitlines()
    out_at = next(i for i, line in enumerate(lines) if "output(" in line)
    assert any("capture_2 = " in line for line in lines[out_at + 1 :])
    json.loads(pictures.render_perfetto(stack.gm))
    ET.fromstring(pictures.render_svg(stack.gm))


# --- the view --------------------------------------------------------------------------------


def test_the_view_pairs_records_and_waits_as_the_happens_before_engine_does(
    sched: msched.Schedule,
) -> None:
    v = view_of(sched)
    binding = v.clocks.binding
    paired = {w: use.record for use in v.events for w in use.waits}
    assert paired == binding
    for wait in binding:
        use = event_of(v, wait)
        assert use is not None and use.record is binding[wait] and wait in use.waits
        if use.record is not None:
            assert v.start[wait.node] >= v.start[use.record.node]
    joins = exit_waits(v)
    assert joins and all(w.stream == 0 and binding[w] is not None for w in joins)
    assert all(host_index(v, w.node) < host_index(v, v.program.output) for w in joins)


def test_a_wait_after_output_binds_to_nothing_because_it_never_runs() -> None:
    stack = decoder_stack(3, (0, 2), moe=True)
    sched = msched.schedule(stack.gm, 3)
    graph = sched.gm.graph
    wait = next(n for n in graph.nodes if n.target is msched.ops.wait_event)
    graph.output_node().append(wait)
    v = view_of(sched.gm)
    step = v.program.steps[host_index(v, wait)]
    assert step not in v.clocks.binding and event_of(v, step) is None
    assert all(step not in use.waits for use in v.events)
    # Named after the record it would bind to if it ran: the latest earlier one of its event.
    records = [s for s in v.program.steps if s.kind == "record_event"]
    latest = [s for s in records if s.event == wait.args[0]][-1]
    line = pictures.render_text(sched.gm).splitlines()[-1]
    assert (
        line
        == f"s{v.program.stream_of[wait]} | {'  ' * v.program.stream_of[wait]}wait "
        + v.names.records[latest]
    )
    json.loads(pictures.render_json(sched.gm))

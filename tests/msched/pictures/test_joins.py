"""Stream-wide joins and host barriers in the pictures: the canonical text, ``msched diff``,
``explain`` and the SVG treat them as joins, and agree with `msched.verify`.

Three ways a capture on a side stream is joined: PyTorch's ``streams.wait_stream`` (traced
with `msched.trace_streams`), a foreign dialect's own join op (``msched_test_myeng::join``,
read with a `msched.Dialect` defined here) and a host barrier (``side.synchronize()``).  For
each: two correct schedules (the second runs one more node on the side stream) and one whose
join is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch.fx import GraphModule, Node

import msched
from msched import pictures
from msched.pictures.diff import same_schedule, schedule_diff
from msched.pictures.explain import explain_lines
from msched.pictures.text import parse_schedule
from msched.pictures.view import stream_joins, view_of
from msched.proof import actions
from msched.proof.dialects import Dialect
from msched.proof.interpreter import interpret

from ..scheduled import Scheduled, aten

# --- PyTorch's own streams -------------------------------------------------------------------

side = torch.Stream(device="cpu")


def _torch_capture(more: bool, join: str | None) -> Callable[..., torch.Tensor]:
    """Stream code that captures ``x * 2`` (``x * 3 * 2`` with ``more``) into ``buf`` on a
    side stream, then joins it by ``join``: ``"wait_stream"``, ``"synchronize"`` or None."""

    def capture(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
        caller = torch.accelerator.current_stream()
        side.wait_stream(caller)
        with side:
            src = x * 3 if more else x
            buf.copy_(src * 2)
        if join == "wait_stream":
            caller.wait_stream(side)
        elif join == "synchronize":
            side.synchronize()
        return x + 1

    return capture


def _traced(more: bool, join: str | None) -> msched.Schedule:
    gm = msched.trace_streams(_torch_capture(more, join), torch.randn(4), torch.zeros(4))
    return msched.read_schedule(gm)


# --- a foreign engine with a stream-wide join op ---------------------------------------------

_MYENG = torch.library.Library("msched_test_myeng", "DEF")
_MYENG.define("fork(int stream) -> ()")  # the stream joins the caller's, work goes there
_MYENG.define("join(int stream) -> ()")  # back to the caller's stream, which joins the stream
_MYENG.define("switch(int stream) -> ()")  # work goes to the stream, nobody waits
for _name in ("fork", "join", "switch"):
    _MYENG.impl(_name, lambda *args: None, "CompositeExplicitAutograd")
myeng = torch.ops.msched_test_myeng


def _fork(node: Node) -> list[actions.Action]:
    s = actions.int_argument(node, 0, "myeng fork", "stream")
    return [actions.wait_stream(s, 0), actions.switch(s)]


def _join(node: Node) -> list[actions.Action]:
    s = actions.int_argument(node, 0, "myeng join", "stream")
    return [actions.switch(0), actions.wait_stream(0, s)]


def _switch(node: Node) -> list[actions.Action]:
    return [actions.switch(actions.int_argument(node, 0, "myeng switch", "stream"))]


MYENG = Dialect.define(
    "myeng",
    {"msched_test_myeng::fork": _fork, myeng.join.default: _join, myeng.switch: _switch},
)


def _myeng(more: bool, join: str | None) -> msched.Schedule:
    """``m = x * 2`` captured into ``buf`` on stream 1 (``e = -x`` first with ``more``),
    joined by ``myeng::join(1)``, or left behind with ``myeng::switch(0)``."""
    s = Scheduled()
    x, buf = s.input("x"), s.input("buf")
    s.graph.call_function(myeng.fork.default, (1,))
    src = s.op("e", aten.neg.default, x) if more else x
    m = s.op("m", aten.mul.Tensor, src, 2)
    s.capture("capture", buf, m)
    if join:
        s.graph.call_function(myeng.join.default, (1,))
    else:
        s.graph.call_function(myeng.switch.default, (0,))
    gm = s.done(s.op("out", aten.add.Tensor, x, 1))
    return msched.read_schedule(gm, dialect=MYENG)


@dataclass(frozen=True)
class Case:
    """One way of joining: the schedules, the capture's name, the join line and op."""

    make: Callable[[bool, str | None], msched.Schedule]
    join: str
    capture: str
    kind: str  # the join's step: wait_stream or synchronize
    op: str  # the name of the join's node

    @property
    def text(self) -> str:
        """The join as the canonical text prints it."""
        return "wait s1" if self.kind == "wait_stream" else "synchronize s1"


CASES = {
    "wait_stream": Case(_traced, "wait_stream", "copy_", "wait_stream", "wait_stream_1"),
    "myeng.join": Case(_myeng, "join", "capture", "wait_stream", "join_default"),
    "synchronize": Case(_traced, "synchronize", "copy_", "synchronize", "synchronize_stream"),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request: pytest.FixtureRequest) -> Case:
    return CASES[request.param]


def _capture(sched: msched.Schedule, name: str) -> Node:
    return next(n for n in sched.gm.graph.nodes if n.name == name)


def _diff(a: msched.Schedule, b: msched.Schedule) -> list[str]:
    return schedule_diff(
        parse_schedule(pictures.render_text(a)), parse_schedule(pictures.render_text(b))
    )


def test_the_text_prints_the_join_as_a_join_line(case: Case) -> None:
    sched = case.make(False, case.join)
    lines = pictures.render_text(sched).splitlines()
    assert f"s0 | {case.text}" in lines
    assert "s1 |   wait s0" in lines  # the side stream joins the caller's before its work
    assert not any(case.op in line for line in lines)  # no raw op line
    # Read back, the text is the program: each join is a join step where it stood.
    parsed = parse_schedule(pictures.render_text(sched))
    sync = [s for s in parsed.steps if s.kind not in ("compute", "host")]
    assert [(s.kind, s.stream, s.to_stream) for s in sync] == [
        ("wait_stream", 1, 0),
        (case.kind, 0, 1),
    ]


def test_a_diff_of_two_joined_schedules_agrees_with_verify(case: Case) -> None:
    a, b = case.make(False, case.join), case.make(True, case.join)
    assert msched.verify(a.gm, dialect=a.dialect).ok and msched.verify(b.gm, dialect=b.dialect).ok
    lines = _diff(a, b)
    assert not any("NOT joined" in line for line in lines), lines
    added = [line for line in lines if line.startswith("+ ") and " on s1 " in line]
    assert added and all("joined by output" in line for line in added), lines


def test_a_missing_join_is_not_joined_in_the_diff_and_in_verify(case: Case) -> None:
    joined, missing = case.make(False, case.join), case.make(True, None)
    report = msched.verify(missing.gm, dialect=missing.dialect)
    assert [v.nodes for v in report.of_kind("exit-not-joined")] == [(case.capture, "output")]
    lines = _diff(joined, missing)
    assert any(line.startswith("+ ") and "NOT joined by output" in line for line in lines), lines
    # The join that went is a line of its own: the stream-wide join or the host barrier.
    gone = "- wait on s0 for stream s1" if case.kind == "wait_stream" else "- synchronize s1 on s0"
    assert any(line.startswith(gone) for line in lines), lines


def test_the_svg_links_the_joined_stream_to_the_waiting_stream(case: Case) -> None:
    sched = case.make(False, case.join)
    svg = pictures.render_svg(sched)
    cls = "link joinlink" if case.kind == "wait_stream" else "link barrierlink"
    links = [line for line in svg.splitlines() if f'class="{cls}' in line and "<title>" in line]
    exit_links = [line for line in links if f"({case.op})" in line]
    assert exit_links, links
    if case.kind == "synchronize":
        assert 'class="barrier"><title>synchronize s1 (synchronize_stream)' in svg
    # From the end of the capture on stream 1's lane to stream 0's lane.
    v = view_of(sched)
    (join,) = [j for j in stream_joins(v) if j.step.node.name == case.op]
    capture = _capture(sched, case.capture)
    assert join.sources == ((1, v.finish[capture]),)
    missing = pictures.render_svg(case.make(False, None))
    assert not [line for line in missing.splitlines() if case.op in line and cls in line]


def test_explain_names_the_join_of_the_capture(case: Case) -> None:
    sched = case.make(False, case.join)
    lines = explain_lines(sched, _capture(sched, case.capture))
    output = next(line for line in lines if line.strip().startswith("output "))
    assert output.endswith(f"joined by {case.text} ({case.op}, stream 0)"), lines
    unjoined = case.make(False, None)
    lines = explain_lines(unjoined, _capture(unjoined, case.capture))
    assert next(line for line in lines if line.strip().startswith("output ")).endswith("NOT JOINED")


def test_explain_of_the_join_says_what_it_waits_for(case: Case) -> None:
    sched = case.make(False, case.join)
    lines = explain_lines(sched, _capture(sched, case.op))
    switch = "switch, " if case.join == "join" else ""  # myeng's join switches, then waits
    assert lines[0] == f"{case.op}: {switch}{case.text}, a stream op issued on stream 0"
    what = (
        "stream 0 waits for all work issued on stream 1 so far"
        if case.kind == "wait_stream"
        else "the host waits for stream 1; later work on every stream follows"
    )
    user = lines[1].split("it is issued for ")[1].split(";")[0]  # the next node on stream 0
    assert lines[2] == f"  {case.text} ({case.op}): {what}; it orders that work before {user}"


# --- host barriers on an event and on the device; JSON and old texts ------------------------


def _barriers() -> GraphModule:
    """PyTorch's ops by hand: stream index 1 joins the caller, writes ``buf``, records event
    index 0; the host synchronizes the event, then the device."""
    st = torch.ops.streams
    s = Scheduled()
    x, buf = s.input("x"), s.input("buf")
    s.graph.call_function(st.wait_stream.default, (1, 0))
    m = s.op("m", aten.mul.Tensor, x, 2)
    write = s.capture("write", buf, m)
    for node in (m, write):
        node.meta["custom"] = {"stream": 1}
    s.graph.call_function(st.record_event.default, (0, 1))
    s.graph.call_function(st.synchronize_event.default, (0,))
    s.graph.call_function(st.synchronize_device.default, ())
    return s.done(s.op("out", aten.add.Tensor, x, 1))


def test_host_barriers_on_an_event_and_the_device_print_and_read_back() -> None:
    gm = _barriers()
    assert msched.verify(gm).ok
    text = pictures.render_text(gm)
    assert text.splitlines()[-5:] == [
        "s1 |   record @write",
        "s0 | synchronize @write",
        "s0 | synchronize",
        "s0 | out = aten.add.Tensor(x, 1)",
        "s0 | output(out)",
    ]
    parsed = parse_schedule(text)
    barrier = next(s for s in parsed.steps if s.kind == "synchronize")
    record = next(s for s in parsed.steps if s.kind == "record_event")
    assert parsed.binding[barrier.node] is record.node
    assert parsed.clocks.exit_happens_after(parsed.compute()["write"].node)
    assert same_schedule(parsed, parse_schedule(pictures.render_json(gm)))


def test_the_json_of_a_torch_graph_reads_as_its_text() -> None:
    """Host-only stream ops (Dynamo's table lookups), stream-wide joins and barriers."""
    for join in ("wait_stream", "synchronize"):
        sched = _traced(True, join)
        text = parse_schedule(pictures.render_text(sched))
        assert same_schedule(text, parse_schedule(pictures.render_json(sched)))


def test_an_old_text_with_a_join_printed_as_its_op_still_reads() -> None:
    old = (
        "# streams 2, events 0, waits 2\n# makespan 3, lower bound 2\n"
        "s0 | x = input\n"
        "s1 |   wait_stream = streams.wait_stream(1, 0)\n"
        "s1 |   mul = operator.mul(x, 2)\n"
        "s0 | wait_stream_1 = streams.wait_stream(0, 1)\n"
        "s0 | output((mul,))\n"
    )
    parsed = parse_schedule(old)
    assert [s.kind for s in parsed.steps] == ["compute"] * 5
    new = parse_schedule(pictures.render_text(_traced(False, "wait_stream")))
    assert any(line.startswith("- wait_stream_1 on s0") for line in schedule_diff(parsed, new))


def test_a_barrier_is_the_joining_wait_of_every_stream() -> None:
    sched = _traced(False, "synchronize")
    clocks = view_of(sched).clocks
    barrier = next(s for s in interpret(sched.gm).steps if s.kind == "synchronize")
    clocks_barrier = next(s for s in clocks.program.steps if s.kind == "synchronize")
    assert barrier.node is clocks_barrier.node
    assert clocks.joining_wait(_capture(sched, "copy_"), 0) == clocks_barrier

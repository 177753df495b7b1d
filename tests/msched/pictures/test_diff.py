"""`msched.pictures.diff`: two schedules compared in schedule terms."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch.fx import GraphModule

import msched
from msched import pictures
from msched.models.decoders import decoder_stack
from msched.pictures.diff import same_schedule, schedule_diff, snapshot_summary
from msched.pictures.text import header_lines, parse_schedule, parsed
from msched.pictures.view import view_of
from msched.proof.interpreter import interpret

from ..scheduled import Scheduled, aten


@pytest.fixture(scope="module")
def sched() -> msched.Schedule:
    return msched.schedule(decoder_stack(3, (0, 2), moe=True).gm, 3)


def _old_text(gm: GraphModule) -> str:
    """The canonical text as earlier versions printed it: events by id (``record e7``)."""
    v = view_of(gm)
    lines = header_lines(v)[1:]  # format 1: no version line
    for step in v.program.steps:
        if step.kind == "set_stream":
            continue
        if step.kind in ("record_event", "wait_event"):
            what = f"{step.kind.split('_')[0]} e{step.event}"
        else:
            what = pictures.text.step_text(step, v.names)
        lines.append(f"s{step.stream} | {'  ' * step.stream}{what}")
    return "\n".join(lines) + "\n"


def _two(wait_for_a: bool, b_stream: int = 1, extra: bool = False) -> GraphModule:
    """``a`` on 0, ``b = a @ w`` on ``b_stream``, ``out = b + a`` on 0; ``extra``: a node
    ``c = a * a`` on stream 2 that output waits for."""
    s = Scheduled()
    x, w = s.input("x"), s.input("w")
    a = s.op("a", aten.mm.default, x, w)
    s.record(1)
    s.stream(b_stream)
    if b_stream:
        s.wait(1 if wait_for_a else 0)
    b = s.op("b", aten.mm.default, a, w)
    if b_stream:
        s.record(2)
        s.stream(0)
        s.wait(2)
    if extra:
        s.stream(2)
        s.wait(1)
        s.op("c", aten.mul.Tensor, a, a)
        s.record(3)
        s.stream(0)
        s.wait(3)
    return s.done(s.op("out", aten.add.Tensor, b, a))


def _diff(a: GraphModule, b: GraphModule) -> list[str]:
    return schedule_diff(parsed(a), parsed(b))


def test_the_same_schedule_has_no_diff(sched: msched.Schedule) -> None:
    text = pictures.render_text(sched)
    assert schedule_diff(parse_schedule(text), parse_schedule(text)) == []
    assert snapshot_summary(text, text) == []


def test_text_json_and_the_old_text_of_event_ids_read_as_the_same_schedule(
    sched: msched.Schedule,
) -> None:
    text = parse_schedule(pictures.render_text(sched))
    assert same_schedule(text, parse_schedule(pictures.render_json(sched)))
    assert same_schedule(text, parse_schedule(_old_text(sched.gm)))
    assert schedule_diff(parse_schedule(_old_text(sched.gm)), text) == []


def _records_apart(gm: GraphModule) -> GraphModule:
    """A copy of ``gm`` whose switches record nothing: each record of a switch's list is a
    ``record_event`` node right before it (the same schedule in the ops of older graphs)."""
    copy = GraphModule(gm, gm.graph.__deepcopy__(), "Apart")
    for node in list(copy.graph.nodes):
        if node.target is msched.ops.set_stream and len(node.args) > 2:
            stream, waits, records = node.args
            node.args = (stream, waits)
            for event in records:  # type: ignore[union-attr]
                with copy.graph.inserting_before(node):
                    copy.graph.call_function(msched.ops.record_event, (event,))
    copy.recompile()
    return copy


def test_a_switch_that_records_reads_as_the_records_before_it(sched: msched.Schedule) -> None:
    apart = _records_apart(sched.gm)
    assert len(apart.graph.nodes) > len(sched.gm.graph.nodes)  # the schedule has some
    assert pictures.render_text(apart) == pictures.render_text(sched.gm)
    assert _diff(apart, sched.gm) == [] and _diff(sched.gm, apart) == []
    assert same_schedule(parsed(sched.gm), parse_schedule(pictures.render_json(apart)))


def test_an_added_node_is_one_line_with_its_waits_and_who_joins_it() -> None:
    lines = _diff(_two(True), _two(True, extra=True))
    assert lines == [
        "+ c on s2 (waits for a on s0; joined by output)",
        "streams 2 → 3, nodes 6 → 7, events 2 → 3, waits 2 → 4, makespan 21 → 21",
    ]
    assert _diff(_two(True, extra=True), _two(True))[0] == (
        "- c on s2 (waits for a on s0; joined by output)"
    )


def test_a_node_moved_to_another_stream() -> None:
    lines = _diff(_two(True, b_stream=0), _two(True, b_stream=1))
    assert lines[0] == "~ b s0 → s1 (waits for a on s0; joined by out on s0)"
    assert lines[1:] == ["streams 1 → 2, events 1 → 2, waits 0 → 2, makespan 21 → 21"]


def test_a_wait_that_changed_names_which_stream_waits_for_which_node() -> None:
    lines = _diff(_two(True), _two(False))
    assert lines[:2] == [
        "+ wait on s1 for an unrecorded event, before b",
        "- wait on s1 for a on s0, before b",
    ]


def test_a_race_is_said_in_the_line_of_the_node() -> None:
    s = Scheduled()
    x = s.input("x")
    a = s.op("a", aten.neg.default, x)
    s.stream(1)
    b = s.op("b", aten.neg.default, x)  # no record: output never waits for it
    s.stream(0)
    racy = s.done(s.op("out", aten.add.Tensor, a, b))
    s = Scheduled()
    x = s.input("x")
    a = s.op("a", aten.neg.default, x)
    out = s.done(s.op("out", aten.add.Tensor, a, x))
    assert _diff(out, racy)[0] == "+ b on s1 (NOT joined by out on s0, output)"


def test_a_wait_that_moved_is_one_line() -> None:
    def graph(early: bool) -> GraphModule:
        s = Scheduled()
        x = s.input("x")
        a = s.op("a", aten.neg.default, x)
        s.record(0)
        s.stream(1)
        if early:
            s.wait(0)
        b = s.op("b", aten.neg.default, x)
        if not early:
            s.wait(0)
        c = s.op("c", aten.add.Tensor, a, b)
        s.record(1)
        s.stream(0)
        s.wait(1)
        return s.done(s.op("out", aten.neg.default, c))

    assert _diff(graph(True), graph(False))[0] == (
        "~ wait on s1 for a on s0: now before c (was before b)"
    )


def test_nodes_reordered_on_their_stream() -> None:
    def graph(first: str) -> GraphModule:
        s = Scheduled()
        x = s.input("x")
        nodes = {}
        for name in (first, "q" if first == "p" else "p"):
            nodes[name] = s.op(name, aten.neg.default, x)
        return s.done(s.op("out", aten.add.Tensor, nodes["p"], nodes["q"]))

    assert (
        _diff(graph("p"), graph("q"))[0] == "~ q reordered on s0: now after (first) (was after p)"
    )


def test_a_snapshot_summary_is_short_and_never_raises(sched: msched.Schedule) -> None:
    one = pictures.render_text(msched.schedule(decoder_stack(3, (0, 2), moe=True).gm, 1))
    three = pictures.render_text(sched)
    summary = snapshot_summary(one, three, limit=3)
    assert len(summary) == 5
    # The counts come first: pytest cuts a long assertion message from its end.
    assert summary[0].startswith("streams 1 → 3, events 0 → ")
    assert summary[4].startswith("... and ") and summary[4].endswith("(msched diff shows all)")
    assert snapshot_summary("not a schedule", three) == []
    assert snapshot_summary(three, three.replace("wait @", "wait @nothing_")) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no '# streams"),
        ("# streams 1, events 0, waits 0\n# makespan 1, lower bound 1\ns0 | frob\n", "line 3"),
        ("# streams 1, events 0, waits 0\n# makespan 1, lower bound 1\ns0 | x = input\n", "output"),
        (
            "# streams 1, events 0, waits 0\n# makespan 1, lower bound 1\ns0 | wait @a\n",
            "before any 'record @a'",
        ),
        ('{"format": "other"}', "msched-schedule/1"),
        ("{", "invalid JSON"),
    ],
)
def test_what_is_not_a_schedule_is_an_error_naming_the_line(text: str, message: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=message):
        parse_schedule(text, "t.txt")


def test_a_stream_beyond_the_header_is_an_error_naming_the_node(sched: msched.Schedule) -> None:
    """A file whose nodes use more streams than its header declares is no schedule: read
    as one, diff would compare a program of streams the file says it does not have."""
    fewer = pictures.render_text(sched).replace("# streams 3,", "# streams 2,", 1)
    doc = json.loads(pictures.render_json(sched))
    doc["streams"] = 2
    for text, name in ((fewer, "t.txt"), (json.dumps(doc), "t.json")):
        with pytest.raises(msched.InvalidArgumentError) as refused:
            parse_schedule(text, name)
        assert str(refused.value).startswith(f"{name}: ")
        assert "names stream 2, but the header declares 2 streams (0 to 1)" in str(refused.value)


def test_the_parsed_program_is_the_program_of_the_text(sched: msched.Schedule) -> None:
    p = parse_schedule(pictures.render_text(sched))
    program = interpret(sched.gm)
    # A switch is a line (and a step) of its own only where it waits: ``switch, wait ...``.
    kinds = [
        s.kind
        for i, s in enumerate(program.steps)
        if s.kind != "set_stream" or program.steps[i + 1].node is s.node
    ]
    assert [s.kind for s in p.steps] == kinds
    assert "set_stream" in kinds
    assert p.clocks.exit_happens_after(p.program.steps[-2].node) or kinds[-2] != "compute"


def test_the_counts_line_names_nodes_with_other_arguments_and_json_says_it_cannot() -> None:
    a = msched.schedule(decoder_stack(6, (1, 5)).gm, 3)
    b = msched.schedule(decoder_stack(6, (0, 1, 5)).gm, 3)
    texts = schedule_diff(parse_schedule(pictures.render_text(a)), parsed(b))
    assert texts[-1].endswith("; 2 nodes with other arguments (capture_1, capture_5)")
    from_json = schedule_diff(parse_schedule(pictures.render_json(a)), parsed(b))
    assert from_json[-1].endswith("; arguments not compared (a JSON schedule does not record them)")
    assert "other arguments" not in from_json[-1]


def test_a_weight_load_on_another_lane_is_no_moved_node() -> None:
    from tests.plugin import myeng

    gm = myeng.model()
    myeng.schedule(gm, 3)
    text = pictures.render_text(msched.read_schedule(gm, dialect=myeng.DIALECT))
    lines = text.splitlines()
    lines.remove("s0 | w1 = self.w1")  # the get_attr of a weight, printed on s1 instead
    at = lines.index("s1 |   stash_default = myeng.stash.default(dest, mm, 0, 4)")
    lines.insert(at + 1, "s1 |   w1 = self.w1")
    summary = snapshot_summary(text, "\n".join(lines) + "\n")
    assert summary and not any("w1" in line for line in summary), summary


# --- text versions ---------------------------------------------------------------------------

OLD_TEXTS = Path(__file__).parent / "old_texts"
EXAMPLE_SNAPSHOTS = (
    Path(__file__).parents[3] / "examples" / "downstream" / "tests" / "__snapshots__"
)


def test_a_committed_snapshot_of_format_1_reads_as_the_schedule_it_was() -> None:
    """The snapshot of ``test_moe_decoder[streams2]`` as it was committed before texts had a
    version line (its lower bound was 140 then): the same schedule as today's snapshot."""
    old = (OLD_TEXTS / "moe_decoder_streams2.format1.txt").read_text()
    assert not old.startswith("# msched text format")
    new = (EXAMPLE_SNAPSHOTS / "test_engine" / "test_moe_decoder[streams2].msched.txt").read_text()
    assert new.startswith("# msched text format 2\n")
    a, b = parse_schedule(old, "old.txt"), parse_schedule(new, "new.txt")
    assert (a.lower_bound, b.lower_bound) == ("140", "141.5")
    assert [(s.kind, s.stream, a.name_of[s.node]) for s in a.steps] == [
        (s.kind, s.stream, b.name_of[s.node]) for s in b.steps
    ]
    assert schedule_diff(a, b) == [
        "events 19 → 19, waits 19 → 19, makespan 178 → 178, lower bound 140 → 141.5"
    ]


def test_a_text_of_another_version_is_an_error_naming_it(sched: msched.Schedule) -> None:
    text = pictures.render_text(sched)
    assert text.startswith("# msched text format 2\n")
    for version in ("3", "two"):
        other = text.replace("format 2", f"format {version}", 1)
        with pytest.raises(
            msched.InvalidArgumentError,
            match=f"t.txt: msched text format '{version}' is not one this msched reads",
        ):
            parse_schedule(other, "t.txt")


def test_events_by_id_are_format_1_only(sched: msched.Schedule) -> None:
    old = _old_text(sched.gm)
    assert "record e" in old
    assert same_schedule(parse_schedule(old), parsed(sched.gm))
    with pytest.raises(msched.InvalidArgumentError, match=r"line \d+: cannot read .record e\d+."):
        parse_schedule("# msched text format 2\n" + old)


def test_other_arguments_are_a_difference_in_a_text_with_switches_that_wait(
    sched: msched.Schedule,
) -> None:
    text = pictures.render_text(sched)
    assert "switch, wait @" in text
    other = text.replace("aten.mm.default(", "aten.mm.default(9, ", 1)
    a, b = parse_schedule(text), parse_schedule(other)
    assert not same_schedule(a, b)
    assert schedule_diff(a, b)[-1].endswith("; 1 node with other arguments (mm_default)")


# --- host-only nodes -------------------------------------------------------------------------


def _with_event_creates(early: bool) -> msched.Schedule:
    """myeng's 3-stream schedule with a host-only ``event_create`` per event: all at the start
    (``early``), or each right before its record: between ``h`` and its record on stream 0,
    between a stash and its record on the stash's stream."""
    from tests.plugin import myeng

    gm = myeng.model()
    myeng.schedule(gm, 3)
    graph = gm.graph
    start = next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))
    for record in [n for n in graph.nodes if n.target is myeng.RECORD]:
        name = str(record.args[0])
        with graph.inserting_before(start if early else record):
            graph.create_node("call_function", myeng.EVENT_CREATE, (name,), name=f"new_{name}")
    gm.recompile()
    sched = msched.read_schedule(gm, dialect=myeng.DIALECT)
    assert msched.verify(gm, dialect=myeng.DIALECT).ok
    return sched


def test_host_only_nodes_are_marked_and_never_moved_nodes_or_anchors() -> None:
    early, late = _with_event_creates(True), _with_event_creates(False)
    text = pictures.render_text(late)
    assert "s0 | host new_src0 = myeng.event_create.default('src0')" in text.splitlines()
    assert "s1 |   host new_stash0 = myeng.event_create.default('stash0')" in text.splitlines()
    lines = schedule_diff(parse_schedule(pictures.render_text(early)), parse_schedule(text))
    assert lines[0] == "host order differs: each stream runs the same nodes and sync in order"
    assert not any(line.startswith(("+", "-", "~")) or "new_" in line for line in lines), lines
    # Read back, each record has the name the text printed (``@mm``, never ``@new_src0``).
    printed = [line.split()[-1] for line in text.splitlines() if " record @" in line]
    assert printed[:2] == ["@mm", "@stash_default"]
    for p in (parse_schedule(text), parse_schedule(pictures.render_json(late))):
        assert [p.record_name[s.node] for s in p.steps if s.kind == "record_event"] == printed
        hosts = [p.name_of[s.node] for s in p.steps if s.kind == "host"]
        assert hosts[:2] == ["new_src0", "new_stash0"]
    assert same_schedule(parse_schedule(text), parse_schedule(pictures.render_json(late)))

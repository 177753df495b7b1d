"""`msched.verify`: exact violations on hand-written schedules, clean reports on msched's own."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.fx import GraphModule

import msched
from msched.analysis.nodes import node_named
from msched.models.decoders import decoder_stack
from msched.proof.verifier import VIOLATION_KINDS, Report, Violation

from ..graphs import cyclic_graph, within
from ..scheduled import Scheduled, aten, two_streams, unjoined_aux_start, unscheduled


def kinds(report: Report) -> list[str]:
    return [v.kind for v in report.violations]


@pytest.mark.parametrize("streams", [1, 2, 3, 4])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_msched_schedules_verify_clean(moe: bool, streams: int) -> None:
    stack = decoder_stack(6, (1, 3, 5), moe=moe)
    sched = msched.schedule(stack.gm, streams)
    for report in (
        msched.verify(stack.gm, original=sched.original),
        msched.verify(stack.gm),
        msched.verify(stack.gm.graph, original=sched.original.graph, num_streams=streams),
    ):
        assert report.ok, str(report)
        assert report.num_nodes == len(sched.original.graph.nodes)


def test_clean_hand_written_schedule() -> None:
    gm = two_streams()
    report = msched.verify(gm, original=unscheduled(gm))
    assert report.ok and report.violations == ()
    assert report.num_streams == 2
    assert str(report) == "schedule verified: no violation (10 nodes on 2 streams)"
    report.raise_if_failed()  # does not raise


def test_missing_wait_is_a_data_race_that_names_nodes_and_streams() -> None:
    gm = two_streams(wait_for_a=False)
    (v,) = msched.verify(gm, original=unscheduled(gm)).violations
    assert (v.kind, v.hazard, v.nodes, v.streams) == ("race", "data", ("a", "b"), (0, 1))
    assert v.message == (
        "`b` on stream 1 uses `a` without waiting for `a` on stream 0: record an event after "
        "`a` and wait on it on stream 1 before `b`"
    )


def test_exit_that_does_not_join_a_capture() -> None:
    gm = two_streams(join_exit=False)
    for report in (msched.verify(gm, original=unscheduled(gm)), msched.verify(gm)):
        (v,) = report.violations
        assert (v.kind, v.nodes, v.streams, v.hazard) == (
            "exit-not-joined",
            ("capture", "output"),
            (1, 0),
            None,
        )
        assert v.message == (
            "output on stream 0 does not wait for `capture` on stream 1: record an event "
            "after it and wait on it before output"
        )


def test_missing_record_stream() -> None:
    gm = two_streams(record=False)
    (v,) = msched.verify(gm, original=unscheduled(gm)).violations
    assert (v.kind, v.nodes, v.streams) == ("missing-record-stream", ("a", "b"), (0, 1))
    assert "add record_stream(a, 1) before `b`" in v.message


def test_graph_inputs_need_no_record_stream() -> None:
    # two_streams() uses the inputs x, w and dest on stream 1 with no record_stream for them.
    gm = two_streams()
    used_on_1 = {n.name for n in gm.graph.nodes if n.name in ("b", "capture")}
    assert used_on_1 == {"b", "capture"}
    assert msched.verify(gm).ok


def storage_hazard(kind: str, synced: bool) -> GraphModule:
    """``dest`` (an input) is read on stream 0 and written by captures on stream 1."""
    s = Scheduled()
    x, dest = s.input("x"), s.input("dest")
    s.record(0)
    s.stream(1)
    s.wait(0)
    if kind == "war":
        s.stream(0)
        read = s.op("read", aten.mul.Tensor, dest, x)
        s.record(1)
        s.stream(1)
        if synced:
            s.wait(1)
        s.capture("write", dest, x)
    else:
        s.capture("write", dest, x)
        s.record(1)
        s.stream(0)
        if synced:
            s.wait(1)
        if kind == "raw":
            read = s.op("read", aten.mul.Tensor, dest, x)
        else:
            s.capture("write_again", dest, x, 4, 8)
            read = s.op("read", aten.mul.Tensor, x, x)
    s.stream(1)
    s.record(2)
    s.stream(0)
    s.wait(2)
    return s.done(read)


@pytest.mark.parametrize(
    ("kind", "pair", "what"),
    [
        ("raw", ("write", "read"), "reads `dest`, which `write` writes,"),
        ("war", ("read", "write"), "writes `dest`, which `read` reads,"),
        ("waw", ("write", "write_again"), "writes `dest` after `write` writes it,"),
    ],
)
def test_storage_hazards_are_races_with_their_kind(
    kind: str, pair: tuple[str, str], what: str
) -> None:
    assert msched.verify(storage_hazard(kind, synced=True)).ok
    gm = storage_hazard(kind, synced=False)
    for report in (msched.verify(gm, original=unscheduled(gm)), msched.verify(gm)):
        (v,) = report.violations
        assert (v.kind, v.hazard, v.nodes) == ("race", kind, pair)
        assert what in v.message


def test_aux_stream_must_join_stream_0_before_its_first_node() -> None:
    gm = unjoined_aux_start()
    (v,) = msched.verify(gm).violations  # the input edge x -> b is the same fact: one report
    assert (v.kind, v.hazard, v.nodes, v.streams) == ("race", "data", ("b",), (1,))
    assert "stream 1 starts with `b` without joining stream 0" in v.message


def test_node_after_output_is_reported_and_never_counted_as_run() -> None:
    gm = two_streams()
    capture = node_named(gm, "capture")
    output = next(n for n in gm.graph.nodes if n.op == "output")
    output.append(capture)
    report = msched.verify(gm, original=unscheduled(two_streams()))
    assert kinds(report) == ["after-output"]
    assert report.violations[0].nodes == ("capture",)
    assert "comes after output and never runs" in report.violations[0].message


def test_missing_and_duplicate_nodes() -> None:
    original = unscheduled(two_streams())
    gm = two_streams()
    graph = gm.graph
    b = node_named(graph, "b")
    with graph.inserting_after(b):
        twin = graph.node_copy(b)
    capture = node_named(graph, "capture")
    graph.erase_node(capture)
    report = msched.verify(gm, original=original)
    assert sorted(kinds(report)) == ["duplicate-node", "missing-node"]
    missing = report.of_kind("missing-node")[0]
    duplicate = report.of_kind("duplicate-node")[0]
    assert missing.nodes == ("capture",) and "not in the scheduled graph" in missing.message
    assert duplicate.nodes == ("b", twin.name)
    assert f"remove `{twin.name}`" in duplicate.message


@pytest.mark.parametrize("with_original", [False, True])
def test_an_input_from_another_graph_is_a_missing_node(with_original: bool) -> None:
    original = unscheduled(two_streams())
    gm = two_streams()
    b = node_named(gm, "b")
    stranger = torch.fx.Graph().placeholder("stranger")
    b.args = (stranger, *b.args[1:])
    report = msched.verify(gm, original=original if with_original else None)
    found = report.of_kind("missing-node")
    assert [v.nodes for v in found] == [("stranger", "b")]
    assert "`b` uses `stranger`, which is not a node of this graph" in found[0].message


def test_waits_on_events_that_were_not_recorded() -> None:
    s = Scheduled()
    x = s.input("x")
    s.wait(7)
    a = s.op("a", aten.relu.default, x)
    s.wait(1)
    s.record(1)
    gm = s.done(a)
    never, later = msched.verify(gm).violations
    assert never.kind == later.kind == "unrecorded-event"
    assert "waits for event 7, but it is never recorded" in never.message
    assert (
        "waits for event 1, but it is first recorded later, by `record_event_default`"
        in later.message
    )


def test_stream_ids_out_of_range_and_an_exit_off_stream_0() -> None:
    s = Scheduled()
    x = s.input("x")
    s.record(0)
    s.stream(2)
    s.wait(0)
    a = s.op("a", aten.relu.default, x)
    gm = s.done(a)
    assert kinds(msched.verify(gm)) == ["bad-stream"]  # output issued on stream 2
    report = msched.verify(gm, num_streams=2)
    assert kinds(report) == ["bad-stream", "bad-stream"]
    assert "names stream 2, but the schedule has 2 streams (0..1)" in report.violations[1].message
    # The advice names no stream op: the graph may be in another engine's dialect
    assert report.violations[0].message == (
        "output is issued on stream 2, not on the caller's stream 0: before output, switch "
        "back to stream 0 and wait there for an event recorded after stream 2's last node"
    )


def test_report_and_violation_are_frozen_and_raise_lists_everything() -> None:
    gm = two_streams(join_exit=False, wait_for_a=False)
    report = msched.verify(gm, original=unscheduled(gm))
    assert not report.ok and len(report.violations) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.violations[0].kind = "race"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.violations = ()  # type: ignore[misc]
    with pytest.raises(msched.ScheduleVerificationError) as info:
        report.raise_if_failed()
    text = str(info.value)
    assert text == str(report)
    assert text.startswith("schedule has 2 violations (10 nodes on 2 streams):")
    for v in report.violations:
        assert str(v) in text
    assert "[race/data] `b` on stream 1" in text and "[exit-not-joined] output" in text
    assert all(v.kind in VIOLATION_KINDS for v in report.violations)
    assert isinstance(report.violations[0], Violation)


def test_verify_reads_only_the_graph() -> None:
    gm = two_streams()
    before = [(n.name, n.target, n.args) for n in gm.graph.nodes]
    msched.verify(gm, original=unscheduled(gm))
    assert [(n.name, n.target, n.args) for n in gm.graph.nodes] == before


def test_happens_before_is_transitive_through_a_third_stream() -> None:
    s = Scheduled()
    x = s.input("x")
    s.record(0)
    a = s.op("a", aten.relu.default, x)
    s.record(1)
    s.stream(1)
    s.wait(1)
    s.record(2)  # stream 1 has only waited: its event carries stream 0's `a`
    s.stream(2)
    s.wait(2)
    b = s.op("b", aten.neg.default, a)
    s.keep(a, 2)
    s.record(3)
    s.stream(0)
    s.wait(3)
    s.keep(b, 0)
    gm = s.done(b)
    assert msched.verify(gm).ok, str(msched.verify(gm))


def test_bad_input_raises_clear_errors() -> None:
    s = Scheduled()
    x = s.input("x")
    s.stream(-1)
    gm = s.done(x)
    with pytest.raises(msched.InvalidGraphError, match="negative id -1"):
        msched.verify(gm)

    s = Scheduled()
    x = s.input("x")
    s.wait(1.5)
    gm = s.done(x)
    with pytest.raises(
        msched.InvalidGraphError,
        match=r"wait_event node 'wait_event\w*' takes a literal int as argument 0 \(event\), "
        r"got 1.5",
    ):
        msched.verify(gm)

    s = Scheduled()
    x = s.input("x")
    s.wait(x)
    with pytest.raises(
        msched.InvalidGraphError, match=r"takes a literal int as argument 0 \(event\), got x"
    ):
        msched.verify(s.done(x))

    s = Scheduled()
    x = s.input("x")
    s.graph.output(x)
    gm = s.done(x)
    with pytest.raises(msched.InvalidGraphError, match="2 output nodes"):
        msched.verify(gm)


@pytest.mark.parametrize("bad", [torch.nn.Linear(2, 2), "graph", 3])
def test_non_graphs_are_rejected(bad: object) -> None:
    with pytest.raises(msched.InvalidArgumentError, match="expected a torch.fx.GraphModule"):
        msched.verify(bad)  # type: ignore[arg-type]
    with pytest.raises(msched.InvalidArgumentError, match="expected a torch.fx.GraphModule"):
        msched.verify(two_streams(), original=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, -1, True, 2.0])
def test_num_streams_must_be_a_positive_int(n: object) -> None:
    with pytest.raises(msched.InvalidArgumentError, match="num_streams"):
        msched.verify(two_streams(), num_streams=n)  # type: ignore[arg-type]


def captured_then_rogue_zero(rogue_stream: int) -> tuple[GraphModule, GraphModule]:
    """``h = x @ x``, ``copy_(dest, h)``, ``cos(h)`` scheduled on 2 streams, then a
    ``zero_(dest)`` that is not in the original added on ``rogue_stream`` right before
    output, with no synchronisation.  Returns the scheduled module and the original."""
    g = torch.fx.Graph()
    x, dest = g.placeholder("x"), g.placeholder("dest")
    h = g.create_node("call_function", aten.mm.default, (x, x), name="h")
    g.create_node("call_function", aten.copy_.default, (dest, h), name="capture")
    g.output(g.create_node("call_function", aten.cos.default, (h,), name="cos"))
    gm = GraphModule(torch.nn.Module(), g)
    sched = msched.schedule(gm, 2)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        gm.graph.call_function(msched.ops.set_stream, (rogue_stream,))
        gm.graph.create_node("call_function", aten.zero_.default, (dest,), name="rogue")
        gm.graph.call_function(msched.ops.set_stream, (0,))
    gm.recompile()
    return gm, sched.original


def test_an_unsynchronised_extra_write_is_an_extra_node_a_race_and_not_joined() -> None:
    gm, original = captured_then_rogue_zero(rogue_stream=1)
    capture_stream = msched.proof.interpreter.interpret(gm).stream_of[node_named(gm, "capture")]
    report = msched.verify(gm, original=original)
    found = [(v.kind, v.hazard, v.nodes) for v in report.violations]
    assert found[0] == ("extra-node", None, ("rogue",))
    assert report.violations[0].message == (
        "`rogue` is not in the original graph (no original node computes the same from the "
        "same values): the schedule added or changed it, and a schedule may add only stream "
        "ops; remove it (or schedule the graph that contains it)"
    )
    assert ("exit-not-joined", None, ("rogue", "output")) in found
    if capture_stream != 1:  # the capture's write to dest is not ordered before the zero_
        assert ("race", "waw", ("capture", "rogue")) in found
    assert "extra-node" not in kinds(msched.verify(gm))  # without original: no node is extra


def test_a_race_free_extra_node_is_only_an_extra_node() -> None:
    gm, original = captured_then_rogue_zero(rogue_stream=0)
    report = msched.verify(gm, original=original)
    assert [(v.kind, v.nodes) for v in report.violations] == [("extra-node", ("rogue",))]
    assert msched.verify(gm).ok  # ordered by the host order on stream 0


def test_an_extra_node_read_by_an_original_node_is_ordered_like_it() -> None:
    gm = two_streams()
    original = unscheduled(gm)
    graph = gm.graph
    a, b = (node_named(graph, name) for name in ("a", "b"))
    with graph.inserting_after(a.next):  # after a's record_event: b's wait misses it
        extra = graph.create_node("call_function", aten.neg.default, (a,), name="extra")
    b.args = (extra, *b.args[1:])
    report = msched.verify(gm, original=original)
    found = [(v.kind, v.hazard, v.nodes) for v in report.violations]
    assert found[0] == ("extra-node", None, ("extra",))
    assert ("race", "data", ("extra", "b")) in found


def _one_stream(*names: str) -> GraphModule:
    """Inputs ``x`` and ``dest``, then the named nodes on stream 0 in the given order:
    ``read`` = ``dest * x``, ``write`` / ``write_again`` = captures of ``x`` into ``dest``
    (``write_again`` into part of it: two equal writes would be interchangeable)."""
    s = Scheduled()
    x, dest = s.input("x"), s.input("dest")
    for name in names:
        if name == "read":
            s.op("read", aten.mul.Tensor, dest, x)
        else:
            s.capture(name, dest, x, 0, 4 if name == "write" else 2)
    return s.done(x)


@pytest.mark.parametrize(
    ("kind", "program", "message"),
    [
        (
            "raw",
            ("write", "read"),
            "`read` on stream 0 reads `dest`, which `write` writes, but `write` (stream 0) is "
            "issued after it, against program order: issue `write` before `read`",
        ),
        (
            "war",
            ("read", "write"),
            "`write` on stream 0 writes `dest`, which `read` reads, but `read` (stream 0) is "
            "issued after it, against program order: issue `read` before `write`",
        ),
        (
            "waw",
            ("write", "write_again"),
            "`write_again` on stream 0 writes `dest` after `write` writes it, but `write` "
            "(stream 0) is issued after it, against program order: issue `write` before "
            "`write_again`",
        ),
    ],
)
def test_a_hazard_issued_against_program_order_has_one_comma(
    kind: str, program: tuple[str, str], message: str
) -> None:
    scheduled = _one_stream(*reversed(program))
    (v,) = msched.verify(scheduled, original=_one_stream(*program)).violations
    assert (v.kind, v.hazard, v.nodes) == ("race", kind, program)
    assert v.message == message


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        (
            "raw",
            "`read` on stream 0 reads `dest`, which `write` writes, without waiting for "
            "`write` on stream 1: record an event after `write` and wait on it on stream 0 "
            "before `read`",
        ),
        (
            "war",
            "`write` on stream 1 writes `dest`, which `read` reads, without waiting for "
            "`read` on stream 0: record an event after `read` and wait on it on stream 1 "
            "before `write`",
        ),
        (
            "waw",
            "`write_again` on stream 0 writes `dest` after `write` writes it, without waiting "
            "for `write` on stream 1: record an event after `write` and wait on it on stream "
            "0 before `write_again`",
        ),
    ],
)
def test_the_exact_message_of_an_unsynchronised_hazard(kind: str, message: str) -> None:
    gm = storage_hazard(kind, synced=False)
    for report in (msched.verify(gm, original=unscheduled(gm)), msched.verify(gm)):
        (v,) = report.violations
        assert v.message == message


@pytest.mark.parametrize(
    ("self_loop", "cycle"), [(False, "cos -> matmul -> cos"), (True, "cos -> cos")]
)
@pytest.mark.parametrize("which", ["scheduled", "original"])
def test_a_cyclic_graph_is_refused_naming_the_cycle(
    self_loop: bool, cycle: str, which: str
) -> None:
    gm = cyclic_graph(self_loop)
    before = [(n.name, n.args) for n in gm.graph.nodes]
    where = "the graph" if which == "scheduled" else "the original graph"
    with (
        within(10),
        pytest.raises(msched.InvalidGraphError, match=f"{where} has a cycle: {cycle} "),
    ):
        if which == "scheduled":
            msched.verify(gm)
        else:
            msched.verify(two_streams(), original=gm)
    assert [(n.name, n.args) for n in gm.graph.nodes] == before


def test_a_node_used_before_its_definition_is_a_race_not_a_cycle() -> None:
    gm = two_streams()
    nodes = {n.name: n for n in gm.graph.nodes}
    nodes["a"].prepend(nodes["b"])  # b = a @ w is issued before a
    assert "race" in kinds(msched.verify(gm))


@pytest.mark.parametrize("dialect", ["msched", None, msched.Dialect()])
def test_dialect_by_name(dialect: object) -> None:
    assert msched.verify(two_streams(), dialect=dialect).ok  # type: ignore[arg-type]
    assert not msched.verify(two_streams(wait_for_a=False), dialect=dialect).ok  # type: ignore[arg-type]


def test_the_trtllm_dialect_by_name_reads_trtllm_op_names() -> None:
    with pytest.raises(msched.InvalidGraphError, match="read in the trtllm dialect"):
        msched.verify(two_streams(), dialect="trtllm")


@pytest.mark.parametrize(
    ("dialect", "match"),
    [
        ("cuda", r"unknown dialect 'cuda': known dialects are 'msched', 'trtllm'"),
        ("aten", r"unknown dialect 'aten'"),  # has record_stream, but is no dialect
        ("", r"unknown dialect ''"),
        (3, "dialect must be a msched.Dialect, a dialect name or None, got int"),
        (msched.ops, "got module"),
    ],
)
def test_a_bad_dialect_is_an_invalid_argument(dialect: object, match: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=match):
        msched.verify(two_streams(), dialect=dialect)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [msched.MAX_STREAMS + 1, 4096])
def test_num_streams_is_bounded(n: int) -> None:
    with within(10), pytest.raises(msched.InvalidArgumentError, match="num_streams must be <= 64"):
        msched.verify(two_streams(), num_streams=n)
    assert msched.verify(two_streams(), num_streams=msched.MAX_STREAMS).ok


def test_a_stream_id_beyond_the_bound_is_refused() -> None:
    s = Scheduled()
    x = s.input("x")
    s.stream(msched.MAX_STREAMS)
    gm = s.done(x)
    with (
        within(10),
        pytest.raises(
            msched.InvalidGraphError, match=r"names stream 64, but stream ids are 0\.\.63"
        ),
    ):
        msched.verify(gm)

"""`msched.verify` on collectives: one issue order, and no use of their tensors before the wait.

Every mutant starts from a schedule `msched.schedule` made (or a hand-written one where the
mutant needs streams the scheduler would not pick) and breaks it in one known way; each has a
fixed twin that verifies.  No process group is needed: the graphs only name
``torch.ops._c10d_functional`` targets.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo  # noqa: F401  (registers torch.ops.streams)
from torch.fx import Graph, GraphModule

import msched
from msched.analysis.collectives import collectives_in
from msched.analysis.nodes import node_named
from msched.proof.collective_order import COLLECTIVE_KINDS
from msched.proof.verifier import VIOLATION_KINDS, Report

from ..scheduled import Scheduled, aten, unscheduled
from ..sharded_graphs import ENGINE_ALL_REDUCE, two_microbatches

FC = torch.ops._c10d_functional


def kinds(report: Report) -> list[tuple[str, str | None]]:
    return [(v.kind, v.hazard) for v in report.violations]


def host_collectives(gm: GraphModule) -> list[str]:
    return [c.node.name for c in collectives_in(gm.graph)]


def move_before(gm: GraphModule, name: str, anchor: str) -> None:
    node_named(gm, anchor).prepend(node_named(gm, name))
    gm.recompile()


# -- the scheduler keeps the order ---------------------------------------------------------


def uneven_microbatches() -> GraphModule:
    """Micro-batch a computes three linears before its all-reduce, b one: a list scheduler
    that ignored the chain would issue b's all-reduce first on two or more streams."""
    g = Graph()
    xa, xb, w = g.placeholder("xa"), g.placeholder("xb"), g.placeholder("w")
    h = xa
    for i in range(3):
        h = g.create_node("call_function", aten.mm.default, (h, w), name=f"a{i}")
    ra = g.create_node("call_function", FC.all_reduce, (h, "sum", "tp"), name="ar_a")
    hb = g.create_node("call_function", aten.mm.default, (xb, w), name="b0")
    rb = g.create_node("call_function", FC.all_reduce, (hb, "sum", "ep"), name="ar_b")
    ta = g.create_node("call_function", FC.wait_tensor, (ra,), name="wait_a")
    tb = g.create_node("call_function", FC.wait_tensor, (rb,), name="wait_b")
    g.output((ta, tb))
    return GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("streams", [1, 2, 3])
@pytest.mark.parametrize("build", [two_microbatches, uneven_microbatches])
def test_schedule_keeps_the_host_order_of_collectives(build: object, streams: int) -> None:
    gm = build()  # type: ignore[operator]
    before = host_collectives(gm)
    sched = msched.schedule(gm, streams)
    assert host_collectives(sched.gm) == before
    for report in (msched.verify(sched.gm, sched.original), msched.verify(sched.gm)):
        assert report.ok, str(report)


def test_the_dag_chains_collectives_of_every_group_in_program_order() -> None:
    dag = msched.build_dag(uneven_microbatches())
    ar_a, ar_b = (node_named(dag.nodes[0].graph, n) for n in ("ar_a", "ar_b"))
    assert dag.dependencies(ar_b) == {ar_a: {"collective"}, node_named(ar_b.graph, "b0"): {"data"}}


# -- collective-order ----------------------------------------------------------------------


def test_two_all_reduces_of_one_group_swapped() -> None:
    sched = msched.schedule(two_microbatches(), 1)
    assert msched.verify(sched.gm, sched.original).ok
    move_before(sched.gm, "lin1_b", "lin1_a")
    move_before(sched.gm, "ar_b", "lin1_a")
    report = msched.verify(sched.gm, sched.original)
    assert kinds(report) == [("collective-order", None)], str(report)
    (v,) = report.violations
    assert v.nodes == ("ar_a", "ar_b")
    assert "against the original order" in v.message


def unordered_on_two_streams(ordered: bool, target: object = FC.all_reduce) -> GraphModule:
    """``ar_a`` on stream 0 and ``ar_b`` on stream 1; stream 1 joined stream 0 at the start
    (and, when ``ordered``, again after ``ar_a``)."""
    s = Scheduled()
    xa, xb, w = s.input("xa"), s.input("xb"), s.input("w")
    group = ("sum", "0") if target is FC.all_reduce else ("0",)
    s.record(0)
    ha = s.op("lin1_a", aten.mm.default, xa, w)
    ra = s.op("ar_a", target, ha, *group)
    s.record(1)
    s.stream(1)
    s.wait(0)
    hb = s.op("lin1_b", aten.mm.default, xb, w)
    if ordered:
        s.wait(1)
    rb = s.op("ar_b", target, hb, *group)
    s.record(2)
    s.stream(0)
    s.wait(2)
    if target is FC.all_reduce:
        ra = s.op("wait_a", FC.wait_tensor, ra)
        rb = s.op("wait_b", FC.wait_tensor, rb)
    oa = s.op("lin2_a", aten.mm.default, ra, w)
    ob = s.op("lin2_b", aten.mm.default, rb, w)
    return s.done((oa, ob))


@pytest.mark.parametrize("with_original", [True, False])
def test_two_collectives_of_one_group_on_two_streams_unordered(with_original: bool) -> None:
    gm = unordered_on_two_streams(ordered=False)
    report = msched.verify(gm, unscheduled(gm) if with_original else None)
    assert kinds(report) == [("collective-order", None)], str(report)
    (v,) = report.violations
    assert (v.nodes, v.streams) == (("ar_a", "ar_b"), (0, 1))
    assert "`ar_b` (all_reduce, group 0) on stream 1 is not ordered after `ar_a`" in v.message
    fixed = unordered_on_two_streams(ordered=True)
    assert msched.verify(fixed, unscheduled(fixed)).ok


def test_the_msched_schedule_moved_to_another_stream_unordered() -> None:
    sched = msched.schedule(two_microbatches(), 2)
    gm = sched.gm
    stream_of = msched.read_schedule(gm).stream_of
    assert stream_of(node_named(gm, "ar_a")) != stream_of(node_named(gm, "lin1_b"))
    move_before(gm, "ar_b", node_named(gm, "lin1_b").next.name)  # right after lin1_b
    report = msched.verify(gm, sched.original)
    assert ("collective-order", None) in kinds(report), str(report)


def test_engine_collectives_on_two_streams_unordered(engine_collective: object) -> None:
    target = ENGINE_ALL_REDUCE.default
    gm = unordered_on_two_streams(ordered=False, target=target)
    report = msched.verify(gm, unscheduled(gm))
    assert kinds(report) == [("collective-order", None)], str(report)
    assert "(mschedtest::all_reduce, group 0)" in report.violations[0].message
    fixed = unordered_on_two_streams(ordered=True, target=target)
    assert msched.verify(fixed, unscheduled(fixed)).ok


def test_an_engine_collective_is_ordered_only_once_registered() -> None:
    gm = unordered_on_two_streams(ordered=False, target=ENGINE_ALL_REDUCE.default)
    assert msched.verify(gm, unscheduled(gm)).ok  # two plain ops: nothing orders them


# -- races on a collective's tensors ---------------------------------------------------------


def _consumer_reads_issue(gm: GraphModule) -> None:
    """``lin2_a`` reads ``ar_a`` itself (as Inductor's code does after the wait), issued right
    after ``ar_a``, before ``wait_a``."""
    lin2, issue = node_named(gm, "lin2_a"), node_named(gm, "ar_a")
    lin2.replace_input_with(node_named(gm, "wait_a"), issue)
    issue.append(lin2)
    gm.recompile()


@pytest.mark.parametrize("with_original", [True, False])
def test_a_consumer_moved_before_the_wait_is_a_race(with_original: bool) -> None:
    sched = msched.schedule(two_microbatches(), 1)
    _consumer_reads_issue(sched.gm)
    report = msched.verify(sched.gm, sched.original if with_original else None)
    assert [k for k, _ in kinds(report)] == ["race"], str(report)
    (v,) = report.violations
    assert v.nodes == ("wait_a", "lin2_a")


def test_a_consumer_after_the_wait_reading_the_issue_is_fine() -> None:
    sched = msched.schedule(two_microbatches(), 1)
    lin2 = node_named(sched.gm, "lin2_a")
    lin2.replace_input_with(node_named(sched.gm, "wait_a"), node_named(sched.gm, "ar_a"))
    sched.gm.recompile()
    assert msched.verify(sched.gm).ok


def other_stream_consumer(joined_after_wait: bool, reads_issue: bool) -> GraphModule:
    """``ar_a`` and ``wait_a`` on stream 0; ``lin2_a`` on stream 1, which waits for an event
    recorded after the issue (or, when ``joined_after_wait``, after the wait)."""
    s = Scheduled()
    xa, w = s.input("xa"), s.input("w")
    s.record(0)
    ha = s.op("lin1_a", aten.mm.default, xa, w)
    ra = s.op("ar_a", FC.all_reduce, ha, "sum", "0")
    if not joined_after_wait:
        s.record(1)
    ta = s.op("wait_a", FC.wait_tensor, ra)
    if joined_after_wait:
        s.record(1)
    s.stream(1)
    s.wait(1)
    oa = s.op("lin2_a", aten.mm.default, ra if reads_issue else ta, w)
    s.keep(ra, 1)
    s.record(2)
    s.stream(0)
    s.wait(2)
    return s.done(oa)


@pytest.mark.parametrize("reads_issue", [True, False], ids=["reads-issue", "reads-wait"])
def test_a_consumer_on_another_stream_without_waiting_is_a_race(reads_issue: bool) -> None:
    gm = other_stream_consumer(joined_after_wait=False, reads_issue=reads_issue)
    for original in (unscheduled(gm), None):
        report = msched.verify(gm, original)
        assert [k for k, _ in kinds(report)] == ["race"], str(report)
        assert report.violations[0].nodes == ("wait_a", "lin2_a")
        assert report.violations[0].streams == (0, 1)
    fixed = other_stream_consumer(joined_after_wait=True, reads_issue=reads_issue)
    assert msched.verify(fixed, unscheduled(fixed)).ok
    assert msched.verify(fixed).ok


def all_to_all_then_write(target: object = FC.all_to_all_single) -> GraphModule:
    """``h`` sent by a collective, then written in place after the wait."""
    g = Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    h = g.create_node("call_function", aten.mm.default, (x, w), name="h")
    extra = ([2, 2], [2, 2], "ep") if target is FC.all_to_all_single else ("sum", "ep")
    sent = g.create_node("call_function", target, (h, *extra), name="send")
    got = g.create_node("call_function", FC.wait_tensor, (sent,), name="wait_send")
    bump = g.create_node("call_function", aten.add_.Tensor, (h, 1), name="bump")
    g.output((got, bump))
    return GraphModule(torch.nn.Module(), g)


@pytest.mark.parametrize("with_original", [True, False])
def test_a_write_to_an_all_to_all_input_before_its_wait_is_a_race(with_original: bool) -> None:
    sched = msched.schedule(all_to_all_then_write(), 1)
    assert msched.verify(sched.gm, sched.original).ok
    move_before(sched.gm, "bump", "wait_send")
    report = msched.verify(sched.gm, sched.original if with_original else None)
    assert kinds(report) == [("race", "war")], str(report)
    assert report.violations[0].nodes == ("wait_send", "bump")


def test_an_all_reduce_copies_its_input_at_issue() -> None:
    """Read exactly: the out-of-place all_reduce no longer reads ``h`` after its issue."""
    sched = msched.schedule(all_to_all_then_write(FC.all_reduce), 1)
    move_before(sched.gm, "bump", "wait_send")
    assert msched.verify(sched.gm, sched.original).ok
    assert msched.verify(sched.gm).ok


def test_an_unwaited_collective_read_by_output_is_a_race() -> None:
    g = Graph()
    x = g.placeholder("x")
    sent = g.create_node("call_function", FC.all_reduce, (x, "sum", "0"), name="ar")
    g.output(sent)
    report = msched.verify(GraphModule(torch.nn.Module(), g))
    assert kinds(report) == [("race", "raw")], str(report)
    assert "wait for it (wait_tensor of `ar`)" in report.violations[0].message


def test_collective_order_is_a_verify_kind() -> None:
    assert COLLECTIVE_KINDS == ("collective-order",)
    assert set(COLLECTIVE_KINDS) <= set(VIOLATION_KINDS)


def torch_streams_program(joined: bool) -> GraphModule:
    """User stream code in PyTorch's encoding: ``ar_a`` annotated with stream 1, ``ar_b`` on
    the caller's stream, joined to stream 1 between them only when ``joined``."""
    st = torch.ops.streams
    g = Graph()
    x = g.placeholder("x")
    g.call_function(st.wait_stream.default, (1, 0))
    ra = g.create_node("call_function", FC.all_reduce, (x, "sum", "0"), name="ar_a")
    ra.meta["custom"] = {"stream": 1}
    ta = g.create_node("call_function", FC.wait_tensor, (ra,), name="wait_a")
    ta.meta["custom"] = {"stream": 1}
    if joined:
        g.call_function(st.wait_stream.default, (0, 1))
    rb = g.create_node("call_function", FC.all_reduce, (x, "sum", "0"), name="ar_b")
    tb = g.create_node("call_function", FC.wait_tensor, (rb,), name="wait_b")
    if not joined:
        g.call_function(st.wait_stream.default, (0, 1))
    g.output((ta, tb))
    return GraphModule(torch.nn.Module(), g)


def test_the_torch_dialect_reads_collectives_too() -> None:
    report = msched.verify(torch_streams_program(joined=False), dialect="torch")
    assert kinds(report) == [("collective-order", None)], str(report)
    assert report.violations[0].nodes == ("ar_a", "ar_b")
    assert msched.verify(torch_streams_program(joined=True), dialect="torch").ok


def two_equal_all_reduces(crossed: bool, twice: bool = False) -> GraphModule:
    """Two all-reduces of one tensor ``x``, one result read by a projection and the other by
    a relu; ``crossed`` swaps which wait each reads (the same values), ``twice`` makes the
    second all-reduce reduce ``2 * x`` instead (then the swap is a real reorder)."""
    s = Scheduled()
    x, w = s.input("x"), s.input("w")
    second = s.op("double", aten.mul.Tensor, x, 2) if twice else x
    r1 = s.op("r1", FC.all_reduce.default, x, "sum", "tp")
    r2 = s.op("r2", FC.all_reduce.default, second, "sum", "tp")
    w1, w2 = s.op("w1", FC.wait_tensor.default, r1), s.op("w2", FC.wait_tensor.default, r2)
    if crossed:
        w1, w2 = w2, w1
    return s.done((s.op("proj", aten.mm.default, w1, w), s.op("act", aten.relu.default, w2)))


def test_equal_collectives_read_crosswise_keep_their_order() -> None:
    """Two all-reduces of one tensor are one value: a graph reading them crosswise issues
    the same operations in the same order, though its readers pair the second issue with
    the first original all-reduce.  That was a false collective-order."""
    report = msched.verify(two_equal_all_reduces(crossed=True), two_equal_all_reduces(False))
    assert report.ok, str(report)
    original = two_equal_all_reduces(crossed=False, twice=True)
    swapped = two_equal_all_reduces(crossed=False, twice=True)
    r1, r2 = node_named(swapped, "r1"), node_named(swapped, "r2")
    r1.prepend(r2)
    swapped.recompile()
    assert kinds(msched.verify(swapped, original)) == [("collective-order", None)]

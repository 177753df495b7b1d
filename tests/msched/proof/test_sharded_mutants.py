"""`msched.verify` names the kind on mutants of the sharded decoder-stack schedules.

Each case is a `decoder_stack` (tensor parallel, expert parallel, with and without two
micro-batches; captures on) that `msched.schedule` put on 2 and 3 streams and `verify` finds
correct; each mutant then breaks the scheduled graph in one way, and its twin (the same edit
done right) verifies.  These are the faults issue 34 asks `verify` to name on *these*
schedules (`test_collectives_verify` has them on hand-written graphs).  None verified
before issue 34: the order of collectives was no rule, and a collective's communication was
not known to run until its ``wait_tensor``.  Building and scheduling the stacks needs no
process group.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx import GraphModule, Node

import msched
from msched.analysis.collectives import collectives_in, waits_of
from msched.analysis.nodes import node_named
from msched.models.decoders import decoder_stack

from ..faults import (
    independent_pairs,
    issue_after,
    on_another_stream,
    rename_every_node,
    swap_names,
    unorder,
)

aten = torch.ops.aten

CASES: dict[str, dict[str, Any]] = {
    "tp": {"tp": 2},
    "tp-microbatches": {"tp": 2, "microbatches": 2},
    "ep": {"moe": True, "ep": 2},
    "ep-microbatches": {"moe": True, "ep": 2, "microbatches": 2},
}
STREAMS = (2, 3)


def scheduled(case: str, streams: int, write_after: bool = False) -> msched.Schedule:
    """Stack ``case`` on rank 0, scheduled on ``streams`` streams and verified.  With
    ``write_after``, the original first gets ``bump_input``: an in-place ``add_`` of the first
    all-to-all's input, after that all-to-all's wait (where the program may write it)."""
    stack = decoder_stack(2, (0, 1), rank=0, **CASES[case])
    if write_after:
        first = collectives_in(stack.gm.graph)[0].node
        (wait,) = waits_of(stack.gm.graph)[first]
        with stack.gm.graph.inserting_after(wait):
            stack.gm.graph.create_node(
                "call_function", aten.add_.Tensor, (first.args[0], 1.0), name="bump_input"
            )
        stack.gm.recompile()
    sched = msched.schedule(stack.gm, streams)
    report = msched.verify(sched.gm, original=sched.original)
    assert report.ok, str(report)
    return sched


def kinds(report: msched.Report) -> list[tuple[str, str | None]]:
    return [(v.kind, v.hazard) for v in report.violations]


def both_reports(sched: msched.Schedule) -> list[msched.Report]:
    """`verify` of the (mutated) schedule with its original and without."""
    return [msched.verify(sched.gm, original=sched.original), msched.verify(sched.gm)]


def independent_pair(gm: GraphModule) -> tuple[Node, Node]:
    """The first two consecutive collectives of ``gm`` where the second does not use the
    first's result (one per micro-batch)."""
    return independent_pairs(gm)[0]


def first_reduced_consumer(gm: GraphModule) -> tuple[Node, Node, Node]:
    """The first all-reduce, its wait and the first node that uses the wait's result."""
    issue = next(c.node for c in collectives_in(gm.graph) if c.op == "all_reduce")
    (wait,) = waits_of(gm.graph)[issue]
    user = next(n for n in gm.graph.nodes if wait in n.all_input_nodes)
    return issue, wait, user


MICROBATCHES = ["tp-microbatches", "ep-microbatches"]
ALL_REDUCES = ["tp", "tp-microbatches"]
ALL_TO_ALLS = ["ep", "ep-microbatches"]


@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("case", MICROBATCHES)
def test_two_collectives_of_one_group_swapped(case: str, streams: int) -> None:
    sched = scheduled(case, streams)
    a, b = independent_pair(sched.gm)
    issue_after(sched.gm, a, b)
    sched.gm.graph.lint()
    report = msched.verify(sched.gm, original=sched.original)
    assert {k for k, _ in kinds(report)} == {"collective-order"}, str(report)
    # and when the two were on two streams, they are no longer ordered either
    assert len(report.violations) <= 2, str(report)
    swapped = next(v for v in report.violations if "against the original" in v.message)
    assert swapped.nodes == (a.name, b.name)


@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("case", MICROBATCHES)
def test_a_renamed_schedule_verifies_and_a_renamed_swap_does_not(case: str, streams: int) -> None:
    """A pass may rename every node: the schedule still verifies.  Two independent
    collectives swapped, their names swapped too, read by name as the original order, but
    each rank would then reduce another micro-batch in each slot."""
    sched = scheduled(case, streams)
    rename_every_node(sched.gm)
    assert msched.verify(sched.gm, original=sched.original).ok
    a, b = independent_pair(sched.gm)
    issue_after(sched.gm, a, b)
    swap_names(a, b)
    sched.gm.recompile()
    report = msched.verify(sched.gm, original=sched.original)
    assert {k for k, _ in kinds(report)} == {"collective-order"}, str(report)
    swapped = next(v for v in report.violations if "against the original" in v.message)
    # `a`, the original's first, now bears the name `b` had (host order `b, a` reads, by
    # name, as the original's): the report names the nodes as they are called now
    assert swapped.nodes == (a.name, b.name) and int(b.name[8:]) < int(a.name[8:])


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("case", MICROBATCHES)
def test_two_collectives_of_one_group_on_two_streams(
    case: str, streams: int, ordered: bool
) -> None:
    sched = scheduled(case, streams)
    a, b = independent_pair(sched.gm)
    if not ordered:  # on one stream: b moves to another; on two: msched's wait goes
        assert unorder(sched.gm, a, b)
    elif msched.read_schedule(sched.gm).stream_of(a) == msched.read_schedule(sched.gm).stream_of(b):
        on_another_stream(sched.gm, b, a, stream=streams - 1)  # joined after a: fine
    for report in both_reports(sched):
        if ordered:
            assert report.ok, str(report)
            continue
        # (dropping msched's wait also frees a buffer earlier: a record_stream goes missing)
        assert [k for k in kinds(report) if k[0] != "missing-record-stream"] == [
            ("collective-order", None)
        ], str(report)
        (v,) = report.of_kind("collective-order")
        assert v.nodes == (a.name, b.name) and "is not ordered after" in v.message


@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("case", ALL_REDUCES)
def test_a_consumer_of_an_all_reduce_moved_before_its_wait(case: str, streams: int) -> None:
    """The consumer reads the all-reduce's result itself, as Inductor's code does once the
    wait has run, and is issued right after the all-reduce, before the wait."""
    sched = scheduled(case, streams)
    issue, wait, user = first_reduced_consumer(sched.gm)
    user.replace_input_with(wait, issue)
    sched.gm.recompile()
    assert msched.verify(sched.gm, original=sched.original).ok  # still after the wait: fine
    issue.append(user)
    sched.gm.recompile()
    with_original, alone = both_reports(sched)
    # the original reads the wait: a data edge; read from the schedule alone, a raw hazard
    assert kinds(with_original) == [("race", "data")], str(with_original)
    assert kinds(alone) == [("race", "raw")], str(alone)
    for report in (with_original, alone):
        assert set(report.violations[0].nodes) == {wait.name, user.name}


@pytest.mark.parametrize("joined", ["issue", "wait"])
@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("case", ALL_REDUCES)
def test_a_consumer_of_an_all_reduce_on_another_stream(
    case: str, streams: int, joined: str
) -> None:
    """The consumer (reading the all-reduce's result, as above) runs on another stream that
    waits for an event recorded after the all-reduce's issue (a race) or after its wait."""
    sched = scheduled(case, streams)
    issue, wait, user = first_reduced_consumer(sched.gm)
    user.replace_input_with(wait, issue)
    on_another_stream(sched.gm, user, issue if joined == "issue" else wait, stream=streams - 1)
    with_original, alone = both_reports(sched)
    if joined == "wait":
        assert with_original.ok and alone.ok, f"{with_original}\n{alone}"
        return
    # the original reads the wait: a data edge; read from the schedule alone, a raw hazard
    assert kinds(with_original) == [("race", "data")], str(with_original)
    assert kinds(alone) == [("race", "raw")], str(alone)
    for report in (with_original, alone):
        assert set(report.violations[0].nodes) == {wait.name, user.name}


@pytest.mark.parametrize("streams", STREAMS)
@pytest.mark.parametrize("case", ALL_TO_ALLS)
def test_an_in_place_write_to_an_all_to_all_input_before_its_wait(case: str, streams: int) -> None:
    sched = scheduled(case, streams, write_after=True)
    dispatch = collectives_in(sched.gm.graph)[0]
    assert dispatch.op == "all_to_all_single" and dispatch.holds_input
    (wait,) = waits_of(sched.gm.graph)[dispatch.node]
    bump = node_named(sched.gm, "bump_input")
    wait.prepend(bump)
    sched.gm.recompile()
    for report in both_reports(sched):
        assert kinds(report) == [("race", "war")], str(report)
        assert report.violations[0].nodes == (wait.name, "bump_input")

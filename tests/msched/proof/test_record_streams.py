"""`missing-record-stream`: only where work on the allocating stream may take the freed block
before the use on another stream ends -- work that allocates nothing takes no block."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx import GraphModule, Node

import msched
from msched.proof.verifier import Report

from ..scheduled import Scheduled, aten, capture_op, unscheduled
from ..sharded_graphs import two_microbatches

FC = torch.ops._c10d_functional

# What stream 0 runs after `gate`'s block is free (its last reader is on stream 1) and before
# it joins stream 1; each returns its value.  True: it may take the block.
BEFORE_THE_JOIN: dict[str, tuple[Callable[[Scheduled, Node, Node], Node], bool]] = {
    "view": (lambda s, x, sent: s.op("flat", aten.view.default, x, [-1]), False),
    "transpose": (lambda s, x, sent: s.op("turned", aten.t.default, x), False),
    "wait_tensor": (lambda s, x, sent: s.op("landed", FC.wait_tensor.default, sent), False),
    "new_tensor": (lambda s, x, sent: s.op("fresh", aten.sigmoid.default, x), True),
    "reshape": (lambda s, x, sent: s.op("reshaped", aten.reshape.default, x, [-1]), True),
    "in_place": (lambda s, x, sent: s.op("scaled", aten.mul_.Tensor, x, 2.0), True),
    "custom_op": (lambda s, x, sent: s.op("copied", capture_op, x, x, 0, 2), True),
    "issue": (lambda s, x, sent: s.op("summed", FC.all_reduce.default, x, "sum", "1"), True),
}


def gated(before_join: str) -> GraphModule:
    """``gate`` made on stream 0 and read last by ``mix`` on stream 1; stream 0 then runs
    ``before_join`` and only then waits for stream 1 (``sent`` is an all-reduce issued and,
    in the ``wait_tensor`` case, waited on stream 0: the docs' fix for a wait on another
    stream)."""
    s = Scheduled()
    x, w = s.input("x"), s.input("w")
    sent = s.op("sent", FC.all_reduce.default, w, "sum", "0")
    gate = s.op("gate", aten.mm.default, x, w)
    s.record(0)
    s.stream(1)
    s.wait(0)
    mixed = s.op("mix", aten.tanh.default, gate)  # gate's last use: its block is free
    s.record(1)
    s.stream(0)
    made = BEFORE_THE_JOIN[before_join][0](s, x, sent)
    s.wait(1)
    values: list[Any] = [s.op("out", aten.add.Tensor, mixed, mixed), made]
    if before_join == "issue":
        values[1] = s.op("summed_landed", FC.wait_tensor.default, made)
    if before_join != "wait_tensor":
        values.append(s.op("landed", FC.wait_tensor.default, sent))
    return s.done(tuple(values))


def reports(gm: GraphModule) -> list[Report]:
    return [msched.verify(gm), msched.verify(gm, original=unscheduled(gm))]


@pytest.mark.parametrize("before_join", list(BEFORE_THE_JOIN))
def test_only_work_that_may_allocate_before_the_join_needs_a_record(before_join: str) -> None:
    takes_a_block = BEFORE_THE_JOIN[before_join][1]
    for report in reports(gated(before_join)):
        found = [(v.kind, v.nodes) for v in report.violations]
        if takes_a_block:
            assert found == [("missing-record-stream", ("gate", "mix"))], str(report)
        else:
            assert report.ok, str(report)


def test_a_record_stream_clears_it() -> None:
    gm = gated("new_tensor")
    mix = next(n for n in gm.graph.nodes if n.name == "mix")
    with gm.graph.inserting_before(mix):
        gm.graph.call_function(msched.ops.record_stream, (mix.args[0], 1))
    gm.recompile()
    assert all(r.ok for r in reports(gm))


def waited_on_the_issuing_stream(early_use: bool) -> GraphModule:
    """`two_microbatches` by hand, with the docs' fix for a wait on another stream: each
    all-reduce is waited on the stream that issued it.  ``lin1_b`` is made on stream 0 and
    read last by ``ar_b`` on stream 1; stream 0 waits for ``ar_a`` before it joins stream 1
    and, with ``early_use``, also computes ``lin2_a`` before the join (which allocates)."""
    s = Scheduled()
    xa, xb, w = s.input("xa"), s.input("xb"), s.input("w")
    ha = s.op("lin1_a", aten.mm.default, xa, w)
    ra = s.op("ar_a", FC.all_reduce, ha, "sum", "0")
    hb = s.op("lin1_b", aten.mm.default, xb, w)
    s.record(0)
    s.stream(1)
    s.wait(0)
    rb = s.op("ar_b", FC.all_reduce, hb, "sum", "0")
    tb = s.op("wait_b", FC.wait_tensor, rb)
    ob = s.op("lin2_b", aten.mm.default, tb, w)
    s.record(1)
    s.stream(0)
    ta = s.op("wait_a", FC.wait_tensor, ra)
    oa = s.op("lin2_a", aten.mm.default, ta, w) if early_use else None
    s.wait(1)
    if oa is None:
        oa = s.op("lin2_a", aten.mm.default, ta, w)
    return s.done((oa, ob))


@pytest.mark.parametrize("early_use", [False, True])
def test_the_sharded_micro_batches_waited_on_their_issuing_streams(early_use: bool) -> None:
    gm = waited_on_the_issuing_stream(early_use)
    original = two_microbatches()
    for report in (msched.verify(gm), msched.verify(gm, original=original)):
        if early_use:
            found = [(v.kind, v.nodes) for v in report.violations]
            assert found == [("missing-record-stream", ("lin1_b", "ar_b"))], str(report)
        else:
            assert report.ok, str(report)

"""`msched.execute(order="search")`, and runs that a race makes fail."""

from __future__ import annotations

import pytest
import torch
from torch.fx import GraphModule

import msched

from ..graphs import CountCalls
from ..scheduled import Scheduled, aten


def war_between_auxiliary_streams(synced: bool) -> GraphModule:
    """Stream 1 reads ``dest``; stream 2, after a few ops, overwrites it, waiting for the read
    only when ``synced``; stream 0 joins both and returns twice the read."""
    s = Scheduled()
    x, dest = s.input("x"), s.input("dest")
    s.record(0)
    s.stream(1)
    s.wait(0)
    read = s.op("read", aten.mul.Tensor, dest, x)
    s.record(1)
    s.stream(2)
    s.wait(0)
    if synced:
        s.wait(1)
    h = x
    for i in range(4):
        h = s.op(f"h{i}", aten.sin.default, h)
    s.capture("write", dest, h)
    s.record(2)
    s.stream(0)
    s.wait(1)
    twice = s.op("twice", aten.mul.Tensor, read, 2.0)
    s.wait(2)
    return s.done(twice)


def war_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(4, 4), torch.full((4, 4), 3.0)


WANT = torch.full((4, 4), 6.0)  # twice x * dest, dest read before the write


def test_search_shows_a_race_between_two_auxiliary_streams_the_fixed_orders_miss() -> None:
    gm = war_between_auxiliary_streams(synced=False)
    report = msched.verify(gm)
    assert [(v.kind, v.hazard, v.nodes) for v in report.violations] == [
        ("race", "war", ("read", "write"))
    ]
    for order in ("late-aux", "early-aux", "random"):
        run = msched.execute(gm, *war_inputs(), order=order, seed=0)
        assert torch.equal(run.output, WANT), order  # what the search has to beat
    x, dest = war_inputs()
    run = msched.execute(gm, x, dest, order="search")
    assert run.differs is True
    assert run.strategy == "stream 1 late"
    assert run.tried == ("late-aux", "early-aux", "stream 1 late")
    assert run.order.index("write") < run.order.index("read")
    assert not torch.equal(run.output, WANT)
    assert torch.equal(dest, torch.sin(torch.sin(torch.sin(torch.sin(x)))))  # its final state


def test_search_of_a_race_free_schedule_tries_every_order_and_finds_nothing() -> None:
    gm = war_between_auxiliary_streams(synced=True)
    assert msched.verify(gm).ok
    x, dest = war_inputs()
    run = msched.execute(gm, x, dest, order="search", seeds=5)
    assert run.differs is False and run.failure is None
    assert run.strategy == "late-aux" and torch.equal(run.output, WANT)
    assert run.tried[:2] == ("late-aux", "early-aux")
    assert len(run.tried) == len(set(run.tried)) > 2  # each distinct order once
    assert all(t.startswith(("late-aux", "early-aux", "stream", "random seed")) for t in run.tried)
    plain = msched.execute(gm, *war_inputs(), order="late-aux")
    assert (plain.differs, plain.tried, plain.strategy) == (None, None, "late-aux")


def test_search_against_the_original_shows_a_wrong_host_order() -> None:
    def one_stream(read_first: bool) -> GraphModule:
        s = Scheduled()
        x, dest = s.input("x"), s.input("dest")
        if read_first:
            read = s.op("read", aten.mul.Tensor, dest, x)
        write = s.capture("write", dest, x)
        if not read_first:
            read = s.op("read", aten.mul.Tensor, dest, x)
        del write
        return s.done(read)

    wrong, original = one_stream(read_first=True), one_stream(read_first=False)
    assert msched.execute(wrong, *war_inputs(), order="search").differs is False
    run = msched.execute(wrong, *war_inputs(), order="search", original=original)
    assert run.differs is True and run.strategy == "late-aux"


def test_search_trials_leave_no_trace_but_the_run_it_returns() -> None:
    root = torch.nn.Module()
    root.count = CountCalls()
    s = Scheduled()
    x = s.input("x")
    s.record(0)
    s.stream(1)
    s.wait(0)
    counted = s.graph.call_module("count", (x,))
    s.record(1)
    s.stream(0)
    s.wait(1)
    s.graph.output(s.op("y", aten.cos.default, counted))
    gm = GraphModule(root, s.graph)
    torch.manual_seed(0)
    inputs = torch.ones(3)
    run = msched.execute(gm, inputs, order="search", seeds=4)
    after = torch.rand(())
    assert run.differs is False and len(run.tried) >= 1
    assert root.count.total.item() == 3.0  # one run's update, not one per order tried
    torch.manual_seed(0)
    torch.rand(())  # the module's one draw
    assert after.item() == torch.rand(()).item()
    assert torch.equal(inputs, torch.ones(3))


def gather_with_a_racing_index(wait: bool) -> GraphModule:
    """Stream 1 routes (argmax); stream 0 gathers rows by the route, waiting only if ``wait``."""
    s = Scheduled()
    x, w = s.input("x"), s.input("w")
    s.record(0)
    s.stream(1)
    s.wait(0)
    route = s.op("route", aten.argmax.default, x, -1)
    s.record(1)
    s.stream(0)
    if wait:
        s.wait(1)
    pick = s.op("pick", aten.index_select.default, w, 0, route)
    s.wait(1)
    return s.done(pick)


@pytest.mark.parametrize("order", ["late-aux", "random", "search"])
def test_a_kernel_that_fails_on_garbage_from_a_race_is_a_finding(order: str) -> None:
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    run = msched.execute(gather_with_a_racing_index(wait=False), x, w, order=order)
    assert run.failure is not None
    assert run.failure.startswith("the race made the graph fail at node pick: IndexError")
    assert run.output is None and "pick" not in run.order
    if order == "search":
        assert run.differs is True and run.strategy == "late-aux"


def test_a_kernel_that_fails_without_garbage_still_raises() -> None:
    gm = gather_with_a_racing_index(wait=True)
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    assert msched.execute(gm, x, w, order="search").failure is None
    with pytest.raises(IndexError):  # rows 0..2 picked from a 2-row table: the input's fault
        msched.execute(gm, x, torch.randn(2, 5), order="late-aux")


def test_search_rejects_a_bad_seed_count() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="seeds"):
        msched.execute(war_between_auxiliary_streams(True), *war_inputs(), order="search", seeds=0)

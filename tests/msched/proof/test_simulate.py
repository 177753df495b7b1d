"""The adversarial executor (`msched.execute`) and the timeline (`msched.simulate`)."""

from __future__ import annotations

import pytest
import torch
from torch.fx import GraphModule

import msched
from msched.models.decoders import decoder_stack
from msched.proof.clocks import clocks_of
from msched.proof.interpreter import interpret

from ..faults import drop_wait_step
from ..graphs import CountCalls, cyclic_graph, within
from ..hb import happens_before as hb_reader
from ..scheduled import Scheduled, aten, two_streams, two_streams_inputs, unscheduled

ORDERS = ("late-aux", "early-aux", "random")


@pytest.mark.parametrize("streams", [1, 2, 3, 4])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_every_order_of_a_correct_schedule_gives_the_reference(moe: bool, streams: int) -> None:
    stack = decoder_stack(6, (1, 3, 5), moe=moe)
    expected_out, expected_dest = stack.reference()
    msched.schedule(stack.gm, streams)
    for order in ORDERS:
        x, dest = stack.example_inputs()
        run = msched.execute(stack.gm, x, dest, order=order, seed=7)
        assert torch.equal(run.output, expected_out), order
        assert torch.equal(run.inputs_at_output[1], expected_dest), order
        assert torch.equal(dest, expected_dest), order
        assert run.after_output == ()


def drop_the_join_of(gm: GraphModule, capture: str) -> str:
    """Erase the wait on stream 0 that makes ``output`` happen after ``capture``."""
    hb = hb_reader(gm)
    stream, seq = hb.position[capture]
    joins = [w for w in hb.waits if w.stream == 0 and w.event[stream] >= seq > w.before[stream]]
    assert len(joins) == 1, joins
    return drop_wait_step(gm, joins[0].step)


def test_teeth_a_dropped_join_of_the_last_capture_is_caught_twice() -> None:
    stack = decoder_stack(12, (1, 5, 11))  # Eagle3: an early, a middle and the last layer
    expected_out, expected_dest = stack.reference()
    sched = msched.schedule(stack.gm, 3)
    assert sched.stream_of("capture_11") != 0  # the capture runs on an auxiliary stream
    assert msched.verify(stack.gm, original=sched.original).ok
    drop_the_join_of(stack.gm, "capture_11")

    report = msched.verify(stack.gm, original=sched.original)
    assert [(v.kind, v.nodes) for v in report.violations] == [
        ("exit-not-joined", ("capture_11", "output"))
    ]
    assert "does not wait for `capture_11`" in str(report)

    x, dest = stack.example_inputs()
    run = msched.execute(stack.gm, x, dest, order="late-aux")
    start, end = stack.capture_slice(11)
    at_output = run.inputs_at_output[1]
    assert torch.equal(run.output, expected_out)
    assert torch.equal(at_output[:, :start], expected_dest[:, :start])
    assert not at_output[:, start:end].any()  # unwritten when output is produced
    assert expected_dest[:, start:end].abs().sum() > 0
    assert "capture_11" in run.after_output
    assert torch.equal(dest, expected_dest)  # the write lands, but too late


def test_late_aux_runs_work_the_exit_does_not_wait_for_after_output() -> None:
    gm = two_streams(join_exit=False)
    x, w, dest = two_streams_inputs()
    run = msched.execute(gm, x, w, dest, order="late-aux")
    assert run.order == ("a", "c", "d", "b", "out", "output", "capture")
    assert run.after_output == ("capture",)
    assert not run.inputs_at_output[2].any() and dest.any()
    joined = msched.execute(two_streams(), *two_streams_inputs(), order="late-aux")
    assert joined.order == ("a", "c", "d", "b", "capture", "out", "output")


def test_early_aux_runs_auxiliary_streams_first() -> None:
    run = msched.execute(two_streams(), *two_streams_inputs(), order="early-aux")
    assert run.order == ("a", "b", "capture", "c", "d", "out", "output")


def test_a_missing_wait_for_data_reads_garbage() -> None:
    x, w, dest = two_streams_inputs()
    expected = unscheduled(two_streams())(x, w, dest.clone())
    run = msched.execute(two_streams(wait_for_a=False), x, w, dest, order="early-aux")
    assert run.order[:2] == ("b", "capture")  # `b` ran before `a`, which it reads
    assert run.output.isnan().all()
    assert run.inputs_at_output[2].isnan().all()
    ok = msched.execute(two_streams(), *two_streams_inputs(), order="early-aux")
    assert torch.equal(ok.output, expected)


def war_schedule(synced: bool) -> GraphModule:
    """Stream 0 reads ``dest`` into the output; stream 1 then overwrites ``dest``."""
    s = Scheduled()
    x, dest = s.input("x"), s.input("dest")
    s.record(0)
    read = s.op("read", aten.mul.Tensor, dest, x)
    s.record(1)
    s.stream(1)
    s.wait(1 if synced else 0)
    s.capture("write", dest, x)
    s.record(2)
    s.stream(0)
    s.wait(2)
    return s.done(read)


def test_early_aux_exposes_a_write_after_read() -> None:
    x, dest = torch.ones(4, 4), torch.zeros(4, 4)
    expected = x * dest
    for order in ORDERS:
        run = msched.execute(war_schedule(True), x, dest.clone(), order=order)
        assert torch.equal(run.output, expected)
    racy = msched.execute(war_schedule(False), x, dest.clone(), order="early-aux")
    assert racy.order == ("write", "read", "output")
    assert not torch.equal(racy.output, expected)


def test_random_orders_respect_happens_before_and_depend_on_the_seed() -> None:
    stack = decoder_stack(4, (1, 3), moe=True)
    msched.schedule(stack.gm, 3)
    preds = clocks_of(interpret(stack.gm)).predecessors
    orders = set()
    for seed in range(8):
        run = msched.execute(stack.gm, *stack.example_inputs(), order="random", seed=seed)
        position = {name: i for i, name in enumerate(run.order)}
        assert len(position) == len(preds)
        for node, before in preds.items():
            assert all(position[p.name] < position[node.name] for p in before)
        orders.add(run.order)
        again = msched.execute(stack.gm, *stack.example_inputs(), order="random", seed=seed)
        assert again.order == run.order
    assert len(orders) == 8


def test_execute_rejects_bad_arguments() -> None:
    gm = two_streams()
    with pytest.raises(msched.InvalidArgumentError, match="order must be one of"):
        msched.execute(gm, *two_streams_inputs(), order="host")
    with pytest.raises(msched.InvalidArgumentError, match=r"3 inputs \(x, w, dest\), got 1"):
        msched.execute(gm, torch.zeros(4, 4))
    with pytest.raises(msched.InvalidArgumentError, match="GraphModule"):
        msched.execute(gm.graph, *two_streams_inputs())  # type: ignore[arg-type]


def test_timeline_of_a_hand_written_schedule() -> None:
    timeline = msched.simulate(two_streams())
    times = {
        n.name: (timeline.stream[n], timeline.start[n], timeline.end[n]) for n in timeline.nodes
    }
    assert times == {
        "a": (0, 0.0, 10.0),
        "c": (0, 10.0, 20.0),
        "b": (1, 10.0, 20.0),
        "capture": (1, 20.0, 21.0),
        "d": (0, 20.0, 30.0),
        "out": (0, 30.0, 31.0),
    }
    assert timeline.makespan == 31.0
    assert timeline.total_cost == 42.0
    assert timeline.critical_path == 21.0  # a -> b -> out, or c -> d -> out
    assert timeline.lower_bound == 21.0
    assert [row[0].name for row in timeline.intervals()][:3] == ["a", "c", "b"]


@pytest.mark.parametrize("streams", [1, 2, 3])
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_timeline_matches_the_schedule(moe: bool, streams: int) -> None:
    stack = decoder_stack(6, (1, 3, 5), moe=moe)
    sched = msched.schedule(stack.gm, streams)
    timeline = msched.simulate(stack.gm)
    assert timeline.makespan == sched.makespan
    assert timeline.lower_bound == pytest.approx(sched.lower_bound)
    if streams > 1:  # one stream keeps program order, which is not the assigned order
        for node in timeline.nodes:  # as soon as possible: never later than assigned
            assert timeline.start[node] <= sched.assignment.start[node]
    for s in range(streams):
        rows = [r for r in timeline.intervals() if r[1] == s]
        assert all(prev[3] <= nxt[2] for prev, nxt in zip(rows, rows[1:], strict=False))


def test_timeline_with_a_custom_cost_model() -> None:
    class Flat:
        def cost(self, node: torch.fx.Node) -> float:
            return 2.0

    timeline = msched.simulate(two_streams(), Flat())
    assert timeline.makespan == 8.0  # a, c, d, out on stream 0
    assert timeline.total_cost == 12.0  # six compute nodes


@pytest.mark.parametrize(
    ("self_loop", "cycle"), [(False, "cos -> matmul -> cos"), (True, "cos -> cos")]
)
def test_execute_and_simulate_refuse_a_cyclic_graph(self_loop: bool, cycle: str) -> None:
    gm = cyclic_graph(self_loop)
    before = [(n.name, n.args) for n in gm.graph.nodes]
    with within(10), pytest.raises(msched.InvalidGraphError, match=f"has a cycle: {cycle} "):
        msched.execute(gm, torch.randn(2, 2))
    with within(10), pytest.raises(msched.InvalidGraphError, match=f"has a cycle: {cycle} "):
        msched.simulate(gm)
    assert [(n.name, n.args) for n in gm.graph.nodes] == before


def test_execute_and_simulate_take_a_dialect_name() -> None:
    gm = two_streams()
    run = msched.execute(gm, *two_streams_inputs(), dialect="msched")
    assert run.order == msched.execute(gm, *two_streams_inputs()).order
    assert msched.simulate(gm, dialect="msched").makespan == msched.simulate(gm).makespan
    with pytest.raises(msched.InvalidArgumentError, match="unknown dialect 'nope'"):
        msched.simulate(gm, dialect="nope")


def test_a_read_before_its_producer_does_not_run_module_state_or_random_numbers_twice() -> None:
    # Stream 1 reads ``m`` with no wait on its producer, so early-aux reads it before it runs.
    root = torch.nn.Module()
    root.count = CountCalls()
    g = torch.fx.Graph()
    x = g.placeholder("x")
    m = g.call_module("count", (x,))
    g.call_function(msched.ops.record_event, (0,))
    g.call_function(msched.ops.set_stream, (1,))
    g.call_function(msched.ops.wait_event, (0,))
    y = g.call_function(aten.cos.default, (m,))
    g.call_function(msched.ops.record_event, (1,))
    g.call_function(msched.ops.set_stream, (0,))
    g.call_function(msched.ops.wait_event, (1,))
    g.output(y)
    gm = GraphModule(root, g)
    m.prepend(next(n for n in g.nodes if n.target is msched.ops.record_event))  # record first
    gm.recompile()
    assert not msched.verify(gm).ok  # the race the executor must expose
    torch.manual_seed(0)
    msched.execute(gm, torch.ones(3), order="early-aux")
    after_execute = torch.rand(())
    torch.manual_seed(0)
    torch.rand(())  # the module's one draw
    assert root.count.total.item() == 3.0  # one call's update, not two
    assert after_execute.item() == torch.rand(()).item()

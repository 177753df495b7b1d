"""The happens-before engine (`msched.proof.clocks`), against hand-written schedules and the
tests' independent reader (`tests.msched.hb`)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.fx import GraphModule, Node

import msched
from msched.models.decoders import decoder_stack
from msched.proof.clocks import Clocks, Stamp, clocks_of
from msched.proof.interpreter import interpret
from msched.proof.program import Step

from ..hb import happens_before as hb_reader
from ..scheduled import Scheduled, aten, two_streams, unjoined_aux_start


def clocks(gm: GraphModule) -> Clocks:
    return clocks_of(interpret(gm))


def named(gm: GraphModule) -> dict[str, Node]:
    return {n.name: n for n in gm.graph.nodes}


def steps_of(c: Clocks, kind: str) -> list[Step]:
    """The steps of ``kind`` in host order (waits and records are steps, not nodes)."""
    return [step for step in c.program.steps if step.kind == kind]


def stream_ops(gm: GraphModule, kind: str) -> list[Node]:
    """The ``kind`` stream ops of ``gm`` (``"record_event"``, ...), in host order."""
    return [s.node for s in interpret(gm).steps if s.kind == kind]


def test_stamps_say_stream_sequence_number_and_clock() -> None:
    gm = two_streams()
    c, n = clocks(gm), named(gm)
    assert c.stamp[n["x"]] == Stamp(0, 0, ())
    assert c.stamp[n["a"]] == (0, 1, (0, -1))
    assert c.stamp[n["b"]] == Stamp(stream=1, seq=1, clock=(1, -1))
    assert c.stamp[n["capture"]].seq == 2
    assert (c.stamp[n["d"]].stream, c.stamp[n["d"]].seq) == (0, 3)
    assert c.stamp[n["out"]].clock == (3, 2)
    assert [node.name for node in c.order] == ["x", "w", "dest", "a", "c", "b", "capture", "d",
                                               "out", "output"]  # fmt: skip
    assert c.num_streams == 2 and c.output is n["output"]


def test_happens_before_follows_waits_only() -> None:
    gm = two_streams()
    c, n = clocks(gm), named(gm)
    assert c.happens_before(n["a"], n["b"])  # b waits on the record after a
    assert not c.happens_before(n["c"], n["b"])  # ... which comes before c
    assert not c.happens_before(n["b"], n["d"])  # d does not wait for stream 1
    assert c.happens_before(n["b"], n["out"]) and c.happens_before(n["x"], n["b"])
    assert not c.happens_before(n["a"], n["a"])


def test_each_wait_binds_to_the_latest_earlier_record_of_its_event() -> None:
    s = Scheduled()
    x = s.input("x")
    s.record(1)
    a = s.op("a", aten.relu.default, x)
    s.record(1)  # re-recorded: later waits see `a`
    s.stream(1)
    s.wait(1)
    s.wait(7)  # never recorded before: waits for nothing
    b = s.op("b", aten.neg.default, a)
    s.record(7)
    s.stream(0)
    s.wait(7)
    gm = s.done(b)
    c = clocks(gm)
    first, second, last = steps_of(c, "record_event")
    on_1, unrecorded, on_0 = steps_of(c, "wait_event")
    assert c.binding == {on_1: second, unrecorded: None, on_0: last}
    assert list(c.unrecorded_waits) == [unrecorded]
    assert c.later_record(c.unrecorded_waits[0]) is last
    assert c.happens_before(named(gm)["a"], named(gm)["b"])
    assert c.clock_after[on_1] == (1, -1) and c.clock_after[unrecorded] == (1, -1)


def test_a_wait_never_recorded_has_no_later_record() -> None:
    s = Scheduled()
    x = s.input("x")
    s.wait(3)
    gm = s.done(s.op("a", aten.relu.default, x))
    c = clocks(gm)
    assert c.binding == {steps_of(c, "wait_event")[0]: None}
    assert c.later_record(c.unrecorded_waits[0]) is None


def test_joining_wait_finds_the_wait_that_orders_a_node_before_a_stream() -> None:
    gm = two_streams()
    c, n = clocks(gm), named(gm)
    waits = steps_of(c, "wait_event")  # wait(0), wait(1) on stream 1; wait(2), wait(3) on 0
    assert c.joining_wait(n["a"], 1) is waits[1]
    assert c.joining_wait(n["x"], 1) is waits[0]  # inputs are ready on stream 0
    assert c.joining_wait(n["b"], 0) is waits[2]
    assert c.joining_wait(n["capture"], 0) is waits[3]
    assert c.joining_wait(n["a"], 0) is None  # same stream: no wait needed
    assert c.joining_wait(n["c"], 1) is None  # stream 1 never joins c
    assert clocks(two_streams(join_exit=False)).joining_wait(n["capture"], 0) is None


def test_joining_wait_and_the_exit_see_joins_through_a_third_stream() -> None:
    s = Scheduled()
    x = s.input("x")
    s.record(0)
    a = s.op("a", aten.relu.default, x)
    s.stream(1)
    s.wait(0)
    b = s.op("b", aten.neg.default, x)
    s.record(1)
    s.stream(2)
    s.wait(1)
    s.record(2)  # stream 2 has only waited: its event carries stream 1's `b`
    s.stream(0)
    s.wait(2)
    gm = s.done(a)
    c = clocks(gm)
    assert c.joining_wait(b, 2) is steps_of(c, "wait_event")[1]
    assert c.joining_wait(b, 0) is steps_of(c, "wait_event")[2]
    assert c.exit_happens_after(b) and c.predecessors[c.output] == (a, b)


def test_exit_happens_after_a_joined_capture_only() -> None:
    gm = two_streams()
    assert clocks(gm).exit_happens_after(named(gm)["capture"])
    unjoined = two_streams(join_exit=False)
    c = clocks(unjoined)
    assert not c.exit_happens_after(named(unjoined)["capture"])
    assert c.exit_happens_after(named(unjoined)["b"]) and c.exit_happens_after(named(unjoined)["x"])

    s = Scheduled()
    x = s.input("x")
    late = s.op("late", aten.relu.default, x)
    s.graph.output(x).append(late)  # `late` after output: it never runs
    after_output = clocks(GraphModule(torch.nn.Module(), s.graph))
    assert late not in after_output.stamp and not after_output.exit_happens_after(late)


def test_predecessors_are_the_previous_node_and_what_the_waits_observe() -> None:
    gm = two_streams()
    c = clocks(gm)
    preds = {k.name: [p.name for p in v] for k, v in c.predecessors.items()}
    assert preds == {
        "a": [],
        "c": ["a"],
        "b": ["a"],
        "capture": ["b"],
        "d": ["c"],
        "out": ["d", "b", "capture"],
        "output": ["out"],
    }
    assert c.predecessors is c.predecessors  # computed once
    assert repr(c) == "Clocks(10 nodes that run, 2 streams, 4 waits)"


def test_auxiliary_streams_that_start_unjoined_are_listed() -> None:
    gm = unjoined_aux_start()
    assert clocks(gm).unjoined_starts == (named(gm)["b"],)
    assert clocks(two_streams()).unjoined_starts == ()


def test_clock_width_is_at_least_the_programs_streams() -> None:
    program = interpret(two_streams())
    wide = clocks_of(program, 4)
    assert wide.num_streams == 4
    assert all(len(clock) == 4 for clock in wide.clock_after.values())
    with pytest.raises(msched.InvalidArgumentError, match="at least the 2 stream"):
        clocks_of(program, 1)
    with pytest.raises(msched.InvalidArgumentError, match="num_streams"):
        clocks_of(program, 0)


@pytest.mark.parametrize("streams", [2, 3, 4])
def test_happens_before_agrees_with_the_independent_reader(streams: int) -> None:
    stack = decoder_stack(4, (1, 3), moe=True)
    msched.schedule(stack.gm, streams)
    c, oracle = clocks(stack.gm), hb_reader(stack.gm)
    body = [n for n in c.order if n.op not in ("placeholder", "get_attr")]
    for u, v in itertools.permutations(body, 2):
        assert c.happens_before(u, v) == oracle.ordered(u.name, v.name), (u.name, v.name)

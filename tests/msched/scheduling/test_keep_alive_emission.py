"""`msched.schedule(..., keep_alive=...)`: a tensor read on another stream is kept alive until
its own stream joins the read (the default) or gets ``record_stream`` for the reading stream;
both verify and run right, the keep-alive never reserves more under any timing."""

from __future__ import annotations

from typing import Any

import pytest
from torch.fx import GraphModule, Node

import msched
from msched.models.decoders import decoder_stack
from msched.proof.interpreter import interpret

MIB = 1024 * 1024
SMALL = dict(n_layers=2, capture_layers=(0, 1), hidden=64, tokens=32)
# Where the fast stacks' schedules protect a cross-stream use (the others need none).
PROTECTED = {
    "moe-3": (dict(SMALL, moe=True), 3),
    "ep-2": (dict(SMALL, moe=True, ep=2, rank=0), 2),
    "tp-2mb-3": (dict(SMALL, tp=2, microbatches=2, rank=0), 3),
}


def records(gm: GraphModule) -> tuple[list[Node], list[Node]]:
    """The ``record_stream`` nodes of ``gm`` for another stream than their tensor's, and those
    for its own stream (keep-alives)."""
    program = interpret(gm.graph, None)
    steps = [s for s in program.steps if s.kind == "record_stream"]
    own = [s.node for s in steps if s.to_stream == program.stream_of[s.tensor]]
    return [s.node for s in steps if s.node not in own], own


def scheduled(kwargs: dict[str, Any], streams: int, keep_alive: bool) -> tuple[Any, Any]:
    stack = decoder_stack(**kwargs)
    sched = msched.schedule(stack.gm, streams, keep_alive=keep_alive)
    return sched, msched.peak_memory(sched.gm, example_inputs=stack.example_inputs())


@pytest.mark.parametrize("case", list(PROTECTED))
def test_keep_alive_replaces_every_record_and_never_reserves_more(case: str) -> None:
    kwargs, streams = PROTECTED[case]
    kept, kept_memory = scheduled(kwargs, streams, keep_alive=True)
    recorded, recorded_memory = scheduled(kwargs, streams, keep_alive=False)
    other, own = records(recorded.gm)
    assert other and not own
    other, own = records(kept.gm)
    assert own and not other
    for sched in (kept, recorded):
        assert msched.verify(sched.gm, original=sched.original).ok
    assert kept.makespan == recorded.makespan
    assert kept_memory.reserved_bound <= recorded_memory.reserved_bound


@pytest.mark.slow
def test_on_the_expert_parallel_stack_the_bound_falls_and_allocated_rises() -> None:
    # 2 layers, hidden 1024, 1024 tokens, rank 0 of 2, 2 streams (the bench's sizes, fewer
    # layers): four dispatch buffers read on stream 1.  Recorded, each stays in stream 0's
    # pool to the end of the graph under any timing; kept alive, each returns at its join.
    kwargs = dict(n_layers=2, capture_layers=(0, 1), hidden=1024, tokens=1024)
    kwargs.update(moe=True, ep=2, rank=0)
    kept, kept_memory = scheduled(kwargs, 2, keep_alive=True)
    recorded, recorded_memory = scheduled(kwargs, 2, keep_alive=False)
    assert (kept_memory.reserved_bound, recorded_memory.reserved_bound) == (110 * MIB, 126 * MIB)
    assert (kept_memory.allocated, recorded_memory.allocated) == (
        60 * MIB + 16384,
        56 * MIB + 16384,
    )
    assert kept.makespan == recorded.makespan


@pytest.mark.slow
def test_the_tensor_parallel_stacks_side_pool_is_not_a_record() -> None:
    # Its 2-stream schedule reserves 1.91x the original order's bound (42 / 22 MiB): the side
    # stream's own 20 MiB segment, not a pinned block, so keeping alive changes nothing.
    kwargs = dict(n_layers=2, capture_layers=(0, 1), hidden=1024, tokens=1024, tp=2, rank=0)
    kept, kept_memory = scheduled(kwargs, 2, keep_alive=True)
    assert records(kept.gm) == ([], [])
    assert kept_memory.reserved_bound == 42 * MIB


def test_a_keep_alive_schedule_runs_right_and_without_its_keep_alives_it_races() -> None:
    kwargs, streams = PROTECTED["moe-3"]
    stack = decoder_stack(**kwargs)
    inputs = stack.example_inputs()
    sched = msched.schedule(stack.gm, streams)
    run = msched.execute(sched.gm, *inputs, order="search", original=sched.original)
    assert run.differs is False
    for keep in records(sched.gm)[1]:  # the tensors are freed after their last read again
        sched.gm.graph.erase_node(keep)
    sched.gm.recompile()
    report = msched.verify(sched.gm, original=sched.original)
    assert {v.kind for v in report.violations} == {"missing-record-stream"}
    run = msched.execute(sched.gm, *inputs, order="search", original=sched.original)
    assert run.differs is True


def test_keep_alive_must_be_a_bool() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="keep_alive"):
        msched.schedule(decoder_stack(**SMALL).gm, 2, keep_alive="yes")  # type: ignore[arg-type]

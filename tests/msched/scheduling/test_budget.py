"""`msched.schedule(..., memory_budget=r)`: the schedule's reserved_bound within r times the
original order's, trading makespan for memory (issue 42, part 2)."""

from __future__ import annotations

from typing import Any

import pytest

import msched
from msched.models.decoders import decoder_stack
from msched.proof.memory import sized_values
from msched.scheduling import budget as budget_module
from msched.scheduling import pipeline

STACKS: dict[str, dict[str, Any]] = {
    "dense": dict(n_layers=3, capture_layers=(0, 2), hidden=64, tokens=32),
    "moe": dict(n_layers=3, capture_layers=(0, 2), hidden=64, tokens=32, moe=True),
    "tp": dict(n_layers=2, capture_layers=(0, 1), hidden=64, tokens=32, tp=2, rank=0),
    "ep": dict(n_layers=2, capture_layers=(0, 1), hidden=64, tokens=32, moe=True, ep=2, rank=0),
    "tp-2mb": dict(
        n_layers=2, capture_layers=(0, 1), hidden=64, tokens=32, tp=2, microbatches=2, rank=0
    ),
}


def _bound(gm: Any, inputs: Any) -> int:
    return msched.peak_memory(gm, example_inputs=inputs).reserved_bound


@pytest.mark.parametrize("streams", [2, 3])
@pytest.mark.parametrize("name", list(STACKS))
def test_a_budget_of_one_keeps_the_original_bound_verifies_and_beats_one_stream(
    name: str, streams: int
) -> None:
    stack = decoder_stack(**STACKS[name])
    inputs = stack.example_inputs()
    sched = msched.schedule(stack.gm, streams, memory_budget=1.0, example_inputs=inputs)
    assert _bound(sched.gm, inputs) <= _bound(sched.original, inputs)
    assert sched.memory.reserved_bound == _bound(sched.gm, inputs)
    assert msched.verify(sched.gm, original=sched.original).ok
    one = msched.schedule(decoder_stack(**STACKS[name]).gm, 1)
    assert sched.makespan <= one.makespan


def test_without_a_budget_the_schedule_is_over_one_so_the_budget_changed_it() -> None:
    """The budget of the test above is not met for free: unbudgeted, every stack's 2-stream
    schedule reserves more than the original order."""
    for kwargs in STACKS.values():
        stack = decoder_stack(**kwargs)
        inputs = stack.example_inputs()
        sched = msched.schedule(stack.gm, 2)
        assert _bound(sched.gm, inputs) > _bound(sched.original, inputs)


def test_a_budget_between_gives_a_schedule_between() -> None:
    """Dense stack: every stream pool is one 2 MiB small segment, so 3 streams reserve 3x
    the original and 2 streams 2x; a budget of 2.0 on 3 streams keeps 2 streams."""
    kwargs = STACKS["dense"]
    inputs = decoder_stack(**kwargs).example_inputs()
    free = {k: msched.schedule(decoder_stack(**kwargs).gm, k) for k in (1, 2, 3)}
    stack = decoder_stack(**kwargs)
    sched = msched.schedule(stack.gm, 3, memory_budget=2.0, example_inputs=inputs)
    ratio = _bound(sched.gm, inputs) / _bound(sched.original, inputs)
    assert ratio == 2.0
    assert _bound(free[3].gm, inputs) / _bound(free[3].original, inputs) == 3.0
    assert free[3].makespan < sched.makespan == free[2].makespan < free[1].makespan
    assert set(sched.streams.values()) == {0, 1}
    assert sched.num_streams == 3  # what was asked for; it used 2
    assert msched.verify(sched.gm, original=sched.original).ok


def test_a_budget_on_collectives_issues_them_later() -> None:
    """EP at issue 42's sizes: the 1-stream list schedule (collectives issued early,
    compute under them) reserves 1.22x; budget 1.1 keeps the original order."""
    kwargs = dict(
        n_layers=2, capture_layers=(0, 1), hidden=1024, tokens=1024, moe=True, ep=2, rank=0
    )
    inputs = decoder_stack(**kwargs).example_inputs()
    loose = msched.schedule(decoder_stack(**kwargs).gm, 1)
    tight = msched.schedule(decoder_stack(**kwargs).gm, 1, memory_budget=1.1, example_inputs=inputs)
    assert _bound(loose.gm, inputs) > 1.1 * _bound(loose.original, inputs)
    assert _bound(tight.gm, inputs) <= 1.1 * _bound(tight.original, inputs)
    assert tight.makespan > loose.makespan
    assert tight.num_events == tight.num_waits == 0


@pytest.mark.parametrize("budget", [0.99, 0.0, -1.0, float("nan"), float("inf"), True, "1.0"])
def test_a_budget_below_one_or_not_a_number_is_refused(budget: object) -> None:
    stack = decoder_stack(**STACKS["dense"])
    before = stack.gm.code
    with pytest.raises(msched.InvalidArgumentError, match="memory_budget must be"):
        msched.schedule(stack.gm, 2, memory_budget=budget, example_inputs=stack.example_inputs())  # type: ignore[arg-type]
    assert stack.gm.code == before


def test_a_budget_without_sizes_asks_for_example_inputs_and_leaves_the_graph() -> None:
    stack = decoder_stack(**STACKS["dense"])
    before = stack.gm.code
    with pytest.raises(msched.InvalidArgumentError, match="example_inputs"):
        msched.schedule(stack.gm, 2, memory_budget=1.0)
    assert stack.gm.code == before


def test_a_budget_no_candidate_meets_names_the_smallest_ratio(monkeypatch) -> None:
    """The original order always meets 1.0; without it among the candidates (as a future
    candidate set might be) the error names the smallest ratio found, and the graph is
    left as it was."""
    real = pipeline._candidates

    def without_original(*args: Any) -> Any:
        found, optimal = real(*args)
        return [c for c in found if c.emitted], optimal

    monkeypatch.setattr(pipeline, "_candidates", without_original)
    monkeypatch.setattr(pipeline, "pin_sets", lambda values: [])
    stack = decoder_stack(**STACKS["dense"])
    before = stack.gm.code
    with pytest.raises(msched.InvalidArgumentError, match=r"smallest .* 2\.000 times"):
        msched.schedule(stack.gm, 3, memory_budget=1.5, example_inputs=stack.example_inputs())
    assert stack.gm.code == before


def test_without_a_budget_nothing_is_priced(monkeypatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("priced without a budget")

    monkeypatch.setattr(pipeline, "sized_values", refuse)
    monkeypatch.setattr(budget_module, "peak_memory_with", refuse)
    msched.schedule(decoder_stack(**STACKS["tp-2mb"]).gm, 2)


@pytest.mark.parametrize("name", ["dense", "tp-2mb"])
def test_a_budget_the_schedule_meets_changes_nothing(name: str) -> None:
    free = msched.schedule(decoder_stack(**STACKS[name]).gm, 3)
    stack = decoder_stack(**STACKS[name])
    loose = msched.schedule(stack.gm, 3, memory_budget=100.0, example_inputs=stack.example_inputs())
    assert loose.gm.code == free.gm.code
    assert loose.makespan == free.makespan


def test_side_streams_without_allocations_beat_one_stream_within_the_original_bound() -> None:
    """TP, two micro-batches, at issue 42's sizes: with every allocating node kept on
    stream 0, the side stream runs captures and waits only; its pool stays empty, so the
    schedule meets 1.0 and is shorter than the 1-stream one."""
    kwargs = dict(
        n_layers=2, capture_layers=(0, 1), hidden=1024, tokens=1024, tp=2, microbatches=2, rank=0
    )
    inputs = decoder_stack(**kwargs).example_inputs()
    one = msched.schedule(decoder_stack(**kwargs).gm, 1)
    stack = decoder_stack(**kwargs)
    sched = msched.schedule(stack.gm, 2, memory_budget=1.0, example_inputs=inputs)
    assert _bound(sched.gm, inputs) <= _bound(sched.original, inputs)
    assert sched.makespan < one.makespan
    assert set(sched.streams.values()) == {0, 1}
    assert msched.verify(sched.gm, original=sched.original).ok


def test_pinned_nodes_that_cost_something_run_on_stream_zero() -> None:
    from msched.analysis.cost import DefaultCostModel
    from msched.scheduling.assign import assign_streams

    stack = decoder_stack(**STACKS["moe"])
    dag = msched.build_dag(stack.gm)
    free = assign_streams(dag, 3, DefaultCostModel())
    moved = {n for n, s in free.stream.items() if s}
    assert moved
    pinned = assign_streams(dag, 3, DefaultCostModel(), pinned=frozenset(moved))
    assert all(pinned.stream[n] == 0 for n in moved if pinned.finish[n] > pinned.start[n])
    assert pinned.makespan > free.makespan


def test_pin_sets_are_the_large_then_every_allocating_node() -> None:
    kwargs = dict(n_layers=1, capture_layers=(0,), hidden=1024, tokens=1024)
    stack = decoder_stack(**kwargs)
    values = sized_values(stack.gm, stack.example_inputs())
    large, every = budget_module.pin_sets(values)
    assert large < every
    assert all(n.op not in ("placeholder", "get_attr") for n in every)
    captures = [n for n in stack.gm.graph.nodes if "capture" in n.name]
    assert captures and not set(captures) & every  # in place: nothing allocated
    small = decoder_stack(**STACKS["dense"])
    assert len(budget_module.pin_sets(sized_values(small.gm, small.example_inputs()))) == 1


def test_an_infinite_budget_says_to_pass_none() -> None:
    # `inf` is >= 1.0: the refusal says what it means instead of "must be >= 1.0".
    stack = decoder_stack(**STACKS["dense"])
    with pytest.raises(msched.InvalidArgumentError, match="memory_budget=None"):
        msched.schedule(stack.gm, 2, memory_budget=float("inf"))


def test_example_inputs_of_the_wrong_count_name_the_graphs_inputs() -> None:
    stack = decoder_stack(**STACKS["dense"])
    x, _ = stack.example_inputs()
    before = stack.gm.code
    with pytest.raises(msched.InvalidArgumentError, match=r"has 1 value.*2 inputs \(x, dest\)"):
        msched.schedule(stack.gm, 2, memory_budget=1.0, example_inputs=(x,))
    assert stack.gm.code == before

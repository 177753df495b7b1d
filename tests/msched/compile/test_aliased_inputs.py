"""Graph inputs that are views of one buffer: Dynamo gives each its own placeholder, and their
fake tensors keep the one storage; msched's effects (so schedule and verify) read it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.fx import GraphModule

import msched
from msched.analysis.effects import compute_effects
from msched.analysis.nodes import node_named
from msched.scheduling.pipeline import Schedule

W = 6  # width of one capture slot
SLOTS = 3


def forward(
    x: torch.Tensor, w: torch.Tensor, buf: torch.Tensor, *slots: torch.Tensor
) -> torch.Tensor:
    """Captures through per-layer views of ``buf``, then a read of all of ``buf``."""
    for slot in slots:
        x = torch.sin(x @ w)
        slot.copy_(x)
    return x * buf.mean()


def fresh_inputs() -> tuple[torch.Tensor, ...]:
    torch.manual_seed(3)
    x, w = torch.randn(5, W), torch.randn(W, W)
    buf = torch.zeros(5, SLOTS * W)
    return (x, w, buf, *(buf[:, i * W : (i + 1) * W] for i in range(SLOTS)))


def scheduling_backend(seen: list[Schedule]) -> Callable[..., Any]:
    """A torch.compile backend that schedules Dynamo's own graph with msched (no AOT)."""

    def compile_graph(gm: GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        sched = msched.schedule(gm, num_streams=3)
        msched.verify(gm, original=sched.original).raise_if_failed()
        seen.append(sched)
        return gm.forward

    return compile_graph


def compiled_run() -> tuple[Schedule, torch.Tensor, torch.Tensor]:
    torch._dynamo.reset()
    seen: list[Schedule] = []
    inputs = fresh_inputs()
    with torch.no_grad():
        out = torch.compile(forward, backend=scheduling_backend(seen), fullgraph=True)(*inputs)
    torch._dynamo.reset()
    assert len(seen) == 1
    return seen[0], out, inputs[2]


def test_views_of_one_buffer_passed_as_inputs_are_one_storage() -> None:
    sched, _, _ = compiled_run()
    original = sched.original
    effects = compute_effects(original.graph)
    placeholders = list(original.graph.find_nodes(op="placeholder"))
    by_name = {p.name: effects.root[p] for p in placeholders}
    first_slot = node_named(original, "l_slots_0_")  # the first of them in the graph
    shared = [by_name[f"l_slots_{i}_"] for i in range(SLOTS)] + [by_name["l_buf_"]]
    assert shared == [first_slot] * (SLOTS + 1)
    assert by_name["l_x_"] is node_named(original, "l_x_")  # other inputs stay their own
    assert by_name["l_w_"] is node_named(original, "l_w_")


def test_scheduled_dynamo_graph_gives_the_eager_numbers() -> None:
    inputs = fresh_inputs()
    with torch.no_grad():
        want = forward(*inputs)
    _, out, buf = compiled_run()
    torch.testing.assert_close(buf, inputs[2])
    torch.testing.assert_close(out, want)


def test_msched_backend_gives_the_eager_numbers() -> None:
    torch._dynamo.reset()
    inputs, again = fresh_inputs(), fresh_inputs()
    with torch.no_grad():
        want = forward(*inputs)
        out = torch.compile(forward, backend=msched.backend(num_streams=3), fullgraph=True)(*again)
    torch._dynamo.reset()
    torch.testing.assert_close(again[2], inputs[2])
    torch.testing.assert_close(out, want)


def read_moved_before_first_capture(original: GraphModule) -> GraphModule:
    """``original`` with the read of the whole buffer moved before the first capture."""
    wrong = GraphModule(original, original.graph.__deepcopy__())  # meta (fake values) kept
    mean = next(n for n in wrong.graph.nodes if n.target in ("mean", torch.mean))
    first_capture = next(n for n in wrong.graph.nodes if n.target == "copy_")
    first_capture.prepend(mean)
    wrong.recompile()
    return wrong


def test_verify_flags_a_read_of_the_buffer_before_the_captures_through_its_views() -> None:
    sched, _, _ = compiled_run()
    wrong = read_moved_before_first_capture(sched.original)
    report = msched.verify(wrong, original=sched.original)
    assert not report.ok
    races = [v for v in report.violations if v.kind == "race"]
    assert {v.hazard for v in races} == {"raw"}
    assert {n for v in races for n in v.nodes} == {"copy__2", "mean"}  # the last capture


@pytest.mark.parametrize("key", ["val", "example_value"])
def test_placeholders_whose_values_share_a_storage_are_one_storage(key: str) -> None:
    g = torch.fx.Graph()
    base, view, other = g.placeholder("base"), g.placeholder("view"), g.placeholder("other")
    buffer = torch.zeros(4, 4)
    base.meta[key], view.meta[key], other.meta[key] = buffer, buffer[1:], torch.zeros(4, 4)
    g.output((base, view, other))
    effects = compute_effects(g)
    assert [effects.root[n] for n in (base, view, other)] == [base, base, other]


def test_a_storage_and_a_label_join_their_groups_at_the_earliest_placeholder() -> None:
    g = torch.fx.Graph()
    a, b, c = g.placeholder("a"), g.placeholder("b"), g.placeholder("c")
    buffer = torch.zeros(8)
    c.meta["val"], b.meta["val"] = buffer, buffer[2:]  # b and c: one storage
    a.meta["msched_storage"] = c.meta["msched_storage"] = "kv"  # a and c: one label
    g.output((a, b, c))
    effects = compute_effects(g)
    assert [effects.root[n] for n in (a, b, c)] == [a, a, a]

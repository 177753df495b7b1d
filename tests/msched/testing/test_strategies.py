"""`msched.testing.strategies`: drawn graphs print as their code; `check_schedule` in @given."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import Phase, find, given, settings
from torch.fx import GraphModule

import msched
import msched.testing.strategies as mst

from ..faults import drop_last_wait

FEW = settings(max_examples=25, database=None, derandomize=True, deadline=None)


def test_a_drawn_graph_reprs_as_its_code_as_drawn() -> None:
    graphs = mst.graphs(min_nodes=4, ops=("module", "mm", "buffer"))
    gm = find(graphs, lambda g: any(n.op == "call_module" for n in g.graph.nodes), settings=FEW)
    text = repr(gm)
    assert text.startswith(f"GeneratedGraph({len(gm.graph.nodes)} nodes)  # state: ")
    assert gm.code.strip() in text
    assert "Generated()" not in text and "def forward(self" in text
    msched.schedule(gm, 3)
    assert repr(gm) == text  # the code as drawn, not as scheduled
    assert repr(copy.deepcopy(gm)) == text


def test_a_falsifying_example_prints_the_graph_as_code() -> None:
    @FEW
    @given(mst.graphs(min_nodes=2, ops=("mm", "capture")))
    def fails_on_any_mm(gm: GraphModule) -> None:
        assert not any(n.target is torch.ops.aten.mm.default for n in gm.graph.nodes)

    with pytest.raises(AssertionError) as raised:
        fails_on_any_mm()
    notes = "\n".join(getattr(raised.value, "__notes__", []))
    assert "gm=GeneratedGraph(" in notes
    assert "def forward(self, x0" in notes and "torch.ops.aten.mm.default(" in notes


@FEW
@given(mst.graphs(), mst.stream_counts())
def test_check_schedule_passes_msched_schedules_inside_given(gm: GraphModule, streams: int) -> None:
    sched = mst.check_schedule(gm, streams)
    assert sched.gm is gm  # msched.schedule rewrites in place


def forgets_the_last_wait(gm: GraphModule, num_streams: int) -> None:
    msched.schedule(gm, num_streams)
    if any(n.target is msched.ops.wait_event for n in gm.graph.nodes):
        drop_last_wait(gm)


def test_check_schedule_fails_a_scheduler_that_forgets_a_wait_with_the_graph() -> None:
    @settings(FEW, max_examples=100, phases=[Phase.generate])  # no shrinking: slow, not needed
    @given(mst.graphs(min_nodes=4, ops=("mm", "capture", "update", "tanh")))
    def check(gm: GraphModule) -> None:
        mst.check_schedule(gm, 2, scheduler=forgets_the_last_wait)

    with pytest.raises(AssertionError) as raised:
        check()
    message = str(raised.value)
    assert message.startswith("msched.verify found violations in the schedule:")
    assert "the graph, on 2 streams:\nGeneratedGraph(" in message and "def forward" in message


def tanh_becomes_sin(gm: GraphModule, num_streams: int) -> None:
    """Schedules correctly, then computes something else under the same node names."""
    msched.schedule(gm, num_streams)
    for node in gm.graph.nodes:
        if node.target is torch.ops.aten.tanh.default:
            node.target = torch.ops.aten.sin.default
    gm.recompile()


def linear_reweighted(gm: GraphModule, num_streams: int) -> None:
    """Schedules correctly, then puts a linear layer with other weights in the place of the
    graph's: the graph is the same, so verify cannot see it; runs can."""
    msched.schedule(gm, num_streams)
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), torch.nn.Linear):
            other = torch.nn.Linear(mst.SIZE, mst.SIZE).requires_grad_(False)
            other.weight.fill_(0.3)
            other.bias.zero_()
            setattr(gm, str(node.target), other)


def test_check_schedule_runs_the_schedule_against_the_unscheduled_graph() -> None:
    gm = find(
        mst.graphs(min_nodes=2, ops=("mm", "module")),
        lambda g: any(
            n.op == "call_module" and isinstance(g.get_submodule(n.target), torch.nn.Linear)
            for n in g.graph.nodes
        ),
    )
    assert mst.check_schedule(copy.deepcopy(gm), 2) is not None  # msched's own passes
    with pytest.raises(AssertionError, match=r"msched\.execute in the order 'late-aux' \(of "):
        mst.check_schedule(gm, 2, scheduler=linear_reweighted)


def test_check_schedule_sees_another_op_under_the_same_name() -> None:
    """verify pairs nodes by what they compute: ``tanh`` replaced by ``sin`` is caught before
    any run (it was left to the runs while nodes were paired by name)."""
    gm = find(
        mst.graphs(min_nodes=2, ops=("mm", "tanh")),
        lambda g: any(n.target is torch.ops.aten.tanh.default for n in g.graph.nodes),
    )
    with pytest.raises(AssertionError, match=r"msched\.verify found violations") as caught:
        mst.check_schedule(gm, 2, scheduler=tanh_becomes_sin)
    assert "[extra-node]" in str(caught.value) and "[missing-node]" in str(caught.value)


def test_check_schedule_takes_inputs_that_alias() -> None:
    g = torch.fx.Graph()
    buf, view = g.placeholder("buf"), g.placeholder("view")
    buf.meta["val"], view.meta["val"] = (base := torch.zeros(4, 8)), base[:, :4]
    g.call_function(torch.ops.aten.copy_.default, (view, g.call_function(torch.sin, (view,))))
    g.output(g.call_function(torch.ops.aten.sum.default, (buf,)))
    gm = GraphModule(torch.nn.Module(), g)
    data = torch.randn(4, 8)
    mst.check_schedule(gm, 3, inputs=(data, data[:, :4]))

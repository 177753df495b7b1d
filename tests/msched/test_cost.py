from __future__ import annotations

import operator

import pytest
import torch
from torch.fx import Graph
from torch.fx.experimental.proxy_tensor import make_fx

import msched
from msched.decoder import decoder_stack

aten = torch.ops.aten


def test_default_table() -> None:
    g = Graph()
    x = g.placeholder("x")
    mm = g.call_function(aten.mm.default, (x, x))
    view = g.call_function(aten.view.default, (mm, [-1]))
    relu = g.call_function(aten.relu.default, (view,))
    parts = g.call_function(aten.split.Tensor, (relu, 2))
    item = g.call_function(operator.getitem, (parts, 0))
    size = g.call_function(aten.sym_size.int, (x, 0))
    moe = g.call_function(torch.ops.msched.moe_experts.default, (x, x, x, x))
    g.output((item, size, moe))
    model = msched.DefaultCostModel()
    costs = {n.name: model.cost(n) for n in g.nodes}
    assert costs["mm_default"] == 10.0
    assert costs["moe_experts_default"] == 20.0
    assert costs["relu_default"] == 1.0
    for free in ("x", "view_default", "split_tensor", "getitem", "sym_size_int", "output"):
        assert costs[free] == 0.0, free
    assert isinstance(model, msched.CostModel)


def test_roofline_uses_shapes_and_falls_back_to_the_table() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a @ b)

    small = make_fx(f, tracing_mode="fake")(torch.randn(8, 8), torch.randn(8, 8))
    big = make_fx(f, tracing_mode="fake")(torch.randn(4096, 4096), torch.randn(4096, 4096))
    model = msched.RooflineCostModel()
    mm_small = next(n for n in small.graph.nodes if n.target == aten.mm.default)
    mm_big = next(n for n in big.graph.nodes if n.target == aten.mm.default)
    expected = 2 * 4096**3 / model.peak_flops * 1e6 + model.launch_us
    assert model.cost(mm_big) == pytest.approx(expected)
    assert model.cost(mm_small) < model.cost(mm_big)
    stack = decoder_stack(1, (0,))  # no meta["val"]: the table decides
    mm = next(n for n in stack.gm.graph.nodes if n.target == aten.mm.default)
    assert model.cost(mm) == 10.0


def test_roofline_schedules_a_traced_graph() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x @ w).relu() + (x @ w.t()).sigmoid()

    gm = make_fx(f)(torch.randn(64, 64), torch.randn(64, 64))
    x, w = torch.randn(64, 64), torch.randn(64, 64)
    expected = gm(x, w)
    sched = msched.schedule(gm, 2, cost_model=msched.RooflineCostModel())
    assert sched.num_waits >= 1
    assert torch.equal(gm(x, w), expected)

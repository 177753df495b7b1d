from __future__ import annotations

import operator

import numpy as np
import pytest
import torch
from torch.fx import Graph
from torch.fx.experimental.proxy_tensor import make_fx

import msched
from msched.analysis.cost import OP_CATEGORIES, op_category
from msched.models.decoders import decoder_stack

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


def _categorised(**kinds: tuple[object, ...]) -> dict[str, str]:
    g = Graph()
    x = g.placeholder("attn_weight")  # a graph input is "other", whatever its name
    categories = {"attn_weight": op_category(x)}
    for name, (target, *args) in kinds.items():
        op = "call_method" if isinstance(target, str) else "call_function"
        node = g.create_node(op, target, (x, *args), name=name)  # type: ignore[arg-type]
        categories[name] = op_category(node)
    g.output(x)
    return categories


def test_op_category_is_the_one_classification_of_ops() -> None:
    categories = _categorised(
        mm=(aten.mm.default, None),
        einsum=(torch.einsum, "ij->ji"),
        attention=(torch.ops.msched.attention.default, None, None, None),
        moe=(torch.ops.msched.moe_experts.default, None, None, None),
        capture=(torch.ops.msched.inplace_slice_copy.default, None, 0, 1),
        add_=("add_", 1.0),
        relu=(aten.relu.default,),
        relu_inplace=(torch.relu_,),
    )
    assert categories == {
        "attn_weight": "other",
        "mm": "matmul",
        "einsum": "matmul",
        "attention": "attention",
        "moe": "moe",
        "capture": "capture / in-place",
        "add_": "capture / in-place",
        "relu": "other",
        "relu_inplace": "capture / in-place",
    }
    assert set(categories.values()) <= set(OP_CATEGORIES)
    # The table costs by the same kinds: attention is matmul-like.
    assert set(msched.DefaultCostModel.TABLE) == set(OP_CATEGORIES)
    assert msched.DefaultCostModel.TABLE["attention"] == msched.DefaultCostModel.TABLE["matmul"]


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


class _Constant:
    """A cost model that gives every node the same (possibly bad) value."""

    def __init__(self, value: object) -> None:
        self.value = value

    def cost(self, node: torch.fx.Node) -> object:
        return self.value


BAD_COSTS = [
    ("x", r"'x' \(str\)"),
    (float("nan"), r"nan \(float\)"),
    (-1, r"-1 \(int\)"),
    (float("inf"), r"inf \(float\)"),
    (True, r"True \(bool\)"),
    (None, r"None \(NoneType\)"),
    (torch.tensor(1.0), r"tensor\(1\.\) \(Tensor\)"),
    (10**400, r"10+\.\.\.0+ \(int\)"),  # finite, but no float holds it; shown shortened
]


@pytest.mark.parametrize(
    ("value", "shown"),
    BAD_COSTS,
    ids=["str", "nan", "negative", "inf", "bool", "none", "tensor", "huge"],
)
def test_a_bad_cost_is_an_invalid_argument_naming_node_value_and_model(
    value: object, shown: str
) -> None:
    stack = decoder_stack(1, (0,))
    before = [(n.name, n.args) for n in stack.gm.graph.nodes]
    first = next(n for n in stack.gm.graph.nodes if n.op == "call_function")
    match = f"cost model _Constant gave {shown} for node '{first.name}'; costs must be finite"
    with pytest.raises(msched.InvalidArgumentError, match=match):
        msched.schedule(stack.gm, 2, _Constant(value))  # type: ignore[arg-type]
    assert [(n.name, n.args) for n in stack.gm.graph.nodes] == before
    with pytest.raises(msched.InvalidArgumentError, match=match):
        msched.simulate(stack.gm, _Constant(value))  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 3, 2.5, np.float64(1.5), np.int64(2)])
def test_real_numbers_are_good_costs(value: object) -> None:
    stack = decoder_stack(1, (0,))
    sched = msched.schedule(stack.gm, 2, _Constant(value))  # type: ignore[arg-type]
    assert isinstance(sched.makespan, float) and sched.makespan >= 0.0
    assert msched.simulate(stack.gm, _Constant(value)).makespan == sched.makespan  # type: ignore[arg-type]


def test_simulate_refuses_a_cost_model_without_cost() -> None:
    stack = decoder_stack(1, (0,))
    with pytest.raises(msched.InvalidArgumentError, match="must have a cost\\(node\\) method"):
        msched.simulate(stack.gm, object())  # type: ignore[arg-type]


class _Block(torch.nn.Module):
    """Modules whose path names say nothing (or the wrong thing) about what they run."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(16, 32)
        self.fc1 = torch.nn.Linear(32, 8)
        self.attn_norm = torch.nn.LayerNorm(8)  # a norm, though its path says "attn"
        self.act = torch.nn.GELU()
        self.flat = torch.nn.Flatten(0)
        self.conv = torch.nn.Conv1d(4, 6, kernel_size=3, groups=2)

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = self.act(self.attn_norm(self.fc1(self.q_proj(x))))
        rows = x.shape[0] + x.size(1) + x.dim()
        return self.flat(h) * rows, self.conv(s)


def _traced_block() -> torch.fx.GraphModule:
    gm = torch.fx.symbolic_trace(_Block())
    torch.fx.passes.shape_prop.ShapeProp(gm).propagate(torch.randn(5, 16), torch.randn(2, 4, 9))
    return gm


def test_call_module_costs_follow_the_module_type_not_its_name() -> None:
    gm = _traced_block()
    model = msched.DefaultCostModel()
    costs = {n.name: model.cost(n) for n in gm.graph.nodes}
    kinds = {n.name: op_category(n) for n in gm.graph.nodes if n.op == "call_module"}
    assert kinds == {
        "q_proj": "matmul",
        "fc1": "matmul",
        "attn_norm": "other",
        "act": "other",
        "flat": "other",
        "conv": "matmul",
    }
    assert [costs[k] for k in ("q_proj", "fc1", "conv", "attn_norm", "act")] == [10, 10, 10, 1, 1]
    assert costs["flat"] == 0.0  # nn.Flatten is a view
    reads = [n for n in gm.graph.nodes if n.target in (getattr, "size", "dim")]
    assert len(reads) == 3 and all(costs[n.name] == 0.0 for n in reads), reads


def test_the_cost_cache_tells_apart_modules_of_one_path_in_different_graphs() -> None:
    model = msched.DefaultCostModel()
    for module, expected in ((torch.nn.Linear(4, 4), 10.0), (torch.nn.ReLU(), 1.0)):
        gm = torch.fx.symbolic_trace(torch.nn.Sequential(module))  # both paths are "0"
        node = next(n for n in gm.graph.nodes if n.op == "call_module")
        assert model.cost(node) == expected


def test_roofline_prices_linear_and_conv_modules_from_weight_and_shapes() -> None:
    gm = _traced_block()
    model = msched.RooflineCostModel(peak_flops=1e9, bandwidth=1e9, launch_us=0.0)
    node = {n.name: n for n in gm.graph.nodes}

    def expected(flops: float, moved_elements: float) -> float:
        return max(flops / 1e9, moved_elements * 4 / 1e9) * 1e6

    # q_proj: [5, 16] -> [5, 32]; weight 32x16 and bias 32
    q_flops = 2 * 5 * 32 * 16
    assert model.cost(node["q_proj"]) == pytest.approx(
        expected(q_flops, 5 * 16 + 5 * 32 + 32 * 16 + 32)
    )
    # conv: [2, 4, 9] -> [2, 6, 7], 2 groups: 2 input channels per group, kernel 3
    conv_flops = 2 * (2 * 6 * 7) * 2 * 3
    conv_moved = 2 * 4 * 9 + 2 * 6 * 7 + 6 * 2 * 3 + 6
    assert model.cost(node["conv"]) == pytest.approx(expected(conv_flops, conv_moved))
    assert model.cost(node["act"]) == pytest.approx(expected(0, 2 * 5 * 8))  # bytes only
    assert model.cost(node["flat"]) == 0.0


def test_roofline_takes_a_linear_output_from_its_input_without_shape_metadata() -> None:
    gm = _traced_block()
    for n in gm.graph.nodes:
        if n.name == "q_proj":
            del n.meta["tensor_meta"]
            q_proj = n
    model = msched.RooflineCostModel(peak_flops=1e9, bandwidth=1e18, launch_us=0.0)
    assert model.cost(q_proj) == pytest.approx(2 * 5 * 32 * 16 / 1e9 * 1e6)


FC = torch.ops._c10d_functional


def _collective_graph() -> Graph:
    """``x`` (256 float32 = 1 KiB) all-reduced and waited, all-gathered into 2 KiB, and
    all-to-all'd; every node carries ``meta["val"]``."""
    g = Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(16, 16)
    ar = g.call_function(FC.all_reduce, (x, "sum", "0"))
    ar.meta["val"] = torch.empty(16, 16)
    wait = g.call_function(FC.wait_tensor, (ar,))
    wait.meta["val"] = torch.empty(16, 16)
    ag = g.call_function(FC.all_gather_into_tensor, (x, 2, "0"))
    ag.meta["val"] = torch.empty(32, 16)
    a2a = g.call_function(FC.all_to_all_single.default, (x, [8, 8], [8, 8], "0"))
    g.output((wait, ag, a2a))  # a2a has no shape: the table's comm
    return g


def test_table_prices_collectives_as_communication_and_waits_as_free() -> None:
    g = _collective_graph()
    costs = {n.name: msched.DefaultCostModel().cost(n) for n in g.nodes}
    assert msched.DefaultCostModel.COMM == 30.0 > 2 * msched.DefaultCostModel.TABLE["matmul"]
    assert costs["all_reduce"] == costs["all_gather_into_tensor"] == 30.0
    assert costs["wait_tensor"] == 0.0
    slower = msched.DefaultCostModel(comm=45)
    assert [slower.cost(n) for n in g.nodes if n.name.startswith("all_")] == [45.0] * 3
    # the collectives and the wait, whatever their names say
    assert {op_category(n) for n in g.nodes if n.op == "call_function"} == {"comm"}


@pytest.mark.parametrize("comm", [-1.0, float("nan"), float("inf"), "30", True])
def test_table_refuses_a_bad_comm(comm: object) -> None:
    with pytest.raises(msched.InvalidArgumentError, match="comm"):
        msched.DefaultCostModel(comm=comm)  # type: ignore[arg-type]


def test_roofline_prices_a_collective_as_bytes_over_the_link_plus_latency() -> None:
    g = _collective_graph()
    model = msched.RooflineCostModel(link_bandwidth=1024e6, link_latency_us=5.0)
    costs = {n.name: model.cost(n) for n in g.nodes}
    assert costs["all_reduce"] == 5.0 + 1.0  # 1 KiB at 1 KiB per microsecond
    assert costs["all_gather_into_tensor"] == 5.0 + 2.0  # its result is the payload
    assert costs["all_to_all_single_default"] == 5.0 + 1.0  # no result shape: its input's
    assert costs["wait_tensor"] == 0.0
    default = msched.RooflineCostModel()
    assert (default.link_bandwidth, default.link_latency_us) == (200e9, 10.0)
    with pytest.raises(msched.InvalidArgumentError, match="link_bandwidth"):
        msched.RooflineCostModel(link_bandwidth=0.0)
    with pytest.raises(msched.InvalidArgumentError, match="link_latency_us"):
        msched.RooflineCostModel(link_latency_us=-1.0)


def _as_dynamo_meta(graph: Graph) -> Graph:
    """``graph`` with its fake values where Dynamo keeps them: ``meta["example_value"]``."""
    for node in graph.nodes:
        if "val" in node.meta:
            node.meta["example_value"] = node.meta.pop("val")
    return graph


def test_roofline_reads_dynamos_example_values() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a @ b)

    big = torch.randn(4096, 4096)
    graph = _as_dynamo_meta(make_fx(f, tracing_mode="fake")(big, big).graph)
    model = msched.RooflineCostModel()
    mm = next(n for n in graph.nodes if n.target == aten.mm.default)
    assert model.cost(mm) == pytest.approx(2 * 4096**3 / model.peak_flops * 1e6 + 2.0)
    g = _as_dynamo_meta(_collective_graph())
    costs = {n.name: msched.RooflineCostModel(link_bandwidth=1024e6, link_latency_us=5.0).cost(n)
             for n in g.nodes}  # fmt: skip
    assert costs["all_reduce"] == 5.0 + 1.0 and costs["all_gather_into_tensor"] == 5.0 + 2.0


def test_roofline_reads_a_graph_dynamo_captured() -> None:
    captured: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example: object) -> object:
        captured.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(lambda x, w: (x @ w).relu(), backend=backend, fullgraph=True)(
        torch.randn(512, 256), torch.randn(256, 1024)
    )
    model = msched.RooflineCostModel()
    (mm,) = (n for n in captured[0].graph.nodes if op_category(n) == "matmul")
    assert "val" not in mm.meta
    flops, moved = 2 * 512 * 1024 * 256, 4 * (512 * 256 + 256 * 1024 + 512 * 1024)
    seconds = max(flops / model.peak_flops, moved / model.bandwidth)
    assert model.cost(mm) == pytest.approx(seconds * 1e6 + 2.0)  # not the table's 10


@pytest.mark.parametrize(
    "setting", ["peak_flops", "bandwidth", "link_bandwidth", "launch_us", "link_latency_us"]
)
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), "1e12", True, None, 10**400])
def test_roofline_refuses_a_bad_setting(setting: str, value: object) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=setting):
        msched.RooflineCostModel(**{setting: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("setting", ["peak_flops", "bandwidth", "link_bandwidth"])
def test_roofline_refuses_a_zero_rate(setting: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=f"{setting} must be a finite, positive"):
        msched.RooflineCostModel(**{setting: 0})  # type: ignore[arg-type]
    assert msched.RooflineCostModel(launch_us=0).launch_us == 0.0

"""`msched.TableCostModel`: costs of particular nodes and ops over a base model."""

from __future__ import annotations

import operator

import pytest
import torch
from torch import nn
from torch.fx import Graph, GraphModule, Node

import msched
from msched.analysis.cost_table import op_key, op_keys

aten = torch.ops.aten


def _graph() -> Graph:
    """Two ``aten.mm.default``, one ``aten.add.Tensor``, one ``aten.add.Scalar``, a view."""
    g = Graph()
    x = g.placeholder("x")
    mm = g.call_function(aten.mm.default, (x, x))
    mm_1 = g.call_function(aten.mm.default, (mm, x))
    add = g.call_function(aten.add.Tensor, (mm_1, x))
    add_1 = g.call_function(aten.add.Scalar, (add, 1))
    view = g.call_function(aten.view.default, (add_1, [-1]))
    g.output(view)
    return g


def _costs(model: msched.CostModel, g: Graph) -> dict[str, float]:
    return {n.name: model.cost(n) for n in g.nodes if n.op == "call_function"}


def test_a_node_name_beats_an_overload_which_beats_a_packet_which_beats_the_base() -> None:
    g = _graph()
    table = {"mm_default_1": 5.0, "aten.mm.default": 7.0, "aten.mm": 9.0, "aten::add": 2}
    model = msched.TableCostModel(table)
    assert _costs(model, g) == {
        "mm_default": 7.0,  # the overload's entry
        "mm_default_1": 5.0,  # its name's
        "add_tensor": 2.0,  # the packet's: both overloads of add
        "add_scalar": 2.0,
        "view_default": 0.0,  # not in the table: DefaultCostModel's
    }
    packet_only = msched.TableCostModel({"aten.mm": 9.0}, base=msched.DefaultCostModel())
    assert _costs(packet_only, g)["mm_default"] == 9.0
    assert _costs(packet_only, g)["add_tensor"] == 1.0


def test_ops_may_be_given_as_objects_or_either_spelling_of_their_name() -> None:
    g = _graph()
    by_object = msched.TableCostModel({aten.mm.default: 3.0, aten.add: 4.0})
    by_colons = msched.TableCostModel({"aten::mm.default": 3.0, "aten::add": 4.0})
    assert _costs(by_object, g) == _costs(by_colons, g)
    assert by_object.costs == by_colons.costs == {"aten.mm.default": 3.0, "aten.add": 4.0}


def test_functions_methods_and_module_classes_are_keys_too() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.matmul(self.proj(x), x.t()).relu() + 1

    gm = torch.fx.symbolic_trace(Block())
    keys = {n.name: op_keys(n) for n in gm.graph.nodes}
    assert keys == {
        "x": (),
        "proj": ("torch.nn.modules.linear.Linear",),
        "t": ("torch.Tensor.t",),
        "matmul": ("torch.matmul",),
        "relu": ("torch.Tensor.relu",),
        "add": ("operator.add",),
        "output": (),
    }
    model = msched.TableCostModel(
        {nn.Linear: 6.0, torch.matmul: 8.0, operator.add: 0.5, "torch.Tensor.relu": 2.0}
    )
    costs = {n.name: model.cost(n) for n in gm.graph.nodes if n.op.startswith("call")}
    assert costs == {"proj": 6.0, "t": 0.0, "matmul": 8.0, "relu": 2.0, "add": 0.5}


def test_the_table_is_over_any_base_model() -> None:
    g = _graph()

    class Flat:
        def cost(self, node: Node) -> float:
            return 100.0

    model = msched.TableCostModel({"aten.mm": 1.0}, base=Flat())
    assert _costs(model, g) == {
        "mm_default": 1.0, "mm_default_1": 1.0, "add_tensor": 100.0, "add_scalar": 100.0,
        "view_default": 100.0,
    }  # fmt: skip


def test_unmatched_lists_keys_that_name_nothing_in_the_graph_and_check_raises() -> None:
    gm = GraphModule(torch.nn.Module(), _graph())
    model = msched.TableCostModel({"aten.mm.default": 1.0, "atn.mm": 2.0, "mm_2": 3.0})
    assert model.unmatched(gm) == ["atn.mm", "mm_2"]
    assert model.unmatched(gm.graph) == ["atn.mm", "mm_2"]
    with pytest.raises(msched.InvalidArgumentError, match="^2 cost keys match no node") as caught:
        model.check(gm)
    assert "'atn.mm' (did you mean 'aten.mm'" in str(caught.value)
    assert "'mm_2'" in str(caught.value)
    assert msched.TableCostModel({"aten.mm": 1.0, "x": 0}).check(gm) is None
    with pytest.raises(msched.InvalidArgumentError, match="^1 cost key matches no node"):
        msched.TableCostModel({"mm_2": 3.0}).check(gm)


def test_a_table_schedules_differently_from_the_default() -> None:
    """Two captures at 40 instead of 1: one stream takes 78 longer (the table is used)."""
    default = msched.schedule(msched.models.decoder_stack(4, (1, 3)).gm, 1)
    table = msched.TableCostModel({"msched.inplace_slice_copy.default": 40.0})
    priced = msched.schedule(msched.models.decoder_stack(4, (1, 3)).gm, 1, cost_model=table)
    assert priced.makespan == default.makespan + 2 * 39.0


@pytest.mark.parametrize(
    ("costs", "message"),
    [
        ({"": 1.0}, "non-empty name"),
        ({" mm": 1.0}, "non-empty name"),
        ({3: 1.0}, "a node name, an op or an op's name"),
        ({"mm": -1.0}, "the cost of 'mm' must be a finite, non-negative number"),
        ({"mm": float("nan")}, "finite"),
        ({"mm": True}, "finite"),
        ({"aten.mm": 1.0, aten.mm: 2.0}, "names 'aten.mm' a second time"),
        ([("mm", 1.0)], "must be a mapping"),
    ],
)
def test_bad_tables_are_invalid_arguments(costs: object, message: str) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=message):
        msched.TableCostModel(costs)  # type: ignore[arg-type]


def test_a_bad_base_is_an_invalid_argument() -> None:
    with pytest.raises(msched.InvalidArgumentError, match="cost_model must have a cost"):
        msched.TableCostModel({}, base=object())  # type: ignore[arg-type]


def test_op_key_spells_every_op_one_way() -> None:
    assert op_key("aten::mm.default") == op_key(aten.mm.default) == "aten.mm.default"
    assert op_key("myeng::fused_moe") == "myeng.fused_moe"
    assert op_key(operator.add) == "operator.add"


@torch.library.custom_op("msched_cost_tests::fused_moe", mutates_args=())
def fused_moe(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """An engine's custom op: traced by ``symbolic_trace`` as a call of its packet."""
    return h @ w


def test_a_call_of_a_packet_with_one_overload_is_priced_by_that_overload() -> None:
    """``symbolic_trace`` records ``torch.ops.myeng.fused_moe(h, w)`` as a call of the
    packet; the one overload it can run is ``.default``, so a key of the overload prices it
    (it fell to the base model, silently).  A packet of several overloads keeps only its
    packet's key: which overload runs depends on the arguments."""

    class Moe(nn.Module):
        def forward(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return torch.ops.msched_cost_tests.fused_moe(h, w) + 1

    gm = torch.fx.symbolic_trace(Moe())
    (moe,) = [n for n in gm.graph.nodes if n.target is torch.ops.msched_cost_tests.fused_moe]
    assert op_keys(moe) == ("msched_cost_tests.fused_moe.default", "msched_cost_tests.fused_moe")
    table = msched.TableCostModel({"msched_cost_tests::fused_moe.default": 85.0})
    assert table.cost(moe) == 85.0
    assert table.unmatched(gm) == []
    g = Graph()
    x = g.placeholder("x")
    g.output(g.call_function(aten.add, (x, x)))
    (add,) = [n for n in g.nodes if n.op == "call_function"]
    assert op_keys(add) == ("aten.add",)

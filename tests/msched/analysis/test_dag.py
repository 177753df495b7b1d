from __future__ import annotations

import pytest
import torch
from torch.fx import Graph

import msched
from msched.analysis._graphcheck import find_cycle
from msched.analysis.nodes import node_named

from ..graphs import cyclic_graph, eagle3_graph, hazard_graph

aten = torch.ops.aten


@pytest.mark.parametrize("positional", [False, True])
def test_output_depends_on_the_capture_with_reason_exit(positional: bool) -> None:
    gm, nodes = eagle3_graph(positional=positional)
    dag = msched.build_dag(gm)
    out = dag.output
    deps = dag.dependencies(out)
    assert deps[nodes["capture"]] == {"exit"}
    assert deps[nodes["out"]] == {"data"}
    dest = node_named(gm, "dest")
    assert dag.dependencies(nodes["capture"]) == {nodes["a"]: {"data"}, dest: {"data"}}


def test_without_exit_edges_nothing_joins_the_exit_but_its_inputs() -> None:
    gm, nodes = eagle3_graph()
    dag = msched.build_dag(gm, exit_edges=False)  # the ablation that reproduces the bug
    assert dag.dependencies(dag.output) == {nodes["out"]: {"data"}}
    assert dag.succs[nodes["capture"]] == []
    with_exit = msched.build_dag(gm)
    assert with_exit.dependencies(with_exit.output)[nodes["capture"]] == {"exit"}


def test_node_named_finds_a_node_or_says_which_is_missing() -> None:
    gm, nodes = eagle3_graph()
    assert node_named(gm, "capture") is nodes["capture"]
    assert node_named(gm.graph, "capture") is nodes["capture"]
    with pytest.raises(msched.InvalidArgumentError, match="no node named 'nope' in the graph"):
        node_named(gm, "nope")
    with pytest.raises(msched.InvalidArgumentError, match="expected a torch.fx.GraphModule"):
        node_named(3, "capture")  # type: ignore[arg-type]


@pytest.mark.parametrize(("kind", "reason"), [("war", "war"), ("raw", "raw"), ("waw", "waw")])
def test_hazards_between_independent_branches(kind: str, reason: str) -> None:
    gm, nodes = hazard_graph(kind)
    deps = msched.build_dag(gm).dependencies(nodes["second"])
    assert reason in deps[nodes["first"]]


def test_last_write_of_each_storage_and_unused_side_effects_join_the_exit() -> None:
    g = Graph()
    x, dest = g.placeholder("x"), g.placeholder("dest")
    first = g.call_function(aten.copy_.default, (dest, x))
    second = g.call_function(aten.add_.Tensor, (dest, x))
    dead = g.call_function(aten.relu.default, (x,))
    prints = g.call_function(torch._assert, (True, "side effect"))
    g.output(x)
    dag = msched.build_dag(g)
    exit_deps = dag.dependencies(dag.output)
    assert exit_deps[second] == {"exit"}
    assert exit_deps[first] == {"exit"}  # a side effect without users, as well as a write
    assert dag.dependencies(second)[first] == {"raw", "waw"}  # add_ reads dest too
    assert exit_deps[dead] == {"exit"}
    assert exit_deps[prints] == {"exit"}


def _log(message: str) -> None:
    print(message)


def test_side_effects_that_write_no_tensor_keep_their_order() -> None:
    msched.register_side_effect(_log)
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(_log, ("a",))
    b = g.call_function(_log, ("b",))
    g.output(x)
    dag = msched.build_dag(g)
    assert dag.dependencies(b) == {a: {"waw"}}


def test_dependencies_of_a_foreign_node_is_an_error() -> None:
    gm, _ = eagle3_graph()
    other, nodes = eagle3_graph()
    with pytest.raises(msched.MschedError, match="not in this graph"):
        msched.build_dag(gm).dependencies(nodes["capture"])


def test_graph_without_output_is_rejected() -> None:
    g = Graph()
    g.placeholder("x")
    with pytest.raises(msched.InvalidGraphError, match="no output"):
        msched.build_dag(g)


def test_build_dag_names_a_cycle_in_data_flow_order_from_its_first_node() -> None:
    g = Graph()
    x = g.placeholder("x")
    a = g.create_node("call_function", aten.neg.default, (x,), name="a")
    b = g.create_node("call_function", aten.relu.default, (a,), name="b")
    c = g.create_node("call_function", aten.cos.default, (b,), name="c")
    g.output(c)
    assert find_cycle(g) is None
    a.args = (c,)  # a uses c: a -> b -> c -> a
    assert [n.name for n in find_cycle(g) or []] == ["a", "b", "c"]
    with pytest.raises(msched.InvalidGraphError, match="the graph has a cycle: a -> b -> c -> a "):
        msched.build_dag(g)
    with pytest.raises(msched.InvalidGraphError, match="has a cycle: cos -> cos "):
        msched.build_dag(cyclic_graph(self_loop=True))


def test_a_node_used_before_its_definition_is_no_cycle() -> None:
    gm, nodes = eagle3_graph()
    nodes["h"].prepend(nodes["a"])  # relu(h) before h: out of order, but acyclic
    assert find_cycle(gm.graph) is None
    with pytest.raises(msched.InvalidGraphError, match="which comes after it in the graph"):
        msched.build_dag(gm)

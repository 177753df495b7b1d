"""Which nodes are collectives, of which group, and which wait_tensor waits for each."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx import Graph

import msched
from msched.analysis import collectives as coll
from msched.analysis._collective_targets import REGISTERED
from msched.analysis._targets import OP_INFO_CACHE
from msched.analysis.effects import compute_effects

from ..sharded_graphs import ENGINE_ALL_REDUCE

FC = torch.ops._c10d_functional


def _functional_graph() -> tuple[Graph, dict[str, torch.fx.Node]]:
    g = Graph()
    x = g.placeholder("x")
    ar = g.call_function(FC.all_reduce, (x, "sum", "0"))
    w = g.call_function(FC.wait_tensor, (ar,))
    a2a = g.call_function(FC.all_to_all_single.default, (x, [4], [4], "tp"))
    w2 = g.call_function(FC.wait_tensor.default, (a2a,))
    co = g.call_function(FC.all_reduce_coalesced, ([x, w], "sum", "0"))
    c0 = g.call_function(operator.getitem, (co, 0))
    c1 = g.call_function(operator.getitem, (co, 1))
    wc0 = g.call_function(FC.wait_tensor, (c0,))
    wc1 = g.call_function(FC.wait_tensor, (c1,))
    lone = g.call_function(FC.all_gather_into_tensor, (x, 2), {"group_name": "dp"})
    g.output((w, w2, wc0, wc1, lone))
    names = dict(ar=ar, w=w, a2a=a2a, w2=w2, co=co, wc0=wc0, wc1=wc1, lone=lone)
    return g, names


def test_functional_collectives_are_read_with_their_group_and_their_waits() -> None:
    g, n = _functional_graph()
    found = coll.collectives_in(g)
    assert [(c.node, c.op, c.group, c.asynchronous, c.holds_input) for c in found] == [
        (n["ar"], "all_reduce", "0", True, False),
        (n["a2a"], "all_to_all_single", "tp", True, True),
        (n["co"], "all_reduce_coalesced", "0", True, False),
        (n["lone"], "all_gather_into_tensor", "dp", True, True),
    ]
    assert coll.waits_of(g) == {
        n["ar"]: [n["w"]],
        n["a2a"]: [n["w2"]],
        n["co"]: [n["wc0"], n["wc1"]],
        n["lone"]: [],
    }
    assert coll.is_wait(n["w"]) and not coll.is_wait(n["ar"])
    assert coll.collective_of(n["w"]) is None
    assert coll.waited(n["wc1"]) is n["co"] and coll.waited(n["ar"]) is None


def test_a_process_group_object_is_read_by_its_name() -> None:
    class Group:
        group_name = "7"

    g = Graph()
    x = g.placeholder("x")
    ar = g.call_function(FC.all_reduce_, (x, "sum", Group()))
    g.output(ar)
    (found,) = coll.collectives_in(g)
    assert (found.op, found.group, found.holds_input) == ("all_reduce_", "7", True)


def test_an_engine_collective_is_synchronous_once_registered() -> None:
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(ENGINE_ALL_REDUCE.default, (x, "tp"))
    b = g.call_function(ENGINE_ALL_REDUCE.default, (a,), {"group_name": "ep"})
    g.output(b)
    assert coll.collectives_in(g) == []
    msched.register_collective(ENGINE_ALL_REDUCE, group="group_name")
    try:
        found = coll.collectives_in(g)
        assert [(c.node, c.group, c.asynchronous) for c in found] == [
            (a, "tp", False),
            (b, "ep", False),
        ]
        assert found[0].op == "mschedtest::all_reduce"
        msched.register_collective(ENGINE_ALL_REDUCE)
        assert [c.group for c in coll.collectives_in(g)] == [None, None]
    finally:
        REGISTERED.clear()
        OP_INFO_CACHE.clear()


@pytest.mark.parametrize(
    ("op", "group", "message"),
    [
        ("not an op", None, "is not an op"),
        (ENGINE_ALL_REDUCE, 3, "must be an argument name"),
        (ENGINE_ALL_REDUCE, "group", "has no argument named group"),
    ],
)
def test_register_collective_refuses_what_it_cannot_read(
    op: object, group: object, message: str
) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=message):
        msched.register_collective(op, group=group)  # type: ignore[arg-type]
    assert REGISTERED == {}


def _effects_graph() -> tuple[Graph, dict[str, torch.fx.Node]]:
    g = Graph()
    x = g.placeholder("x")
    ar = g.call_function(FC.all_reduce, (x, "sum", "0"))
    w = g.call_function(FC.wait_tensor, (ar,))
    a2a = g.call_function(FC.all_to_all_single, (x, [4], [4], "0"))
    w2 = g.call_function(FC.wait_tensor, (a2a,))
    inplace = g.call_function(FC.all_reduce_, (x, "sum", "0"))
    w3 = g.call_function(FC.wait_tensor, (inplace,))
    g.output((w, w2, w3))
    return g, dict(x=x, ar=ar, w=w, a2a=a2a, w2=w2, inplace=inplace, w3=w3)


def test_a_wait_completes_the_collective_it_waits_for() -> None:
    """The issue writes its own result; the wait writes it again and is its storage; a wait
    of a collective that holds its input reads that input too."""
    g, n = _effects_graph()
    e = compute_effects(g)
    x, ar, a2a, inplace = n["x"], n["ar"], n["a2a"], n["inplace"]
    assert (e.reads[ar], e.writes[ar], e.root[ar]) == ((x,), (ar,), ar)
    assert (e.reads[n["w"]], e.writes[n["w"]], e.root[n["w"]]) == ((ar,), (ar,), ar)
    assert (e.reads[n["w2"]], e.writes[n["w2"]], e.root[n["w2"]]) == ((a2a, x), (a2a,), a2a)
    assert (e.writes[inplace], e.root[inplace]) == ((x,), x)
    assert (e.reads[n["w3"]], e.writes[n["w3"]]) == ((x,), (x,))
    assert {ar, a2a, inplace, n["w"], n["w2"], n["w3"]} <= e.side_effects
    assert not e.world & {ar, a2a, inplace, n["w"], n["w2"], n["w3"]}


def test_the_dag_orders_uses_after_the_wait_and_collectives_in_one_chain() -> None:
    g, n = _effects_graph()
    dag = msched.build_dag(g)
    assert dag.dependencies(n["a2a"]) == {n["x"]: {"data"}, n["ar"]: {"collective"}}
    assert dag.dependencies(n["inplace"])[n["a2a"]] == {"collective", "war"}
    assert dag.dependencies(n["inplace"])[n["w2"]] == {"war"}  # a2a reads x until its wait
    assert n["w"] not in dag.dependencies(n["inplace"])  # all_reduce copied x at issue

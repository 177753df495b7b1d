"""Which nodes are collectives, of which group, and which wait_tensor waits for each."""

from __future__ import annotations

import operator

import pytest
import torch
from torch.fx import Graph

import msched
from msched.analysis import collectives as coll
from msched.analysis._collective_targets import REGISTERED
from msched.analysis._targets import _OP_INFO_CACHE

FC = torch.ops._c10d_functional


@torch.library.custom_op("mscheng34::all_reduce", mutates_args=())
def engine_all_reduce(t: torch.Tensor, group_name: str) -> torch.Tensor:
    return t.clone()


@engine_all_reduce.register_fake
def _(t: torch.Tensor, group_name: str) -> torch.Tensor:
    return torch.empty_like(t)


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
    a = g.call_function(torch.ops.mscheng34.all_reduce.default, (x, "tp"))
    b = g.call_function(torch.ops.mscheng34.all_reduce.default, (a,), {"group_name": "ep"})
    g.output(b)
    assert coll.collectives_in(g) == []
    msched.register_collective(torch.ops.mscheng34.all_reduce, group="group_name")
    try:
        found = coll.collectives_in(g)
        assert [(c.node, c.group, c.asynchronous) for c in found] == [
            (a, "tp", False),
            (b, "ep", False),
        ]
        assert found[0].op == "mscheng34::all_reduce"
        msched.register_collective(torch.ops.mscheng34.all_reduce)
        assert [c.group for c in coll.collectives_in(g)] == [None, None]
    finally:
        REGISTERED.clear()
        _OP_INFO_CACHE.clear()


@pytest.mark.parametrize(
    ("op", "group", "message"),
    [
        ("not an op", None, "is not an op"),
        (torch.ops.mscheng34.all_reduce, 3, "must be an argument name"),
        (torch.ops.mscheng34.all_reduce, "group", "has no argument named group"),
    ],
)
def test_register_collective_refuses_what_it_cannot_read(
    op: object, group: object, message: str
) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=message):
        msched.register_collective(op, group=group)  # type: ignore[arg-type]
    assert REGISTERED == {}

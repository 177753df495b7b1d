"""Issue 34: communication ops read as collectives (point-to-point, ``_c10d_functional_autograd``,
``_dtensor``, any op of a communication namespace), registrations that cover every call of
an engine's op, and a wait on the input of an in-place collective."""

from __future__ import annotations

import operator
from collections.abc import Iterator

import pytest
import torch
import torch._dynamo  # noqa: F401  (registers torch.ops.streams)
import torch.fx as fx
from torch.fx import Graph, GraphModule

import msched
from msched.analysis import collectives as coll
from msched.analysis._collective_targets import REGISTERED
from msched.analysis._targets import OP_INFO_CACHE
from msched.analysis.nodes import node_named
from msched.proof.verifier import Report

from ..scheduled import Scheduled, aten, unscheduled
from ..sharded_graphs import ENGINE_ALL_REDUCE, engine_all_reduce

FC = torch.ops._c10d_functional
FCA = torch.ops._c10d_functional_autograd


@pytest.fixture
def clean_registry() -> Iterator[None]:
    yield
    REGISTERED.clear()
    OP_INFO_CACHE.clear()


def kinds(report: Report) -> list[tuple[str, str | None]]:
    return [(v.kind, v.hazard) for v in report.violations]


# -- communication ops of torch ------------------------------------------------------------


def test_communication_ops_are_read_with_their_group_and_wait() -> None:
    g = Graph()
    x = g.placeholder("x")
    pg = g.placeholder("pg")
    send = g.call_function(FC.isend.default, (x, 1, 0, "pp"))
    recv = g.call_function(FC.irecv.default, (x, 0, 0, "pp"))
    batch = g.call_function(FC.batch_p2p_ops.default, (["isend"], [1], [0], [x], "pp"))
    a2a = g.call_function(FCA.all_to_all_single.default, (x, [2, 2], [2, 2], "tp"))
    ag = g.call_function(FCA.all_gather_into_tensor, (x, 2, "dp"))
    rs = g.call_function(FCA.reduce_scatter_tensor.default, (x, "sum", 2, "dp"))
    shard = g.call_function(torch.ops._dtensor.shard_dim_alltoall.default, (x, 0, 1, "tp"))
    barrier = g.call_function(torch.ops.c10d.barrier.default, (x, pg, [0]))
    waits = [g.call_function(FC.wait_tensor, (n,)) for n in (send, recv, a2a, ag, rs)]
    b0 = g.call_function(operator.getitem, (batch, 0))
    waits.append(g.call_function(FC.wait_tensor, (b0,)))
    g.output((*waits, shard, barrier))
    found = {c.node: c for c in coll.collectives_in(g)}
    assert list(found) == [send, recv, batch, a2a, ag, rs, shard, barrier]
    read = {n: (c.op, c.group, c.asynchronous, c.holds_input) for n, c in found.items()}
    assert read[send] == ("isend", "pp", True, True)
    assert read[recv] == ("irecv", "pp", True, True)
    assert read[batch] == ("batch_p2p_ops", "pp", True, True)
    assert read[a2a] == ("_c10d_functional_autograd::all_to_all_single", "tp", True, True)
    assert read[ag][1:3] == ("dp", True) and read[rs][1:3] == ("dp", True)
    # no wait_tensor waits for these two: synchronous on their stream
    assert read[shard] == ("_dtensor::shard_dim_alltoall", "tp", False, True)
    assert read[barrier][0] == "c10d::barrier" and not read[barrier][2]
    assert coll.waits_of(g)[batch] == [waits[-1]]
    assert coll.collective_of(waits[0]) is None


def p2p(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    r0 = FC.wait_tensor(FC.all_reduce(x, "sum", "0"))
    a = x @ x
    a = a @ a
    a = a @ a
    s = FC.isend(a, 1, 0, "0")
    r = FC.irecv(buf, 0, 0, "0")
    r = FC.wait_tensor(r)
    s = FC.wait_tensor(s)
    return r @ r + r0


def _comm_order(gm: GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.name in ("isend", "irecv")]


@pytest.mark.parametrize("k", [1, 2])
def test_the_scheduler_keeps_a_send_before_its_recv(k: int) -> None:
    gm = fx.symbolic_trace(p2p)
    sched = msched.schedule(gm, k)
    assert _comm_order(gm) == ["isend", "irecv"]
    assert msched.verify(gm, sched.original).ok
    move = node_named(gm, "irecv")
    node_named(gm, "isend").prepend(move)
    gm.recompile()
    report = msched.verify(gm, sched.original)
    assert ("collective-order", None) in kinds(report), str(report)


def p2p_on_two_streams(ordered: bool) -> GraphModule:
    s = Scheduled()
    x, buf, w = s.input("x"), s.input("buf"), s.input("w")
    s.record(0)
    a = s.op("a", aten.mm.default, x, w)
    send = s.op("send", FC.isend.default, a, 1, 0, "0")
    s.record(1)
    s.stream(1)
    s.wait(0)
    if ordered:
        s.wait(1)
    recv = s.op("recv", FC.irecv.default, buf, 0, 0, "0")
    s.record(2)
    s.stream(0)
    s.wait(2)
    ws = s.op("wait_s", FC.wait_tensor, send)
    wr = s.op("wait_r", FC.wait_tensor, recv)
    return s.done((s.op("out", aten.add.Tensor, wr, ws),))


def test_a_send_and_a_recv_on_two_unordered_streams() -> None:
    gm = p2p_on_two_streams(ordered=False)
    report = msched.verify(gm, unscheduled(gm))
    assert kinds(report) == [("collective-order", None)], str(report)
    assert report.violations[0].nodes == ("send", "recv")
    fixed = p2p_on_two_streams(ordered=True)
    assert msched.verify(fixed, unscheduled(fixed)).ok


# -- register_collective covers every call of the op ----------------------------------------


def _engine_graph() -> tuple[Graph, list[fx.Node]]:
    g = Graph()
    x = g.placeholder("x")
    a = g.call_function(ENGINE_ALL_REDUCE, (x, "tp"))  # Dynamo's packet call
    b = g.call_function(ENGINE_ALL_REDUCE.default, (a, "tp"))
    g.output(b)
    return g, [a, b]


@pytest.mark.parametrize(
    "form",
    [engine_all_reduce, ENGINE_ALL_REDUCE, ENGINE_ALL_REDUCE.default],
    ids=["custom_op", "packet", "overload"],
)
def test_every_registration_form_covers_packet_and_overload_calls(
    form: object, clean_registry: None
) -> None:
    g, calls = _engine_graph()
    assert coll.collectives_in(g) == []
    msched.register_collective(form, group="group_name")
    found = coll.collectives_in(g)
    assert [(c.node, c.group, c.asynchronous) for c in found] == [
        (calls[0], "tp", False),
        (calls[1], "tp", False),
    ]


@pytest.mark.parametrize(
    ("op", "message"),
    [
        (FC.wait_tensor, "wait of the functional collectives"),
        (FC.all_reduce, "one of torch's communication ops"),
        (torch.ops.aten.add, "aten::add is not a collective"),
    ],
)
def test_register_collective_refuses_torch_ops(
    op: object, message: str, clean_registry: None
) -> None:
    with pytest.raises(msched.InvalidArgumentError, match=message):
        msched.register_collective(op)
    assert REGISTERED == {}


# -- a wait on the input of an in-place collective ----------------------------------------


def wait_on_input(x: torch.Tensor) -> torch.Tensor:
    t = x * 3
    FC.all_reduce_(t, "sum", "0")
    t2 = FC.wait_tensor(t)
    return t2 + 1


def use_before_wait(x: torch.Tensor) -> torch.Tensor:
    t = x * 3
    FC.all_reduce_(t, "sum", "0")
    early = t * 2
    t2 = FC.wait_tensor(t)
    return t2 + early


def test_a_wait_on_the_input_waits_for_the_in_place_collective() -> None:
    gm = fx.symbolic_trace(wait_on_input)
    issue, wait = node_named(gm, "all_reduce_"), node_named(gm, "wait_tensor")
    assert coll.waited(wait) is issue
    assert coll.waits_of(gm.graph) == {issue: [wait]}
    assert msched.verify(gm).ok


@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_wait_on_the_input_verifies_once_scheduled(k: int) -> None:
    gm = fx.symbolic_trace(wait_on_input)
    sched = msched.schedule(gm, k)
    report = msched.verify(gm, sched.original)
    assert report.ok, str(report)


def test_a_use_of_the_input_before_the_wait_is_still_a_race() -> None:
    gm = fx.symbolic_trace(use_before_wait)
    report = msched.verify(gm)
    assert ("race", "raw") in kinds(report), str(report)


def test_waits_on_the_inputs_of_the_other_in_place_forms() -> None:
    g = Graph()
    x, y, out = g.placeholder("x"), g.placeholder("y"), g.placeholder("out")
    first = g.call_function(FC.broadcast_.default, (x, 0, "0"))
    wx = g.call_function(FC.wait_tensor, (x,))
    co = g.call_function(FC.all_reduce_coalesced_.default, ([x, y], "sum", "0"))
    wy = g.call_function(FC.wait_tensor, (y,))
    wx2 = g.call_function(FC.wait_tensor, (x,))
    ag = g.call_function(FC.all_gather_into_tensor_out.default, (y, 2, "0"), {"out": out})
    wo = g.call_function(FC.wait_tensor, (out,))
    plain = g.call_function(FC.wait_tensor, (g.call_function(aten.relu.default, (x,)),))
    g.output((wx, wy, wx2, wo, plain))
    assert coll.waited(wx) is first  # the latest one before it
    assert coll.waited(wy) is co and coll.waited(wx2) is co
    assert coll.waited(wo) is ag
    assert coll.waited(plain) is None
    assert coll.waits_of(g) == {first: [wx], co: [wy, wx2], ag: [wo]}

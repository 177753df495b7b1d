"""The emitted program achieves the assignment: ``simulate(scheduled gm) == sched.makespan``."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx import Graph, GraphModule

import msched
import msched.testing.strategies as mst
from msched.analysis.collectives import collectives_in
from msched.testing import families
from msched.testing.decoders import decoder_stack

aten = torch.ops.aten


def _view_beside_a_chain() -> GraphModule:
    """``head`` feeds a chain of three matmuls (kept on stream 0) and a free ``transpose``
    whose own chain of three matmuls goes to stream 1: the transpose starts when the chain's
    first matmul does, on the same stream."""
    g = Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    head = g.call_function(aten.mm.default, (x, w))
    main = head
    for _ in range(3):
        main = g.call_function(aten.mm.default, (main, w))
    side = g.call_function(aten.t.default, (head,))
    for _ in range(3):
        side = g.call_function(aten.mm.default, (side, w))
    g.output((main, side))
    return GraphModule(torch.nn.Module(), g)


def test_a_view_starting_with_a_kernel_on_its_stream_is_emitted_before_it() -> None:
    gm = _view_beside_a_chain()
    x, w = torch.randn(3, 3), torch.randn(3, 3)
    expected = gm(x, w)
    sched = msched.schedule(gm, 2)
    a = sched.assignment
    assert a is not None
    t = next(n for n in a.order if n.target is aten.t.default)
    kernel = next(n for n in a.order if a.start[n] == a.start[t] and n is not t)
    assert a.stream[kernel] == a.stream[t] != a.stream[next(iter(t.users))]
    nodes = list(gm.graph.nodes)
    assert nodes.index(t) < nodes.index(kernel)  # else its event is recorded after the kernel
    assert sched.makespan == 40.0
    assert msched.simulate(gm).makespan == 40.0  # 50 when the view came after the kernel
    assert msched.verify(gm, original=sched.original).ok
    assert all(map(torch.equal, gm(x, w), expected))


def _assert_achieved(gm: GraphModule, streams: int) -> None:
    sched = msched.schedule(gm, streams)
    assert msched.simulate(gm).makespan == sched.makespan


@given(mst.graphs(), mst.stream_counts())
def test_generated_graphs_run_as_fast_as_claimed(gm: GraphModule, streams: int) -> None:
    _assert_achieved(gm, streams)


FAMILIES = {
    "layered": families.layered_dag,
    "moe": families.moe_layer,
    "attention": families.attention_mlp,
}


@settings(max_examples=150)
@given(st.sampled_from(sorted(FAMILIES)), st.integers(0, 10_000), st.integers(2, 4))
def test_graph_families_run_as_fast_as_claimed(family: str, seed: int, streams: int) -> None:
    _assert_achieved(FAMILIES[family](seed), streams)


@settings(max_examples=20)
@given(st.integers(1, 6), st.booleans(), st.integers(2, 4))
def test_decoder_stacks_run_as_fast_as_claimed(layers: int, moe: bool, streams: int) -> None:
    captures = (0, layers - 1) if layers > 1 else (0,)
    _assert_achieved(decoder_stack(layers, captures, moe).gm, streams)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.integers(0, 60))
def test_sharded_stacks_run_as_fast_as_claimed(
    layers: int, microbatches: int, streams: int, comm: int
) -> None:
    """With collectives (a tensor-parallel `decoder_stack`): communication off the streams, one
    channel per group, waits after it -- the simulator and the scheduler agree, and the
    collectives keep their original host order."""
    gm = decoder_stack(layers, (0,), tp=2, microbatches=microbatches, rank=0).gm
    model = msched.DefaultCostModel(comm=comm)
    sched = msched.schedule(gm, streams, cost_model=model)
    assert msched.simulate(gm, model).makespan == sched.makespan >= sched.lower_bound
    names = [[c.node.name for c in collectives_in(g.graph)] for g in (gm, sched.original)]
    assert names[0] == names[1]

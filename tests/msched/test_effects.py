from __future__ import annotations

import operator

import pytest
import torch
from torch.fx import Graph

import msched
from msched.effects import compute_effects, produces_tensor

from .graphs import capture_op, eagle3_graph, module

aten = torch.ops.aten


def test_write_through_slice_of_placeholder_is_a_write_to_the_placeholder() -> None:
    g = Graph()
    dest, src = g.placeholder("dest"), g.placeholder("src")
    view = g.call_function(aten.slice.Tensor, (dest, 1, 0, 4))
    copy = g.call_function(aten.copy_.default, (view, src))
    g.output(None)
    eff = compute_effects(g)
    assert eff.root[view] is dest
    assert eff.writes[copy] == (dest,)
    assert eff.reads[view] == ()
    assert copy in eff.side_effects


@pytest.mark.parametrize("positional", [False, True])
def test_capture_writes_dest_positionally_and_by_keyword(positional: bool) -> None:
    gm, nodes = eagle3_graph(positional=positional)
    eff = compute_effects(gm.graph)
    dest = next(n for n in gm.graph.nodes if n.name == "dest")
    assert eff.writes[nodes["capture"]] == (dest,)
    assert nodes["capture"] in eff.side_effects


def test_call_method_inplace_and_setitem_write_their_target() -> None:
    g = Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    t = g.call_method("t", (x,))
    add_ = g.call_method("add_", (t, y))
    setitem = g.call_function(operator.setitem, (y, 0, 1.0))
    g.output(x)
    eff = compute_effects(g)
    assert eff.writes[add_] == (x,)
    assert eff.writes[setitem] == (y,)
    assert eff.root[t] is x


def test_view_results_alias_and_fresh_outputs_are_roots() -> None:
    g = Graph()
    x = g.placeholder("x")
    parts = g.call_function(aten.split.Tensor, (x, 2))
    first = g.call_function(operator.getitem, (parts, 0))
    mm = g.call_function(aten.mm.default, (first, first))
    sorted_ = g.call_function(aten.sort.default, (mm,))
    values = g.call_function(operator.getitem, (sorted_, 0))
    g.output(values)
    eff = compute_effects(g)
    assert eff.root[first] is x
    assert eff.root[mm] is mm
    assert eff.root[values] is values
    assert eff.reads[mm] == (x,)


def test_register_mutation_and_side_effect_for_ops_without_schema_effects() -> None:
    lib = torch.library.Library("msched_test_fx", "FRAGMENT")
    lib.define("fill_quietly(Tensor buf, Tensor src) -> ()")
    lib.define("log_it(Tensor x) -> ()")
    lib.impl("fill_quietly", lambda buf, src: buf.copy_(src) and None, "CompositeExplicitAutograd")
    lib.impl("log_it", lambda x: None, "CompositeExplicitAutograd")
    fill = torch.ops.msched_test_fx.fill_quietly.default
    log = torch.ops.msched_test_fx.log_it.default
    g = Graph()
    buf, src = g.placeholder("buf"), g.placeholder("src")
    fill_node = g.call_function(fill, (buf, src))
    log_node = g.call_function(log, (src,))
    g.output(None)
    before = compute_effects(g)
    assert before.writes[fill_node] == () and log_node not in before.side_effects
    msched.register_mutation(fill, "buf")
    msched.register_side_effect(log)
    after = compute_effects(g)
    assert after.writes[fill_node] == (buf,)
    assert log_node in after.side_effects


def test_register_mutation_rejects_unknown_argument_names() -> None:
    with pytest.raises(msched.MschedError, match="no argument named nope"):
        msched.register_mutation(capture_op, "nope")


def test_produces_tensor_distinguishes_tensors_from_tuples_and_ints() -> None:
    g = Graph()
    x = g.placeholder("x")
    mm = g.call_function(aten.mm.default, (x, x))
    size = g.call_function(aten.sym_size.int, (x, 0))
    sorted_ = g.call_function(aten.sort.default, (mm,))
    values = g.call_function(operator.getitem, (sorted_, 0))
    g.output((values, size))
    module(g)
    assert produces_tensor(mm) and produces_tensor(values)
    assert not produces_tensor(size) and not produces_tensor(sorted_)

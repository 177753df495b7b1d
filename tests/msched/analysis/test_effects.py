from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from functools import partial

import pytest
import torch
from torch.fx import Graph

import msched
from msched.analysis import _targets
from msched.analysis.effects import compute_effects, produces_tensor
from msched.analysis.nodes import node_named

from ..graphs import capture_op, eagle3_graph, module

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
    dest = node_named(gm, "dest")
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


# --- sound by default -------------------------------------------------------------------------


def _opaque(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a


torch.fx.wrap("_opaque")


class _CallsOpaque(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r = _opaque(x, y)
        r.mul_(2)
        return r


def test_an_unknown_function_reads_and_writes_its_inputs_and_its_result_aliases_them() -> None:
    gm = torch.fx.symbolic_trace(_CallsOpaque())
    n = partial(node_named, gm)
    eff = compute_effects(gm.graph)
    assert set(eff.writes[n("_opaque")]) == {n("x"), n("y")}
    assert set(eff.writes[n("mul_")]) == {n("_opaque"), n("x"), n("y")}
    assert n("_opaque") in eff.world and n("_opaque") in eff.side_effects


@contextlib.contextmanager
def _registered_pure(target: object) -> Iterator[None]:
    """`msched.register_pure` for the block only."""
    msched.register_pure(target)
    try:
        yield
    finally:
        _targets.REGISTERED_PURE.discard(target)
        _targets.OP_INFO_CACHE.clear()


def test_register_pure_makes_an_unknown_function_plain() -> None:
    gm = torch.fx.symbolic_trace(_CallsOpaque())
    with _registered_pure(_opaque):
        eff = compute_effects(gm.graph)
    n = partial(node_named, gm)
    assert eff.writes[n("_opaque")] == () and eff.root[n("_opaque")] is n("_opaque")
    assert eff.writes[n("mul_")] == (n("_opaque"),)


class _Mystery(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class _UsesModules(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mystery = _Mystery()
        self.relu = torch.nn.ReLU(inplace=True)
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(self.relu(self.mystery(x)))


class _MysteryIsALeaf(torch.fx.Tracer):
    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return isinstance(m, _Mystery) or super().is_leaf_module(m, qualname)


@pytest.mark.parametrize("declare", ["type", "instance"])
def test_modules_unknown_by_default_and_register_pure_accepts_types_and_instances(
    declare: str,
) -> None:
    root = _UsesModules()
    gm = torch.fx.GraphModule(root, _MysteryIsALeaf().trace(root))
    n = partial(node_named, gm)
    eff = compute_effects(gm.graph)
    assert eff.writes[n("mystery")] == (n("x"),)  # unknown module: writes what it receives
    assert eff.writes[n("relu")] == (n("mystery"), n("x"))  # inplace=True, through the alias
    assert eff.writes[n("lin")] == () and len(eff.reads[n("lin")]) == 4  # input, alias, w, b
    with _registered_pure(_Mystery if declare == "type" else root.mystery):
        after = compute_effects(gm.graph)
    assert after.writes[n("mystery")] == () and after.writes[n("relu")] == (n("mystery"),)


@pytest.mark.parametrize(
    "call",
    [lambda: msched.register_mutation(123, "x"), lambda: msched.register_side_effect([])],
)
def test_registering_something_that_is_no_target_is_an_invalid_argument(call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(msched.InvalidArgumentError, match="not an op, a function"):
        call()


class _Cache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k_cache", torch.zeros(2, 4))
        self.head = torch.nn.Linear(4, 4, bias=False)
        self.tail = torch.nn.Linear(4, 4, bias=False)
        self.tail.weight = self.head.weight  # tied

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        self.k_cache.copy_(k)
        return self.k_cache + self.head.weight.sum() + self.tail(k)


def test_every_get_attr_of_one_attribute_and_tied_state_are_one_storage() -> None:
    gm = torch.fx.symbolic_trace(_Cache())
    n = partial(node_named, gm)
    eff = compute_effects(gm.graph)
    caches = [x for x in gm.graph.nodes if x.op == "get_attr" and x.target == "k_cache"]
    assert len(caches) == 2 and {eff.root[c] for c in caches} == {caches[0]}
    weight = next(x for x in gm.graph.nodes if x.op == "get_attr" and x.target == "head.weight")
    assert weight in eff.reads[n("tail")]  # the module reads the tied parameter
    dag = msched.build_dag(gm)
    assert "raw" in dag.dependencies(n("add"))[n("copy_")]


def test_placeholders_with_one_storage_label_are_one_storage() -> None:
    g = Graph()
    base, view = g.placeholder("base"), g.placeholder("view")
    base.meta["msched_storage"] = view.meta["msched_storage"] = "cache"
    mm = g.call_function(aten.mm.default, (view, view))
    mul_ = g.call_function(aten.mul_.Tensor, (base, 0.5))
    g.output(mm)
    eff = compute_effects(g)
    assert eff.root[view] is base
    assert "war" in msched.build_dag(module(g)).dependencies(mul_)[mm]


def _dropout_then_rand(x: torch.Tensor) -> torch.Tensor:
    a = torch.nn.functional.dropout(x.cos(), 0.5)
    return a + torch.rand_like(x)


def test_random_calls_keep_their_order() -> None:
    gm = torch.fx.symbolic_trace(_dropout_then_rand)
    n = partial(node_named, gm)
    assert "waw" in msched.build_dag(gm).dependencies(n("rand_like"))[n("dropout")]


@pytest.mark.parametrize(
    ("method", "alias"), [("float", "maybe"), ("reshape", "maybe"), ("t", "view"), ("add_", "same")]
)
def test_methods_that_may_return_self_alias_their_input(method: str, alias: str) -> None:
    g = Graph()
    x = g.placeholder("x")
    args = (x, 1) if method == "add_" else (x, 16) if method == "reshape" else (x,)
    y = g.call_method(method, args)
    w = g.call_method("mul_", (y, 2))
    g.output(None)
    eff = compute_effects(g)
    if alias == "maybe":  # its own storage (a fresh block when it copies), also x's
        assert eff.root[y] is y and eff.writes[w] == (y, x)
    else:
        assert eff.root[y] is x and eff.writes[w] == (x,)


def test_set_makes_later_accesses_touch_the_source() -> None:
    g = Graph()
    x, y = g.placeholder("x"), g.placeholder("y")
    g.call_function(aten.set_.source_Tensor, (y, x))
    w = g.call_function(aten.mul_.Tensor, (y, 2))
    g.output(None)
    assert set(compute_effects(g).writes[w]) == {x, y}


def test_torch_functions_take_effects_from_their_aten_schemas() -> None:
    g = Graph()
    x, c = g.placeholder("x"), g.placeholder("c")
    mul = g.call_function(torch.mul, (x, 3))
    out = g.call_function(torch.mul, (x, 3), {"out": c})
    view = g.call_function(torch.moveaxis, (x, 0, 1))
    g.output((mul, out, view))
    eff = compute_effects(g)
    assert eff.writes[mul] == () and eff.root[mul] is mul
    assert eff.writes[out] == (c,) and eff.root[out] is c
    assert eff.root[view] is x and eff.reads[view] == ()


_fresh_lib = torch.library.Library("msched_test_fresh", "FRAGMENT")
_fresh_lib.define("make_and_write(Tensor x, Tensor(a!)[] writes) -> Tensor[]")


def test_registered_fresh_results_of_a_writing_op_are_storages_of_their_own() -> None:
    """Results of a multi-output op that writes are read as ``out=`` results (aliases of
    what it writes) unless the op is declared to return new storages."""
    op = torch.ops.msched_test_fresh.make_and_write.default
    g = Graph()
    x, dest = g.placeholder("x"), g.placeholder("dest")
    call = g.call_function(op, (x, [dest]))
    first = g.call_function(operator.getitem, (call, 0))
    second = g.call_function(operator.getitem, (call, 1))
    g.output((first, second))
    before = compute_effects(g)
    assert before.root[first] is before.root[second] and dest in before.aliases[before.root[first]]
    _targets.register_fresh_results(op)
    try:
        after = compute_effects(g)
    finally:
        _targets.REGISTERED_FRESH_RESULTS.discard(op)
        _targets.OP_INFO_CACHE.clear()
    assert (after.root[first], after.root[second]) == (first, second)
    assert after.writes[call] == (dest,)
    assert all(dest not in after.aliases.get(n, ()) for n in (call, first, second))


def test_register_fresh_results_takes_an_op_overload_only() -> None:
    from msched.analysis import _targets

    with pytest.raises(msched.InvalidArgumentError, match="needs an OpOverload, got"):
        _targets.register_fresh_results(torch.ops.msched_test_fresh.make_and_write)

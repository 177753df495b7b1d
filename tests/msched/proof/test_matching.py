"""`msched.proof.matching`: original and scheduled nodes paired by what they compute, and
`msched.verify` with ``original=`` built on it, whatever the nodes are called."""

from __future__ import annotations

import pytest
import torch
from torch.fx import GraphModule, Node

import msched
from msched.analysis.nodes import node_named
from msched.proof.interpreter import interpret
from msched.proof.matching import match_nodes

from ..faults import rename_every_node, swap_names
from ..scheduled import Scheduled, aten, two_streams, unscheduled

FC = torch.ops._c10d_functional


def pairs_by_name(
    original: GraphModule, gm: GraphModule, dialect: str | None = None
) -> dict[str, str]:
    match = match_nodes(original.graph, interpret(gm, dialect))
    assert not match.missing and not match.extras
    return {o.name: s.name for o, s in match.pairs.items()}


def test_a_renamed_schedule_pairs_every_node_with_what_it_computes() -> None:
    gm = two_streams()
    original = unscheduled(gm)
    computes = {n.name: (n.target, len(n.args)) for n in original.graph.nodes}
    rename_every_node(gm)
    paired = pairs_by_name(original, gm)
    assert set(paired) == set(computes) and all(s.startswith("renamed_") for s in paired.values())
    for o, s in paired.items():
        node = node_named(gm, s)
        assert (node.target, len(node.args)) == computes[o], (o, s)
    assert node_named(gm, paired["b"]).args[0] is node_named(gm, paired["a"])
    assert msched.verify(gm, original=original).ok


def begin_aux_stream_passthrough(x: torch.Tensor) -> torch.Tensor:
    return x  # AutoDeploy's helper (known by its name): switches streams, returns its input


def end_aux_stream_passthrough(x: torch.Tensor) -> torch.Tensor:
    return x


def test_a_stream_op_passing_a_value_on_stands_for_that_value() -> None:
    s = Scheduled()
    x = s.input("x")
    begun = s.graph.call_function(begin_aux_stream_passthrough, (x,))
    doubled = s.op("doubled", aten.add.Tensor, begun, begun)
    ended = s.graph.call_function(end_aux_stream_passthrough, (doubled,))
    gm = s.done(s.op("halved", aten.mul.Tensor, ended, 0.5))
    o = Scheduled()
    ox = o.input("x")
    original = o.done(o.op("half", aten.mul.Tensor, o.op("double", aten.add.Tensor, ox, ox), 0.5))
    assert pairs_by_name(original, gm, "autodeploy") == {
        "x": "x",
        "double": "doubled",
        "half": "halved",
        "output": "output",
    }


def equal_pair(order: tuple[str, str], names: tuple[str, str]) -> tuple[GraphModule, list[str]]:
    """Two equal transposes of ``w`` (``order``: which one each step issues), each read by
    its own product; ``names`` are the transposes' names in host order."""
    s = Scheduled()
    x, w = s.input("x"), s.input("w")
    made = {tag: s.op(name, aten.t.default, w) for tag, name in zip(order, names, strict=True)}
    left = s.op("left", aten.mm.default, x, made["first"])
    right = s.op("right", aten.mm.default, made["second"], x)
    return s.done((left, right)), [made["first"].name, made["second"].name]


def test_equal_nodes_in_another_order_pair_by_their_readers() -> None:
    original, _ = equal_pair(("first", "second"), ("t_first", "t_second"))
    gm, (first, second) = equal_pair(("second", "first"), ("t_first", "t_second"))
    # the scheduled `t_first` is read as the original `t_second` is: the names mean nothing
    assert pairs_by_name(original, gm)["t_first"] == first == "t_second"
    assert pairs_by_name(original, gm)["t_second"] == second == "t_first"
    assert msched.verify(gm, original=original).ok


def test_identical_writes_are_interchangeable() -> None:
    """Two copies of ``x`` into ``dest`` write the same thing: either may come first."""

    def build(names: tuple[str, str]) -> GraphModule:
        s = Scheduled()
        x, dest = s.input("x"), s.input("dest")
        for name in names:
            s.capture(name, dest, x)
        return s.done(x)

    report = msched.verify(build(("copy_b", "copy_a")), original=build(("copy_a", "copy_b")))
    assert report.ok, str(report)


def snapshots(before_write: str, after_write: str, swapped: bool) -> GraphModule:
    """``x`` cloned, then bumped in place, then cloned again; the clones are returned as
    (before, after) -- or, ``swapped``, in the other order."""
    s = Scheduled()
    x, w = s.input("x"), s.input("w")
    early = s.op(before_write, aten.clone.default, x)
    s.op("bump", aten.add_.Tensor, x, w)
    late = s.op(after_write, aten.clone.default, x)
    return s.done((late, early) if swapped else (early, late))


def test_equal_looking_reads_swapped_across_a_write_are_a_race() -> None:
    """The clone before the bump is what the original returns second: it stands for the
    original's later clone, which must read the bumped ``x`` (and the other one for the
    earlier clone, which must read it before the bump)."""
    original = snapshots("old", "new", swapped=False)
    gm = snapshots("new", "old", swapped=True)  # names follow the returned slots
    report = msched.verify(gm, original=original)
    assert [(v.kind, v.hazard, v.nodes) for v in report.violations] == [
        ("race", "war", ("old", "bump")),
        ("race", "raw", ("bump", "new")),
    ], str(report)


def test_a_node_reading_another_value_is_missing_and_extra_whatever_its_name() -> None:
    """Paired by name, ``scaled`` reading ``negated`` instead of ``rectified`` verified."""

    def build(source: str) -> GraphModule:
        s = Scheduled()
        x, w = s.input("x"), s.input("w")
        values = {"rectified": s.op("rectified", aten.relu.default, x)}
        values["negated"] = s.op("negated", aten.neg.default, x)
        return s.done(s.op("scaled", aten.mul.Tensor, values[source], w))

    report = msched.verify(build("negated"), original=build("rectified"))
    assert [(v.kind, v.nodes) for v in report.violations] == [
        ("missing-node", ("scaled",)),
        ("extra-node", ("scaled",)),
    ], str(report)
    assert "no node computes it from the same values" in report.violations[0].message


def test_returned_values_in_each_others_place_are_reported() -> None:
    def build(swapped: bool) -> GraphModule:
        s = Scheduled()
        x = s.input("x")
        up, down = s.op("up", aten.relu.default, x), s.op("down", aten.neg.default, x)
        return s.done((down, up) if swapped else (up, down))

    report = msched.verify(build(True), original=build(False))
    assert [(v.kind, v.nodes) for v in report.violations] == [
        ("missing-node", ("up", "down")),
        ("missing-node", ("down", "up")),
    ], str(report)
    assert "output returns `down` where the original returns `up`" in str(report)
    assert "return `up`, which computes it" in str(report)


def test_pairing_is_the_same_every_time() -> None:
    original, _ = equal_pair(("first", "second"), ("t1", "t2"))
    gm, _ = equal_pair(("second", "first"), ("t1", "t2"))
    runs = {tuple(sorted(pairs_by_name(original, gm).items())) for _ in range(3)}
    assert len(runs) == 1


def collectives_in_host_order(gm: GraphModule) -> list[Node]:
    return [n for n in gm.graph.nodes if n.target is FC.all_reduce.default]


def two_gathers() -> GraphModule:
    """Scores of two requests, each scaled and summed over the ``dp`` group: independent."""
    s = Scheduled()
    p, q, k = s.input("p"), s.input("q"), s.input("k")
    sp, sq = s.op("scaled_p", aten.mul.Tensor, p, k), s.op("scaled_q", aten.mul.Tensor, q, k)
    rp = s.op("sum_p", FC.all_reduce.default, sp, "sum", "dp")
    rq = s.op("sum_q", FC.all_reduce.default, sq, "sum", "dp")
    wp, wq = s.op("got_p", FC.wait_tensor.default, rp), s.op("got_q", FC.wait_tensor.default, rq)
    return s.done((wp, wq))


def test_collectives_swapped_with_their_names_are_out_of_order() -> None:
    original = two_gathers()
    gm = two_gathers()
    sum_p, sum_q = collectives_in_host_order(gm)
    sum_p.prepend(sum_q)
    swap_names(sum_p, sum_q)  # host order reads `sum_p, sum_q` again, by name
    gm.recompile()
    assert [n.name for n in collectives_in_host_order(gm)] == ["sum_p", "sum_q"]
    report = msched.verify(gm, original=original)
    assert [(v.kind, v.nodes) for v in report.violations] == [
        ("collective-order", ("sum_q", "sum_p"))
    ], str(report)
    assert "`sum_p` (all_reduce, group dp) is issued before `sum_q`" in str(report)


def test_an_op_overload_is_the_same_op_as_its_packet() -> None:
    """Dynamo writes ``aten.relu``, AOT autograd ``aten.relu.default``: one computation."""

    def build(target: object) -> GraphModule:
        s = Scheduled()
        return s.done(s.op("r", target, s.input("x")))

    assert msched.verify(build(aten.relu.default), original=build(aten.relu)).ok
    assert not msched.verify(build(aten.neg.default), original=build(aten.relu)).ok


def test_a_node_reading_a_stream_op_is_not_paired_by_what_else_it_reads() -> None:
    """Only a value reported on its own (an extra node, a node of another graph) may stand in
    for an input when a node is paired despite reading it."""
    s = Scheduled()
    s.input("x")
    switch = s.stream(0)
    gm = s.done(s.op("r", aten.relu.default, switch))
    o = Scheduled()
    original = o.done(o.op("r", aten.relu.default, o.input("x")))
    report = msched.verify(gm, original=original)
    assert [(v.kind, v.nodes) for v in report.violations] == [
        ("missing-node", ("r",)),
        ("extra-node", ("r",)),
    ], str(report)


def _views_read_by_projections(swap: bool) -> GraphModule:
    """``h = relu(x)``; two equal views of it, read by the q and k projections, each read
    alike further down (as a traced Llama reads its hidden state); ``swap`` emits the
    second view first."""
    g = torch.fx.Graph()
    x, wq, wk = (g.placeholder(n) for n in ("x", "wq", "wk"))
    h = g.call_function(aten.relu.default, (x,))
    views = [g.call_function(aten.view.default, (h, [4, 4])) for _ in range(2)]
    q, k = (
        g.call_function(aten.mm.default, (view, w)) for view, w in zip(views, (wq, wk), strict=True)
    )
    rq, rk = (g.call_function(aten.relu.default, (p,)) for p in (q, k))
    g.output((g.call_function(aten.add.Tensor, (rq, rk)),))
    if swap:  # the scheduler emits the second view first
        h.append(views[1])
    return GraphModule(torch.nn.Module(), g)


def test_equal_values_paired_crosswise_leave_their_readers_paired() -> None:
    """A tiny transformers Llama's pieces failed verification with 13 missing and extra
    projections: its q and k projections each read one of several equal views, the view a
    scheduled projection read was paired with another of them, and the projection's own
    key then found no original."""
    original = _views_read_by_projections(swap=False)
    gm = _views_read_by_projections(swap=True)
    assert [n.name for n in gm.graph.nodes][4:6] == ["view_default_1", "view_default"]
    report = msched.verify(gm, original=original)
    assert report.ok, report
    match = match_nodes(original.graph, interpret(gm))
    assert not match.missing and not match.extras


def _equal_constants_per_layer(side_first: bool) -> GraphModule:
    """Two layers, each masking ``x`` with a constant of its own (equal constants, equal
    masks, as a transformers Qwen3 piece makes one ``scalar_tensor(-inf)`` per layer) read
    with the layer's own weight; ``side_first`` runs layer 1 on stream 1 ahead of layer 0."""
    s = Scheduled()
    x, mask = s.input("x"), s.input("mask")
    weights = [s.input("w0"), s.input("w1")]
    layers: dict[int, Node] = {}

    def layer(i: int) -> None:
        low = s.op(f"low_{i}", aten.scalar_tensor.default, float("-inf"))
        masked = s.op(f"masked_{i}", aten.where.self, mask, x, low)
        layers[i] = s.op(f"attend_{i}", aten.mul.Tensor, masked, weights[i])

    if side_first:
        s.stream(0)
        s.record(0)
        s.stream(1)
        s.wait(0)
        layer(1)
        s.record(1)
        s.stream(0)
        layer(0)
        s.wait(1)
    else:
        layer(0)
        layer(1)
    return s.done(s.op("total", aten.add.Tensor, layers[0], layers[1]))


def test_equal_constants_of_two_layers_pair_within_their_layer() -> None:
    """The real failure: a 3-stream schedule of a tiny Qwen3 failed its own verification
    with four false races, since layer 2's ``scalar_tensor`` came first in host order and
    was paired with layer 0's (equal nodes read alike two levels down), which paired the
    masks and attentions across layers.  Equal nodes keep their own names' pairs."""
    original = _equal_constants_per_layer(side_first=False)
    gm = _equal_constants_per_layer(side_first=True)
    report = msched.verify(gm, original=original)
    assert report.ok, report
    assert all(o == s for o, s in pairs_by_name(original, gm).items())


def test_equal_constants_of_two_layers_renamed_pair_within_their_layer() -> None:
    """The same with every node renamed, as a pass may: names cannot choose, and pairing
    the constants in host order paired layer 1's with layer 0's -- two false races.  The
    weight each layer's attention reads, two readers down, tells them apart."""
    original = _equal_constants_per_layer(side_first=False)
    gm = _equal_constants_per_layer(side_first=True)
    layer_of = {n: n.name for n in gm.graph.nodes}
    rename_every_node(gm)
    report = msched.verify(gm, original=original)
    assert report.ok, report
    assert all(o == layer_of[node_named(gm, s)] for o, s in pairs_by_name(original, gm).items())


def _filled_buffers(*, b_first: bool, swapped: bool, computed: bool = False) -> GraphModule:
    """Two empty buffers filled from ``a`` and ``b`` and all-reduced in place, as an engine
    that preallocates its communication buffers writes it; ``b_first`` allocates ``b``'s
    buffer first (harmless), ``swapped`` reduces ``b``'s buffer first and returns the results
    in each other's place (wrong twice: another issue order, other outputs).  ``computed``
    fills them with ``a @ w`` and ``b @ w``, computed after both buffers are allocated."""
    s = Scheduled()
    a, b, w = s.input("a"), s.input("b"), s.input("w")
    empty = aten.empty.memory_format
    if b_first:
        eb, ea = s.op("buf_b", empty, [4, 4]), s.op("buf_a", empty, [4, 4])
    else:
        ea, eb = s.op("buf_a", empty, [4, 4]), s.op("buf_b", empty, [4, 4])
    if computed:
        a, b = s.op("proj_a", aten.mm.default, a, w), s.op("proj_b", aten.mm.default, b, w)
    s.op("fill_a", aten.copy_.default, ea, a)
    s.op("fill_b", aten.copy_.default, eb, b)
    order = [("sum_b", eb), ("sum_a", ea)] if swapped else [("sum_a", ea), ("sum_b", eb)]
    sums = {n: s.op(n, FC.all_reduce_.default, e, "sum", "tp") for n, e in order}
    got_a = s.op("got_a", FC.wait_tensor.default, sums["sum_a"])
    got_b = s.op("got_b", FC.wait_tensor.default, sums["sum_b"])
    return s.done((got_b, got_a) if swapped else (got_a, got_b))


@pytest.mark.parametrize("computed", [False, True])
def test_empty_buffers_pair_by_what_fills_them(computed: bool) -> None:
    """Two ``empty`` nodes are equal until written: paired by host order (or by name), the
    buffer filled from ``b`` stood for the original one filled from ``a``.  A correct graph
    that only allocates in another order then failed (a false collective-order and false
    wrong returns), and the graph that swaps both the issue order and the returns verified.
    With ``computed`` the values that tell the buffers apart are made after both buffers."""
    original = _filled_buffers(b_first=False, swapped=False, computed=computed)
    moved = _filled_buffers(b_first=True, swapped=False, computed=computed)
    rename_every_node(moved)
    report = msched.verify(moved, original=original)
    assert report.ok, report
    wrong = _filled_buffers(b_first=True, swapped=True, computed=computed)
    rename_every_node(wrong)
    report = msched.verify(wrong, original=original)
    assert "collective-order" in [v.kind for v in report.violations], report
    assert "missing-node" in [v.kind for v in report.violations], report


def test_empty_buffers_named_crosswise_pair_by_what_fills_them() -> None:
    """The same by names: each buffer named as the other, both equal and written by
    nothing themselves, so names chose between them."""
    original = _filled_buffers(b_first=False, swapped=False)
    for swapped in (False, True):
        gm = _filled_buffers(b_first=False, swapped=swapped)
        swap_names(node_named(gm, "buf_a"), node_named(gm, "buf_b"))
        gm.recompile()
        report = msched.verify(gm, original=original)
        assert report.ok is not swapped, report

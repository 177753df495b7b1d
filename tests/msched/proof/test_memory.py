"""`msched.peak_memory` on hand-built programs whose figures are worked out by hand.

Most tensors here are 16 MiB (``BIG``: 2048 x 2048 float32): a block of 10 MiB or more gets a
segment of its own rounded to 2 MiB, so a 16 MiB block holds exactly 16 MiB of segments and
the pools' figures read as counts of blocks.  Under the default cost model every ``neg`` and
``add`` here costs 1.
"""

from __future__ import annotations

import operator
from typing import Any

import pytest
import torch
from torch.fx import GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx

import msched
from msched.proof.dialects import Dialect
from msched.proof.memory import MIB, block_bytes, peak_memory, segment_bytes

from ..scheduled import Scheduled, aten, define_stream_ops

FC = torch.ops._c10d_functional
ENGINE = "msched_test_memory"  # another engine's four stream ops
_lib = define_stream_ops(ENGINE)
BIG = (2048, 2048)  # 16 MiB of float32


def sized(node: Node, *shape: int, dtype: torch.dtype = torch.float32) -> Node:
    node.meta["val"] = torch.empty(*shape, dtype=dtype, device="meta")
    return node


def big(s: Scheduled, name: str, target: Any, *args: Any) -> Node:
    return sized(s.op(name, target, *args), *BIG)


def figures(gm: GraphModule) -> tuple[int, int, int]:
    report = peak_memory(gm)
    return report.allocated // MIB, report.reserved // MIB, report.reserved_bound // MIB


def two_branches() -> GraphModule:
    """``a`` and ``d = -a`` on stream 0 beside ``b`` and ``c = -b`` on stream 1, joined by
    ``out = d + c`` on stream 0."""
    s = Scheduled()
    x = sized(s.input("x"), *BIG)
    s.record(0)
    a = big(s, "a", aten.neg.default, x)
    s.stream(1)
    s.wait(0)
    b = big(s, "b", aten.neg.default, x)
    c = big(s, "c", aten.neg.default, b)
    s.record(1)
    s.stream(0)
    d = big(s, "d", aten.neg.default, a)
    s.wait(1)
    return s.done(big(s, "out", aten.add.Tensor, d, c))


def test_two_branches_on_two_streams_hold_two_pools() -> None:
    # Host order a, b, c, d, out.  Live: a 16; b 32; c 48, then b is freed: 32; d 48, then
    # a: 32; out 48, then c and d: 16 (out is returned).  Peak 48 MiB.
    # Stream 0's pool holds a + d = 32, then d + out = 32 (a went back at its free); stream
    # 1's holds b + c = 32.  Nothing is recorded on another stream: the bound is the same.
    report = peak_memory(two_branches())
    assert figures(two_branches()) == (48, 64, 64)
    assert report.per_stream == {0: 32 * MIB, 1: 32 * MIB} == report.per_stream_bound
    assert report.baseline == 16 * MIB  # x, apart from the three figures
    assert [(p.node, p.allocated // MIB) for p in report.curve] == [
        ("a", 16), ("b", 32), ("c", 48), ("d", 48), ("out", 48),
    ]  # fmt: skip


def cross_stream(record: bool, dialect: Dialect | None = None) -> GraphModule:
    """``a`` made on stream 0 and last read by ``b`` on stream 1.

    ``record``: ``record_stream(a, 1)``, ``a`` freed after ``b`` (host order), then ``c``,
    ``d = -c`` and ``out = b + d`` on stream 0.  Otherwise stream 0 keeps ``a`` alive until
    it has waited for ``b`` (``c = a + b``), then ``out = -c``.  ``dialect``: the stream ops
    of another engine.
    """
    s = Scheduled(dialect)
    x = sized(s.input("x"), *BIG)
    s.record(0)
    a = big(s, "a", aten.neg.default, x)
    s.record(1)
    s.stream(1)
    s.wait(1)
    if record:
        s.keep(a, 1)
    b = big(s, "b", aten.neg.default, a)
    s.record(2)
    s.stream(0)
    if record:
        c = big(s, "c", aten.neg.default, x)
        d = big(s, "d", aten.neg.default, c)
        s.wait(2)
        return s.done(big(s, "out", aten.add.Tensor, b, d))
    s.wait(2)
    c = big(s, "c", aten.add.Tensor, a, b)
    return s.done(big(s, "out", aten.neg.default, c))


def test_a_block_recorded_on_another_stream_returns_when_that_use_has_ended() -> None:
    # Times: a [0, 1] on stream 0, b [1, 2] on stream 1; c [1, 2], d [2, 3], out [3, 4] on
    # stream 0.  Live: a 16; b 32, then a (last read by b): 16; c 32; d 48, then c: 32; out
    # 48.  Stream 0's pool: at c (t=1) b still reads a (until t=2): a + c = 32; at d (t=2) a
    # is back and d takes it: c + d = 32; out: d + out = 32.  Stream 1: b = 16.  Reserved
    # 48.  Under any timing a never comes back during the graph: a + c + d = 48 on stream 0.
    report = peak_memory(cross_stream(record=True))
    assert figures(cross_stream(record=True)) == (48, 48, 64)
    assert report.per_stream == {0: 32 * MIB, 1: 16 * MIB}
    assert report.per_stream_bound == {0: 48 * MIB, 1: 16 * MIB}


def test_another_engines_stream_ops_give_the_same_figures() -> None:
    gm = cross_stream(record=True, dialect=Dialect.from_namespace(ENGINE))
    assert peak_memory(gm, dialect=ENGINE).per_stream_bound == {0: 48 * MIB, 1: 16 * MIB}
    assert figures(gm) == (48, 48, 64)  # the dialect detected from the ops


SIDE = torch.Stream(device="cpu")


def side_branch(x: torch.Tensor) -> torch.Tensor:
    """PyTorch's own stream code: ``y = relu(x) * 2`` on a side stream, ``y + 1`` on the
    caller's after it has waited for the side stream."""
    caller = torch.accelerator.current_stream()
    SIDE.wait_stream(caller)
    with SIDE:
        y = x.relu() * 2
    caller.wait_stream(SIDE)
    return y + 1


@pytest.mark.parametrize("stage", ["dynamo", "aot"])
def test_pytorchs_own_streams_are_read_as_traced(stage: str) -> None:
    # relu 16 on the side stream; y 32, then relu is freed: 16; y + 1 on the caller's 32.
    # The side pool holds relu + y = 32, the caller's y + 1 = 16; nothing is recorded.
    gm = msched.trace_streams(side_branch, torch.zeros(BIG), stage=stage)
    report = peak_memory(gm)
    assert figures(gm) == (32, 48, 48)
    assert sorted(report.per_stream.values()) == [16 * MIB, 32 * MIB]


def test_a_recorded_block_the_device_still_uses_stays_out_of_its_pool() -> None:
    class SlowB(msched.DefaultCostModel):
        def cost(self, node: Node) -> float:
            return 5.0 if node.name == "b" else super().cost(node)

    # b runs [1, 6]: at d (t=2) a is not back: a + c + d = 48 on stream 0, as the bound says;
    # out waits for b (t=6), a is back then: d + out = 32.
    report = peak_memory(cross_stream(record=True), cost_model=SlowB())
    assert (report.reserved, report.reserved_bound) == (64 * MIB, 64 * MIB)


def test_a_block_kept_alive_until_the_join_is_reusable_at_once() -> None:
    # Live: a 16; b 32; c 48, then a and b are freed: 16; out 32.  Stream 0 holds a + c = 32,
    # a returns at its free (on its own stream, after the wait for b: no record_stream), so
    # out reuses it: c + out = 32, whatever the timing.  Stream 1: b = 16.
    assert figures(cross_stream(record=False)) == (48, 48, 48)


def test_an_all_to_all_holds_its_input_until_its_wait() -> None:
    # a 16; the all-to-all's result 32; b (unused, freed at once) 48: a is still held, as the
    # wait reads it; after the wait a is freed; c = -wait: t + c = 32.  Peak 48, not 32.
    s = Scheduled()
    x = sized(s.input("x"), *BIG)
    a = big(s, "a", aten.neg.default, x)
    t = big(s, "a2a", FC.all_to_all_single.default, a, [1024, 1024], [1024, 1024], "0")
    big(s, "b", aten.neg.default, x)
    w = big(s, "w", FC.wait_tensor.default, t)
    gm = s.done(big(s, "c", aten.neg.default, w))
    report = peak_memory(gm)
    assert report.allocated == 48 * MIB
    assert [(p.node, p.allocated // MIB) for p in report.curve] == [
        ("a", 16), ("a2a", 32), ("b", 48), ("w", 32), ("c", 32),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("nbytes", "block", "segment"),
    [
        (1, 512, 2 * MIB),
        (512, 512, 2 * MIB),
        (513, 1024, 2 * MIB),
        (MIB, MIB, 2 * MIB),  # the largest small request
        (MIB + 1, MIB + 512, 20 * MIB),  # large: from a 20 MiB segment
        (10 * MIB - 512, 10 * MIB - 512, 20 * MIB),
        (10 * MIB, 10 * MIB, 10 * MIB),  # kMinLargeAlloc: a segment of its own
        (10 * MIB + 1, 10 * MIB + 512, 12 * MIB),  # rounded up to 2 MiB
    ],
)
def test_size_classes_at_their_edges(nbytes: int, block: int, segment: int) -> None:
    assert (block_bytes(nbytes), segment_bytes(block_bytes(nbytes))) == (block, segment)
    s = Scheduled()
    x = sized(s.input("x"), nbytes, dtype=torch.uint8)
    report = peak_memory(s.done(sized(s.op("y", aten.neg.default, x), nbytes, dtype=torch.uint8)))
    assert (report.allocated, report.reserved, report.reserved_bound) == (block, segment, segment)
    assert report.baseline == block


def test_small_blocks_share_segments_and_large_ones_share_twenty_mib() -> None:
    # Five live 512 KiB blocks: 2.5 MiB of small blocks, two 2 MiB segments.  Three live
    # 8 MiB blocks: 24 MiB of 1-10 MiB blocks, two 20 MiB segments.
    for shape, count, reserved in (((512 * 1024,), 5, 4 * MIB), ((8 * MIB,), 3, 40 * MIB)):
        s = Scheduled()
        x = sized(s.input("x"), *shape, dtype=torch.uint8)
        ys = [sized(s.op(f"y{i}", aten.neg.default, x), *shape, dtype=torch.uint8)
              for i in range(count)]  # fmt: skip
        report = peak_memory(s.done(tuple(ys)))
        assert report.allocated == count * shape[0]
        assert report.reserved == report.reserved_bound == reserved


def test_views_getitems_and_in_place_ops_allocate_nothing() -> None:
    # a 16 MiB; its view, its in-place add, its split and the split's getitems are a's
    # storage.  topk allocates both of its results (values and indices, 64 KiB each).
    s = Scheduled()
    x = sized(s.input("x"), *BIG)
    a = big(s, "a", aten.neg.default, x)
    v = big(s, "v", aten.view.default, a, [-1])
    s.op("add_", aten.add_.Tensor, v, 1.0)
    parts = s.op("parts", aten.split.Tensor, a, 1024)
    parts.meta["val"] = [torch.empty(1024, 2048, device="meta")] * 2
    first = sized(s.op("first", operator.getitem, parts, 0), 1024, 2048)
    top = s.op("top", aten.topk.default, a, 8)
    top.meta["val"] = (torch.empty(2048, 8, device="meta"),) * 2
    values = sized(s.op("values", operator.getitem, top, 0), 2048, 8)
    report = peak_memory(s.done((first, values)))
    assert report.allocated == 16 * MIB + 2 * 2048 * 8 * 4
    assert [p.allocated for p in report.curve][:4] == [16 * MIB] * 4


def test_outputs_live_to_the_end_and_inputs_are_the_baseline() -> None:
    # a is returned: it stays; b and c follow (b freed after c): a + b + c = 48 at c.
    # Returning c instead: a is freed after b, so the peak is 32.  The weight w (a
    # get_attr buffer) and x are the baseline.
    def program(keep_a: bool) -> GraphModule:
        s = Scheduled()
        x = sized(s.input("x"), *BIG)
        w = s.graph.get_attr("w")
        a = big(s, "a", aten.neg.default, x)
        b = big(s, "b", aten.mul.Tensor, a, w)
        c = big(s, "c", aten.neg.default, b)
        s.graph.output((a, c) if keep_a else c)
        root = torch.nn.Module()
        root.register_buffer("w", torch.zeros(1024))
        return GraphModule(root, s.graph)

    kept, dropped = peak_memory(program(True)), peak_memory(program(False))
    assert (kept.allocated, dropped.allocated) == (48 * MIB, 32 * MIB)
    assert kept.baseline == 16 * MIB + 4096


def test_without_sizes_it_says_what_to_pass() -> None:
    s = Scheduled()
    x = s.input("x")
    gm = s.done(s.op("y", aten.neg.default, x))
    with pytest.raises(msched.InvalidArgumentError, match=r"2 nodes \(x, y\).*example_inputs"):
        msched.peak_memory(gm)
    report = msched.peak_memory(gm, example_inputs=(torch.zeros(BIG),))
    assert (report.allocated, report.baseline) == (16 * MIB, 16 * MIB)


def test_symbolic_sizes_at_the_hints_or_at_the_sizes_given() -> None:
    # relu(x) (1 MiB at the hints 256 x 1024 float32), then relu + 1: 2 MiB live at once.
    gm = make_fx(lambda x: torch.relu(x) + 1, tracing_mode="symbolic")(torch.zeros(256, 1024))
    rows, cols = (str(d) for d in next(iter(gm.graph.nodes)).meta["val"].shape)
    hinted = peak_memory(gm)
    assert hinted.allocated == 2 * MIB
    assert (hinted.sizes, hinted.hinted) == ({rows: 256, cols: 1024}, tuple(sorted((rows, cols))))
    assert str(hinted).endswith("(hints)")
    given = peak_memory(gm, sizes={rows: 4096})  # an engine's largest batch
    assert given.allocated == 2 * 4096 * 1024 * 4
    assert (given.sizes, given.hinted) == ({rows: 4096, cols: 1024}, (cols,))
    with pytest.raises(msched.InvalidArgumentError, match="sizes names s_nope"):
        peak_memory(gm, sizes={"s_nope": 1})


def test_peak_memory_is_exported() -> None:
    assert {"peak_memory", "MemoryReport"} <= set(msched.__all__)
    assert msched.peak_memory is peak_memory


def test_an_exported_modules_guards_need_no_size() -> None:
    # `ExportedProgram.module()` calls `_guards_fn` without a fake value: it returns None,
    # and the module's symbolic batch stays symbolic (no example_inputs needed).
    class AddRelu(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x + 1).relu()

    x = torch.randn(256, 1024)  # 1 MiB
    batch = torch.export.Dim("batch", max=4096)
    gm = torch.export.export(AddRelu(), (x,), dynamic_shapes=({0: batch},)).module()
    assert any(n.target == "_guards_fn" for n in gm.graph.nodes)
    report = peak_memory(gm)
    assert (report.allocated, report.baseline) == (2 * MIB, MIB)
    (symbol,) = report.hinted
    assert peak_memory(gm, sizes={symbol: 4096}).allocated == 32 * MIB


def test_example_inputs_of_another_size_than_the_traced_one_are_measured() -> None:
    # An engine traces at a small batch and budgets at its largest: the inputs given win
    # over the traced sizes when they differ (and the traced ones serve when they agree).
    gm = make_fx(lambda x: (x + 1) * 2, tracing_mode="fake")(torch.randn(8, 1024))
    assert peak_memory(gm).allocated == 64 * 1024
    assert peak_memory(gm, example_inputs=(torch.randn(8, 1024),)).allocated == 64 * 1024
    assert peak_memory(gm, example_inputs=(torch.randn(4096, 1024),)).allocated == 32 * MIB


def test_sizes_where_the_graph_cannot_run_are_an_error_not_a_zero_division() -> None:
    gm = make_fx(lambda x: x.view(-1, 2) * 2, tracing_mode="symbolic")(torch.randn(8, 1024))
    hints = peak_memory(gm).sizes
    batch = next(name for name, value in hints.items() if value == 8)
    with pytest.raises(msched.InvalidArgumentError, match=f"no value at .*{batch}=0"):
        peak_memory(gm, sizes={**hints, batch: 0})


def test_symbolic_example_inputs_are_not_specialized_by_the_comparison() -> None:
    # Comparing a traced size with the caller's symbolic one would add the guard s == 8 to
    # the caller's shape environment, making their batch static.
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    gm = make_fx(lambda x: (x + 1) * 2, tracing_mode="fake")(torch.randn(8, 1024))
    env = ShapeEnv()
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    x = FakeTensorMode(shape_env=env).from_tensor(torch.randn(8, 1024), symbolic_context=dynamic)
    assert peak_memory(gm, example_inputs=(x,)).allocated == 64 * 1024
    assert not env.guards
    assert type(x.shape[0]) is not int

"""A tensor read on another stream, kept alive until its own stream has waited for that read,
instead of ``record_stream``: `msched.verify` accepts it, `msched.execute` runs it right,
`msched.peak_memory` counts it, and the same program freed too early is caught by both.

Tensors are 16 MiB (``BIG``, as in ``test_memory.py``): a block of 10 MiB or more gets a
segment of its own, so the pools' figures read as counts of blocks.  Each ``neg`` and ``add``
costs 1 under the default cost model.
"""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

import msched
from msched.proof.memory import MIB, peak_memory

from ..scheduled import Scheduled, aten

BIG = (2048, 2048)  # 16 MiB of float32


def big(node: Node) -> Node:
    node.meta["val"] = torch.empty(*BIG, device="meta")
    return node


def made_on_0_read_on_1(form: str) -> GraphModule:
    """``a = -x`` on stream 0, last read by ``b = -a`` on stream 1; stream 0 runs ``c = -x``,
    waits for ``b``, runs ``d = -c`` and ``out = b + d``.

    ``form``: ``"keep"``, ``record_stream(a, 0)`` after the wait (``a`` is freed there, on
    its own stream, after stream 0 has waited for ``b``); ``"record"``, ``record_stream(a,
    1)`` before ``b``; ``"early"``, neither: ``a`` is freed after ``b`` in host order, and
    ``c`` may take its block while ``b`` still reads it.
    """
    s = Scheduled()
    x = big(s.input("x"))
    s.record(0)
    a = big(s.op("a", aten.neg.default, x))
    s.record(1)
    s.stream(1)
    s.wait(1)
    if form == "record":
        s.keep(a, 1)
    b = big(s.op("b", aten.neg.default, a))
    s.record(2)
    s.stream(0)
    c = big(s.op("c", aten.neg.default, x))
    s.wait(2)
    if form == "keep":
        s.keep(a, 0)
    d = big(s.op("d", aten.neg.default, c))
    return s.done(big(s.op("out", aten.add.Tensor, b, d)))


def figures(gm: GraphModule) -> tuple[int, int, int]:
    report = peak_memory(gm)
    return report.allocated // MIB, report.reserved // MIB, report.reserved_bound // MIB


def rules(gm: GraphModule) -> list[str]:
    return [v.kind for v in msched.verify(gm).violations]


def test_kept_alive_until_the_join_verifies_and_a_missing_one_is_reported() -> None:
    assert rules(made_on_0_read_on_1("keep")) == []
    assert rules(made_on_0_read_on_1("record")) == []
    assert rules(made_on_0_read_on_1("early")) == ["missing-record-stream"]


def test_a_keep_alive_before_the_wait_is_no_keep_alive() -> None:
    # record_stream(a, 0) before c: a is freed there, and c may take its block before b ends.
    gm = made_on_0_read_on_1("keep")
    keep = next(n for n in gm.graph.nodes if n.target is msched.ops.record_stream)
    c = next(n for n in gm.graph.nodes if n.name == "c")
    c.prepend(keep)
    gm.recompile()
    assert rules(gm) == ["missing-record-stream"]


def test_kept_alive_the_block_returns_at_the_join_recorded_it_never_does() -> None:
    # Host order a, b, c, (wait), keep, d, out.  Keep: live a 16; b 32; c 48; a is freed at
    # the keep (after the wait), d takes its block: b + c + d = 48, then c: 32; out 48.
    # Stream 0 holds a + c = 32, then c + d = 32 (a's block), then d + out = 32; stream 1
    # b = 16: reserved 48 under any timing.
    # Record: a is freed after b (host order) but recorded on stream 1: under any timing it
    # never returns, stream 0 holds a + c + d = 48 (then a + d + out): bound 64.  Simulated,
    # b has ended (t=2) when d starts (t=2): a is back, 48.
    assert figures(made_on_0_read_on_1("keep")) == (48, 48, 48)
    assert figures(made_on_0_read_on_1("record")) == (48, 48, 64)
    keep = peak_memory(made_on_0_read_on_1("keep"))
    assert keep.per_stream_bound == {0: 32 * MIB, 1: 16 * MIB}


def test_the_executor_runs_a_keep_alive_right_and_catches_an_early_free() -> None:
    x = torch.randn(4, 4)
    want = made_on_0_read_on_1("record")(x)
    for form in ("keep", "record"):
        run = msched.execute(made_on_0_read_on_1(form), x, order="search")
        assert run.differs is False, form
        torch.testing.assert_close(run.output, want)
    # Stream 0 first (late-aux): c takes a's block before b reads it, b reads garbage.
    early = msched.execute(made_on_0_read_on_1("early"), x)
    assert early.output.isnan().all()
    assert msched.execute(made_on_0_read_on_1("early"), x, order="search").differs is True

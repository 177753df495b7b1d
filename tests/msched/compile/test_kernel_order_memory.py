"""The memory of Inductor's kernel order (issue 42, part 5): `msched.peak_memory` of a piece's
``kernel_order`` reads the buffers' layouts Inductor had when msched recorded the order, and
a reused buffer (written into an old buffer's memory) allocates nothing.

The first tests build `FinalOrder`s by hand; the last compiles TinyDecoder with
``msched.backend(num_streams=2, compiler="inductor")`` (one compile, marked slow like the
other Inductor builds of this size).
"""

from __future__ import annotations

import pytest
import torch

import msched
from msched.compile._inductor_buffers import BufferLayout
from msched.compile._inductor_internals import FinalOrder, ScheduledNode
from msched.compile.kernel_order import kernel_order_program
from msched.compile.order_records import _decoded, _encoded
from msched.models.decoders import TinyDecoder
from msched.proof.memory import MIB, sized_memory

KIB = 1024


def kernel(name: str, outputs: list[str], reads: list[str]) -> ScheduledNode:
    return ScheduledNode(name, "kernel", None, tuple(outputs), tuple(reads), (), ())


def floats(nbytes: int) -> BufferLayout:
    return BufferLayout((nbytes // 4,), (1,), torch.float32)


LAYOUTS = (
    ("x", floats(4 * KIB)),
    ("buf0", floats(MIB)),
    ("buf1", floats(4 * KIB)),
    ("buf2", floats(512 * KIB)),
)
# k0 makes buf0 from x, k1 buf1 from buf0 (buf0's last read), k2 buf2 from buf1.
NODES = (
    kernel("k0", ["buf0"], ["x"]),
    kernel("k1", ["buf1"], ["buf0"]),
    kernel("k2", ["buf2"], ["buf1"]),
)


def _memory(reuses: tuple[tuple[str, str], ...], layouts=LAYOUTS) -> msched.MemoryReport:
    order = FinalOrder(NODES, ("x",), ("buf2",), reuses, layouts=layouts)
    return msched.peak_memory(kernel_order_program(order))


def _after(report: msched.MemoryReport, node: str) -> int:
    return next(p.allocated for p in report.curve if p.node == node)


def test_a_reused_buffer_allocates_nothing() -> None:
    fresh = _memory(())
    assert _after(fresh, "k2") == 4 * KIB + 512 * KIB  # buf0 freed after k1: buf1 and buf2
    reused = _memory((("buf0", "buf2"),))  # buf2 written into buf0's memory
    assert _after(reused, "k2") == _after(reused, "k1") == MIB + 4 * KIB  # nothing new at k2
    assert reused.allocated == fresh.allocated == MIB + 4 * KIB
    assert fresh.baseline == reused.baseline == 4 * KIB
    for report in (fresh, reused):
        assert report.allocated <= report.reserved <= report.reserved_bound


def test_an_order_without_layouts_has_no_memory_to_show() -> None:
    order = FinalOrder(NODES, ("x",), ("buf2",))
    assert sized_memory(kernel_order_program(order)) is None
    partial = tuple(entry for entry in LAYOUTS if entry[0] != "buf1")
    assert (
        sized_memory(kernel_order_program(FinalOrder(NODES, ("x",), ("buf2",), layouts=partial)))
        is None
    )


def test_a_kept_order_keeps_its_layouts() -> None:
    order = FinalOrder(NODES, ("x",), ("buf2",), (("buf0", "buf2"),), code="x", layouts=LAYOUTS)
    assert _decoded(_encoded(order), "x").layouts == LAYOUTS
    before = {k: v for k, v in _encoded(order).items() if k != "layouts"}  # a record of before
    assert _decoded(before, "x").layouts == ()


@pytest.mark.slow
def test_each_piece_of_an_inductor_build_has_its_memory(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    model = TinyDecoder(2, 16, (1,), moe=True)
    x, cap = model.example_inputs(4)
    backend = msched.backend(num_streams=2, compiler="inductor")
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=backend)(x, cap)
    assert backend.pieces
    for piece in backend.pieces:
        assert piece.kernel_order is not None
        report = msched.peak_memory(piece.kernel_order)
        assert 0 < report.allocated <= report.reserved <= report.reserved_bound
        assert report.baseline >= x.nbytes + cap.nbytes
        assert set(report.per_stream) <= {0, 1} and 0 in report.per_stream

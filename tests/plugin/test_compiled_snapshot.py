"""The reviewed snapshot of an Inductor-compiled piece: TinyDecoder's final kernel order.

``assert piece == graph_snapshot`` stores the piece's ``kernel_order`` (Inductor's kernels and
msched's stream ops, in the order the output code runs them, on their lanes) in the msched
text format, like the snapshot of an FX schedule.  Inductor fuses differently from one torch
release to the next (2.14 fuses two kernels 2.13 runs apart, and numbers its nodes and
buffers after them), so renaming cannot make one text fit both: each tested torch has its own
snapshot (``[torch2.13]``, ``[torch2.14]``, ``[torch2.15]``), and the others are skipped,
which keeps their file.  Within one torch the text is the same on every run, compiled or
served from the cache, first in its process or after other compiles.
"""

from __future__ import annotations

import pytest
import torch

import msched
from msched.models.decoders import TinyDecoder
from pytest_msched import ScheduledGraphExtension

RUNNING = ".".join(torch.__version__.split(".")[:2])
SNAPSHOTTED = ("2.13", "2.14", "2.15")  # the tested torch releases (docs/versions.md)


@pytest.fixture(autouse=True)
def fresh_inductor_cache(tmp_path, monkeypatch):
    """A cold compile (msched's pass runs), then a hit in the same folder."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))


def _compiled_piece():
    model = TinyDecoder(2, 16, (1,), moe=True)
    x, cap = model.example_inputs(4)
    b = msched.backend(num_streams=2, compiler="inductor")
    torch._dynamo.reset()
    with torch.no_grad():
        torch.compile(model, backend=b)(x, cap)
    [piece] = b.pieces
    assert piece.report is not None and piece.report.ok
    return piece


@pytest.mark.slow
@pytest.mark.parametrize("release", SNAPSHOTTED, ids=[f"torch{v}" for v in SNAPSHOTTED])
def test_tiny_decoder_kernel_order(release, graph_snapshot, tmp_path, monkeypatch) -> None:
    """A second cold compile in the same process gave another text: Inductor fused another
    of two nodes into a kernel's tail, and the kernel was named after all its nodes."""
    if release != RUNNING:
        pytest.skip(f"the snapshot of torch {release}; this is torch {RUNNING}")
    compiled = _compiled_piece()
    served = _compiled_piece()  # Inductor's cache: the order kept when it was compiled
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "another-cache"))
    again = _compiled_piece()  # cold, after the compile above in this process
    assert compiled.schedule is not None and served.schedule is None
    assert again.schedule is not None
    text = ScheduledGraphExtension().serialize
    assert text(served) == text(compiled)
    assert text(again) == text(compiled)
    assert compiled == graph_snapshot

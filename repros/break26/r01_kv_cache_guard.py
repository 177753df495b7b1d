"""break26 r01 (severity: false positive / refused correct model; fixed in 7e7417b).

A 1-layer GQA decoder (static KV cache written with ``index_copy_``) compiled with
``msched.backend(num_streams=2, compiler="inductor")`` under ``torch.no_grad()``.

Observed (before the fix): ``PieceVerificationError: [missing-record-stream] `buf57` is
allocated on stream 1 and used by `op85` on stream 0 without record_stream``.  msched put the
functional ``index_put`` of the k cache (buf57 = clone, buf58 = the in-place scatter into it)
on stream 1 and the write-back ``copy_`` into the cache buffer on stream 0, which reads
``buf58``.  The reuse guard (`_cross_stream_buffers`) kept ``buf58`` (the name read) but the
wrapper frees the allocation ``buf57`` (``del buf57``), so the code msched made really had a
cross-stream free on CUDA, and the build was refused.

Expected: the guard keeps the allocation too; the piece verifies; outputs, capture and KV
caches equal eager on two calls (what this script prints after the fix).
Run: PYTHONPATH=<worktree>:repros/break26 python repros/break26/r01_kv_cache_guard.py
"""

import copy
import os
import tempfile

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
import torch
from b26_model import Model

import msched


def main(layers: int = 1) -> None:
    torch.manual_seed(0)
    model = Model(layers=layers)
    ref = copy.deepcopy(model)
    backend = msched.backend(num_streams=2, compiler="inductor")
    compiled = torch.compile(model, backend=backend)
    for call in range(2):
        x, pos = torch.randn(3, 32), torch.arange(3) + call
        cap, cap_ref = torch.zeros(2, 16, 32), torch.zeros(2, 16, 32)
        with torch.no_grad():
            out, exp = compiled(x, pos, cap), ref(x, pos, cap_ref)
        caches = all(
            torch.allclose(getattr(model.blocks[i].attn, n), getattr(ref.blocks[i].attn, n))
            for i in range(layers)
            for n in ("kc", "vc")
        )
        print(
            f"call {call}: out {torch.allclose(out, exp, atol=1e-5)}, "
            f"capture {torch.allclose(cap, cap_ref, atol=1e-5)}, caches {caches}"
        )
    print("pieces verified:", [p.report.ok for p in backend.pieces])


if __name__ == "__main__":
    main()

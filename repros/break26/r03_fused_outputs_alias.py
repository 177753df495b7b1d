"""break26 r03 (severity: false positive / refused correct model; NOT fixed on this branch).

The r01 decoder (1 layer) in bf16 under ``torch.inference_mode()`` with one token and a capture
through a custom op that returns a tensor (``b26::scale_out``, ``mutates_args=("out",)``),
``msched.backend(num_streams=2, compiler="inductor")``.  Also seen: fp16, piecewise on 3
streams split at ``aten::_scaled_dot_product_flash_attention_for_cpu.default``.

Observed (before the fix): ``PieceVerificationError: [race/raw] `op75` on stream 1 reads
`buf19`, which `op60` writes``.  op75 reads ``buf22``, a new buffer of the fused kernel
``op21_op22``, which also wrote ``buf21`` into ``buf19``'s memory (a reuse).  The kernel-order
program made that kernel one ``inductor_kernel_writes`` call, and `msched.verify` reads the
results of a call with written arguments as those arguments (``out=``), so ``buf22`` was
read as ``buf19``, which the caller's stream later reuses for ``buf60``: a race between two
different buffers.

Expected: verified; outputs, capture and caches equal eager (bf16 tolerance) on two calls.
Seen with r01's fix applied.  A fix (a writing kernel with new buffers as two nodes of the
kernel-order program, break26 commit 83806f3, reverted in the next commit) made this verify,
but then TinyDecoder's guard_reuse ablation (test_inductor_backend.py) no longer failed:
that ablation's failure may rest on this same false alias; not investigated for lack of time.
Run: PYTHONPATH=<worktree>:repros/break26 python repros/break26/r03_fused_outputs_alias.py
"""

import copy
import os
import tempfile

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
import torch
from b26_model import Model

import msched

torch.manual_seed(0)
model = Model(layers=1, captures="scale_out").to(torch.bfloat16)
ref = copy.deepcopy(model)
backend = msched.backend(num_streams=2, compiler="inductor")
compiled = torch.compile(model, backend=backend)
for call in range(2):
    x, pos = torch.randn(1, 32, dtype=torch.bfloat16), torch.arange(1) + call
    cap = torch.zeros(2, 16, 32, dtype=torch.bfloat16)
    cap_ref = cap.clone()
    with torch.inference_mode():
        out, exp = compiled(x, pos, cap), ref(x, pos, cap_ref)
    close = dict(atol=2e-2, rtol=2e-2)
    print(
        f"call {call}: out {torch.allclose(out, exp, **close)}, "
        f"capture {torch.allclose(cap, cap_ref, **close)}"
    )
print("pieces verified:", [p.report.ok for p in backend.pieces])

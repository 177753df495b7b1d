"""A plain MoE-with-shared-expert block (no custom op, no KV cache, no index_copy_) compiled
with compiler="inductor", num_streams=2: msched's own build fails its final-order verification
with missing-record-stream (expected: compiles, verified ok).  The buffers named are ones the
reuse guard puts in Inductor's never_reuse_buffers, which Inductor also never frees (no `del`
in the code: they live until the call returns, after the exit joined every stream), so the
refusal was wrong.  Fixed on break25 (kernel_order_program(kept_to_exit=True)): prints "ok"."""

import os
import sys
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
import torch

import msched


class MoE(torch.nn.Module):
    def __init__(self, d=16, experts=3):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.gate = torch.nn.Linear(d, experts)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(experts))
        self.shared = torch.nn.Sequential(
            torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d)
        )

    def forward(self, x):
        h = self.ln(x)
        probs = torch.softmax(self.gate(h), dim=-1)
        routed = sum(probs[:, i : i + 1] * e(h) for i, e in enumerate(self.experts))
        return x + routed + self.shared(h)


m = MoE().eval()
x = torch.randn(4, 16)
b = msched.backend(num_streams=int(sys.argv[1]) if len(sys.argv) > 1 else 2, compiler="inductor")
try:
    with torch.no_grad():
        out = torch.compile(m, backend=b)(x)
    print("ok", torch.allclose(out, m(x), atol=1e-5), b.pieces[0].report.ok)
except Exception as e:
    print(type(e).__name__, str(e)[:3000])
    if b.pieces:
        print(b.pieces[-1].code[:100])

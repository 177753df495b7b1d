"""compiler="inductor" on a small block (LayerNorm, two parallel branches, residual, a buffer),
whole and piecewise, called with 4, 6 and 8 tokens (automatic dynamic, then mark_dynamic);
num_streams=1; graphs that compute nothing but a view, or only mutate an input.
Before break25's fix whole-auto and whole-mark failed with missing-record-stream (see r06);
now every case equals eager and verifies; streams1, view-only, mutate-only always did."""

import os
import sys
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
import torch

import msched


class Block(torch.nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.a, self.b = torch.nn.Linear(d, d), torch.nn.Linear(d, d)
        self.register_buffer("bias", torch.linspace(0, 1, d))

    def forward(self, x):
        h = self.ln(x)
        return x + self.a(h).relu() + self.b(h).sigmoid() + self.bias


def run(name, fn, make, streams=2, mark=False, **kw):
    torch._dynamo.reset()
    b = msched.backend(num_streams=streams, compiler="inductor", **kw)
    c = torch.compile(fn, backend=b)
    try:
        for t in (4, 6, 8):
            args = make(t)
            if mark:
                torch._dynamo.mark_dynamic(args[0], 0)
            eargs = [a.clone() for a in args]
            with torch.no_grad():
                e, g = fn(*eargs), c(*args)
            same = torch.allclose(g, e, atol=1e-5) and all(
                torch.allclose(a, ea) for a, ea in zip(args, eargs, strict=True)
            )
            print(f"{name} tokens={t}: equal={same}", flush=True)
        print(f"{name}: pieces={len(b.pieces)} ok={[p.report.ok for p in b.pieces]}", flush=True)
    except Exception as ex:
        print(f"{name}: {type(ex).__name__}: {str(ex)[:400]}", flush=True)


def tokens(t):
    torch.manual_seed(t)
    return [torch.randn(t, 16)]


cases = {
    "whole-auto": lambda: run("whole-auto", Block().eval(), tokens),
    "whole-mark": lambda: run("whole-mark", Block().eval(), tokens, mark=True),
    "streams1": lambda: run("streams1", Block().eval(), tokens, streams=1),
    "view-only": lambda: run("view-only", lambda x: x.t(), tokens),
    "mutate-only": lambda: run("mutate-only", lambda x: x.mul_(2), tokens),
}
for key in sys.argv[1:] or cases:
    cases[key]()

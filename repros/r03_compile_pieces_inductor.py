"""msched.compile_pieces(model, x, compiler="inductor") — the documented one-call helper —
raises NoGraphCompiledError although Inductor compiled the graph (b.graphs only holds fx graphs)."""

import os
import tempfile

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
import torch

import msched


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x).relu() + self.b(x).sin()


try:
    gms = msched.compile_pieces(M(), torch.randn(4, 8), num_streams=2, compiler="inductor")
    print("ok:", len(gms), "pieces")
except Exception as e:
    print(type(e).__name__, e)

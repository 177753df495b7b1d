"""compiler="inductor" on a training graph (parameters require grad, no no_grad).
compiler="fx" raises TrainingGraphError; expected the same for inductor."""

import os
import tempfile

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp())
import torch

import msched

m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
x = torch.randn(4, 8)
for compiler in ("fx", "inductor"):
    torch._dynamo.reset()
    b = msched.backend(num_streams=2, compiler=compiler)
    try:
        out = torch.compile(m, backend=b)(x)
        out.sum().backward()
        print(
            compiler,
            "-> compiled a training graph, pieces:",
            len(b.pieces),
            "requires_grad:",
            out.requires_grad,
        )
    except Exception as e:
        print(compiler, "->", type(e).__name__, str(e)[:200])

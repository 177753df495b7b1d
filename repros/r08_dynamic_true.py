"""torch.compile(dynamic=True) of a model with nn.LayerNorm, piecewise, compiler=argv[1]
("plain" = backend="inductor" for comparison).
Observed (torch 2.13, CPU): plain and compiler="fx" run and equal eager for 4 and 6 tokens;
compiler="inductor" raises DataDependentOutputException (aten._local_scalar_dense) at the
first call: dynamic=True lifts LayerNorm's float eps to a tensor input read with .item(),
and a lazy piece is compiled by compile_fx from the real arguments, with no ShapeEnv.
Expected: runs like "fx", or a clear MschedError naming the workaround
(torch._dynamo.mark_dynamic on the token dimension instead of dynamic=True)."""

import os
import sys
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, os.path.dirname(__file__))
import torch
from common_model import Model, inputs

import msched

which = sys.argv[1] if len(sys.argv) > 1 else "inductor"
torch.manual_seed(0)
m = Model().eval()
b = (
    "inductor"
    if which == "plain"
    else msched.backend(num_streams=3, compiler=which, piecewise=True, split_ops=["break25::attn"])
)
c = torch.compile(m, backend=b, dynamic=True)
try:
    for t in (4, 6):
        x, buf = inputs(t)
        with torch.no_grad():
            g = c(x, torch.zeros_like(buf))
            e = m(x, buf.clone())
        print(which, t, torch.allclose(g[0]["hidden"], e[0]["hidden"], atol=1e-5))
except Exception as ex:
    print(which, type(ex).__name__, str(ex)[:300])

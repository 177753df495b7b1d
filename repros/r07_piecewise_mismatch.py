"""Checked a suspected wrong-output-but-verified case of r04: NOT a bug.  Piecewise at
break25::attn, 3 streams, compiler="inductor" differs from eager by ~1e-7, exactly as plain
backend="inductor" does (fused kernels); "fx" is bit-exact.  With 2 streams this build fails
with missing-record-stream (r06).  argv: streams ng|im plain|fx|inductor"""

import os
import sys
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
sys.path.insert(0, os.path.dirname(__file__))
import torch
from common_model import Model, inputs

import msched

streams = int(sys.argv[1]) if len(sys.argv) > 1 else 3
ctx = {"ng": torch.no_grad, "im": torch.inference_mode}[sys.argv[2] if len(sys.argv) > 2 else "ng"]
which = sys.argv[3] if len(sys.argv) > 3 else "inductor"
torch.manual_seed(0)
m = Model().eval()
if which == "plain":
    b = "inductor"
else:
    b = msched.backend(
        num_streams=streams, compiler=which, piecewise=True, split_ops=["break25::attn"]
    )
c = torch.compile(m, backend=b)
x, buf = inputs(4)
with ctx():
    ebuf = buf.clone()
    e = m(x, ebuf)
    gbuf = torch.zeros_like(buf)
    g = c(x, gbuf)


def diff(a, b):
    return float((a - b).abs().max())


print(
    f"{which} s{streams} {ctx.__name__}: hidden {diff(g[0]['hidden'], e[0]['hidden']):.3g} "
    f"logits {diff(g[0]['logits'], e[0]['logits']):.3g} x {diff(g[1][0], e[1][0]):.3g} "
    f"capture {diff(gbuf, ebuf):.3g}"
)
if which != "plain":
    print("reports", [p.report.ok if p.report else None for p in b.pieces])

"""trace_streams(stage="inductor") refuses correct stream code whose custom op mutates a graph
input (an Eagle3 capture on a side stream, joined): "cannot trace capture_joined in one graph:
AssertionError: n=copy_, ..." -- the message says a graph break, but the graph was traced
(the dynamo and aot stages verify it ok); what failed is Inductor (torch 2.13's AOT
functional-graph check: the write-back copy_ targets a control_deps output, not the input).
Plain torch.compile(backend="inductor") of the same function fails the same way (printed)."""

import os
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
import torch

import msched
from msched.compile.tracing import _registered_caller


@torch.library.custom_op("break25c::capture", mutates_args=("buf",))
def capture(h: torch.Tensor, buf: torch.Tensor) -> None:
    buf.copy_(h)


@capture.register_fake
def _(h, buf):
    return None


with msched.cuda_streams_on_cpu():
    side = torch.cuda.Stream()


def capture_joined(x, buf):
    cur = torch.cuda.current_stream()
    h = x.sin() * 2
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        capture(h.cos(), buf)
    cur.wait_stream(side)
    return h + 1


x, buf = torch.randn(8, 8), torch.zeros(8, 8)
for stage in ("dynamo", "inductor"):
    try:
        with msched.cuda_streams_on_cpu():
            gm = msched.trace_streams(capture_joined, x, buf, stage=stage)
        print(stage, "verify ok:", msched.verify(gm).ok)
    except Exception as e:
        print(stage, type(e).__name__, str(e)[:200])
torch.compiler.reset()
try:
    with msched.cuda_streams_on_cpu() as caller, _registered_caller(caller), torch.no_grad():
        torch.compile(capture_joined, backend="inductor", fullgraph=True)(x, buf)
    print("plain inductor: compiled")
except Exception as e:
    print(
        "plain inductor:",
        type(e).__name__,
        str(e).strip().splitlines()[-1][:200] if str(e).strip() else "",
    )

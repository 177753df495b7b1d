# Observed: capture_unjoined and capture_joined at stage="inductor" fail in Inductor (r10, torch
# bug; message fixed); with_record_stream at stage="inductor" is a race: Inductor reuses `a`'s
# buffer for a caller-stream write while the side stream reads it (record_stream cannot protect
# against Inductor's own reuse): a correct flag of an Inductor hazard.
"""More user stream code through trace_streams(stage="inductor"): a capture custom op
(mutates_args) on an unjoined side stream, and record_stream with Inductor's buffer reuse."""

import os
import sys
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
import torch

import msched


@torch.library.custom_op("break25u::capture", mutates_args=("buf",))
def capture(h: torch.Tensor, buf: torch.Tensor) -> None:
    buf.copy_(h)


@capture.register_fake
def _(h, buf):
    return None


with msched.cuda_streams_on_cpu():
    side = torch.cuda.Stream()


def capture_unjoined(x, buf):  # RACY: the capture write on the side stream is never joined
    side.wait_stream(torch.cuda.current_stream())
    h = x.sin() * 2
    with torch.cuda.stream(side):
        capture(h.cos(), buf)
    return h + 1


def capture_joined(x, buf):  # OK
    cur = torch.cuda.current_stream()
    h = x.sin() * 2
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        capture(h.cos(), buf)
    cur.wait_stream(side)
    return h + 1


def with_record_stream(x, y):  # OK in eager CUDA (record_stream); Inductor may reuse `a`
    cur = torch.cuda.current_stream()
    a = x.sin() * 3
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        a.record_stream(side)
        b = (a @ y).cos()
    c = (x * 2 + 1) @ y
    d = c.exp() @ y
    cur.wait_stream(side)
    return b + d


for fn in (capture_unjoined, capture_joined, with_record_stream):
    if sys.argv[1:] and fn.__name__ not in sys.argv[1:]:
        continue
    for stage in ("aot", "inductor"):
        try:
            with msched.cuda_streams_on_cpu():
                gm = msched.trace_streams(fn, torch.randn(8, 8), torch.randn(8, 8), stage=stage)
            r = msched.verify(gm)
            print(
                f"{fn.__name__:20s} {stage:8s} ok={r.ok} {sorted({v.kind for v in r.violations})}",
                flush=True,
            )
            if stage == "inductor" and not r.ok:
                print("   ", str(r).splitlines()[1][:300])
        except Exception as e:
            print(f"{fn.__name__:20s} {stage:8s} {type(e).__name__}: {str(e)[:300]}", flush=True)

# Observed (torch 2.13, CPU): every racy case is flagged at every stage and the correct ones
# verify, except side_overwrites_input at stage="inductor", where torch 2.13 Inductor itself fails
# (see r10).
"""User stream code through trace_streams(stage=...) + msched.verify, racy and correct cases.
Prints, per case, what verify says at the dynamo, aot and inductor stages."""

import os
import sys
import tempfile

os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp()
import torch

import msched

with msched.cuda_streams_on_cpu():
    side = torch.cuda.Stream()
    ev, ev2 = torch.cuda.Event(), torch.cuda.Event()


def unjoined_view(x, y):  # RACY: side result returned as a view, never joined
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        b = y.cos() * 2
    return x.sin() + 1, b.t()


def unjoined_slice(x, y):  # RACY: a slice of the side result, never joined
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        b = y.cos() * 2
    return x.sin() + 1, b[0]


def wrong_direction(x, y):  # RACY: side waits the caller at the end instead of the reverse
    cur = torch.cuda.current_stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        b = y.cos() * 2
    side.wait_stream(cur)
    return x.sin() + b


def wait_before_record(x, y):  # RACY: the caller waits an event before it is recorded
    cur = torch.cuda.current_stream()
    side.wait_stream(cur)
    ev.wait(cur)
    with torch.cuda.stream(side):
        b = y.cos() * 2
        ev.record(side)
    return x.sin() + b


def no_record_stream(x, y):  # RACY on CUDA: `a` made on caller, read on side, freed before the join
    cur = torch.cuda.current_stream()
    a = x.sin() * 3
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        b = (a @ y).cos()
    c = (x * 2 + 1) @ y
    d = c.exp() @ y
    cur.wait_stream(side)
    return b + d


def side_overwrites_input(x, y):  # RACY: side writes y in place while the caller reads it
    cur = torch.cuda.current_stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        y.mul_(2)
    c = y.sin()
    cur.wait_stream(side)
    return c


def correct_events(x, y):  # OK: event fork/join
    cur = torch.cuda.current_stream()
    ev.record(cur)
    with torch.cuda.stream(side):
        ev.wait(side)
        b = y.cos() * 2
        ev2.record(side)
    ev2.wait(cur)
    return x.sin() + b


def correct_two_side_ops(x, y):  # OK: wait_stream fork/join, two results
    cur = torch.cuda.current_stream()
    side.wait_stream(cur)
    with torch.cuda.stream(side):
        b = y.cos() * 2
        b2 = b.exp() + y
    cur.wait_stream(side)
    return x.sin() + b, b2.view(-1)


cases = [
    unjoined_view,
    unjoined_slice,
    wrong_direction,
    wait_before_record,
    no_record_stream,
    side_overwrites_input,
    correct_events,
    correct_two_side_ops,
]
only = sys.argv[1:]
for fn in cases:
    if only and fn.__name__ not in only:
        continue
    for stage in ("dynamo", "aot", "inductor"):
        try:
            with msched.cuda_streams_on_cpu():
                gm = msched.trace_streams(fn, torch.randn(8, 8), torch.randn(8, 8), stage=stage)
            r = msched.verify(gm)
            kinds = sorted({v.kind for v in r.violations})
            print(f"{fn.__name__:22s} {stage:8s} ok={r.ok} {kinds}", flush=True)
        except Exception as e:
            print(f"{fn.__name__:22s} {stage:8s} {type(e).__name__}: {str(e)[:300]}", flush=True)

"""Benchmark of one CPU forward of a scheduled decoder stack against the unscheduled one (MoE).

For each size (12, 61 and 244 layers) this prints: compute nodes; stream-op nodes of the
scheduled graph, per compute node; the host time of one forward of the unscheduled graph
(``Schedule.original``) and of the scheduled one (``msched.schedule``'s module, the same
parameters), and their ratio.  On CPU the stream ops are no-ops and the tensors are tiny, so
the difference is the host cost of the stream-op nodes themselves (direct calls of the runtime,
`msched.scheduling.codegen`; through the dispatcher before, about 1 µs more each);
on CUDA each of them also calls the driver.

Both modules run in the same process under ``torch.no_grad()``, alternating in every round
(unscheduled, then scheduled) so that load on a shared machine hits both alike; each round
times ``--calls`` forwards of each with the garbage collector collected and disabled around
the measurement, and the table shows the median per forward over ``--repeat`` rounds.  Torch
runs on one intra-op thread: the tensors are tiny, and on a shared machine more threads only
add contention to what is measured.

``compute`` counts the nodes of the unscheduled graph (weights and inputs included, as
``bench_schedule``'s ``streamops/node``).

Run: ``python benchmarks/bench_forward.py [--streams 3] [--repeat 7] [--calls 3]
[--layers 12,61,244]``
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import torch
from bench_schedule import capture_layers, print_table

import msched
from msched.models.decoders import decoder_stack

STREAM_OPS = set(msched.ops.STREAM_OPS)


def timed(fn: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls, the collector off."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) / calls
    finally:
        gc.enable()


def measure(layers: int, streams: int, repeat: int, calls: int) -> dict[str, float]:
    torch.set_num_threads(1)
    stack = decoder_stack(layers, capture_layers(layers), moe=True)
    sched = msched.schedule(stack.gm, streams)
    scheduled, unscheduled = sched.gm, sched.original
    x, dest = stack.example_inputs()
    times: dict[str, list[float]] = {"unscheduled": [], "scheduled": []}
    with torch.no_grad():
        for module in (unscheduled, scheduled):  # warm up: code generation, first dispatch
            module(x, dest)
        for _ in range(repeat):
            times["unscheduled"].append(timed(lambda: unscheduled(x, dest), calls))
            times["scheduled"].append(timed(lambda: scheduled(x, dest), calls))
    ops = sum(1 for n in scheduled.graph.nodes if n.target in STREAM_OPS)
    compute = len(unscheduled.graph.nodes)
    t_plain, t_sched = (statistics.median(times[k]) for k in ("unscheduled", "scheduled"))
    return {
        "layers": layers,
        "compute": compute,
        "streamops/compute": ops / compute,
        "unscheduled_ms": t_plain * 1e3,
        "scheduled_ms": t_sched * 1e3,
        "ratio": t_sched / t_plain,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--layers", default="12,61,244")
    args = parser.parse_args()
    sizes = [int(n) for n in args.layers.split(",")]
    rows = [measure(n, args.streams, args.repeat, args.calls) for n in sizes]
    title = (
        f"one CPU forward, scheduled / unscheduled, {args.streams} streams, median of "
        f"{args.repeat} rounds of {args.calls} calls"
    )
    print_table(title, rows, width=17)


if __name__ == "__main__":
    main()

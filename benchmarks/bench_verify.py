"""Benchmark of `msched.verify` on scheduled decoder stacks of 12, 61 and 244 layers (MoE).

For each size this prints: nodes of the scheduled graph; the time of
``msched.verify(gm, original=sched.original)`` and of ``msched.verify(gm)`` (orderings from
the host order); the floor measured in the same run, a bare ``Graph.graph_copy`` of the same
scheduled graph; the ratios to the floor; and the time per node relative to the smallest size
(1.0 = linear).  Times are medians of several runs with the garbage collector collected and
disabled around each measurement; the sizes are interleaved in every round so that load on a
shared machine affects them alike (``--cpu-time`` measures process CPU time instead).

Run: ``python benchmarks/bench_verify.py [--streams 3] [--repeat 7] [--layers 12,61,244]``
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench_schedule import capture_layers
from torch.fx import Graph, GraphModule

import msched
from msched.models.decoders import decoder_stack


def timed(fn: Callable[[], object], clock: Callable[[], float]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = clock()
        fn()
        return clock() - t0
    finally:
        gc.enable()


@dataclass
class Case:
    layers: int
    gm: GraphModule
    original: GraphModule
    times: dict[str, list[float]] = field(default_factory=dict)

    def median(self, key: str) -> float:
        return statistics.median(self.times[key])


def build(layers: int, streams: int) -> Case:
    stack = decoder_stack(layers, capture_layers(layers), moe=True)
    sched = msched.schedule(stack.gm, streams)
    assert msched.verify(stack.gm, original=sched.original).ok
    return Case(layers, stack.gm, sched.original)


def measure(cases: list[Case], repeat: int, clock: Callable[[], float]) -> None:
    """Interleave the sizes in every round, so load on a shared machine hits all alike."""
    for _ in range(repeat):
        for case in cases:
            for key, fn in _runs(case).items():
                case.times.setdefault(key, []).append(timed(fn, clock))


def _runs(case: Case) -> dict[str, Callable[[], object]]:
    gm, original = case.gm, case.original
    return {
        "floor": lambda: Graph().graph_copy(gm.graph, {}),
        "with_original": lambda: msched.verify(gm, original=original),
        "alone": lambda: msched.verify(gm),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--layers", default="12,61,244")
    parser.add_argument(
        "--cpu-time", action="store_true", help="process CPU time instead of wall time"
    )
    args = parser.parse_args()
    cases = [build(int(n), args.streams) for n in args.layers.split(",")]
    measure(cases, args.repeat, time.process_time if args.cpu_time else time.perf_counter)
    rows = [
        {
            "layers": c.layers,
            "nodes": len(c.gm.graph.nodes),
            **{k: c.median(k) for k in ("floor", "with_original", "alone")},
        }
        for c in cases
    ]
    base = rows[0]
    print(
        f"{'layers':>6} {'nodes':>7} {'verify(orig) ms':>15} {'verify() ms':>11} "
        f"{'graph_copy ms':>13} {'ratio(orig)':>11} {'ratio()':>8} {'per-node vs first':>17}"
    )
    for r in rows:
        per_node = (r["with_original"] / r["nodes"]) / (base["with_original"] / base["nodes"])
        print(
            f"{r['layers']:>6} {r['nodes']:>7} {r['with_original'] * 1e3:>15.1f} "
            f"{r['alone'] * 1e3:>11.1f} {r['floor'] * 1e3:>13.1f} "
            f"{r['with_original'] / r['floor']:>11.2f} {r['alone'] / r['floor']:>8.2f} "
            f"{per_node:>17.2f}"
        )


if __name__ == "__main__":
    main()

"""Benchmark of `msched.schedule` on decoder stacks of 12, 61 and 244 layers (MoE).

For each size this prints: nodes; the time of `msched.schedule` until the module's code shows
the schedule; the floor measured in the same run (a bare ``Graph.graph_copy`` of the same graph
plus generating its module code, i.e. ``GraphModule(root, copy)``, which generates and compiles
the source as ``recompile`` does); their ratio, and the ratio against a floor that only generates
the source text; events; waits per node; stream-op nodes per node;
makespan / lower bound; and the single-stream cost.  Times are medians of several runs with the
garbage collector collected and disabled around each measurement.

It also splits the schedule time: ``recompile_ms`` is one more ``recompile()`` of the scheduled
module (generating and compiling its source, which ``msched.schedule`` must do once), measured in
the same run, and ``analysis_ms`` is the rest (dag, assignment, emission).  ``recompile/floor``
shows how much of the ratio the code of the scheduled graph alone takes: it has more nodes than
the input (the stream ops), and FX generates and Python compiles every one of them.

Run: ``python benchmarks/bench_schedule.py [--streams 3] [--repeat 5] [--layers 12,61,244]``
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from functools import partial

from torch.fx import Graph, GraphModule

import msched
from msched.testing.decoders import decoder_stack

STREAM_OPS = set(msched.ops.STREAM_OPS)


def capture_layers(layers: int) -> tuple[int, ...]:
    """Captures at layer 1, the middle layer and the last layer (fewer for tiny stacks)."""
    return tuple(sorted({min(1, layers - 1), layers // 2, layers - 1}))


def eager(gm: GraphModule) -> GraphModule:
    """``gm`` as a plain ``GraphModule`` (its code generated now), as a traced model is: the
    test stacks are lazy graph modules, which would leave code generation out of the floor's
    input and move it into the schedule's first read of ``code``."""
    return GraphModule(gm, gm.graph, gm.__class__.__name__)


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        gc.enable()


def floor(gm: GraphModule) -> None:
    """A bare copy of the graph plus generating its module code (what ``recompile`` does)."""
    copy = Graph()
    copy.output(copy.graph_copy(gm.graph, {}))
    GraphModule(gm, copy)


def floor_source_only(gm: GraphModule) -> None:
    """A bare copy plus generating the source text only (no Python compile)."""
    copy = Graph()
    copy.output(copy.graph_copy(gm.graph, {}))
    copy.python_code("self")


def _schedule_into(box: list[msched.Schedule], gm: GraphModule, streams: int) -> None:
    """Schedule ``gm`` until its code shows the schedule: a lazy graph module (the test
    stacks') generates its code only when it is read, so it is read here."""
    box.append(msched.schedule(gm, streams))
    assert "msched_set_stream(" in gm.code


def _recompile(gm: GraphModule) -> None:
    """Generate and compile ``gm``'s code again (lazy or not)."""
    gm.recompile()
    assert gm.code


def measure(layers: int, streams: int, repeat: int) -> dict[str, float]:
    sched_times, floor_times, source_times, recompile_times = [], [], [], []
    sched = None
    for _ in range(repeat):
        gm = eager(decoder_stack(layers, capture_layers(layers), moe=True).gm)
        floor_times.append(timed(partial(floor, gm)))
        source_times.append(timed(partial(floor_source_only, gm)))
        box: list[msched.Schedule] = []
        sched_times.append(timed(partial(_schedule_into, box, gm, streams)))
        sched = box[0]
        recompile_times.append(timed(partial(_recompile, sched.gm)))
    assert sched is not None
    nodes = len(sched.original.graph.nodes)
    ops = sum(1 for n in sched.gm.graph.nodes if n.target in STREAM_OPS)
    t_sched, t_floor = statistics.median(sched_times), statistics.median(floor_times)
    t_recompile = statistics.median(recompile_times)
    return {
        "layers": layers,
        "nodes": nodes,
        "schedule_ms": t_sched * 1e3,
        "floor_ms": t_floor * 1e3,
        "ratio": t_sched / t_floor,
        "ratio_vs_src": t_sched / statistics.median(source_times),
        "recompile_ms": t_recompile * 1e3,
        "analysis_ms": (t_sched - t_recompile) * 1e3,
        "recompile/floor": t_recompile / t_floor,
        "events": sched.num_events,
        "waits/node": sched.num_waits / nodes,
        "streamops/node": ops / nodes,
        "makespan/lb": sched.makespan / sched.lower_bound,
        "1-stream cost": sched.assignment.total_cost,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layers", default="12,61,244")
    args = parser.parse_args()
    rows = [measure(int(n), args.streams, args.repeat) for n in args.layers.split(",")]
    print_table(f"msched.schedule, {args.streams} streams, median of {args.repeat}", rows)


def print_table(title: str, rows: list[dict[str, object]], width: int = 14) -> None:
    """``title``, a header of the rows' keys, then one line per row (floats to 3 places)."""
    cols = list(rows[0])
    print(title)
    print("  ".join(f"{c:>{width}}" for c in cols))
    for row in rows:
        print(
            "  ".join(
                f"{row[c]:>{width}.3f}" if isinstance(row[c], float) else f"{row[c]:>{width}}"
                for c in cols
            )
        )


if __name__ == "__main__":
    main()

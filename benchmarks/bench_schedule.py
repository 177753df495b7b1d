"""Benchmark of `msched.schedule` on decoder stacks of 12, 61 and 244 layers (MoE).

For each size this prints: nodes; the time of `msched.schedule` until the module's code shows
the schedule; the floor measured in the same run (a bare ``Graph.graph_copy`` of the same graph
plus generating its module code, i.e. ``GraphModule(root, copy)``, which generates and compiles
the source as ``recompile`` does); their ratio, and the ratio against a floor that only generates
the source text (each ratio the median of the ratios of each run's schedule to the floor measured
around it (the mean of one floor just before the schedule and one just after), in the same
run: a machine whose speed drifts moves both alike); events; waits per node; stream-op nodes
per node; makespan / lower bound; and the single-stream cost.  Times are medians of several
runs with the garbage collector collected and disabled around each measurement.

It also splits the schedule time: ``recompile_ms`` is one more ``recompile()`` of the scheduled
module (generating and compiling its source, which ``msched.schedule`` must do once), measured in
the same run, and ``analysis_ms`` is the rest (dag, assignment, emission).  ``recompile/floor``
shows how much of the ratio the code of the scheduled graph alone takes: it has more nodes than
the input (the stream ops), and FX generates and Python compiles every one of them.

``--slope`` times ``msched.schedule`` instead on graphs of about ``--nodes`` nodes (1k to 20k):
decoder stacks (MoE) and random layered DAGs (matmuls, adds, tanh and views, each reading one
or two of the last few values; drawn here so that any checkout can schedule them), and prints
the time per node and the log-log slope of time against nodes (1.0: linear).
``--baseline PATH`` measures the msched of the checkout at ``PATH`` too, each in a child process
(``PYTHONPATH``), alternating baseline and this checkout for ``--rounds`` rounds, and prints
both side by side (the medians of the rounds).  ``--cpu`` times with ``time.process_time``
(this process's CPU time) instead of the wall clock: steadier on a machine shared with others.

Run: ``python benchmarks/bench_schedule.py [--streams 3] [--repeat 5] [--layers 12,61,244]``
or ``python benchmarks/bench_schedule.py --slope [--baseline ../base] [--rounds 2] [--cpu]``
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch.fx import Graph, GraphModule, Node

import msched
from msched.models.decoders import decoder_stack

STREAM_OPS = set(msched.ops.STREAM_OPS)


def capture_layers(layers: int) -> tuple[int, ...]:
    """Captures at layer 1, the middle layer and the last layer (fewer for tiny stacks)."""
    return tuple(sorted({min(1, layers - 1), layers // 2, layers - 1}))


def eager(gm: GraphModule) -> GraphModule:
    """``gm`` as a plain ``GraphModule`` (its code generated now), as a traced model is: the
    test stacks are lazy graph modules, which would leave code generation out of the floor's
    input and move it into the schedule's first read of ``code``."""
    return GraphModule(gm, gm.graph, gm.__class__.__name__)


CLOCK = time.perf_counter  # time.process_time with --cpu


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = CLOCK()
        fn()
        return CLOCK() - t0
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
        before = timed(partial(floor, gm))
        source_times.append(timed(partial(floor_source_only, gm)))
        box: list[msched.Schedule] = []
        sched_times.append(timed(partial(_schedule_into, box, gm, streams)))
        sched = box[0]
        after = timed(partial(floor, eager(sched.original)))  # the graph before scheduling
        floor_times.append((before + after) / 2)
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
        "ratio": paired_ratio(sched_times, floor_times),
        "ratio_vs_src": paired_ratio(sched_times, source_times),
        "recompile_ms": t_recompile * 1e3,
        "analysis_ms": (t_sched - t_recompile) * 1e3,
        "recompile/floor": paired_ratio(recompile_times, floor_times),
        "events": sched.num_events,
        "waits/node": sched.num_waits / nodes,
        "streamops/node": ops / nodes,
        "makespan/lb": sched.makespan / sched.lower_bound,
        "1-stream cost": sched.assignment.total_cost,
    }


def paired_ratio(times: list[float], floors: list[float]) -> float:
    """The median of ``times[i] / floors[i]``: each run against the floor of the same run."""
    return statistics.median(t / f for t, f in zip(times, floors, strict=True))


def layered_graph(nodes: int, seed: int = 0, width: int = 4) -> GraphModule:
    """A random layered DAG of about ``nodes`` nodes: layers of 1..``width`` matmuls (by a
    weight), adds, tanh and views, each reading values of the last two layers; the values
    nobody reads are the outputs."""
    rng = random.Random(seed)
    graph, root = Graph(), torch.nn.Module()
    aten = torch.ops.aten
    weights = [graph.get_attr(f"w{i}") for i in range(8)]
    for i in range(8):
        root.register_buffer(f"w{i}", torch.zeros(4, 4))
    earlier: list[Node] = [graph.placeholder("x")]
    while len(graph.nodes) < nodes:
        for _ in range(rng.randint(1, width)):
            src, kind = rng.choice(earlier[-2 * width :]), rng.random()
            if kind < 0.45:
                args: tuple[object, ...] = (aten.mm.default, src, rng.choice(weights))
            elif kind < 0.6:
                args = (aten.view.default, src, [4, 4])
            elif kind < 0.8:
                args = (aten.add.Tensor, src, rng.choice(earlier[-2 * width :]))
            else:
                args = (aten.tanh.default, src)
            earlier.append(graph.call_function(args[0], args[1:]))  # type: ignore[arg-type]
    graph.output(tuple(n for n in earlier[1:] if not n.users))
    return GraphModule(root, graph, "LayeredGraph")


def decoder_graph(nodes: int) -> GraphModule:
    """A MoE decoder stack with about ``nodes`` nodes (layers grow it linearly)."""
    one, two = (len(decoder_stack(n, capture_layers(n), moe=True).gm.graph.nodes) for n in (2, 3))
    layers = max(2, round(2 + (nodes - one) / (two - one)))
    return eager(decoder_stack(layers, capture_layers(layers), moe=True).gm)


FAMILIES: dict[str, Callable[[int], GraphModule]] = {
    "decoder": decoder_graph,
    "layered": layered_graph,
}


def slope_times(sizes: list[int], streams: int, repeat: int) -> dict[str, list[list[float]]]:
    """``{family: [[nodes, median schedule ms], ...]}`` for graphs of about ``sizes`` nodes."""
    out: dict[str, list[list[float]]] = {}
    for family, build in FAMILIES.items():
        out[family] = []
        for size in sizes:
            times = []
            for _ in range(repeat):
                gm = build(size)
                box: list[msched.Schedule] = []
                times.append(timed(partial(_schedule_into, box, gm, streams)))
            out[family].append([len(box[0].original.graph.nodes), statistics.median(times) * 1e3])
    return out


def log_log_slope(points: list[list[float]]) -> float:
    """Least-squares slope of log(time) against log(nodes)."""
    xs = [math.log(n) for n, _ in points]
    ys = [math.log(t) for _, t in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    covariance = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return covariance / sum((x - mx) ** 2 for x in xs)


def child_times(path: str, args: argparse.Namespace) -> dict[str, list[list[float]]]:
    """`slope_times` of the msched at ``path``, measured in a child process."""
    command = [sys.executable, __file__, "--slope", "--json", "--nodes", args.nodes]
    command += ["--streams", str(args.streams), "--repeat", str(args.repeat)]
    command += ["--cpu"] * args.cpu
    env = {**os.environ, "PYTHONPATH": path}
    run = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def slope_rows(label: str, runs: list[dict[str, list[list[float]]]]) -> list[dict[str, object]]:
    """One row per family and size: the median over ``runs`` of the schedule time."""
    rows: list[dict[str, object]] = []
    for family in runs[0]:
        for i, (nodes, _) in enumerate(runs[0][family]):
            ms = statistics.median(run[family][i][1] for run in runs)
            spread = max(run[family][i][1] for run in runs) / min(r[family][i][1] for r in runs)
            rows.append(
                {"checkout": label, "family": family, "nodes": int(nodes), "schedule_ms": ms,
                 "us/node": ms * 1e3 / nodes, "max/min": spread}
            )  # fmt: skip
    return rows


def slope_main(args: argparse.Namespace) -> None:
    sizes = [int(n) for n in args.nodes.split(",")]
    if args.json:
        print(json.dumps(slope_times(sizes, args.streams, args.repeat)))
        return
    checkouts = {"this": str(Path(__file__).resolve().parents[1])}
    if args.baseline:
        checkouts = {"baseline": str(Path(args.baseline).resolve()), **checkouts}
    runs: dict[str, list[dict[str, list[list[float]]]]] = {label: [] for label in checkouts}
    for _ in range(args.rounds if args.baseline else 1):
        for label, path in checkouts.items():
            if args.baseline:
                runs[label].append(child_times(path, args))
            else:
                runs[label].append(slope_times(sizes, args.streams, args.repeat))
    rows = [row for label in checkouts for row in slope_rows(label, runs[label])]
    print_table(f"msched.schedule, {args.streams} streams, median of {args.repeat}", rows)
    for label in checkouts:
        for family in runs[label][0]:
            points = [[r["nodes"], r["schedule_ms"]] for r in rows
                      if r["checkout"] == label and r["family"] == family]  # fmt: skip
            print(f"log-log slope {label} {family}: {log_log_slope(points):.3f}")  # type: ignore[arg-type]


def main() -> None:
    global CLOCK
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--layers", default="12,61,244")
    parser.add_argument("--slope", action="store_true", help="time per node, 1k to 20k nodes")
    parser.add_argument("--nodes", default="1000,2000,5000,10000,20000")
    parser.add_argument("--baseline", help="another checkout to measure alongside (--slope)")
    parser.add_argument("--rounds", type=int, default=2, help="alternations with --baseline")
    parser.add_argument("--cpu", action="store_true", help="time.process_time, not wall time")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cpu:
        CLOCK = time.process_time
    if args.slope:
        slope_main(args)
        return
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

"""The makespan-memory trade-off of `msched.schedule`'s ``memory_budget``, per stream count.

Graphs (`msched.models.decoders.decoder_stack`, the sizes of issue 42): ``dense``, 6 layers,
hidden 64, 32 tokens; ``moe``, 12 layers, hidden 256, 64 tokens; the sharded stacks on rank 0
of 2 (functional collectives; building, scheduling and pricing them needs no process group),
4 layers, hidden 1024, 1024 tokens: ``tp`` (tensor parallel), ``ep`` (expert-parallel MoE,
all-to-all dispatch and combine), ``tp-2mb`` (tensor parallel, two micro-batches).  Sizes are
propagated from each stack's example inputs.  Costs are `msched.DefaultCostModel`'s.

For each graph, stream count (1-3) and budget (none, 1.0, 1.1, 1.25, 1.5) it prints the
makespan (cost-model units) and `msched.peak_memory`'s ``reserved_bound``, ``reserved`` and
``allocated`` of the schedule, each as a ratio to the original order's, measured in the same
run (first row of each graph, ``orig``: the figures in MiB).  No timing.

Run: ``python benchmarks/bench_memory.py [--fast] [--graphs dense,moe,...] [--streams 1,2,3]
[--budgets none,1.0,1.1,1.25,1.5] [--record]``; ``--record`` emits ``record_stream`` for
every protected cross-stream use (``keep_alive=False``, the emission of 0.1.0); ``--fast``
uses 2 layers and small sizes (the smoke test's).

``--emission`` prints instead, per graph and stream count (2, 3), the schedule without a
budget emitted both ways: ``record``, a ``record_stream`` on every cross-stream use the
allocator could otherwise race (``keep_alive=False``), and ``keep``, the storage kept alive
until its own stream joins the use where a later node of that stream does (the default):
the makespan (``msched.simulate``, cost-model units), ``allocated``, ``reserved`` and
``reserved_bound`` in MiB, and how many ``record_stream`` calls each emits for another
stream (``recs``) and for the tensor's own (``keeps``).  Both verify.

``--scale`` prints instead what `msched.peak_memory` costs as the graph grows (issue 42's
acceptance: linear, 1k to 20k nodes): dense decoder stacks (hidden 16, 8 tokens, sizes on the
nodes from `DecoderStack.with_sizes`) with as many layers as make about ``--nodes``
(default 1000,2500,5000,10000,20000) nodes, scheduled on ``--scale-streams`` streams (default
2; 1: the unscheduled graph).  Per graph: its nodes, the CPU seconds of this process (steadier
than wall time on a shared machine) of ``peak_memory`` (best of
3, a full ``gc.collect()`` before each), microseconds per node and that per-node time over
the smallest graph's (``ratio``: near 1 for a linear cost); then the same best of 3 with the
garbage collector off (``nogc_s``, ``nogc_ratio``: timeit's convention, the algorithm without
the collector's passes over the whole heap).
"""

from __future__ import annotations

import argparse
import gc
import time
from typing import Any

import msched
import msched.proof.interpreter
from msched.models.decoders import DecoderStack, decoder_stack

MIB = 1024 * 1024
GRAPHS: dict[str, dict[str, Any]] = {
    "dense": dict(n_layers=6, capture_layers=(1, 3, 5), hidden=64, tokens=32),
    "moe": dict(n_layers=12, capture_layers=(1, 5, 11), hidden=256, tokens=64, moe=True),
    "tp": dict(n_layers=4, capture_layers=(1, 3), hidden=1024, tokens=1024, tp=2, rank=0),
    "ep": dict(n_layers=4, capture_layers=(1, 3), hidden=1024, tokens=1024, moe=True, ep=2, rank=0),
    "tp-2mb": dict(
        n_layers=4, capture_layers=(1, 3), hidden=1024, tokens=1024, tp=2, microbatches=2, rank=0
    ),
}
FAST = dict(n_layers=2, capture_layers=(0, 1), hidden=64, tokens=32)
HEADER = ["graph", "streams", "budget", "makespan", "ratio", "bound", "reserved", "allocated"]


def build(name: str, fast: bool) -> DecoderStack:
    kwargs = dict(GRAPHS[name])
    if fast:
        kwargs.update(FAST)
    return decoder_stack(**kwargs)


def original_row(name: str, fast: bool) -> tuple[float, msched.MemoryReport]:
    stack = build(name, fast)
    serial = msched.simulate(stack.gm).makespan
    return serial, msched.peak_memory(stack.gm, example_inputs=stack.example_inputs())


def row(
    name: str, fast: bool, streams: int, budget: float | None, keep_alive: bool = True
) -> tuple[float, Any]:
    stack = build(name, fast)
    inputs = stack.example_inputs()
    sched = msched.schedule(
        stack.gm, streams, memory_budget=budget, example_inputs=inputs, keep_alive=keep_alive
    )
    if not msched.verify(sched.gm, original=sched.original).ok:
        raise SystemExit(f"{name} on {streams} streams, budget {budget}: verify failed")
    return sched.makespan, msched.peak_memory(stack.gm, example_inputs=inputs)


EMISSION_HEADER = ["graph", "streams", "emit", "makespan", "allocated", "reserved", "bound"]
EMISSION_HEADER += ["recs", "keeps"]


def stream_records(gm: Any) -> tuple[int, int]:
    """The ``record_stream`` nodes of ``gm``: for another stream than the tensor's, and for its
    own (keep-alives), as `msched.verify` reads them."""
    program = msched.proof.interpreter.interpret(gm.graph, None)
    steps = [s for s in program.steps if s.kind == "record_stream"]
    own = sum(1 for s in steps if s.to_stream == program.stream_of.get(s.tensor))
    return len(steps) - own, own


def emission(names: list[str], counts: list[int], fast: bool) -> None:
    """The ``--emission`` table: record_stream against keep-alive, no budget."""
    print("record_stream (record) against keep-alive until the join (keep); memory in MiB")
    print("".join(f"{h:>11}" for h in EMISSION_HEADER))
    for name in names:
        for k in counts:
            for keep in (False, True):
                stack = build(name, fast)
                inputs = stack.example_inputs()
                sched = msched.schedule(stack.gm, k, keep_alive=keep)
                if not msched.verify(sched.gm, original=sched.original).ok:
                    raise SystemExit(f"{name} on {k} streams, keep_alive={keep}: verify failed")
                mem = msched.peak_memory(stack.gm, example_inputs=inputs)
                figures = (mem.allocated, mem.reserved, mem.reserved_bound)
                cells = [name, str(k), "keep" if keep else "record", f"{sched.makespan:g}"]
                cells += [f"{f / MIB:.2f}" for f in figures]
                cells += [str(c) for c in stream_records(stack.gm)]
                print("".join(f"{c:>11}" for c in cells), flush=True)


SCALE_NODES = (1000, 2500, 5000, 10000, 20000)
SCALE_HEADER = ["nodes", "layers", "seconds", "us/node", "ratio", "nogc_s", "nogc_ratio"]


def scale_stack(nodes: int) -> DecoderStack:
    """A dense stack of about ``nodes`` nodes (at least 2 layers), its nodes sized."""

    def count(layers: int) -> int:
        return len(decoder_stack(layers, (0, layers - 1), hidden=16, tokens=8).gm.graph.nodes)

    base, per_layer = count(2), count(3) - count(2)
    layers = max(2, 2 + round((nodes - base) / per_layer))
    return decoder_stack(layers, (0, layers - 1), hidden=16, tokens=8).with_sizes()


def best_of_3(fn: Any, collect: bool) -> float:
    """The least process CPU time of three calls of ``fn``; ``collect``: the garbage collector
    on."""
    best = float("inf")
    for _ in range(3):
        gc.collect()
        if not collect:
            gc.disable()
        try:
            start = time.process_time()
            fn()
            best = min(best, time.process_time() - start)
        finally:
            gc.enable()
    return best


def scale(sizes: list[int], streams: int) -> None:
    """The ``--scale`` table: seconds of `msched.peak_memory` per graph size."""
    print(f"msched.peak_memory on dense decoder stacks, {streams} stream(s), best of 3")
    print("".join(f"{h:>11}" for h in SCALE_HEADER))
    first: tuple[float, float] | None = None
    for target in sizes:
        stack = scale_stack(target)
        gm = stack.gm if streams == 1 else msched.schedule(stack.gm, streams).gm
        n = len(gm.graph.nodes)
        seconds = best_of_3(lambda gm=gm: msched.peak_memory(gm), collect=True)
        nogc = best_of_3(lambda gm=gm: msched.peak_memory(gm), collect=False)
        if first is None:
            first = (seconds / n, nogc / n)
        cells = [str(n), str(stack.n_layers), f"{seconds:.3f}", f"{seconds / n * 1e6:.1f}"]
        cells += [f"{seconds / n / first[0]:.2f}", f"{nogc:.3f}", f"{nogc / n / first[1]:.2f}"]
        print("".join(f"{c:>11}" for c in cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="2 layers, small sizes")
    parser.add_argument("--graphs", default=",".join(GRAPHS), help="comma-separated")
    parser.add_argument("--streams", default="1,2,3", help="stream counts, comma-separated")
    parser.add_argument("--budgets", default="none,1.0,1.1,1.25,1.5", help="comma-separated")
    parser.add_argument("--emission", action="store_true", help="record_stream or keep-alive")
    parser.add_argument("--record", action="store_true", help="schedules with keep_alive=False")
    parser.add_argument("--scale", action="store_true", help="peak_memory's cost per size")
    parser.add_argument("--nodes", default=",".join(map(str, SCALE_NODES)), help="--scale sizes")
    parser.add_argument("--scale-streams", type=int, default=2, help="--scale's stream count")
    args = parser.parse_args()
    if args.scale:
        scale([int(n) for n in args.nodes.split(",")], args.scale_streams)
        return
    counts = [int(s) for s in args.streams.split(",")]
    if args.emission:
        emission(args.graphs.split(","), [k for k in counts if k > 1], args.fast)
        return
    trade_off(args, counts)


def trade_off(args: argparse.Namespace, counts: list[int]) -> None:
    """The default table: makespan and memory per stream count and budget."""
    budgets = [None if b == "none" else float(b) for b in args.budgets.split(",")]
    print("ratios to the original order (orig rows: makespan in cost units, memory in MiB)")
    print("".join(f"{h:>11}" for h in HEADER))
    for name in args.graphs.split(","):
        serial, base = original_row(name, args.fast)
        figures = (base.reserved_bound, base.reserved, base.allocated)
        cells = [name, "orig", "-", f"{serial:g}", "1.000", *(f"{f / MIB:.2f}" for f in figures)]
        print("".join(f"{c:>11}" for c in cells))
        for k in counts:
            for budget in budgets:
                makespan, mem = row(name, args.fast, k, budget, not args.record)
                ratios = (
                    mem.reserved_bound / base.reserved_bound,
                    mem.reserved / base.reserved,
                    mem.allocated / base.allocated,
                )
                shown = "none" if budget is None else f"{budget:g}"
                cells = [name, str(k), shown, f"{makespan:g}", f"{makespan / serial:.3f}"]
                cells += [f"{r:.3f}" for r in ratios]
                print("".join(f"{c:>11}" for c in cells))
                if budget is not None and mem.reserved_bound > budget * base.reserved_bound:
                    raise SystemExit(f"{name} on {k} streams: over the budget {budget}")


if __name__ == "__main__":
    main()

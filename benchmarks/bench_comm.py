"""How much communication `msched.schedule` hides, on sharded graphs, per stream count.

Graphs: the sharded decoder stacks of `msched.models.decoders.decoder_stack` on rank 0 of 2
(PyTorch's functional collectives on the default group; building them needs no process
group), every layer captured: ``tp``, tensor parallel (an all-reduce after the attention
output projection and after the MLP's down projection); ``tp-2mb``, the same with two
micro-batches (two-batch overlap: one micro-batch's all-reduce under the other's compute);
``ep-moe``, an expert-parallel MoE (all-to-all dispatch and combine, a shared expert).
Costs are `msched.DefaultCostModel`'s (a collective's communication ``--comm``, 30 by
default; a matmul 10).

For each graph and stream count it prints the makespan msched claims (and `msched.simulate`
of the emitted module confirms: a mismatch is an error), the serial makespan (the
unscheduled graph simulated: every collective waited right after its issue), their ratio,
the lower bound (`msched.analysis.bounds`, with communication as a latency and one channel
per group) and the makespan over it, and the optimum (`msched.optimal_makespan`, whose CP-SAT
model has the same communication; ``*`` marks one the solver did not prove within
``--time-limit`` seconds, "-" a run without OR-Tools) and the makespan over it.  No timing:
these are cost-model units.

Run: ``python benchmarks/bench_comm.py [--layers 2] [--streams 1,2,3] [--comm 30]
[--time-limit 10]``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from torch.fx import GraphModule

import msched
from msched.models.decoders import decoder_stack


def graphs(layers: int) -> dict[str, Callable[[], GraphModule]]:
    def stack(**kwargs: Any) -> Callable[[], GraphModule]:
        return lambda: decoder_stack(layers, tuple(range(layers)), rank=0, **kwargs).gm

    return {
        "tp": stack(tp=2),
        "tp-2mb": stack(tp=2, microbatches=2),
        "ep-moe": stack(moe=True, ep=2),
    }


def optimum(
    build: Callable[[], GraphModule], streams: int, model: msched.CostModel, limit: float
) -> tuple[float, bool] | None:
    """The solver's makespan and whether it is proven; None without OR-Tools."""
    try:
        found = msched.optimal_makespan(build(), streams, model, time_limit=limit)
    except msched.MissingDependencyError:
        return None
    return found.makespan, found.proven


def row(build: Callable[[], GraphModule], streams: int, model: msched.CostModel) -> list[float]:
    gm = build()
    sched = msched.schedule(gm, streams, cost_model=model)
    simulated = msched.simulate(gm, model).makespan
    if simulated != sched.makespan:
        raise SystemExit(f"simulated {simulated} != claimed {sched.makespan}")
    serial = msched.simulate(sched.original, model).makespan
    bound = sched.lower_bound
    return [sched.makespan, serial, sched.makespan / serial, bound, sched.makespan / bound]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2, help="layers of each stack")
    parser.add_argument("--streams", default="1,2,3", help="stream counts, comma-separated")
    parser.add_argument("--comm", type=float, default=msched.DefaultCostModel.COMM)
    parser.add_argument("--time-limit", type=float, default=10.0, help="solver seconds")
    args = parser.parse_args()
    model = msched.DefaultCostModel(comm=args.comm)
    counts = [int(s) for s in args.streams.split(",")]
    print(f"communication {args.comm:g} per collective, matmul 10 (msched.DefaultCostModel)")
    header = ["graph", "streams", "makespan", "serial", "ratio", "bound", "makespan/lb"]
    header += ["optimum", "makespan/opt"]
    print("".join(f"{h:>14}" for h in header))
    for name, build in graphs(args.layers).items():
        for k in counts:
            values = row(build, k, model)
            cells = [
                name,
                str(k),
                *(f"{v:.3f}" if i in (2, 4) else f"{v:g}" for i, v in enumerate(values)),
                *optimum_cells(optimum(build, k, model, args.time_limit), values[0]),
            ]
            print("".join(f"{c:>14}" for c in cells))


def optimum_cells(found: tuple[float, bool] | None, makespan: float) -> list[str]:
    if found is None:
        return ["-", "-"]
    best, proven = found
    return [f"{best:g}" + ("" if proven else "*"), f"{makespan / best:.3f}"]


if __name__ == "__main__":
    main()

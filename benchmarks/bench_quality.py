"""Quality of `msched.schedule` against the optimum, per graph family and stream count.

Families: random layered DAGs, MoE layers (3-16 unequal experts and a shared expert),
attention + MLP blocks with independent branches (`msched.testing.families`), traced
``nn.Module``s (small Inception, ResNeXt, FPN, DLRM and MoE models, here) and msched's decoder
stack.  Costs are `msched.DefaultCostModel`'s.  For each family and stream count (2-4) it
prints msched's simulated makespan (`msched.simulate` of the emitted module) over the optimum
CP-SAT proves on the same Dag and costs (`msched.optimal_makespan`, one worker, a time limit
per case): mean, p90, max and the share of cases at the optimum; the cases where the
simulated makespan differs from the claimed one (``sched.makespan``); the claimed makespans
of the heuristics side by side (forward pass only, forward + reversed top level, msched's
final); and the lower bound over the optimum.  Where CP-SAT proves no optimum in its time,
its best schedule stands in (counted in ``unproven``).

Run: ``python benchmarks/bench_quality.py [--quick] [--time-limit 5]`` (needs the
``optimal`` extra: ``pip install 'ortools>=9.8'``).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.fx import GraphModule

import msched
from msched.models.decoders import decoder_stack
from msched.scheduling.assign import PASSES, assign_streams
from msched.testing import families

HEURISTICS = {"forward": (), "reversed": ("reversed top level",), "final": PASSES}


class Inception(nn.Module):
    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.b1 = nn.Conv2d(c, c, 1)
        self.b3 = nn.Sequential(nn.Conv2d(c, c, 1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1))
        self.b5 = nn.Sequential(nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 5, padding=2), nn.ReLU())
        self.pool = nn.Sequential(nn.MaxPool2d(3, 1, 1), nn.Conv2d(c, c, 1))
        self.mix = nn.Conv2d(4 * c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            x = self.mix(torch.cat([self.b1(x), self.b3(x), self.b5(x), self.pool(x)], 1))
        return x


class ResNeXt(nn.Module):
    def __init__(self, c: int = 4, paths: int = 4) -> None:
        super().__init__()
        self.paths = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, c, 1), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1))
            for _ in range(paths)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(2):
            x = x + sum(p(x) for p in self.paths)
        return x


class FPN(nn.Module):
    def __init__(self, c: int = 4) -> None:
        super().__init__()
        self.down = nn.ModuleList(nn.Conv2d(c, c, 3, 2, 1) for _ in range(3))
        self.lateral = nn.ModuleList(nn.Conv2d(c, c, 1) for _ in range(4))
        self.smooth = nn.ModuleList(nn.Conv2d(c, c, 3, padding=1) for _ in range(4))
        self.up = nn.Upsample(scale_factor=2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        levels = [x]
        for d in self.down:
            levels.append(d(levels[-1]))
        top = self.lateral[3](levels[3])
        outs = [self.smooth[3](top)]
        for i in (2, 1, 0):
            top = self.up(top) + self.lateral[i](levels[i])
            outs.append(self.smooth[i](top))
        return tuple(outs)


class DLRM(nn.Module):
    def __init__(self, d: int = 8, tables: int = 6) -> None:
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.tables = nn.ModuleList(nn.Embedding(16, d) for _ in range(tables))
        self.top = nn.Sequential(nn.Linear(d * (tables + 1), d), nn.ReLU(), nn.Linear(d, 1))

    def forward(self, dense: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        feats = [self.bottom(dense)] + [t(idx[:, i]) for i, t in enumerate(self.tables)]
        return self.top(torch.cat(feats, 1))


class MoEModule(nn.Module):
    def __init__(self, d: int = 8, experts: int = 6) -> None:
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(
            nn.Sequential(*[m for _ in range(1 + i % 3) for m in (nn.Linear(d, d), nn.GELU())])
            for i in range(experts)
        )
        self.shared = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.router(x).softmax(-1)
        out = self.shared(x)
        for i, e in enumerate(self.experts):
            out = out + e(x) * gate[:, i : i + 1]
        return out


def _traced(module: nn.Module) -> Callable[[int], GraphModule]:
    return lambda seed: torch.fx.symbolic_trace(module)


def _decoder(seed: int) -> GraphModule:
    layers = 2 + seed % 4
    return decoder_stack(layers, (0, layers - 1), moe=seed % 2 == 1).gm


def family_cases(quick: bool) -> Iterator[tuple[str, Callable[[int], GraphModule], int]]:
    """(family, builder, number of seeds)."""
    n = 4 if quick else 24
    yield "layered", lambda s: families.layered_dag(s, layers=4 + s % 5, width=3 + s % 4), n
    yield "moe", families.moe_layer, n
    yield "attention", lambda s: families.attention_mlp(s, blocks=1 + s % 3), n
    modules = {
        "inception": Inception(),
        "resnext": ResNeXt(),
        "fpn": FPN(),
        "dlrm": DLRM(),
        "moe-module": MoEModule(),
    }
    for name, module in modules.items():
        yield name, _traced(module), 1
    yield "decoder", _decoder, 2 if quick else 8


def measure(gm: GraphModule, streams: int, time_limit: float) -> dict[str, float]:
    """One case: the optimum and what each heuristic claims; msched's final schedule is
    also emitted and simulated."""
    model = msched.DefaultCostModel()
    dag = msched.build_dag(gm)
    row = {h: assign_streams(dag, streams, model, p).makespan for h, p in HEURISTICS.items()}
    best = msched.optimal_makespan(gm, streams, time_limit=time_limit)
    sched = msched.schedule(gm, streams)
    row["simulated"] = msched.simulate(gm).makespan
    row["claimed"] = sched.makespan
    row["lower_bound"] = sched.lower_bound
    row["optimum"] = min(best.makespan, row["final"])
    row["proven"] = float(best.proven)
    return row


def _p90(values: list[float]) -> float:
    return sorted(values)[min(len(values) - 1, int(0.9 * len(values)))]


def summary(rows: list[dict[str, float]]) -> dict[str, str]:
    ratio = [r["simulated"] / r["optimum"] if r["optimum"] else 1.0 for r in rows]
    out = {
        "cases": str(len(rows)),
        "mean": f"{statistics.fmean(ratio):.4f}",
        "p90": f"{_p90(ratio):.4f}",
        "max": f"{max(ratio):.4f}",
        "at_opt%": f"{100 * sum(x <= 1 + 1e-9 for x in ratio) / len(ratio):.0f}",
        "mismatch": str(sum(r["simulated"] != r["claimed"] for r in rows)),
        "unproven": str(sum(not r["proven"] for r in rows)),
    }
    for h in HEURISTICS:
        values = [r[h] / r["optimum"] if r["optimum"] else 1.0 for r in rows]
        out[f"{h}_mean"] = f"{statistics.fmean(values):.4f}"
        out[f"{h}_max"] = f"{max(values):.4f}"
    bounds = [r["lower_bound"] / r["optimum"] if r["optimum"] else 1.0 for r in rows]
    out["lb/opt_min"] = f"{min(bounds):.4f}"
    return out


def print_table(table: list[tuple[str, str, dict[str, str]]]) -> None:
    columns = list(table[0][2])
    header = ["family", "streams", *columns]
    widths = [max(len(h), *(len(str(r[i])) for r in _rows(table))) for i, h in enumerate(header)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for row in _rows(table):
        print("  ".join(str(v).rjust(w) for v, w in zip(row, widths, strict=True)))


def _rows(table: list[tuple[str, str, dict[str, str]]]) -> list[list[str]]:
    return [[f, s, *d.values()] for f, s, d in table]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few cases per family")
    parser.add_argument("--time-limit", type=float, default=5.0, help="CP-SAT time per case")
    parser.add_argument("--streams", default="2,3,4", help="stream counts, comma-separated")
    args = parser.parse_args()
    table: list[tuple[str, str, dict[str, str]]] = []
    everything: list[dict[str, float]] = []
    for streams in (int(s) for s in args.streams.split(",")):
        for name, build, seeds in family_cases(args.quick):
            rows = [measure(build(seed), streams, args.time_limit) for seed in range(seeds)]
            everything += rows
            table.append((name, str(streams), summary(rows)))
    table.append(("all", "-", summary(everything)))
    print_table(table)


if __name__ == "__main__":
    main()

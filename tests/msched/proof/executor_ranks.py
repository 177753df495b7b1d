"""What the executor-on-ranks test runs on each rank (module level, so that the ranks import it).

`run_executor` builds each sharded stack on its rank, schedules it on 2 and 3 streams and runs
it with `msched.execute` in each adversarial order, against the unscheduled run on that rank.
Each order is a linear extension of the schedule's happens-before, and consecutive
collectives are ordered by happens-before (the Dag's collective chain, emitted as stream
order or an event, and checked by `msched.verify`), so every order issues the collectives in
the original order on every rank; a rank that issued them otherwise would hang the test.
"""

from __future__ import annotations

from typing import Any

import torch

import msched
from msched.analysis.collectives import collectives_in
from msched.models.decoders import decoder_stack

CASES: dict[str, dict[str, Any]] = {
    "tp": {"tp": 2},
    "tp-microbatches": {"tp": 2, "microbatches": 2},
    "ep": {"moe": True, "ep": 2},
}
STREAMS = (2, 3)
ORDERS = ("late-aux", "early-aux", "random", "search")


def _gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max().item())


def run_executor(rank: int, world_size: int) -> dict[str, Any]:
    """``{case/streams/order: {"out", "dest", "failure", "ran"}}`` plus each case's
    ``verify`` verdicts: the largest differences from the unscheduled run on this rank, and
    the collectives in the order the executor ran them against the original's."""
    found: dict[str, Any] = {}
    for name, kwargs in CASES.items():
        for k in STREAMS:
            stack = decoder_stack(2, (0, 1), rank=rank, **kwargs)
            x, dest = stack.example_inputs()
            want = stack.gm(x, dest)
            sched = msched.schedule(stack.gm, k)
            found[f"{name}/{k}/verify"] = msched.verify(stack.gm, original=sched.original).ok
            original = [c.node.name for c in collectives_in(sched.original.graph)]
            for order in ORDERS:
                x2, dest2 = stack.example_inputs()
                run = msched.execute(
                    stack.gm, x2, dest2, order=order, seeds=4, original=sched.original
                )
                ran = [n for n in run.order if n in set(original)]
                found[f"{name}/{k}/{order}"] = {
                    "out": _gap(run.output, want),
                    "dest": _gap(dest2, dest),
                    "failure": run.failure,
                    "differs": run.differs,
                    "collectives": ran == original,
                }
    return found

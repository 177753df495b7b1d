"""Schedules within a memory budget: `msched.schedule(gm, k, memory_budget=r)`.

Why: more overlap keeps more tensors alive, holds a collective's buffers longer and, through
the CUDA caching allocator's pool per stream, reserves more memory (`msched.proof.memory`);
a serving engine pays for every byte at its peak out of its KV cache.  The budget caps the
schedule's ``reserved_bound`` (what the allocator may hold under any timing) at ``r`` times
the original order's.

The rule, kept simple and sound: the candidates are the list schedules on ``k``, ``k - 1``,
..., 2 streams, each also with the nodes of each of `pin_sets` kept on stream 0 (a pool per
stream costs at least a segment; side streams that allocate only small blocks, or nothing,
cost less), on one stream (only when the graph has asynchronous collectives: that one
issues compute between a collective and its wait), and the original order on one stream.
Each is emitted into the graph (with the emission `msched.schedule` was asked for: by default
a cross-stream tensor kept alive until its stream's join, never more ``reserved_bound`` than
``record_stream``), priced with `msched.proof.memory.peak_memory_with` (sizes
read or propagated once, before scheduling) and taken back out; the shortest (the most
streams on a tie) whose ``reserved_bound`` is within the budget is kept.  Candidates are
priced in order of makespan and pricing stops at the first that fits, so a loose budget
costs two pricings more than no budget (the original order's and the first candidate's).
The original order is the graph itself: its bound is the original's, so every budget >= 1.0
is met and the error for a budget nothing meets (it names the smallest ratio a candidate
reached) guards only the unexpected.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch.fx import GraphModule, Node

from msched.analysis.cost import CostModel
from msched.analysis.nodes import INPUT_OPS
from msched.analysis.sizes import SizeEvaluator, storage_bytes
from msched.errors import InvalidArgumentError
from msched.proof.memory import SMALL_SIZE, MemoryReport, peak_memory_with
from msched.scheduling.assign import Assignment

__all__ = ["BudgetChoice", "Candidate", "check_memory_budget", "choose_within_budget", "pin_sets"]


def pin_sets(values: dict[Node, Any]) -> list[frozenset[Node]]:
    """The sets of nodes a budget's intermediate candidates keep on stream 0: those that
    allocate more than 1 MiB (side streams then hold only small 2 MiB segments), then
    every node that allocates (side streams run only in-place work, such as captures);
    distinct and non-empty, in that order."""
    evaluate = SizeEvaluator(None)
    sizes: dict[Node, int] = {}
    for node, value in values.items():
        if node.op in INPUT_OPS:
            continue
        items = value if isinstance(value, (list, tuple)) else (value,)
        found = [storage_bytes(v, evaluate) for v in items]
        sizes[node] = max((b for b in found if b), default=0)
    large = frozenset(n for n, b in sizes.items() if b > SMALL_SIZE)
    every = frozenset(n for n, b in sizes.items() if b)
    return [p for i, p in enumerate((large, every)) if p and p not in (large, every)[:i]]


def check_memory_budget(budget: object) -> float:
    """``budget`` as a float if it is a finite real number >= 1.0; `InvalidArgumentError`
    otherwise (bools and strings are refused)."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise InvalidArgumentError(
            f"memory_budget must be a number >= 1.0 (a ratio of the original order's "
            f"reserved_bound) or None, got {budget!r} ({type(budget).__name__})"
        )
    value = float(budget)
    if value == math.inf:
        raise InvalidArgumentError(
            "memory_budget must be finite: inf is no budget, pass memory_budget=None (the "
            "default) for none, or a finite ratio >= 1.0 of the original order's "
            "reserved_bound"
        )
    if not math.isfinite(value) or value < 1.0:
        raise InvalidArgumentError(
            f"memory_budget must be >= 1.0 (a ratio of the original order's reserved_bound; "
            f"1.0: no more than the original order), got {budget!r}; the original order on "
            "one stream always meets 1.0"
        )
    return value


@dataclass(frozen=True)
class Candidate:
    """A schedule to price: its assignment, and whether it is emitted (False: the original
    order on one stream, the graph as it is)."""

    assignment: Assignment
    emitted: bool = True


@dataclass(frozen=True)
class BudgetChoice:
    """The candidate kept, its memory, the original order's, and whether the graph holds it
    now (``emitted``: rewritten, else the original order)."""

    candidate: Candidate
    memory: MemoryReport
    original: MemoryReport
    emitted: bool


def choose_within_budget(
    gm: GraphModule,
    candidates: Sequence[Candidate],
    budget: float,
    values: dict[Node, Any],
    cost_model: CostModel | None,
    emit: Callable[[Assignment], None],
    take_back: Callable[[], None],
) -> BudgetChoice:
    """The shortest of ``candidates`` (the most streams, then the first, on a tie) whose
    ``reserved_bound`` is at most ``budget`` times the original order's (``gm`` as it is
    now).

    ``emit`` rewrites ``gm`` with an assignment and ``take_back`` restores the original
    order; the candidate chosen stays emitted."""
    original = peak_memory_with(gm, values, cost_model)
    limit = budget * original.reserved_bound
    ranked = sorted(
        range(len(candidates)),
        key=lambda i: (
            candidates[i].assignment.makespan,
            -candidates[i].assignment.num_streams,
            i,
        ),
    )
    ratios: list[float] = []
    for i in ranked:
        candidate = candidates[i]
        report = original
        if candidate.emitted:
            emit(candidate.assignment)
            report = peak_memory_with(gm, values, cost_model)
        if report.reserved_bound <= limit:
            return BudgetChoice(candidate, report, original, candidate.emitted)
        if candidate.emitted:
            take_back()
        ratios.append(report.reserved_bound / max(original.reserved_bound, 1))
    raise InvalidArgumentError(
        f"no schedule meets memory_budget={budget}: the smallest reserved_bound found is "
        f"{min(ratios, default=math.inf):.3f} times the original order's "
        f"({original.reserved_bound} bytes); pass memory_budget >= {min(ratios):.3f}"
    )

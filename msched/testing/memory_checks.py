"""Memory limits of a schedule as a test states them: ``assert_peak_memory`` and the
``msched_memory_budget`` option of the pytest plugin.

A limit is bytes (an int) or a ratio (a float >= 1.0) of the original order's
``reserved_bound`` (`msched.peak_memory`), the figure ``msched.schedule(...,
memory_budget=...)`` keeps within its budget.  `memory_problem` says what is wrong, or None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch.fx import GraphModule

from msched._text import counted
from msched.analysis.cost import CostModel
from msched.errors import InvalidArgumentError
from msched.proof.dialects import Dialect
from msched.proof.memory import MIB, MemoryReport, peak_memory

__all__ = ["MAX_RATIO", "check_limit", "memory_problem"]

# The largest ratio ``at_most`` takes.  Why: bytes computed as a float (``0.9 * free``,
# ``1.5 * 2**30``) would otherwise read as a ratio of billions and never fail.
MAX_RATIO = 1000.0


def check_limit(at_most: object) -> int | float:
    """``at_most`` if it is bytes (an int >= 0) or a ratio (a float from 1.0 to
    `MAX_RATIO`); `msched.InvalidArgumentError` otherwise."""
    if isinstance(at_most, int) and not isinstance(at_most, bool) and at_most >= 0:
        return at_most
    if isinstance(at_most, float) and at_most > MAX_RATIO and math.isfinite(at_most):
        raise InvalidArgumentError(
            f"at_most={at_most!r} is a float, so a ratio of the original order's "
            f"reserved_bound, and no ratio over {MAX_RATIO:g} limits anything: for bytes "
            f"pass an int (at_most=int({at_most!r}))"
        )
    if isinstance(at_most, float) and 1.0 <= at_most < float("inf"):
        return at_most
    raise InvalidArgumentError(
        f"at_most is bytes (an int >= 0) or a ratio of the original order's reserved_bound "
        f"(a float >= 1.0, e.g. 1.0 or 1.25), got {at_most!r}"
    )


def _mib(n: int) -> str:
    return f"{n / MIB:.2f} MiB ({counted(n, 'byte')})"


def memory_problem(
    gm: GraphModule,
    at_most: int | float,
    *,
    original: GraphModule | None = None,
    example_inputs: Sequence[Any] | None = None,
    cost_model: CostModel | None = None,
    dialect: Dialect | str | None = None,
    report: MemoryReport | None = None,
) -> str | None:
    """Why ``gm``'s ``reserved_bound`` is over ``at_most`` (`check_limit`), or None when it
    is not.  A ratio needs ``original``, the unscheduled graph (priced on one stream with the
    same ``example_inputs``); ``report``, when given, is ``gm``'s already."""
    limit = check_limit(at_most)
    if isinstance(limit, float) and original is None:
        raise InvalidArgumentError(
            f"at_most={limit} is a ratio of the original order's reserved_bound: pass a "
            "msched.Schedule (it keeps its original) or original=, or give bytes (an int)"
        )
    found = report or peak_memory(
        gm, cost_model=cost_model, dialect=dialect, example_inputs=example_inputs
    )
    bound = found.reserved_bound
    if isinstance(limit, float):
        assert original is not None
        base = peak_memory(original, cost_model=cost_model, example_inputs=example_inputs)
        allowed, stated = (
            limit * base.reserved_bound,
            (
                f"{limit:g} x the original order's {_mib(base.reserved_bound)} = "
                f"{_mib(int(limit * base.reserved_bound))}"
            ),
        )
        ratio = f", {bound / max(base.reserved_bound, 1):.3f} x the original's"
    else:
        allowed, stated, ratio = limit, _mib(limit), ""
    if bound <= allowed:
        return None
    pools = ", ".join(f"stream {s}: {_mib(b)}" for s, b in found.per_stream_bound.items())
    return (
        f"the schedule may reserve {_mib(bound)} under some timing (reserved_bound{ratio}), "
        f"over at_most {stated}\n  pools: {pools}\n  {found}\n"
        "  fewer streams or msched.schedule(..., memory_budget=...) lower it"
    )

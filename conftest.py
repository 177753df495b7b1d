"""Repository-wide test configuration (the plugin itself loads through its entry point).

Hypothesis profiles, chosen with ``MSCHED_HYPOTHESIS_PROFILE``: ``ci`` (default; at least 500
examples for the property test, derandomized so CI is reproducible), ``long`` (10,000) and
``dev`` (50, for a quick loop).  Tests that record a ``fault_detection`` property
(``{fault: [injected, detected]}``) are summed into one table at the end of the run, which
also works under xdist.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", max_examples=500, deadline=None, derandomize=True, suppress_health_check=_SLOW_OK
)
settings.register_profile(
    "long", max_examples=10_000, deadline=None, suppress_health_check=_SLOW_OK
)
settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=_SLOW_OK)
settings.load_profile(os.environ.get("MSCHED_HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    totals: dict[str, list[int]] = {}
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            for name, value in getattr(report, "user_properties", ()):
                if name != "fault_detection":
                    continue
                for fault, (injected, detected) in value.items():
                    row = totals.setdefault(fault, [0, 0])
                    row[0] += injected
                    row[1] += detected
    if totals:
        terminalreporter.write_sep("-", "fault injection: detected by msched.verify")
        for fault, (injected, detected) in sorted(totals.items()):
            terminalreporter.write_line(f"{fault:<34} {detected:>6} / {injected:<6} detected")

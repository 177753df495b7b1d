"""Repository-wide test configuration (the plugin itself loads through its entry point).

Two tiers.  The README's test command (``python -m pytest -n 2``) runs the default tier, the
fast feedback a contributor runs before every push.  ``--slow`` adds the slow tier, which
``.ci/run`` runs: the tests marked ``@pytest.mark.slow`` (compiles of whole models, runs of
the benchmark scripts, the ``-n 2`` twins of plugin tests that also run serially) and the
hypothesis tests at full breadth.  Mark a test slow when it costs more than a few seconds
and the default tier keeps a cheaper case of the same behaviour (a smaller model, one stream
count, the serial twin), or when it runs a whole script or model build; nothing is dropped,
CI runs every case.  A ``-m`` expression on the command line selects by marker as pytest
always does (``-m slow``: the slow tests only; ``-m "not slow"``: the default tier).

Hypothesis profiles, chosen with ``MSCHED_HYPOTHESIS_PROFILE``: ``ci`` (the slow tier's; at
least 500 examples for the property test, derandomized so CI is reproducible), ``default``
(the default tier's: 100, derandomized), ``long`` (10,000) and ``dev`` (50, for a quick loop).
Without the variable, the profile follows the tier.  Tests that record a ``fault_detection``
property (``{fault: [injected, detected]}``) are summed into one table at the end of the run,
which also works under xdist.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

SLOW_OPTION = "--slow"
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", max_examples=500, deadline=None, derandomize=True, suppress_health_check=_SLOW_OK
)
settings.register_profile(
    "default", max_examples=100, deadline=None, derandomize=True, suppress_health_check=_SLOW_OK
)
settings.register_profile(
    "long", max_examples=10_000, deadline=None, suppress_health_check=_SLOW_OK
)
settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=_SLOW_OK)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        SLOW_OPTION,
        action="store_true",
        help="run the slow tier too, as .ci/run does: tests marked slow, and hypothesis "
        "tests at the 'ci' profile (see conftest.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    tier = "ci" if config.getoption(SLOW_OPTION) else "default"
    settings.load_profile(os.environ.get("MSCHED_HYPOTHESIS_PROFILE", tier))


def pytest_report_header(config: pytest.Config) -> str:
    if config.getoption(SLOW_OPTION):
        return "msched tiers: default and slow (--slow)"
    return "msched tiers: default only (--slow adds the slow tier, as .ci/run does)"


@pytest.hookimpl(trylast=True)  # after syrupy's: it keeps the snapshots of deselected tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ``--slow`` (and without a ``-m`` expression), deselect the slow tier."""
    if config.getoption(SLOW_OPTION) or config.getoption("markexpr"):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


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

"""pytest-msched: the pytest plugin of msched (marker, fixtures, helpers, snapshots).

The plugin loads through the ``pytest11`` entry point; this package exports what downstream
tests import: the assertion helpers (rewritten by pytest, so failures show their values) and
the syrupy extension `ScheduledGraphExtension`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pytest

pytest.register_assert_rewrite("pytest_msched.assertions")

if TYPE_CHECKING:
    from pytest_msched.assertions import (
        assert_capture_safe,
        assert_captures_precede_output,
        assert_exit_waits_on,
        assert_peak_memory,
        assert_race_free,
        assert_survives_recompile,
    )
    from pytest_msched.snapshot import ScheduledGraphExtension

__all__ = [
    "ScheduledGraphExtension",
    "assert_capture_safe",
    "assert_captures_precede_output",
    "assert_exit_waits_on",
    "assert_peak_memory",
    "assert_race_free",
    "assert_survives_recompile",
]

# Imported on first use (PEP 562): the plugin loads this package in every pytest process, and
# the helpers import torch, which a pytest-xdist controller (it runs no test) does not need.
_HOMES = {
    "ScheduledGraphExtension": "pytest_msched.snapshot",
    "assert_capture_safe": "pytest_msched.assertions",
    "assert_captures_precede_output": "pytest_msched.assertions",
    "assert_exit_waits_on": "pytest_msched.assertions",
    "assert_peak_memory": "pytest_msched.assertions",
    "assert_race_free": "pytest_msched.assertions",
    "assert_survives_recompile": "pytest_msched.assertions",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])

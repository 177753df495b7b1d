"""pytest-msched: the pytest plugin of msched (marker, fixtures, helpers, snapshots).

The plugin loads through the ``pytest11`` entry point; this package exports what downstream
tests import: the assertion helpers and the syrupy extension `ScheduledGraphExtension`.

`_HOMES` is the one table of the public names: each with the module it lives in.
``__all__`` is made from it, and the ``TYPE_CHECKING`` imports below repeat it for type
checkers and IDEs, which cannot read a table; ``tests/plugin/test_exports.py`` fails when the
two disagree.  A new public name is one line in `_HOMES` and one import line below.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # ``import x as x``: re-exported, also under strict re-export rules
    from pytest_msched.assertions import assert_capture_safe as assert_capture_safe
    from pytest_msched.assertions import (
        assert_captures_precede_output as assert_captures_precede_output,
    )
    from pytest_msched.assertions import assert_exit_waits_on as assert_exit_waits_on
    from pytest_msched.assertions import assert_peak_memory as assert_peak_memory
    from pytest_msched.assertions import assert_race_free as assert_race_free
    from pytest_msched.assertions import assert_survives_recompile as assert_survives_recompile
    from pytest_msched.snapshot import ScheduledGraphExtension as ScheduledGraphExtension

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

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])

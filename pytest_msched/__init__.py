"""pytest-msched: the pytest plugin of msched (marker, fixtures, helpers, snapshots).

The plugin loads through the ``pytest11`` entry point; this package exports what downstream
tests import: the assertion helpers (rewritten by pytest, so failures show their values) and
the syrupy extension `ScheduledGraphExtension`.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("pytest_msched.assertions")

from pytest_msched.assertions import (  # noqa: E402
    assert_captures_precede_output,
    assert_exit_waits_on,
    assert_race_free,
    assert_survives_recompile,
)
from pytest_msched.snapshot import ScheduledGraphExtension  # noqa: E402

__all__ = [
    "ScheduledGraphExtension",
    "assert_captures_precede_output",
    "assert_exit_waits_on",
    "assert_race_free",
    "assert_survives_recompile",
]

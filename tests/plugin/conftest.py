"""Runs of pytest inside these tests must not believe they are pytest-xdist workers."""

from __future__ import annotations

import pytest

XDIST_WORKER_VARIABLES = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
)


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """When this suite runs under ``-n``, hide the worker's xdist variables from inner runs.

    syrupy (and pytest-xdist itself) read them from the environment: an inner run that sees
    them skips its snapshot report and leaves unused-snapshot handling to a controller that
    does not exist.
    """
    for name in XDIST_WORKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)

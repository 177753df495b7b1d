"""`ReadingContext`: the dialect and stream count the running test reads graphs with.

Its own module, below both `pytest_msched._session` (which sets it for each test) and
`pytest_msched.snapshot` (whose serializer reads it), so that neither imports the other.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from pytest_msched import _params

if TYPE_CHECKING:
    from msched.proof.dialects import Dialect

DIALECT_FIXTURE = "msched_dialect"

PLUGIN_DIALECT_HINT = (
    "configure it for pytest-msched's helpers, schedule_graph and snapshots: "
    "`msched_dialect = package.module:DIALECT` in the ini file, --msched-dialect=..., or a "
    "msched_dialect fixture in conftest.py; or pass dialect=... to the helper"
)
"""How `msched.UnreadStreamOpsError` says to give the dialect while the plugin reads a graph."""


class ReadingContext:
    """How the plugin's helpers, snapshots and dumps read graphs while a test (or, outside
    one, the session) runs: the dialect configured for it and the stream count it asked for.

    In a test the dialect is the value of its ``msched_dialect`` fixture (the ini or
    command-line value, or a ``conftest.py`` override), asked for the first time a helper
    needs it; outside a test it is ``session_dialect()``, the session's `Settings.dialect`.
    ``None``: detected from each graph's ops.  Set for the extent of a test by
    `MschedSession.reading`, so nothing outlives the test or the session (in-process
    ``pytester`` runs nest).
    """

    def __init__(
        self,
        session_dialect: Callable[[], Dialect | None],
        request: pytest.FixtureRequest | None = None,
    ) -> None:
        self._session_dialect = session_dialect  # the settings are resolved only when asked
        self._request = request
        self._dialect: list[Dialect | None] = []  # the dialect once looked up

    def dialect(self) -> Dialect | None:
        if not self._dialect:
            self._dialect.append(self._lookup())
        return self._dialect[0]

    def _lookup(self) -> Dialect | None:
        from msched.proof.dialects import as_dialect

        if self._request is None:
            return self._session_dialect()
        value = self._request.getfixturevalue(DIALECT_FIXTURE)
        return None if value is None else as_dialect(value)

    def updating_snapshots(self) -> bool:
        """Whether the run rewrites snapshots (syrupy's ``--snapshot-update``)."""
        config = self._request.config if self._request is not None else None
        return config is not None and bool(config.getoption("update_snapshots", False))

    def requested_streams(self) -> int | None:
        """The ``num_streams`` of the running test (``3`` in ``test[streams3]``), if any."""
        callspec = getattr(self._request.node, "callspec", None) if self._request else None
        count = callspec.params.get(_params.FIXTURE) if callspec is not None else None
        return count if isinstance(count, int) else None


_READING: contextvars.ContextVar[ReadingContext | None] = contextvars.ContextVar(
    "pytest_msched_reading", default=None
)


@contextlib.contextmanager
def reading_in(context: ReadingContext) -> Iterator[None]:
    """While this runs, `reading_context` is ``context``."""
    token = _READING.set(context)
    try:
        yield
    finally:
        _READING.reset(token)


@contextlib.contextmanager
def plugin_hint() -> Iterator[None]:
    """While this runs (a helper, ``schedule_graph`` or a snapshot reading a graph for the
    test), `msched.UnreadStreamOpsError` says to give the dialect the plugin's way
    (`PLUGIN_DIALECT_HINT`, `msched.errors.dialect_hint`); msched's own functions called in a
    test keep saying ``dialect=``, the only way they take one."""
    from msched.errors import dialect_hint  # msched (and torch) only once a graph is read

    with dialect_hint(PLUGIN_DIALECT_HINT):
        yield


def reading_context() -> ReadingContext | None:
    """The `ReadingContext` of the running test or session; None outside any pytest run."""
    return _READING.get()


def configured_dialect() -> Dialect | None:
    """The dialect the running test reads graphs in when a helper is given none (see
    `ReadingContext`); None (detect) outside a pytest run."""
    context = _READING.get()
    return None if context is None else context.dialect()

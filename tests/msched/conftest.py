"""Fixtures shared by msched's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import msched
from msched.analysis._collective_targets import REGISTERED
from msched.analysis._targets import OP_INFO_CACHE

from .sharded_graphs import ENGINE_ALL_REDUCE


@pytest.fixture
def engine_collective() -> Iterator[object]:
    """`ENGINE_ALL_REDUCE` registered as a collective for one test, then forgotten (left
    registered, it changed what later tests in the same worker read)."""
    op = ENGINE_ALL_REDUCE
    msched.register_collective(op, group="group_name")
    yield op
    REGISTERED.pop(op, None)
    OP_INFO_CACHE.clear()

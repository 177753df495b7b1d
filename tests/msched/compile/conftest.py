"""Fixtures of the compile tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def run_inductor_cache(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Path]:
    """An Inductor cache folder that starts empty in this run and that every xdist worker of
    the run shares for the requesting module (Inductor writes its entries atomically, under
    file locks, for processes that share a folder).  A module whose compiles must each run
    msched's pass uses it instead of Inductor's default folder, where an earlier run's entry
    could serve a graph without the pass; shared between the workers, a kernel one worker
    compiled is loaded, not compiled again, by the other."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base is a folder of the run's own (``popen-gw0``), new per run.
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / f"inductor-cache-{request.module.__name__.rsplit('.', 1)[-1]}"
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(folder))
        yield folder

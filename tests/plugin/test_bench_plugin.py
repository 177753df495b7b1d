"""``benchmarks/bench_plugin.py`` still runs and prints its tables (no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_plugin.py"
COLUMNS = ["snap/plain", "serial/xdist", "finish_s", "test_ms", "xstart_s", "finish/first"]


@pytest.mark.slow  # four pytest runs of a generated suite, each importing torch
def test_bench_plugin_prints_its_tables() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "4", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    headers = [line.split() for line in lines if line.split()[:1] == ["tests"]]
    assert len(headers) == 3, run.stdout
    assert all(any(c in h for h in headers) for c in COLUMNS), headers
    rows = [line.split() for line in lines if line.split()[:1] == ["4"]]
    assert [r[0] for r in rows] == ["4"] * 3, run.stdout
    for row in rows:
        assert all(float(v) >= 0 for v in row), row

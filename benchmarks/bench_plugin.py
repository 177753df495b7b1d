"""Benchmark of the pytest plugin at downstream scale: 200, 800 and 2,000 snapshot tests.

Each size is a generated test module in a temporary directory, the kind of suite a downstream
repository writes: ``@pytest.mark.multistream(streams=[2, 3])`` ×
``@pytest.mark.parametrize("seed", range(size // 2))``, each test building a 4-layer
``decoder_stack``, ``schedule_graph`` (schedule and verify), one helper
(``assert_exit_waits_on``) and ``assert sched == graph_snapshot``.  A second module, the same
without the snapshot, is the suite "without snapshots".  pytest is given the module's path, as
CI gives its test paths (syrupy then checks every snapshot file against the tests that ran).
The snapshots are written once (``--snapshot-update``, untimed); then the runs of a size —
serial and ``-n JOBS`` with snapshots, serial without — alternate ``--repeat`` times and the
medians are printed:

- ``serial_s`` / ``xdist_s``: wall time of the pytest process with snapshots, serial and with
  ``-n JOBS``; ``plain_s``: serial without snapshots;
- ``snap/plain``: serial with snapshots / without (the cost of the snapshot bookkeeping);
- ``serial/xdist``: the speed-up of ``-n JOBS`` over serial, with snapshots;
- ``finish_s``: time in ``pytest_sessionfinish``, serial with snapshots (syrupy's unused-snapshot
  detection runs there); ``xfinish_s``: the same on the xdist controller (it also waits there
  for the workers to shut down);
- ``test_ms``: per test, the setup + call + teardown time pytest reports, serial, with
  snapshots (what a test costs, without start-up and collection); ``wall_ms``: ``serial_s``
  per test.

The phases table splits the serial and the xdist (``x``) runs: ``plugins``, launch to the
suite's conftest on the controller (pytest and the plugins imported); ``start``, launch to the
first test; ``run``, first test to last (``run/xrun``: the speed-up of the test phase alone);
``end``, last test to exit.  The growth table divides each size by the first (linear
bookkeeping: ``finish/first`` grows like ``tests/first``).  Times come from a conftest the
generated suite carries (one JSON file per process); ratios are of runs in the same invocation,
alternated, so load on a shared machine affects them alike.

``--baseline DIR`` measures another checkout too (``PYTHONPATH=DIR``; a ``git worktree`` of the
commit before a change), alternating with this one, and prints every table for both.

Run: ``python benchmarks/bench_plugin.py [--sizes 200,800,2000] [--jobs 2] [--repeat 1]
[--baseline DIR]`` (``--quick``: sizes 20,80).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEST_MODULE = """
import pytest

from pytest_msched import assert_exit_waits_on


@pytest.mark.multistream(streams=[2, 3])
@pytest.mark.parametrize("seed", range({seeds}))
def test_stack(decoder_stack, schedule_graph{fixture}, seed):
    stack = decoder_stack(n_layers=4, capture_layers=(1, 3), seed=seed)
    sched = schedule_graph(stack.gm)
    assert_exit_waits_on(sched.gm, stack.captures[-1])
{assertion}"""

TIMING_CONFTEST = '''
"""Writes this process's timings to $BENCH_TIMINGS/<worker>.json (epoch seconds for events)."""
import json
import os
import time

import pytest

_TIMES = {"conftest": time.time(), "sessionfinish": 0.0, "tests": 0.0, "count": 0}


def _process_start():
    """When this process started (epoch seconds; Linux only, else when conftest loaded)."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return _TIMES["conftest"]


_TIMES["started"] = _process_start()


def pytest_collection_finish(session):
    _TIMES["collected"] = time.time()


def pytest_runtest_logstart(nodeid, location):
    _TIMES.setdefault("first_test", time.time())


def pytest_runtest_logfinish(nodeid, location):
    _TIMES["last_test"] = time.time()


def pytest_runtest_logreport(report):
    _TIMES["tests"] += report.duration
    _TIMES["count"] += report.when == "call"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_sessionfinish(session):
    t0 = time.perf_counter()
    try:
        return (yield)
    finally:
        _TIMES["sessionfinish"] = time.perf_counter() - t0
        _TIMES["finished"] = time.time()
        _TIMES["cpu"] = time.process_time()
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        path = os.path.join(os.environ["BENCH_TIMINGS"], name + ".json")
        with open(path, "w") as f:
            json.dump(_TIMES, f)
'''

# Named on the command line, as CI names its test paths (syrupy then matches every snapshot
# file against the tests that ran).
MODULE = "test_stacks.py"
# The generated suites use neither hypothesis nor the cache; their plugins cost each process.
PYTEST_ARGS = ("-q", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:randomly")


def write_suite(root: Path, tests: int, snapshots: bool) -> None:
    root.mkdir(parents=True)
    fixture, assertion = (", graph_snapshot", "    assert sched == graph_snapshot\n")
    if not snapshots:
        fixture, assertion = "", ""
    module = TEST_MODULE.format(seeds=tests // 2, fixture=fixture, assertion=assertion)
    (root / MODULE).write_text(module)
    (root / "conftest.py").write_text(TIMING_CONFTEST)
    (root / "pytest.ini").write_text("[pytest]\n")


def run_pytest(root: Path, *args: str, pythonpath: str | None = None) -> dict[str, float]:
    """Run pytest in ``root``; its wall time and the timings its processes wrote."""
    timings = root / "timings"
    timings.mkdir(exist_ok=True)
    for old in timings.iterdir():
        old.unlink()
    env = {**os.environ, "BENCH_TIMINGS": str(timings)}
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    launched, t0 = time.time(), time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", *PYTEST_ARGS, MODULE, *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    wall, ended = time.perf_counter() - t0, time.time()
    if run.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} failed in {root}:\n{run.stdout[-3000:]}")
    per_process = {p.stem: json.loads(p.read_text()) for p in timings.iterdir()}
    main = per_process.pop("main")
    runners = list(per_process.values()) or [main]  # the xdist workers, else this process
    first = min(t["first_test"] for t in runners)
    last = max(t["last_test"] for t in runners)
    return {
        "wall": wall,
        "finish": main["sessionfinish"],
        "tests": sum(t["tests"] for t in runners),
        "count": sum(t["count"] for t in runners),
        "conftest": main["conftest"] - launched,
        "startup": first - launched,
        "testing": last - first,
        "ending": ended - last,
    }


@dataclass
class Suite:
    """The two generated suites of one size for one checkout (``pythonpath`` None: this one)."""

    tests: int
    root: Path
    pythonpath: str | None
    runs: dict[str, list[dict[str, float]]] = field(
        default_factory=lambda: {"serial": [], "xdist": [], "plain": []}
    )

    def prepare(self) -> None:
        write_suite(self.root / "snap", self.tests, snapshots=True)
        write_suite(self.root / "plain", self.tests, snapshots=False)
        run_pytest(self.root / "snap", "--snapshot-update", pythonpath=self.pythonpath)

    def run_once(self, jobs: int) -> None:
        snap, plain, path = self.root / "snap", self.root / "plain", self.pythonpath
        self.runs["serial"].append(run_pytest(snap, pythonpath=path))
        self.runs["plain"].append(run_pytest(plain, pythonpath=path))
        self.runs["xdist"].append(run_pytest(snap, "-n", str(jobs), pythonpath=path))

    def rows(self) -> tuple[dict[str, Any], dict[str, Any]]:
        med = {
            kind: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
            for kind, rs in self.runs.items()
        }
        serial, xdist, plain = med["serial"], med["xdist"], med["plain"]
        assert serial["count"] == xdist["count"] == self.tests, med
        return {
            "tests": self.tests,
            "serial_s": serial["wall"],
            "xdist_s": xdist["wall"],
            "plain_s": plain["wall"],
            "snap/plain": serial["wall"] / plain["wall"],
            "serial/xdist": serial["wall"] / xdist["wall"],
            "finish_s": serial["finish"],
            "xfinish_s": xdist["finish"],
            "test_ms": serial["tests"] / self.tests * 1e3,
            "wall_ms": serial["wall"] / self.tests * 1e3,
        }, {
            "tests": self.tests,
            "start_s": serial["startup"],
            "run_s": serial["testing"],
            "end_s": serial["ending"],
            "xplugins_s": xdist["conftest"],
            "xstart_s": xdist["startup"],
            "xrun_s": xdist["testing"],
            "xend_s": xdist["ending"],
            "run/xrun": serial["testing"] / xdist["testing"],
        }


def measure(base: Path, tests: int, jobs: int, repeat: int, checkouts: dict[str, str | None]):
    """The rows of one size for every checkout, its runs alternating between checkouts."""
    suites = {name: Suite(tests, base / f"{name}{tests}", path) for name, path in checkouts.items()}
    for suite in suites.values():
        suite.prepare()
    for _ in range(repeat):
        for suite in suites.values():
            suite.run_once(jobs)
    return {name: suite.rows() for name, suite in suites.items()}


def print_table(title: str, rows: list[dict[str, float]]) -> None:
    cols = list(rows[0])
    print(title)
    print("  ".join(f"{c:>12}" for c in cols))
    for row in rows:
        print(
            "  ".join(
                f"{row[c]:>12.3f}" if isinstance(row[c], float) else f"{row[c]:>12}" for c in cols
            )
        )


def growth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    first = rows[0]
    return [
        {
            "tests": r["tests"],
            "tests/first": r["tests"] / first["tests"],
            "finish/first": r["finish_s"] / max(first["finish_s"], 1e-9),
            "wall/first": r["serial_s"] / first["serial_s"],
        }
        for r in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200,800,2000", help="tests per suite (even)")
    parser.add_argument("--quick", action="store_true", help="sizes 20,80")
    parser.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers (-n)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--baseline", help="another checkout to measure too (its PYTHONPATH)")
    args = parser.parse_args()
    sizes = [20, 80] if args.quick else [int(s) for s in args.sizes.split(",")]
    checkouts: dict[str, str | None] = {"this": None}
    if args.baseline:
        checkouts["baseline"] = args.baseline
    with tempfile.TemporaryDirectory(prefix="bench_plugin_") as tmp:
        results = [measure(Path(tmp), n, args.jobs, args.repeat, checkouts) for n in sizes]
    for name in checkouts:
        rows = [r[name][0] for r in results]
        where = "this checkout" if checkouts[name] is None else checkouts[name]
        print(f"== {where}")
        print_table(f"pytest-msched, 4-layer stacks, -n {args.jobs}, median of {args.repeat}", rows)
        print_table("phases (serial; x: -n JOBS), with snapshots", [r[name][1] for r in results])
        print_table(
            "growth against the smallest size (linear: finish/first = tests/first)", growth(rows)
        )


if __name__ == "__main__":
    main()

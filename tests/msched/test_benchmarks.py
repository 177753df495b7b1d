"""The CPU benchmarks still run and print their tables (no timing is asserted here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"
FAMILIES = ("decoder", "layered")  # bench_schedule.py --slope's graphs

# Each runs a benchmark script in a fresh process (torch imported, graphs compiled): the slow
# tier, which CI runs.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("script", "columns"),
    [
        (
            "bench_schedule.py",
            ["ratio", "recompile/floor", "analysis_ms", "waits/node", "makespan/lb"],
        ),
        ("bench_verify.py", ["nodes"]),
        ("bench_forward.py", ["streamops/compute", "unscheduled_ms", "scheduled_ms", "ratio"]),
    ],
)
def test_benchmark_prints_its_table(script: str, columns: list[str]) -> None:
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--layers", "2,3", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    header = next(line for line in lines if "layers" in line.split())
    assert all(c in header.split() for c in columns), header
    rows = [line.split() for line in lines if line.split()[:1] in (["2"], ["3"])]
    assert [r[0] for r in rows] == ["2", "3"]
    # Every value is a number; times and counts are non-negative.  ``analysis_ms`` is the
    # difference of two medians taken in one run (schedule minus recompile), which noise on
    # a loaded machine can push below zero at 2 layers: it is only checked to be a number
    # (the columns before it are one word each, so its index is the same in header and rows).
    names = header.split()
    differences = {names.index("analysis_ms")} if "analysis_ms" in names else set()
    for row in rows:
        assert all(float(v) >= 0 for i, v in enumerate(row) if i not in differences), row


def test_schedule_benchmark_prints_the_slope_of_this_and_a_baseline_checkout() -> None:
    """The table and the slopes, with their rows in order; no timing is judged (a slope of
    tiny graphs on a loaded machine may be anything, even negative)."""
    root = str(BENCHMARKS.parent)  # the baseline is this checkout too, in child processes
    command = [sys.executable, str(BENCHMARKS / "bench_schedule.py"), "--slope", "--cpu"]
    command += ["--nodes", "150,300", "--repeat", "1", "--rounds", "1", "--baseline", root]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].split() == ["checkout", "family", "nodes", "schedule_ms", "us/node", "max/min"]
    rows = [line.split() for line in lines[2:] if not line.startswith("log-log")]
    assert [r[:2] for r in rows] == [
        [checkout, family]
        for checkout in ("baseline", "this")
        for family in FAMILIES
        for _ in range(2)
    ]
    assert all(int(r[2]) >= 150 and len(r) == 6 for r in rows), rows
    for row in rows:
        [float(v) for v in row[3:]]  # numbers, whatever their values
    slopes = [line.split() for line in lines if line.startswith("log-log slope")]
    assert [s[2:4] for s in slopes] == [
        [checkout, f"{family}:"] for checkout in ("baseline", "this") for family in FAMILIES
    ]
    for slope in slopes:
        float(slope[4])


def test_quality_benchmark_prints_its_table() -> None:
    pytest.importorskip("ortools")
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_quality.py"), "--quick", "--streams", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    header = lines[0].split()
    assert header[:2] == ["family", "streams"]
    for column in ("mean", "p90", "max", "at_opt%", "mismatch", "forward_mean", "final_max"):
        assert column in header, column
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert {"layered", "moe", "attention", "resnext", "decoder", "all"} <= set(rows)
    total = rows["all"]
    assert total[header.index("mismatch")] == "0"  # simulate(emitted) == claimed, always
    assert all(float(v) >= 1.0 for v in total[header.index("mean") : header.index("at_opt%")])


def test_communication_benchmark_prints_its_table() -> None:
    run = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_comm.py"), "--layers", "1", "--streams", "1,2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr  # it exits with an error on a simulate mismatch
    lines = run.stdout.splitlines()
    header = lines[1].split()
    assert header == [
        *("graph", "streams", "makespan", "serial", "ratio", "bound", "makespan/lb"),
        *("optimum", "makespan/opt", "pytorch", "msched/pytorch"),
        *("alloc-KiB", "pytorch-KiB", "bound-MiB", "pytorch-bound-MiB"),
    ]
    graphs = ["tp", "tp-2mb", "ep-moe", "llama-tp"]
    notes = ["llama-tp: the largest of the 1 graph(s) Dynamo made of the sharded Llama's forward,"
             " 4 all-reduces (AOT, aten-level)"]  # fmt: skip
    if importlib.util.find_spec("transformers") is None:
        graphs.pop()
        notes = ["llama-tp: skipped, transformers is not installed (pip install transformers)"]
    rows = [line.split() for line in lines[2:-1]]
    # PyTorch's pass ran, and its order of every graph verifies: no other note under the table
    assert [r[:2] for r in rows] == [[g, k] for g in graphs for k in ("1", "2")], run.stdout
    assert lines[-1:] == notes
    column = {name: [r[header.index(name)] for r in rows] for name in header}
    at = header.index("optimum")
    assert all(float(r[at].rstrip("*")) <= float(r[2]) for r in rows)  # never above msched
    for row in rows:
        makespan, serial, ratio, bound, over = map(float, row[2:7])
        assert bound <= makespan <= serial and ratio <= 1.0 <= over
        theirs, ours_over_theirs = map(float, row[9:11])
        assert ours_over_theirs == pytest.approx(makespan / theirs, abs=1e-3)
        assert all(float(cell) > 0 for cell in row[11:])
    # one order per graph, on one stream: the same PyTorch cells on each of its rows
    for name in ("pytorch", "pytorch-KiB", "pytorch-bound-MiB"):
        assert column[name][0::2] == column[name][1::2]
    # the target: on one stream msched is never longer than PyTorch's pass
    one_stream = [r for r in rows if r[1] == "1"]
    assert all(float(r[header.index("msched/pytorch")]) <= 1.0 for r in one_stream)
    assert all(r[-2] == r[-1] for r in one_stream)  # one stream, one pool each


def test_the_gpu_inductor_benchmark_imports_and_says_it_needs_cuda(capsys) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_inductor", BENCHMARKS / "gpu_inductor.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = module.build_parser().parse_args(["--streams", "2", "--layers", "4"])
    assert (args.streams, args.layers, args.repeat) == (2, 4, 20)
    if module.torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run the benchmark itself")
    assert module.main([]) == 1
    assert "needs a CUDA device" in capsys.readouterr().out


def test_the_gpu_cuda_graphs_benchmark_imports_and_skips_on_cpu(capsys) -> None:
    import importlib.util

    path = BENCHMARKS / "gpu_cuda_graphs.py"
    spec = importlib.util.spec_from_file_location("gpu_cuda_graphs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = module.build_parser().parse_args(["--streams", "2", "--layers", "4"])
    assert (args.streams, args.layers, args.tokens, args.repeat) == (2, 4, 16, 50)
    assert module.VARIANTS == ("fx", "inductor")
    if module.torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run the benchmark itself")
    assert module.main([]) == 0
    assert "needs a CUDA device" in capsys.readouterr().out


def test_the_gpu_memory_benchmark_imports_and_says_it_needs_cuda(capsys) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_memory", BENCHMARKS / "gpu_memory.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = module.build_parser().parse_args(["--streams", "2", "--layers", "4"])
    assert (args.streams, args.layers, args.graphs, args.ways) == (
        "2",
        4,
        "dense,moe",
        "graph,fx,inductor",
    )
    # a row: pieces, measured allocated and reserved, the model's three figures (bytes)
    mib = module.MIB
    cells = module.row("dense", 2, "fx", (1, 3 * mib, 8 * mib, 3 * mib, 4 * mib, 8 * mib))
    assert cells.split() == [
        "dense", "2", "fx", "1", "3.00", "3.00", "1.00", "8.00", "4.00", "8.00", "2.00", "1.00"
    ]  # fmt: skip
    if module.torch.cuda.is_available():
        pytest.skip("a CUDA device is present: run the benchmark itself")
    assert module.main([]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "gpu_memory.py needs a CUDA device: torch.cuda.is_available() is False"
    ]


def test_memory_benchmark_prints_record_stream_against_keep_alive() -> None:
    """``--emission --fast`` on the MoE stack, 3 streams (its schedule protects 4 reads): one
    row per emission, the same makespan, the keep-alive's bound no higher, its protections all
    keep-alives."""
    command = [sys.executable, str(BENCHMARKS / "bench_memory.py"), "--emission", "--fast"]
    command += ["--graphs", "moe", "--streams", "3"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr  # it exits with an error if a schedule is unsound
    lines = run.stdout.splitlines()
    assert lines[1].split() == [
        "graph", "streams", "emit", "makespan", "allocated", "reserved", "bound", "recs", "keeps"
    ]  # fmt: skip
    record, keep = (line.split() for line in lines[2:])
    assert record[:3] == ["moe", "3", "record"] and keep[:3] == ["moe", "3", "keep"]
    assert record[3] == keep[3]
    assert float(keep[6]) <= float(record[6])
    assert (record[7], keep[7]) == ("4", "0") and (record[8], keep[8]) == ("0", "4")


def test_memory_benchmark_prints_the_trade_off() -> None:
    command = [sys.executable, str(BENCHMARKS / "bench_memory.py"), "--fast"]
    command += ["--streams", "1,2", "--budgets", "none,1.0"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr  # it exits with an error over a budget or unsound
    lines = run.stdout.splitlines()
    header = lines[1].split()
    assert header == [
        "graph", "streams", "budget", "makespan", "ratio", "bound", "reserved", "allocated"
    ]  # fmt: skip
    rows = [line.split() for line in lines[2:]]
    graphs = ["dense", "moe", "tp", "ep", "tp-2mb"]
    expected = [[g, k, b] for g in graphs for k, b in [("orig", "-")] + [
        (k, b) for k in ("1", "2") for b in ("none", "1")
    ]]  # fmt: skip
    assert [r[:3] for r in rows] == expected
    for row in rows:
        if row[2] == "1":
            assert float(row[5]) <= 1.0  # the bound within the budget
        if row[1] == "2" and row[2] == "none":
            assert float(row[5]) > 1.0  # the budget had something to do


def test_memory_benchmark_prints_the_cost_per_graph_size() -> None:
    """``--scale`` on two small stacks: the table's columns and a row per size, the first
    row's ratios 1 (no timing is judged)."""
    command = [sys.executable, str(BENCHMARKS / "bench_memory.py"), "--scale"]
    command += ["--nodes", "100,200", "--scale-streams", "2"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].split() == [
        "nodes", "layers", "seconds", "us/node", "ratio", "nogc_s", "nogc_ratio"
    ]  # fmt: skip
    rows = [line.split() for line in lines[2:]]
    assert len(rows) == 2
    assert int(rows[0][0]) < int(rows[1][0])  # more layers, more nodes
    assert rows[0][4] == rows[0][6] == "1.00"
    assert all(float(v) >= 0 for row in rows for v in row)


def test_costs_benchmark_prints_predicted_against_measured() -> None:
    """One row per decoder stack, and one for the tiny Llama when ``transformers`` is
    installed (else a line saying it is skipped); every value a positive number, none
    judged."""
    command = [sys.executable, str(BENCHMARKS / "bench_costs.py"), "--layers", "2"]
    command += ["--hidden", "16", "--tokens", "8", "--repeat", "1", "--warmup", "0"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    header = ["model", "nodes", "fwd_us", "fwd_drift", "isolated", "in_context", "predicted"]
    header += ["from_first", "overhead_us", "sched3/1"]
    assert lines[1].split() == header
    rows = [line.split() for line in lines[2:]]
    # from_first: the first stack's model pricing a larger stack ('-' on the first row and
    # the Llama's); with one warm-up-free repeat any ratio may round to 0 on a busy machine
    assert all(row[7] == "-" for row in rows)
    assert all(float(v) >= 0 for row in rows for v in row[1:7] + row[8:]), rows
    rows = [row[:7] + row[8:] for row in rows]
    try:
        import transformers  # noqa: F401

        assert [r[0] for r in rows] == ["decoder-2", "llama-3"]
    except ImportError:
        assert rows == [rows[0]] and rows[0][0] == "decoder-2"
        assert "transformers is not installed" in lines[0]
    assert all(float(row[2]) > 0 and float(row[-1]) > 0 for row in rows), rows

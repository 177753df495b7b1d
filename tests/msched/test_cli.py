"""Tests of the ``msched`` command, in-process through `msched.cli.main` and once as a script."""

from __future__ import annotations

import difflib
import io
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import msched
from msched import cli
from msched.cli.options import DEFAULT_STACK
from msched.cli.stack import Progress, build_and_schedule
from msched.models.decoders import decoder_stack
from msched.pictures.demo import layer_members

SMALL = ["--layers", "4", "--captures", "1,3", "--moe", "--streams", "3"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``msched argv`` (argparse exits via SystemExit)."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_demo_names_every_capture_and_verifies_2_and_3_streams(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(["demo"], capsys)
    assert code == 0, out + err
    assert err == ""
    rows = {line.split()[0]: line.split() for line in out.splitlines()[3:6]}
    assert set(rows) == {"1", "2", "3"}
    assert all(row[-1] == "ok" for row in rows.values())
    assert rows["1"][6] == "1.00x"  # speed-up
    captures = out.split("Captures, relative to output")[1].splitlines()[2:]
    for capture in ("capture_1", "capture_5", "capture_11"):
        joined = [line for line in captures if line.split()[1] == capture]
        assert [line.split()[0] for line in joined] == ["2", "3"]
        assert all("wait @" in line for line in joined)
    assert "Layer 5 on 3 streams" in out and "s2 |     wait @" in out


def test_demo_shows_the_peak_memory_and_its_ratio_per_stream_count(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(["demo"], capsys)
    assert code == 0
    head, *rows = out.splitlines()[2:6]
    assert "peak allocated" in head and "reserved bound" in head
    cells = {
        row.split()[0]: re.findall(r"(\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)) (\d+\.\d\dx)", row)
        for row in rows
    }
    assert all(len(found) == 2 for found in cells.values()), rows
    assert [ratio for _, ratio in cells["1"]] == ["1.00x", "1.00x"]  # one stream: the original's
    bounds = [float(cells[s][1][1][:-1]) for s in ("1", "2", "3")]
    assert bounds == sorted(bounds) and bounds[-1] > 1.0  # a pool per stream


def test_explain_shows_the_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["explain", *SMALL, "capture_3"], capsys)
    assert code == 0
    memory = out.split("Memory (msched.peak_memory):\n")[1].splitlines()
    assert memory[0].startswith("  peak: allocated ") and ", bound " in memory[0]
    assert memory[1].startswith("  after capture_3: ")


def test_the_layer_excerpt_comes_from_the_layers_the_stack_recorded() -> None:
    stack = decoder_stack(4, (1, 3), moe=True)
    layer_of = stack.layer_of
    assert (layer_of["l2_wq"], layer_of["capture_1"], layer_of["capture_3"]) == (2, 1, 3)
    assert not {"x", "dest", "final_ln", "output"} & set(layer_of)
    in_layers = [layer_of[n.name] for n in stack.gm.graph.nodes if n.name in layer_of]
    assert in_layers == sorted(in_layers) and set(in_layers) == {0, 1, 2, 3}
    run = build_and_schedule(4, (1, 3), True, 3)
    assert run.stack is not None
    members = layer_members(run.stack, 3)
    ops = {n.name for n in stack.gm.graph.nodes if n.op == "call_function"}
    assert members == {name for name in ops if layer_of.get(name) == 3}
    assert "capture_3" in members and "capture_1" not in members


def test_demo_out_writes_the_pictures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["demo", "--out", str(tmp_path)], capsys)
    assert code == 0
    svg = ET.fromstring((tmp_path / "demo-3streams.svg").read_text())
    lanes = [r for r in svg.iter("{http://www.w3.org/2000/svg}rect") if r.get("class") == "lane"]
    assert len(lanes) == 3
    trace = json.loads((tmp_path / "demo-2streams.trace.json").read_text())
    assert trace["traceEvents"]
    assert (tmp_path / "demo-1streams.dot").read_text().startswith("digraph msched {")
    assert str(tmp_path) in out


def test_demo_console_script_runs() -> None:
    script = Path(sys.executable).with_name("msched")
    if not script.exists():
        pytest.skip("the msched console script is not installed next to this interpreter")
    done = subprocess.run([str(script), "demo"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "capture_11" in done.stdout and done.stderr == ""


@pytest.mark.parametrize("fmt", ["text", "json", "dot", "trace", "svg"])
def test_schedule_writes_each_format(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["schedule", *SMALL, "--format", fmt], capsys)
    assert (code, err) == (0, "")
    if fmt == "text":
        assert out.startswith("# msched text format 2\n# streams 3, ")
        assert out.rstrip().endswith(")")
    elif fmt in ("json", "trace"):
        data = json.loads(out)
        assert data["streams"] == 3 if fmt == "json" else data["traceEvents"]
    elif fmt == "dot":
        assert out.startswith("digraph msched {") and "cluster_s2" in out
    else:
        ET.fromstring(out)


def test_schedule_json_is_byte_identical_across_runs(capsys: pytest.CaptureFixture[str]) -> None:
    first = run(["schedule", *SMALL, "--format", "json"], capsys)[1]
    second = run(["schedule", *SMALL, "--format", "json"], capsys)[1]
    assert first == second


def test_schedule_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "s.svg"
    code, out, _ = run(["schedule", *SMALL, "--format", "svg", "-o", str(target)], capsys)
    assert (code, out) == (0, "")
    ET.fromstring(target.read_text())


def test_schedule_with_roofline_costs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["schedule", *SMALL, "--cost", "roofline"], capsys)
    assert code == 0 and out.startswith("# msched text format 2\n# streams 3")


def test_explain_last_capture_names_the_exit_dependency(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(["explain", *SMALL, "capture_3"], capsys)
    assert code == 0
    assert out.startswith("capture_3 = msched.inplace_slice_copy.default(")
    exit_line = next(line for line in out.splitlines() if line.lstrip().startswith("output "))
    assert "exit" in exit_line.split() and "joined by wait @capture_3 " in exit_line
    assert "exit dependency" in out
    assert "Why stream" in out and "Waits right before capture_3:" in out


def test_explain_a_node_after_a_cross_stream_wait(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["explain", *SMALL, "output"], capsys)
    assert code == 0
    assert "capture_1" in out and "capture_3" in out
    assert "  wait @capture_3: recorded on stream 1" in out.split("Waits right before output:")[1]


@pytest.mark.parametrize(
    "argv",
    [
        ["schedule", "--streams", "0"],
        ["schedule", "--layers", "4", "--captures", "1,4"],
        ["schedule", "--format", "png"],
        ["schedule", "--cost", "magic"],
        ["schedule", "--captures", "one"],
        ["explain", "--layers", "4", "--captures", "1,3", "no_such_node"],
        ["explain", "--streams", "-1", "capture_1"],
        ["schedule", "--streams", "4096"],
        ["schedule", "--streams", "65"],
        ["demo", "--out", "/dev/null/pictures"],
        ["frobnicate"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and "error: " in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--streams", "0"], "argument --streams: expected a stream count from 1 to 64, got '0'"),
        (["--captures", ",0"], "expected comma-separated layer numbers such as 1,5,11"),
        (["--captures", "1,,3"], "expected comma-separated layer numbers such as 1,5,11"),
        (["--layers", "4", "--captures", "3,5"], "capture layer 5 is beyond the stack"),
        (["--layers", "4", "--captures", "5,9,11"], "capture layers 5, 9 and 11 are beyond"),
    ],
)
def test_each_bad_stack_option_is_said_in_the_options_words(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["schedule", *argv], capsys)
    assert (code, out) == (2, "")
    assert err.startswith("msched schedule: error: ") and said in err
    assert "num_streams" not in err and len(err.splitlines()) == 1


def test_python_dash_m_runs_the_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "msched.cli", "--version"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (0, f"msched {msched.__version__}\n"), done.stderr


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"msched {msched.__version__}\n"


@pytest.mark.parametrize("command", ["demo", "schedule", "explain", "diff"])
def test_help_for_each_subcommand(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([command, "--help"], capsys)
    assert code == 0
    assert out.startswith(f"usage: msched {command}")


def test_progress_is_quiet_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["schedule", "--layers", "60", "--captures", "59", "--moe"], capsys)
    assert (code, err) == (0, "")


def test_progress_shows_on_a_terminal_for_big_graphs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert Progress.for_layers(60, moe=True).enabled
    assert not Progress.for_layers(12, moe=True).enabled
    buf = io.StringIO()
    progress = Progress(buf, enabled=True)
    progress.step("scheduling 2700 nodes on 3 streams")
    progress.done()
    assert "scheduling 2700 nodes" in buf.getvalue()


def test_explain_a_wait_names_the_node_it_is_issued_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(["explain", *SMALL, "wait_event_3"], capsys)
    assert code == 0
    assert out.startswith("wait_event_3: wait @")
    assert "it is issued for " in out and "it orders " in out


def test_streams_above_the_bound_say_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["schedule", "--streams", "4096"], capsys)
    assert (code, out) == (2, "")
    assert err == (
        "msched schedule: error: argument --streams: expected a stream count from 1 to 64, "
        "got '4096'\n"
    )
    assert "Traceback" not in err


@pytest.mark.parametrize("where", ["missing/x.txt", "file/x.txt", "."])
def test_an_output_that_cannot_be_written_exits_2_naming_it(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / where
    code, out, err = run(["schedule", *SMALL, "-o", str(path)], capsys)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1
    assert err.startswith(f"msched schedule: error: cannot write {path}: ")
    assert any(why in err for why in ("No such file", "Not a directory", "Is a directory"))


def test_a_demo_directory_that_cannot_be_made_exits_2_before_scheduling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(cli, "_demo_rows", lambda progress: pytest.fail("scheduled first"))
    code, out, err = run(["demo", "--out", str(tmp_path / "file" / "pictures")], capsys)
    assert (code, out) == (2, "")
    assert err == (
        f"msched demo: error: cannot create directory {tmp_path / 'file' / 'pictures'}: "
        "Not a directory\n"
    )


def test_any_msched_error_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise msched.InvalidGraphError("the graph has a cycle:\n cos -> cos")

    monkeypatch.setattr("msched.cli.stack.build_and_schedule", broken)
    code, out, err = run(["schedule", *SMALL], capsys)
    assert (code, out) == (2, "")
    assert err == "msched schedule: error: InvalidGraphError: the graph has a cycle: cos -> cos\n"


# --- diff ------------------------------------------------------------------------------------

STACK12 = ["--layers", "12", "--moe", "--streams", "3"]


def _changed_lines(a: Path, b: Path) -> int:
    """``diff a b | grep -c '^[<>]'``: lines only one of the files has, in a line diff."""
    if shutil.which("diff"):
        done = subprocess.run(["diff", str(a), str(b)], capture_output=True, text=True)
        return sum(1 for line in done.stdout.splitlines() if line.startswith(("<", ">")))
    lines = difflib.unified_diff(a.read_text().splitlines(), b.read_text().splitlines(), n=0)
    return sum(1 for line in lines if line[:1] in "+-" and line[:3] not in ("+++", "---"))


def test_one_more_capture_changes_a_few_lines_and_diff_names_only_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The experiment of issue 15: one capture more, early in a 12-layer MoE stack."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    fmt = ["--format", "text", "-o"]
    assert run(["schedule", *STACK12, "--captures", "1,5,11", *fmt, str(a)], capsys)[0] == 0
    assert run(["schedule", *STACK12, "--captures", "0,1,5,11", *fmt, str(b)], capsys)[0] == 0
    assert _changed_lines(a, b) <= 15  # 307 when events were numbered
    code, out, err = run(["diff", str(a), str(b)], capsys)
    assert (code, err) == (1, "")
    first, counts = out.splitlines()
    m = re.fullmatch(r"\+ capture_0 on s(\d) \(waits for (\w+) on s(\d); joined by output\)", first)
    assert m is not None, first
    stream, waited, recorded_on = m.groups()
    assert counts.startswith("nodes 481 → 482, events 76 → 77, waits 100 → 101, makespan 810 → 810")
    # The lines the text gained are the capture, its wait and the record it waits for.
    new = set(b.read_text().splitlines()) - set(a.read_text().splitlines())
    lane, indent = f"s{stream} | ", "  " * int(stream)
    assert any(  # ``wait @X``, or ``switch, wait ... @X ...`` where the stream switched
        line.startswith(f"{lane}{indent}") and "wait " in line and f"@{waited}" in line.split()
        for line in new
    ), new
    assert f"s{recorded_on} | {'  ' * int(recorded_on)}record @{waited}" in new
    assert any(line.startswith(f"{lane}{indent}capture_0 = ") for line in new)


def test_diff_of_the_same_schedule_exits_0_silently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, doc = tmp_path / "s.txt", tmp_path / "s.json"
    run(["schedule", *SMALL, "-o", str(text)], capsys)
    run(["schedule", *SMALL, "--format", "json", "-o", str(doc)], capsys)
    for argv in (
        [str(text), str(doc)],
        [str(text), *SMALL],
        [*SMALL, "vs", "--streams", "3"],
        [str(doc), "vs", *SMALL],
    ):
        assert run(["diff", *argv], capsys) == (0, "", ""), argv


def test_every_command_builds_the_default_stack_its_help_states(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    default = DEFAULT_STACK
    given = ["--layers", str(default.layers), "--captures", ",".join(map(str, default.captures))]
    given += ["--streams", str(default.streams), "--cost", default.cost]
    plain = tmp_path / "plain.txt"
    run(["schedule", "-o", str(plain)], capsys)
    assert run(["schedule", *given], capsys)[1] == plain.read_text()
    assert run(["diff", str(plain), "--no-moe"], capsys) == (0, "", "")  # diff's defaults
    assert run(["diff", "--no-moe", "vs", *given], capsys) == (0, "", "")
    for command in ("schedule", "diff"):
        helps = " ".join(run([command, "--help"], capsys)[1].split())
        assert f"(default {given[3]})" in helps and f"(default {default.layers})" in helps


def test_diff_of_two_stacks_takes_the_right_from_the_left(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(["diff", *SMALL, "vs", "--streams", "2"], capsys)
    assert (code, err) == (1, "")
    assert out.splitlines()[-1].startswith("streams 3 → 2, events ")
    assert any(line.startswith("~ ") and " s2 → " in line for line in out.splitlines())
    code, out, _ = run(["diff", *SMALL, "vs", "--no-moe"], capsys)
    assert code == 1 and "- moe_experts_default on s1" in out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["one.txt"],
        ["a.txt", "b.txt", "c.txt"],
        ["a.txt", "b.txt", "--streams", "2"],
        ["vs", "vs"],
        ["a.txt", "vs", "b.txt", "vs", "c.txt"],
        ["missing.txt", "missing.txt"],
        ["bad.txt", "bad.txt"],
        ["--layers", "2", "--captures", "5", "vs", "--streams", "2"],
        ["--streams", "0", "vs", "--streams", "2"],
        ["--frobnicate", "vs"],
    ],
)
def test_diff_of_bad_input_exits_2_with_one_line(
    argv: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.txt").write_text("# streams 1\nnot a schedule\n")
    code, out, err = run(["diff", *argv], capsys)
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and err.startswith("msched diff: error: "), err


def test_explain_a_switch_that_records_says_the_record_on_the_old_stream_then_the_switch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(["explain", *SMALL, "set_stream_2"], capsys)
    assert code == 0
    first, second, *rest = out.splitlines()
    assert first.startswith("set_stream_2: record @") and first.endswith(", then")
    assert second.startswith("set_stream_2: switch, wait @")
    assert any(line.startswith("  record @") and " waited on by " in line for line in rest)

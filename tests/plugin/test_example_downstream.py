"""examples/downstream/, run the way a downstream repository runs it.

The example is a toy inference engine with its own op namespace (``toyeng``), its own
multi-stream pass (``toyengine.multistream.schedule``) and two historical bugs of that pass
behind ``TOYENG_BUG``.  It points the plugin at its pass with a ``conftest.py`` (fixtures
``msched_scheduler`` and ``msched_dialect``) or, in its ``ini-form/``, with the ini options of
the same names.  Each run copies the example into ``pytester``'s directory and runs pytest in
a subprocess (the engine registers its ops once per process, as real engines do):

- clean: every test passes, ``[streams2]`` and ``[streams3]``, against the committed
  snapshots, serially and under ``-n 2``; ``--snapshot-update`` without snapshots writes
  the committed ones;
- ``TOYENG_BUG=1`` (a capture emitted after ``output``) and ``TOYENG_BUG=2`` (an exit that does
  not wait for the auxiliary stream that ran a capture): every test fails, naming the last
  capture, with ``--msched-verify=strict`` (``schedule_graph`` reports it) and
  ``--msched-verify=off`` (the helpers report it).

``test_toyengine_*`` check the engine itself with msched, without the plugin.
"""

from __future__ import annotations

import copy
import re
import shutil
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.fx import GraphModule

import msched
from msched.models.decoders import decoder_stack

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "downstream"
SNAPSHOTS = Path("tests", "__snapshots__", "test_engine")
LAST_CAPTURE = {"test_eagle3_decoder": "capture_5", "test_moe_decoder": "capture_1"}
IDS = sorted(f"{test}[streams{n}]" for test in LAST_CAPTURE for n in (2, 3))
# The inner suites do not use hypothesis; its plugin costs a second in each process.
WITHOUT_HYPOTHESIS = ("-p", "no:hypothesispytest")
TIMEOUT = 600.0  # seconds a pytest subprocess may run
BUG_MESSAGES = {
    # schedule_graph (verify): "[after-output] `capture_5` comes after output and never runs";
    # assert_captures_precede_output: "capture_1 (stream 0), capture_3 (stream 0) and
    # capture_5 (stream 0) are emitted after output: ...".
    "1": r"\b{capture}\b`?( \(stream \d+\))? (comes|is emitted|are emitted) after `?output`?",
    # verify: "[exit-not-joined] output on stream 0 does not wait for `capture_5` on stream 1";
    # assert_exit_waits_on: "output on stream 0 does not wait for capture_5 (stream 1): ...".
    "2": r"output on stream 0 does not wait for `?{capture}\b",
}
SUMMARY = [
    "*- msched summary -*",
    "graphs scheduled: 4 (streams2: 2, streams3: 2)",
    "total waits: *",
    "violations: 0",
]


def _committed_snapshots() -> dict[str, str]:
    found = {p.name: p.read_text() for p in sorted((EXAMPLE / SNAPSHOTS).glob("*"))}
    assert sorted(found) == [f"{test_id}.msched.txt" for test_id in IDS], (
        f"{EXAMPLE.relative_to(EXAMPLE.parents[1]) / SNAPSHOTS} must hold the reviewed "
        "snapshots of the example's tests: write them with `cd examples/downstream && "
        "python -m pytest --snapshot-update`, review them and commit them"
    )
    return found


def _copy_example(pytester: pytest.Pytester, form: str) -> Path:
    """The example as a repository of its own in ``pytester.path``, configured by ``form``."""
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.egg-info")
    shutil.copytree(EXAMPLE, pytester.path, dirs_exist_ok=True, ignore=ignore)
    if form == "ini":
        (pytester.path / "conftest.py").unlink()
        shutil.copy(pytester.path / "ini-form" / "pytest.ini", pytester.path / "pytest.ini")
    return pytester.path / SNAPSHOTS


def _snapshots(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.glob("*"))}


def _passed_ids(result: pytest.RunResult) -> list[str]:
    """Test ids of the PASSED lines of a ``-v`` run (serial or xdist layout)."""
    ids = (re.search(r"test_engine\.py::(\S+)", line) for line in result.outlines)
    lines = zip(result.outlines, ids, strict=True)
    return sorted(m.group(1) for line, m in lines if m is not None and "PASSED" in line)


def _failure_sections(result: pytest.RunResult) -> dict[str, str]:
    """The text of each test's section under FAILURES, by test id."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in result.outlines:
        header = re.fullmatch(r"_{3,} (\S+) _{3,}", line)
        if header is not None:
            current = sections.setdefault(header.group(1), [])
        elif re.fullmatch(r"=+ .* =+|-+ msched summary -+", line):
            current = None
        elif current is not None:
            current.append(line)
    return {test_id: "\n".join(lines) for test_id, lines in sections.items()}


# Each case is a pytest subprocess: the default tier runs the serial conftest form.
@pytest.mark.parametrize(
    ("form", "workers"),
    [
        pytest.param("conftest", (), id="serial-conftest"),
        pytest.param("ini", (), id="serial-ini", marks=pytest.mark.slow),
        pytest.param("conftest", 2, id="n2-conftest", marks=pytest.mark.slow),
        pytest.param("ini", 2, id="n2-ini", marks=pytest.mark.slow),
    ],
)
def test_clean_engine_passes_with_its_snapshots(
    pytester: pytest.Pytester, form: str, workers: int | tuple[()]
) -> None:
    committed = _committed_snapshots()
    snapshots = _copy_example(pytester, form)
    xdist = ("-n", str(workers)) if workers else ()
    result = pytester.runpytest_subprocess("-v", *xdist, *WITHOUT_HYPOTHESIS, timeout=TIMEOUT)
    result.assert_outcomes(passed=4)
    assert _passed_ids(result) == IDS
    result.stdout.fnmatch_lines(SUMMARY)
    result.stdout.fnmatch_lines(["*snapshot report summary*", "4 snapshots passed."])
    for word in ("failed", "updated", "generated", "deleted", "unused"):
        result.stdout.no_fnmatch_line(f"*snapshot* {word}*")
    assert result.stdout.str().count("msched summary") == 1
    assert _snapshots(snapshots) == committed


def test_snapshot_update_rewrites_the_committed_snapshots(pytester: pytest.Pytester) -> None:
    """A user's first run: ``pytest --snapshot-update`` with no snapshots writes the ones
    committed (the pass is deterministic), and a plain run then passes against them."""
    committed = _committed_snapshots()
    snapshots = _copy_example(pytester, "conftest")
    shutil.rmtree(snapshots)
    first = pytester.runpytest_subprocess("--snapshot-update", *WITHOUT_HYPOTHESIS, timeout=TIMEOUT)
    first.assert_outcomes(passed=4)
    first.stdout.fnmatch_lines(["4 snapshots generated."])
    assert _snapshots(snapshots) == committed
    pytester.runpytest_subprocess(*WITHOUT_HYPOTHESIS, timeout=TIMEOUT).assert_outcomes(passed=4)


# Each case is a pytest subprocess.  The default tier runs a pairwise cover (every bug, verify
# mode and form, and every pair of them, at least once); the slow tier the rest of the product.
_PAIRWISE = {("1", "strict", "conftest"), ("2", "strict", "ini"), ("1", "off", "ini"),
             ("2", "off", "conftest")}  # fmt: skip
BUG_CASES = [
    pytest.param(
        bug,
        verify,
        form,
        id=f"{bug}-{verify}-{form}",
        marks=() if (bug, verify, form) in _PAIRWISE else pytest.mark.slow,
    )
    for bug in ("1", "2")
    for verify in ("strict", "off")
    for form in ("conftest", "ini")
]


@pytest.mark.parametrize(("bug", "verify", "form"), BUG_CASES)
def test_historical_bug_fails_naming_the_capture(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, form: str, verify: str, bug: str
) -> None:
    _copy_example(pytester, form)
    monkeypatch.setenv("TOYENG_BUG", bug)
    result = pytester.runpytest_subprocess(
        f"--msched-verify={verify}", *WITHOUT_HYPOTHESIS, timeout=TIMEOUT
    )
    result.assert_outcomes(failed=4)
    sections = _failure_sections(result)
    assert sorted(sections) == IDS
    for test_id, text in sections.items():
        capture = LAST_CAPTURE[test_id.split("[")[0]]
        message = BUG_MESSAGES[bug].format(capture=re.escape(capture))
        assert re.search(message, text), f"no /{message}/ in the failure of {test_id}:\n{text}"
        if verify == "off":  # the helpers caught it, not schedule_graph
            assert "msched.verify found violations" not in text
            assert "AssertionError" in text
    if verify == "off":
        result.stdout.fnmatch_lines(["violations: 0 (4 graphs not verified: --msched-verify=off)"])
    else:
        result.stdout.fnmatch_lines(["violations: *"])
        result.stdout.no_fnmatch_line("violations: 0*")


# --- the engine itself, checked with msched directly (no plugin involved) --------------------


@pytest.fixture(scope="module")
def toyengine() -> ModuleType:
    """The example's engine package, imported once per process (it registers ``toyeng``)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(EXAMPLE))
        import toyengine

    return toyengine


def _stack(toyengine: ModuleType, **kwargs: object) -> GraphModule:
    """A decoder stack whose captures are the engine's ``toyeng::inplace_slice_copy``."""
    gm = decoder_stack(**kwargs).gm  # type: ignore[arg-type]
    for node in gm.graph.nodes:
        if node.target is torch.ops.msched.inplace_slice_copy.default:
            node.target = toyengine.ops.inplace_slice_copy
    gm.recompile()
    return gm


def _inputs(gm: GraphModule) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    width = sum(n.target is torch.ops.toyeng.inplace_slice_copy.default for n in gm.graph.nodes)
    return x, torch.zeros(4, 8 * width)


STACKS = {
    "eagle3": ({"n_layers": 6, "capture_layers": (1, 3, 5)}, "capture_5"),
    "moe": ({"n_layers": 2, "capture_layers": (1,), "moe": True}, "capture_1"),
}


@pytest.fixture(params=[(stack, n) for stack in STACKS for n in (2, 3)], ids=str)
def scheduled_by_engine(
    request: pytest.FixtureRequest, toyengine: ModuleType, monkeypatch: pytest.MonkeyPatch
):
    """``(bug -> (scheduled, original))``: the engine's pass with each bug switched on."""
    name, num_streams = request.param
    kwargs, last = STACKS[name]

    def run(bug: int) -> tuple[GraphModule, GraphModule, str]:
        monkeypatch.setattr(toyengine.multistream, "BUG", bug)
        gm = _stack(toyengine, **kwargs)
        original = GraphModule(gm, copy.deepcopy(gm.graph))
        return toyengine.multistream.schedule(gm, num_streams), original, last

    return run, num_streams


DIALECT = "toyeng"


def test_toyengine_pass_is_race_free_and_exact(scheduled_by_engine) -> None:
    run, num_streams = scheduled_by_engine
    gm, original, _ = run(0)
    report = msched.verify(gm, original=original, dialect=DIALECT, num_streams=num_streams)
    assert report.ok, str(report)
    streams = {n.args[0] for n in gm.graph.nodes if n.target is torch.ops.toyeng.set_stream.default}
    assert streams == set(range(num_streams))
    x, dest = _inputs(original)
    expected = original(x, dest)
    for order in ("late-aux", "early-aux", "random"):
        x, got = _inputs(original)
        run_ = msched.execute(gm, x, got, order=order, dialect=DIALECT)
        assert torch.allclose(run_.output, expected)
        assert torch.equal(run_.inputs_at_output[1], dest)


def test_toyengine_bug_1_emits_captures_after_output(scheduled_by_engine) -> None:
    run, _ = scheduled_by_engine
    gm, original, last = run(1)
    report = msched.verify(gm, original=original, dialect=DIALECT)
    assert {v.kind for v in report.violations} == {"after-output"}
    assert last in {name for v in report.violations for name in v.nodes}
    assert gm.code.index(f"{last} = ") > gm.code.index("return ")


def test_toyengine_bug_2_exit_does_not_join_the_capture(scheduled_by_engine) -> None:
    run, _ = scheduled_by_engine
    gm, original, last = run(2)
    report = msched.verify(gm, original=original, dialect=DIALECT)
    assert [(v.kind, v.nodes) for v in report.violations] == [("exit-not-joined", (last, "output"))]
    x, dest = _inputs(original)
    original(x, dest)
    x, late = _inputs(original)
    at_output = msched.execute(gm, x, late, order="late-aux", dialect=DIALECT)
    assert not torch.equal(at_output.inputs_at_output[1], dest)

"""docs/writing-a-pass.md, followed as a downstream repository follows it.

The guide shows every file of a small engine repository as a code block whose info string
names the file (```` ```{.python title="myengine/ops.py"} ````).  These tests write those
blocks, as they are, into ``pytester``'s directory and run pytest in a subprocess with this
environment's Python: ``--snapshot-update``, then a plain run, then ``-n 2``, as the guide
says.  Each bug the guide shows is the guide's pass with one line changed; the report lines
the guide quotes (``[kind] ...``) must be in the failing run's output, so the guide can drift
neither from the code nor from msched's messages.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-pass.md"
FILE_BLOCK = re.compile(r'^```\{\.\w+ title="([^"]+)"\}\n(.*?)^```$', re.M | re.S)
TEST_IDS = [f"test_captures_run_on_side_streams[streams{n}]" for n in (2, 3)]
WITHOUT_HYPOTHESIS = ("-p", "no:hypothesispytest")
TIMEOUT = 600.0
PASS = "myengine/passes.py"


def guide_files() -> dict[str, str]:
    """The files of the guide's repository: path -> text, in the guide's order."""
    files = {m.group(1): m.group(2) for m in FILE_BLOCK.finditer(GUIDE.read_text())}
    assert len(files) == len(FILE_BLOCK.findall(GUIDE.read_text())), "a file shown twice"
    return files


def section(heading: str) -> str:
    """The text of the guide under ``heading`` (a ``##`` or ``###`` line), to the next one."""
    text = GUIDE.read_text()
    start = text.index(f"\n{heading}\n")
    end = re.compile(r"^#{2,3} ", re.M).search(text, start + len(heading) + 2)
    return text[start : end.start() if end else len(text)]


def reported_lines(heading: str) -> list[str]:
    """The report lines the guide quotes under ``heading``: each violation (``  [kind]
    ...``) and each failure of the pass itself (``the scheduler ...``)."""
    lines = section(heading).splitlines()
    return [s.strip() for s in lines if s.startswith(("  [", "the scheduler "))]


def write_repository(pytester: pytest.Pytester, edit: tuple[str, str] | None = None) -> None:
    """The guide's repository in ``pytester.path``; ``edit`` replaces one text of the pass."""
    for name, text in guide_files().items():
        if edit is not None and name == PASS:
            assert edit[0] in text, f"the guide's pass no longer has {edit[0]!r}"
            text = text.replace(edit[0], edit[1])
        path = pytester.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*args, *WITHOUT_HYPOTHESIS, timeout=TIMEOUT)


def test_the_guide_shows_every_file_of_the_repository() -> None:
    assert sorted(guide_files()) == [
        "myengine/__init__.py",
        "myengine/dialect.py",
        "myengine/ops.py",
        "myengine/passes.py",
        "pyproject.toml",
        "tests/test_mypass.py",
    ]


@pytest.mark.parametrize(
    "xdist", [pytest.param(False, id="serial"), pytest.param(True, id="n2", marks=pytest.mark.slow)]
)
def test_the_guide_reaches_a_green_run(pytester: pytest.Pytester, xdist: bool) -> None:
    write_repository(pytester)
    snapshots = pytester.path / "tests" / "__snapshots__" / "test_mypass"
    first = run(pytester, "--snapshot-update")
    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines(["2 snapshots generated."])
    written = {p.name: p.read_text() for p in snapshots.iterdir()}
    assert sorted(written) == [f"{test_id}.msched.txt" for test_id in TEST_IDS]
    # The excerpt of the [streams2] snapshot the guide shows is in the file.
    excerpt = section("## A first test").split("```\n")[-2]
    assert excerpt in written[f"{TEST_IDS[0]}.msched.txt"]
    again = run(pytester, "-v", *(("-n", "2") if xdist else ()))
    again.assert_outcomes(passed=2)
    # Each line on its own: syrupy's summary and msched's come in either order (pytest 8.0
    # and syrupy 7.0 print msched's first).
    for line in ("2 snapshots passed.", "graphs scheduled: 2 (streams2: 1, streams3: 1)"):
        again.stdout.fnmatch_lines([line])
    again.stdout.fnmatch_lines(["violations: 0"])
    assert {p.name: p.read_text() for p in snapshots.iterdir()} == written


# One line of the guide's pass changed, and the heading of the guide's section on that bug.
BUGS = {
    "dropped-wait": (
        "### A dropped wait",
        ("graph.call_function(ops.wait_signal, (ready,))  # rules 2 and 3", "pass"),
    ),
    "dropped-previous": (
        "### A dropped wait",
        ("graph.call_function(ops.wait_signal, (previous,))  # rule 3: one buffer", "pass"),
    ),
    "after-output": (
        "### A capture after output",
        (
            "    gm.recompile()\n",
            "    output = graph.output_node()\n"
            "    for node in [n for n in graph.nodes if n.target is ops.capture]:\n"
            "        output.append(node)\n"
            "    gm.recompile()\n",
        ),
    ),
    "exit-not-joined": (
        "### A side stream never joined",
        ("graph.call_function(ops.wait_signal, (done,))  # rule 6: join the exit", "pass"),
    ),
    "missing-record-stream": (
        "### A missing `record_stream`",
        ("graph.call_function(ops.keep_alive, (src, stream))  # rule 4", "pass"),
    ),
    "raises": (
        "### A pass that raises or returns something else",
        (
            'src = node.kwargs["src"] if "src" in node.kwargs else node.args[1]',
            'src = node.kwargs["source"]',
        ),
    ),
    "returns-a-tuple": (
        "### A pass that raises or returns something else",
        ("    return None\n", "    return gm, num_streams\n"),
    ),
}
# Each case is a pytest subprocess: the default tier runs two, the slow tier the rest.
DEFAULT_TIER = ("dropped-wait", "exit-not-joined")
# The guide's section shows lines of several cases: the kind of line each case prints.
SHARED = {"dropped-previous": "[race/waw]", "raises": "raised", "returns-a-tuple": "returned"}


@pytest.mark.parametrize(
    "bug", [pytest.param(b, marks=() if b in DEFAULT_TIER else pytest.mark.slow) for b in BUGS]
)
def test_each_bug_fails_as_the_guide_shows(pytester: pytest.Pytester, bug: str) -> None:
    heading, edit = BUGS[bug]
    write_repository(pytester, edit)
    result = run(pytester, "--snapshot-update")
    output = result.stdout.str()
    if bug == "dropped-previous":  # a [race/waw] needs 3 streams: [streams2] passes
        result.assert_outcomes(passed=1, failed=1)
    else:
        result.assert_outcomes(failed=2)
    shown = reported_lines(heading)
    if bug in SHARED:
        expected = [line for line in shown if SHARED[bug] in line]
    else:  # the guide shows the [streams2] run's lines, and the [race/waw] of another case
        expected = [line for line in shown if "[race/waw]" not in line]
    assert expected, f"the guide shows no report under {heading}"
    missing = [line for line in expected if line not in output]
    assert not missing, f"not in the output: {missing}\n{output}"

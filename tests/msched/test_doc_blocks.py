"""Every Python block of the README and of ``docs/*.md`` runs, so the documents stay true.

pytest-codeblocks reads the blocks and the HTML comments that mark them; this module runs
them.  (Its own collector, ``--codeblocks``, runs each block alone in an empty namespace and
only defines a block's test functions; the pages need a setup, blocks that share names, and
their tests run under the plugin.)  The blocks of a page run in order in one namespace, as a
reader types them, after the page's setup (`SETUP`, else a decoder stack's ``gm``, ``x``,
``dest``: the names the prose assumes).  A block that defines ``test_`` functions is a pytest
test module: it is written to a file after the page's imports (`TEST_PRELUDE`) and run by
pytest with the plugin.  ``<!--pytest.mark.skip-->`` on the line before a block keeps it from
running (an engine the reader supplies); ``<!--pytest.mark.slow-->`` puts it in the slow tier
(an Inductor build); a test block's other marks apply to its module.  A block after
``<!-- the output of: msched demo -->`` is checked against what ``msched demo`` prints (a
``...`` line stands for lines left out).  CONTRIBUTING.md says the same to authors.
"""

from __future__ import annotations

import importlib.util
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from pytest_codeblocks import CodeBlock, extract_from_buffer, extract_from_file

from msched.cli import main as msched_main

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
SKIP, SLOW = "pytest.mark.skip", "pytest.mark.slow"
TEST_DEF = re.compile(r"^(async )?def test_", re.M)
DEMO_QUOTE = "<!-- the output of: msched demo -->"

# The ops of the engine library.md registers, defined once per process (the library keeps
# them while it lives): a namespace of their own, which no other test uses.
_MYENGINE = torch.library.Library("myengine", "FRAGMENT")
_MYENGINE.define("my_op(Tensor buf, Tensor x) -> ()")
_MYENGINE.define("my_logging_op(Tensor x) -> ()")
_MYENGINE.define("all_reduce(Tensor tensor, str group_name) -> Tensor")

_STACK = """\
import torch
import msched
from msched.models.decoders import decoder_stack

stack = decoder_stack(n_layers=2, capture_layers=(1,))
gm, model = stack.gm, stack.gm
x, dest = stack.example_inputs()
capture = dest
"""
SETUP: dict[str, str] = {
    "library.md": _STACK
    + """\
from pathlib import Path

node = next(n for n in gm.graph.nodes if n.op == "call_function")
output_node = next(n for n in gm.graph.nodes if n.op == "output")
my_op, my_logging_op = torch.ops.myengine.my_op, torch.ops.myengine.my_logging_op


def my_fused_fn(a):
    return a


trt_gm = decoder_stack(n_layers=1, capture_layers=(0,)).gm  # read as TensorRT-LLM ops
""",
    "memory.md": _STACK + "stack.with_sizes()  # the fake values a compiled graph carries\n",
}
# The pages whose blocks each start from the setup's graph (a reference of separate calls).
FRESH = {"library.md", "memory.md"}
TEST_PRELUDE: dict[str, str] = {
    "plugin.md": """\
import pytest
import torch

import msched
from pytest_msched import assert_peak_memory


class MyMoEBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.shared, self.routed = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
        self.aux = torch.cuda.Stream()

    def forward(self, x):
        cur = torch.cuda.current_stream()
        self.aux.wait_stream(cur)
        with torch.cuda.stream(self.aux):
            shared = self.shared(x)
        routed = self.routed(x)
        cur.wait_stream(self.aux)
        return shared + routed


""",
}


def python_blocks(page: Path) -> list[CodeBlock]:
    """The page's ``python`` blocks, in order."""
    return [b for b in extract_from_file(page) if b.syntax == "python"]


def runs_in(block: CodeBlock, slow: bool) -> bool:
    """Whether the tier (default, or default and slow) runs ``block``."""
    return SKIP not in block.marks and (slow or SLOW not in block.marks)


def run_blocks(name: str, blocks: list[CodeBlock], setup: str = "", fresh: bool = False) -> None:
    """Run ``blocks`` in order in one namespace after ``setup``; a block that fails raises
    `AssertionError` naming ``name`` and its line, with the block and the error.  ``fresh``:
    run ``setup`` again before each block."""
    namespace: dict[str, Any] = {"__name__": "__doc_block__"}
    for n, block in enumerate(blocks):
        if n == 0 or fresh:
            exec(compile(setup, f"{name} (setup)", "exec"), namespace)
        try:
            exec(compile(block.code, f"{name}:{block.lineno}", "exec"), namespace)
        except Exception as error:
            raise AssertionError(
                f"the block of {name} at line {block.lineno} fails: "
                f"{type(error).__name__}: {error}\n{block.code}"
            ) from error


def _page_params() -> list[Any]:
    params = []
    for page in PAGES:
        blocks = python_blocks(page)
        name = str(page.relative_to(REPO))
        if any(not TEST_DEF.search(b.code) and runs_in(b, False) for b in blocks):
            params.append(pytest.param(page, False, id=name))
        if any(not TEST_DEF.search(b.code) and SLOW in b.marks for b in blocks):
            params.append(pytest.param(page, True, id=f"{name}-slow", marks=pytest.mark.slow))
    return params


@pytest.mark.parametrize(("page", "slow"), _page_params())
def test_the_python_blocks_of_a_page_run(
    page: Path, slow: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # what a block writes (schedule.svg) lands there
    blocks = [b for b in python_blocks(page) if runs_in(b, slow) and not TEST_DEF.search(b.code)]
    name = str(page.relative_to(REPO))
    run_blocks(name, blocks, SETUP.get(page.name, _STACK), fresh=page.name in FRESH)


def blocks_that_are_tests(page: Path, slow: bool) -> list[CodeBlock]:
    """The page's blocks that are pytest test modules, of the slow tier or of the default."""
    return [
        b
        for b in python_blocks(page)
        if TEST_DEF.search(b.code) and SKIP not in b.marks and (SLOW in b.marks) == slow
    ]


def _test_block_params() -> list[Any]:
    params = []
    for page in PAGES:
        name = str(page.relative_to(REPO))
        if blocks_that_are_tests(page, False):
            params.append(pytest.param(page, False, id=name))
        if blocks_that_are_tests(page, True):
            params.append(pytest.param(page, True, id=f"{name}-slow", marks=pytest.mark.slow))
    return params


@pytest.mark.parametrize(("page", "slow"), _test_block_params())
def test_the_test_blocks_of_a_page_pass_under_the_plugin(
    page: Path, slow: bool, pytester: pytest.Pytester
) -> None:
    """Each block is a test module of its own, run by pytest with the plugin as a user would
    (the reviewed snapshots a block compares with are written first: ``--snapshot-update``)."""
    blocks = blocks_that_are_tests(page, slow)
    run_test_blocks(pytester, page.stem, blocks, TEST_PRELUDE.get(page.name, ""))


def run_test_blocks(
    pytester: pytest.Pytester, stem: str, blocks: list[CodeBlock], prelude: str = ""
) -> None:
    """Run each of ``blocks`` as a test module (``prelude`` first) with pytest and the plugin;
    `AssertionError` with pytest's output unless every test passes (or fails as marked)."""
    files = {f"test_{stem}_{b.lineno}": _marked(b.marks) + prelude + b.code for b in blocks}
    pytester.makepyfile(**files)
    result = pytester.runpytest("-p", "no:cacheprovider", "--snapshot-update", "-q")
    outcomes = result.parseoutcomes()
    bad = sum(outcomes.get(k, 0) for k in ("failed", "errors", "skipped", "xpassed"))
    ran = outcomes.get("passed", 0) + outcomes.get("xfailed", 0)
    assert bad == 0 and ran > 0, "\n".join(result.outlines)


def _marked(marks: list[str]) -> str:
    """The lines that give a test block's module the marks its HTML comments name (a block
    that shows a failing test: ``<!--pytest.mark.xfail(strict=True)-->``)."""
    marks = [m for m in marks if m != SLOW]
    if not marks:
        return ""
    return f"import pytest\n\npytestmark = [{', '.join(marks)}]\n"


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed")
def test_the_python_blocks_are_formatted_as_the_code_is(tmp_path: Path) -> None:
    for page in PAGES:
        for block in python_blocks(page):
            (tmp_path / f"{page.stem}_{block.lineno}.py").write_text(block.code, "utf-8")
    config = str(REPO / "pyproject.toml")
    check = [sys.executable, "-m", "ruff", "format", "--check", "--config", config, "."]
    done = subprocess.run(check, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"ruff format these blocks (page_line.py):\n{done.stdout}"


def demo_quotes(page: Path) -> list[str]:
    """The blocks of ``page`` quoted as ``msched demo``'s output."""
    text = page.read_text(encoding="utf-8")
    quotes = []
    for start in [m.end() for m in re.finditer(re.escape(DEMO_QUOTE), text)]:
        quotes += [b.code for b in extract_from_buffer(io.StringIO(text[start:]))[:1]]
    return quotes


def quote_matches(quote: str, output: str) -> bool:
    """Whether ``quote`` is ``output`` with runs of lines left out where it says ``...``: its
    other lines appear in ``output`` in order, consecutive between two ``...``."""
    lines, at = output.splitlines(), 0
    for part in re.split(r"^\.\.\.\n", quote, flags=re.M):
        want = part.splitlines()
        while at + len(want) <= len(lines) and lines[at : at + len(want)] != want:
            at += 1
        if at + len(want) > len(lines):
            return False
        at += len(want)
    return True


@pytest.fixture(scope="module")
def demo_output() -> str:
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.stdout", out)
        assert msched_main(["demo"]) == 0
    return out.getvalue()


QUOTING = [p for p in PAGES if demo_quotes(p)]


@pytest.mark.parametrize("page", QUOTING, ids=lambda p: str(p.relative_to(REPO)))
def test_the_demo_output_a_page_quotes_is_what_the_demo_prints(
    page: Path, demo_output: str
) -> None:
    for quote in demo_quotes(page):
        assert quote_matches(quote, demo_output), f"{quote}\n-- is not in --\n{demo_output}"


def test_the_cli_page_quotes_the_demo() -> None:
    assert REPO / "docs" / "cli.md" in QUOTING


BROKEN_PAGE = """\
# A page

<!--pytest.mark.skip-->
```python
raise RuntimeError("an engine the reader supplies")
```

```python
total = 1 + 1
```

```python
assert total == 3, "the page is wrong"
```

```python
def test_a_stack_has_no_graph(decoder_stack):
    assert decoder_stack().gm is None
```
"""


def test_a_broken_block_fails_naming_its_page_and_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(BROKEN_PAGE, encoding="utf-8")
    blocks = [b for b in python_blocks(page) if runs_in(b, slow=True)]
    assert [b.lineno for b in blocks] == [8, 12, 16]  # the skipped block is not among them
    with pytest.raises(AssertionError, match="page.md at line 12 fails: .*the page is wrong"):
        run_blocks("page.md", blocks[:2])  # the second block sees the first one's `total`


def test_a_failing_test_block_fails(tmp_path: Path, pytester: pytest.Pytester) -> None:
    page = tmp_path / "page.md"
    page.write_text(BROKEN_PAGE, encoding="utf-8")
    blocks = [b for b in python_blocks(page) if TEST_DEF.search(b.code)]
    with pytest.raises(AssertionError, match="1 failed"):
        run_test_blocks(pytester, "page", blocks)


def test_a_quote_matches_the_lines_it_shows_in_order() -> None:
    output = "a\nb\nc\nd\n"
    assert quote_matches("a\nb\n...\nd\n", output)
    assert not quote_matches("a\nc\n", output)  # c does not follow a
    assert not quote_matches("c\n...\na\n", output)
    assert not quote_matches("a\nb\nx\n", output)

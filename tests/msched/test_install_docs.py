"""The install instructions work on a fresh machine today.

pytest-msched is not on PyPI yet, so every ``pip install pytest-msched`` in the documents is
labelled as what to run after a release; the README installs from a checkout or a built wheel,
as `.ci/run` does (its wheel step is the end-to-end check: a downstream test against the
wheel in a clean venv, with ``--snapshot-update``, plain and under ``-n 2``); torch is pinned
and installed first everywhere, and the CI example takes it from PyTorch's CPU index.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from msched._torch_internals import TORCH_TESTED
from msched.scheduling.exact import EXTRA

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        *(REPO / "docs").glob("*.md"),
        *(REPO / "docs").glob("*.yml"),
        *(REPO / "examples").rglob("README.md"),
    ]
)
FROM_PYPI = re.compile(r"pip install\b.*\bpytest-msched\b(?! @)")
CPU_INDEX = "--index-url https://download.pytorch.org/whl/cpu"


def unreleased_installs(text: str) -> list[str]:
    """The lines of ``text`` that install pytest-msched from PyPI with no "after a release"
    on them or on the three lines before."""
    lines = text.splitlines()
    return [
        line
        for i, line in enumerate(lines)
        if FROM_PYPI.search(line)
        and "after a release" not in "\n".join(lines[max(i - 3, 0) : i + 1]).lower()
    ]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_pypi_installs_are_labelled_as_after_a_release(document: Path) -> None:
    assert unreleased_installs(document.read_text(encoding="utf-8")) == []


def test_the_label_check_finds_an_unlabelled_install() -> None:
    text = "```bash\npip install pytest-msched\n```\n# After a release\npip install pytest-msched\n"
    assert unreleased_installs(text) == ["pip install pytest-msched"]
    assert unreleased_installs("pip install 'pytest-msched @ git+https://x/y@v1'") == []


def _install_section(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    return text[text.index("## Install\n") :].split("\n## ", 1)[0]


@pytest.mark.parametrize("document", ["README.md", "docs/plugin.md"])
def test_the_install_section_installs_a_checkout_and_a_wheel_after_torch(document: str) -> None:
    section = _install_section(REPO / document)
    commands = [line for line in section.splitlines() if re.search(r"\bpip (install|wheel)", line)]
    torch_first = [i for i, line in enumerate(commands) if "install torch==" in line]
    checkout = next(i for i, line in enumerate(commands) if "install -e ." in line)
    wheel = next(i for i, line in enumerate(commands) if line.startswith("pip install dist/"))
    assert torch_first and torch_first[0] < checkout and torch_first[1] < wheel
    assert any("pip wheel --no-deps --wheel-dir dist ." in line for line in commands)
    assert CPU_INDEX in section


def test_the_readme_and_the_plugin_page_install_alike() -> None:
    readme, plugin = (_install_section(REPO / p) for p in ("README.md", "docs/plugin.md"))
    blocks = re.compile(r"```bash\n.*?```", re.S)
    assert blocks.findall(readme) == blocks.findall(plugin)


def test_ci_runs_the_wheel_as_the_readme_builds_it() -> None:
    run = (REPO / ".ci" / "run").read_text()
    assert "pip wheel --quiet --no-deps --wheel-dir" in run
    check = run[run.index("wheel_check() {") :].split("\n}\n", 1)[0]
    assert "--snapshot-update" in check and "-n 2" in check


def _tested(version: str) -> bool:
    major, minor = map(int, version.split(".")[:2])
    low, high = TORCH_TESTED
    return low <= (major, minor) < high


def _install_step(workflow: str) -> str:
    """The text of the step named ``Install`` (up to the next step)."""
    step = workflow[workflow.index("- name: Install\n") :]
    return re.split(r"\n {6}- ", step, maxsplit=1)[0]


def test_the_ci_example_pins_a_cpu_torch_before_the_plugin() -> None:
    install = _install_step((REPO / "docs" / "github-actions-example.yml").read_text())
    commands = [line.strip() for line in install.splitlines() if "pip install" in line]
    commands = [c for c in commands if not c.startswith("#")]
    torch = re.fullmatch(r"python -m pip install torch==(\S+) (.*)", commands[1])
    assert torch is not None, f"the second install is not a pinned torch: {commands[1]}"
    assert _tested(torch.group(1)) and torch.group(2) == CPU_INDEX
    assert commands[2:] == ['python -m pip install "$MSCHED"', 'python -m pip install -e ".[test]"']
    assert re.search(r'\n +MSCHED: "pytest-msched @ git\+https://\S+@\S+"\n', install)


def test_the_missing_optional_dependency_message_names_the_extra() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (requirement,) = pyproject["project"]["optional-dependencies"]["optimal"]
    assert f"pip install '{requirement}'" in EXTRA

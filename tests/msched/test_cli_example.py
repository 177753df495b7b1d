"""``msched example DIR``: the downstream example, copied out of the installation or checkout.

The wheel ships ``examples/downstream`` as data files (``[tool.setuptools.data-files]`` of
pyproject.toml); these tests check that every file of the example is listed there, that the
command copies the example whole from either place, and that it refuses a directory that is
not empty.  ``.ci/run`` runs the copied example against the built wheel.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest

from msched import cli
from msched.cli import example

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "downstream"


def _tracked_files() -> list[str]:
    """The example's files as git tracks them, relative to the example."""
    listed = subprocess.run(
        ["git", "ls-files", "--", "examples/downstream"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    if not listed:  # an exported tree without git: the files on disk
        listed = [str(p.relative_to(REPO)) for p in EXAMPLE.rglob("*") if p.is_file()]
    return sorted(str(Path(f).relative_to("examples/downstream")) for f in listed)


def _files(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): p.read_text()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and ".pytest_cache" not in p.parts
    }


def test_every_file_of_the_example_ships_in_the_wheel() -> None:
    data_files = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "data-files"
    ]
    shipped = set()
    for target, patterns in data_files.items():
        assert target.startswith(str(example.INSTALLED)), target
        for pattern in patterns:
            for path in REPO.glob(pattern):
                relative = path.relative_to(EXAMPLE)
                assert str(Path(target) / relative.name).endswith(str(relative)), (target, path)
                shipped.add(str(relative))
    assert sorted(shipped) == _tracked_files()


def test_example_copies_the_example_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "engine"
    assert cli.main(["example", str(target)]) == 0
    assert _files(target) == {name: (EXAMPLE / name).read_text() for name in _tracked_files()}
    assert f"copied the downstream example to {target}" in capsys.readouterr().out


def test_example_prefers_the_installed_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    installed = tmp_path / "prefix" / example.INSTALLED
    installed.mkdir(parents=True)
    (installed / "pyproject.toml").write_text("[project]\nname = 'installed'\n")
    monkeypatch.setattr(example.sysconfig, "get_path", lambda name: str(tmp_path / "prefix"))
    assert example.example_source() == installed
    assert cli.main(["example", str(tmp_path / "out")]) == 0
    assert _files(tmp_path / "out") == {"pyproject.toml": "[project]\nname = 'installed'\n"}


def test_example_refuses_a_directory_that_is_not_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mine.py").write_text("x = 1\n")
    assert cli.main(["example", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"msched example: error: {tmp_path} exists and is not an empty directory\n"
    assert _files(tmp_path) == {"mine.py": "x = 1\n"}


def test_example_into_an_empty_directory(tmp_path: Path) -> None:
    assert cli.main(["example", str(tmp_path)]) == 0
    assert (tmp_path / "toyengine" / "multistream.py").is_file()


def test_example_says_where_it_looked_when_it_is_not_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(example.sysconfig, "get_path", lambda name: str(tmp_path / "prefix"))
    monkeypatch.setattr(example.msched, "__file__", str(tmp_path / "site" / "msched" / "x.py"))
    assert cli.main(["example", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("msched example: error: the downstream example is not installed")
    assert str(tmp_path / "prefix" / example.INSTALLED) in err
    assert not (tmp_path / "out").exists()

"""The pytest-xdist interfaces of `pytest_msched._pytest_internals`, the tested ranges of
pytest, pytest-xdist and syrupy, and the warning outside them."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from pytest_msched import _pytest_internals as pi

XDIST = metadata.version("pytest-xdist")


def test_pyproject_requires_exactly_the_tested_ranges() -> None:
    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    for name in pi.TESTED:
        found = [d for d in dependencies if d.split(">")[0] == name]
        assert found == [pi.requirement(name)]


def test_the_installed_versions_are_tested_ones() -> None:
    assert pi.untested_versions() == []


def test_a_version_outside_a_range_is_named_with_the_range() -> None:
    installed = {"pytest": "9.3.0", "pytest-xdist": "3.8.0", "syrupy": "7.0.2rc1"}
    assert pi.untested_versions(installed) == [
        "pytest-msched is tested with pytest>=8.0,<9.3, and pytest 9.3.0 is installed: it may "
        "work; install a tested version to be sure",
    ]
    low = {"pytest": "7.4.4", "pytest-xdist": "3.0.1", "syrupy": "7.0.1"}
    assert [m.split(",")[0] for m in pi.untested_versions(low)] == [
        "pytest-msched is tested with pytest>=8.0",
        "pytest-msched is tested with pytest-xdist>=3.0.2",
        "pytest-msched is tested with syrupy>=7.0.2",
    ]


def test_the_plugin_warns_at_start_up_outside_a_range(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(pi.TESTED, "syrupy", ("99.0", "100"))
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        ["*UntestedVersionWarning: pytest-msched is tested with syrupy>=99.0,<100, and syrupy*"]
    )


def test_xdist_workers_and_their_output_are_seen(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "import pytest_msched._pytest_internals as pi\n\n"
        "def pytest_configure(config):\n"
        "    if not pi.is_xdist_worker(config):\n"
        "        assert pi.distributes(config)\n"
        "        print('CONTROLLER DISTRIBUTES')\n\n"
        "def pytest_testnodedown(node, error):\n"
        "    assert pi.node_output(node).get('msched_probe') == 'sent'\n"
        "    print('NODE OUTPUT OK')\n"
    )
    pytester.makepyfile(
        "import pytest_msched._pytest_internals as pi\n\n"
        "def test_worker(request):\n"
        "    assert pi.is_xdist_worker(request.config)\n"
        "    pi.worker_output(request.config)['msched_probe'] = 'sent'\n"
    )
    result = pytester.runpytest_subprocess("-n", "1", "-s")
    message = f"pytest-xdist {XDIST} changed workerinput/workeroutput or its dist/tx options"
    assert result.ret == 0, message
    result.stdout.fnmatch_lines(["*CONTROLLER DISTRIBUTES*", "*NODE OUTPUT OK*"])

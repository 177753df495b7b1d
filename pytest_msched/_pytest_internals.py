"""The undocumented pytest-xdist interfaces the plugin uses, and the versions it is tested with.

pytest itself is used through its public API only.  pytest-xdist documents its hooks, but
not how a process tells it is a worker or a controller, nor how a worker's data reaches the
controller: the attributes ``config.workerinput`` / ``config.workeroutput`` (and
``node.workeroutput`` on the controller) and its option names ``dist`` and ``tx``.  They are
read here and nowhere else; ``tests/plugin/test_pytest_internals.py`` checks them against the
installed pytest-xdist.

`untested_versions` names every installed pytest, pytest-xdist and syrupy outside the range
CI tests (``pyproject.toml`` requires exactly these); the plugin warns with each at start-up.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import pytest
from packaging.version import Version


class UntestedVersionWarning(pytest.PytestWarning):
    """pytest, pytest-xdist or syrupy is installed in a version outside the tested range (the
    plugin's counterpart of `msched.UntestedVersionWarning`, which it cannot import without
    torch)."""


#: The tested releases of each library: at least the first, below the second.
TESTED: dict[str, tuple[str, str]] = {
    "pytest": ("8.0", "9.3"),
    "pytest-xdist": ("3.0.2", "3.9"),
    "syrupy": ("7.0.2", "7.1"),
}


def requirement(name: str) -> str:
    """``pytest>=8.0,<9.3``: the requirement ``pyproject.toml`` states for ``name``."""
    low, high = TESTED[name]
    return f"{name}>={low},<{high}"


def untested_versions(installed: dict[str, str] | None = None) -> list[str]:
    """One message per library of `TESTED` installed outside its range (``installed``: name
    to version, the installed ones by default)."""
    messages = []
    for name, (low, high) in TESTED.items():
        version = installed[name] if installed is not None else metadata.version(name)
        release = Version(Version(version).base_version)
        if not Version(low) <= release < Version(high):
            messages.append(
                f"pytest-msched is tested with {requirement(name)}, and {name} {version} is "
                "installed: it may work; install a tested version to be sure"
            )
    return messages


def is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def worker_output(config: pytest.Config) -> dict[str, Any] | None:
    """A worker's dict that xdist sends to the controller when the worker ends."""
    return getattr(config, "workeroutput", None)


def node_output(node: Any) -> dict[str, Any]:
    """On the controller: the dict a worker (``node``, of ``pytest_testnodedown``) sent."""
    return getattr(node, "workeroutput", None) or {}


def distributes(config: pytest.Config) -> bool:
    """Whether xdist's options (``-n``, ``--dist``) hand tests to workers."""
    option = config.option
    return getattr(option, "dist", "no") != "no" and bool(getattr(option, "tx", None))

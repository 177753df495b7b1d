"""pytest hooks of msched (registered through the ``pytest11`` entry point).

Hooks only; each hands off to the run's `MschedSession` (``config.stash``).  Fixtures live in
the modules listed in ``pytest_plugins``, which pytest registers together with this one.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_msched._options import MARKER_HELP, add_options
from pytest_msched._pytest_internals import UntestedVersionWarning, untested_versions
from pytest_msched._session import MschedSession

# Fixture modules, registered with this plugin.  Add one line per module here. --------------
pytest_plugins = [
    "pytest_msched.fixtures",
    "pytest_msched.compile_fixtures",
    "pytest_msched.stream_fixtures",
]
# ---------------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)
    for message in untested_versions():
        config.issue_config_time_warning(UntestedVersionWarning(message), stacklevel=2)
    MschedSession.install(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    MschedSession.of(metafunc.config).parametrize(metafunc)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    with MschedSession.of(session.config).reading():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    MschedSession.of(item.config).after_report(item, report)
    return report


@pytest.hookimpl(wrapper=True, trylast=True)  # inside xdist's, which sends what we publish
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, None, None]:
    with MschedSession.of(session.config).finishing(session):
        return (yield)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    MschedSession.of(node.config).collect(node)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    MschedSession.of(config).write_summary(terminalreporter)

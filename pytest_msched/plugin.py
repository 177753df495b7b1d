"""pytest hooks of msched (registered through the ``pytest11`` entry point).

Hooks only; each hands off to a module of this package.  Fixtures live in the modules listed
in ``pytest_plugins``, which pytest registers together with this one.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_msched import _options, _params, _state

# Fixture modules, registered with this plugin.  Add one line per module here. --------------
pytest_plugins = [
    "pytest_msched.fixtures",
    "pytest_msched.compile_fixtures",
]
# ---------------------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    _options.add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", _options.MARKER_HELP)
    config.stash[_options.SETTINGS_KEY] = _options.resolve_settings(config)
    config.stash[_state.STATS_KEY] = _state.SessionStats()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    _params.parametrize(metafunc, metafunc.config.stash[_options.SETTINGS_KEY])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    dump_dir = item.config.stash[_options.SETTINGS_KEY].dump_dir
    if dump_dir is not None and report.when == "call" and report.failed:
        _state.dump_schedules(item, dump_dir)
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    _state.publish_worker_stats(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    _state.collect_worker_stats(node.config, node)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    _state.write_summary(config, terminalreporter)

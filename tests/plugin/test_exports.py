"""Each public name of the plugin, and each fixture module, is declared in one place.

``pytest_msched._HOMES`` is the table of the public names (name -> module); ``__all__`` is made
from it and the ``TYPE_CHECKING`` imports repeat it for type checkers, so these tests fail
when the imports and the table disagree.  Fixtures are found by pytest in the modules listed
in ``pytest_msched.plugin.pytest_plugins``: a module that defines a fixture and is not listed
there would define it for nobody.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import pytest_msched
import pytest_msched.assertions
import pytest_msched.plugin
from tests.msched.test_layout import PLUGIN_ROOT, find_modules

INIT = PLUGIN_ROOT / "__init__.py"


def type_checking_imports(source: str) -> dict[str, str]:
    """Name -> module of every ``from module import name [as name]`` inside
    ``if TYPE_CHECKING:`` in ``source``; an import under another name is kept as ``?``."""
    found: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom), ast.unparse(imported)
                for alias in imported.names:
                    same = alias.asname in (None, alias.name)
                    found[alias.asname or alias.name] = imported.module if same else "?"
    return found


def test_the_type_checking_imports_are_the_table() -> None:
    assert type_checking_imports(INIT.read_text()) == pytest_msched._HOMES


def test_all_is_the_table_and_every_name_lives_in_its_module() -> None:
    assert pytest_msched.__all__ == sorted(pytest_msched._HOMES)
    for name, module in pytest_msched._HOMES.items():
        value = getattr(pytest_msched, name)
        assert value is getattr(importlib.import_module(module), name)
        assert value.__module__ == module, f"{name} is defined in {value.__module__}"


def test_the_imports_are_re_exports_for_type_checkers() -> None:
    """``from m import x as x``: a strict type checker (mypy's ``no_implicit_reexport``,
    pyright on a ``py.typed`` package) sees each name as exported."""
    tree = ast.parse(INIT.read_text())
    aliases = [
        alias
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for imported in node.body
        if isinstance(imported, ast.ImportFrom)
        for alias in imported.names
    ]
    assert aliases and all(alias.asname == alias.name for alias in aliases)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("if TYPE_CHECKING:\n    from m import a as a\n", {"a": "m"}),
        ("if TYPE_CHECKING:\n    from m import a as b\n", {"b": "?"}),
        (
            "if TYPE_CHECKING:\n    from m import a\n    from n import b as b\n",
            {"a": "m", "b": "n"},
        ),
        ("from m import a\n", {}),
    ],
)
def test_the_import_reader(source: str, found: dict[str, str]) -> None:
    assert type_checking_imports(source) == found


def _defines_a_fixture(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                called = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(called) == "pytest.fixture":
                    return True
    return False


def test_every_module_with_fixtures_is_a_listed_plugin() -> None:
    modules = find_modules(PLUGIN_ROOT, "pytest_msched")
    with_fixtures = sorted(m for m, path in modules.items() if _defines_a_fixture(path))
    assert with_fixtures == sorted(pytest_msched.plugin.pytest_plugins)


def test_the_fixture_finder_sees_both_decorator_forms(tmp_path: Path) -> None:
    for text, expected in [
        ("import pytest\n@pytest.fixture\ndef a(): ...\n", True),
        ("import pytest\n@pytest.fixture(scope='session')\ndef a(): ...\n", True),
        ("import pytest\n@pytest.mark.slow\ndef test_a(): ...\n", False),
    ]:
        path = tmp_path / "m.py"
        path.write_text(text)
        assert _defines_a_fixture(path) is expected, text


def test_the_helpers_module_is_not_rewritten() -> None:
    """The helpers build their own messages (`pytest_msched.assertions._fail`): pytest must not
    rewrite their module, which would add its ``where False = ...`` lines to a failure."""
    source = inspect.getsource(pytest_msched)
    assert "register_assert_rewrite" not in source
    helpers = ast.parse(Path(pytest_msched.assertions.__file__).read_text())
    asserts = [node.lineno for node in ast.walk(helpers) if isinstance(node, ast.Assert)]
    assert asserts == []

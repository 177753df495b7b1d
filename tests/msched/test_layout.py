"""The package layout: imports point down the pipeline, and names do not shadow modules.

Read from the source with `pkgutil` and `ast` (nothing is imported, so an import cycle or a
side effect cannot hide a violation):

- ``msched.analysis`` imports none of ``scheduling``, ``proof``, ``pictures``, ``compile``,
  ``testing``; ``msched.proof`` imports none of ``scheduling``, ``pictures``, ``compile``,
  ``testing``; the backend (``msched.compile.compiler``) imports no test model
  (``msched.testing``); nothing imports ``msched.cli``;
- no module of ``msched`` imports ``pytest`` (or the plugin, ``pytest_msched``);
- every error class is defined in ``msched.errors`` and exported from ``msched``;
- no module is named like a name it exports (``msched/schedule.py`` exporting ``schedule``
  made ``msched.schedule`` a function that hid the module), and no package binds a name of
  one of its submodules to anything but that submodule.

Every import statement counts, inside functions and ``if TYPE_CHECKING:`` blocks too: the
layering is about what a module depends on, not about when it is loaded.  Imports are direct
only: importing ``msched.x.y`` runs ``msched/__init__.py``, which imports everything, so a
transitive closure would say nothing.
"""

from __future__ import annotations

import ast
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "msched"

# Importer (a package or a module) -> the packages or modules it must not import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "analysis": ("scheduling", "proof", "pictures", "compile", "testing", "cli"),
    "proof": ("scheduling", "pictures", "compile", "testing", "cli"),
    "compile": ("testing",),
}
# Imported by no module of msched (the CLI is the top; pytest is the plugin's business).
NOWHERE = ("{package}.cli", "pytest", "_pytest", "pytest_msched")


def find_modules(root: Path, package: str) -> dict[str, Path]:
    """Every module and package below ``root`` (the directory of ``package``), by name."""
    found = {package: root / "__init__.py"}
    for info in pkgutil.iter_modules([str(root)]):
        name = f"{package}.{info.name}"
        if info.ispkg:
            found.update(find_modules(root / info.name, name))
        else:
            found[name] = root / f"{info.name}.py"
    return found


def imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` for everything ``tree`` imports, relative imports resolved;
    ``from a import b`` gives ``a.b`` (``b`` may be a submodule), and ``a`` only when ``b``
    is ``*``."""
    here = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                yield node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def import_violations(modules: dict[str, Path], package: str) -> list[str]:
    """One line per import that breaks `FORBIDDEN` or `NOWHERE`."""
    nowhere = [n.format(package=package) for n in NOWHERE]
    problems = []
    for module, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(), str(path))
        forbidden = [
            f"{package}.{target}"
            for importer, targets in FORBIDDEN.items()
            if _within(module, f"{package}.{importer}")
            for target in targets
        ]
        for line, name in imported_names(tree, module, path.name == "__init__.py"):
            if any(_within(name, t) and not _within(module, t) for t in forbidden + nowhere):
                problems.append(f"{module} imports {name} (line {line})")
    return problems


def exported_names(tree: ast.Module) -> set[str]:
    """What a module exports: its ``__all__`` when it lists names, else its public top-level
    definitions and imported names."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            if isinstance(node.value, (ast.List, ast.Tuple)):
                return {str(e.value) for e in node.value.elts if isinstance(e, ast.Constant)}
    return {name for name in bound_names(tree) if not name.startswith("_")}


def bound_names(tree: ast.Module) -> dict[str, ast.stmt]:
    """The names a module's top-level statements bind, with the statement binding each."""
    bound: dict[str, ast.stmt] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[node.name] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound[target.id] = node
    return bound


def name_violations(modules: dict[str, Path]) -> list[str]:
    """Modules named like what they export; packages binding a submodule's name to
    something else."""
    problems = []
    for module, path in sorted(modules.items()):
        tree = ast.parse(path.read_text(), str(path))
        short = module.rpartition(".")[2]
        if path.name != "__init__.py" and short in exported_names(tree):
            problems.append(f"{module} exports {short!r}, a name equal to its own")
        if path.name == "__init__.py":
            for name, node in bound_names(tree).items():
                if f"{module}.{name}" in modules and not _binds_submodule(node, module, name):
                    problems.append(f"{module} binds {name!r}, hiding the module {module}.{name}")
    return problems


def _binds_submodule(node: ast.stmt, package: str, name: str) -> bool:
    """Whether ``node`` binds ``name`` to the submodule ``package.name`` itself."""
    if isinstance(node, ast.ImportFrom):
        origin = "." * node.level + (node.module or "")
        return origin in (package, ".") and any(a.name == name for a in node.names)
    return isinstance(node, ast.Import)


def layout_violations(root: Path, package: str) -> list[str]:
    modules = find_modules(root, package)
    return import_violations(modules, package) + name_violations(modules)


def test_msched_layout_holds() -> None:
    assert layout_violations(ROOT, "msched") == []


def test_every_module_is_seen() -> None:
    modules = find_modules(ROOT, "msched")
    for name in ("msched.analysis.dag", "msched.scheduling.emit", "msched.compile.compiler"):
        assert name in modules
    assert all(path.is_file() for path in modules.values())


# The CLI's own error never leaves `msched.cli.main` (it becomes exit status 2).
PRIVATE_ERRORS = {"msched.cli.UsageError"}


def test_every_error_is_defined_in_errors_and_exported() -> None:
    import msched
    import msched.errors

    elsewhere = [
        f"{module}.{node.name}"
        for module, path in find_modules(ROOT, "msched").items()
        if module != "msched.errors"
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(b).endswith(("Error", "Warning", "Exception")) for b in node.bases)
    ]
    assert sorted(set(elsewhere) - PRIVATE_ERRORS) == []
    defined = [
        name
        for name, value in vars(msched.errors).items()
        if isinstance(value, type) and issubclass(value, Exception)
    ]
    assert defined and all(
        getattr(msched, name) is getattr(msched.errors, name) for name in defined
    )
    assert set(defined) <= set(msched.__all__)


# --- the checker itself: it finds deliberate violations in a package of its own -----------

BROKEN = {
    "__init__.py": "from .impl import helper\nfrom .impl import tools as _t\n",
    "impl.py": "def tools(): ...\n",
    "helper.py": "",
    "cli.py": "import pkg.analysis\n",
    "analysis/__init__.py": "",
    "analysis/dag.py": "from pkg.scheduling import emit\n",
    "analysis/cost.py": "def f():\n    from ..proof import verify\n",
    "proof/__init__.py": "",
    "proof/verify.py": "def verify(): ...\nfrom pkg.scheduling.emit import x\n",
    "proof/read.py": "import pytest\nfrom .. import cli\n",
    "scheduling/__init__.py": "from .emit import *\n",
    "scheduling/emit.py": "__all__ = ['emit']\nfrom pkg.proof import read\n",
    "compile/__init__.py": "",
    "compile/compiler.py": "from pkg.testing.models import Model\n",
}


@pytest.fixture
def broken(tmp_path: Path) -> Path:
    for name, text in BROKEN.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "pkg"


def test_the_checker_finds_each_kind_of_violation(broken: Path) -> None:
    assert layout_violations(broken, "pkg") == [
        "pkg.analysis.cost imports pkg.proof.verify (line 2)",  # relative, inside a function
        "pkg.analysis.dag imports pkg.scheduling.emit (line 1)",
        "pkg.compile.compiler imports pkg.testing.models.Model (line 1)",
        "pkg.proof.read imports pytest (line 1)",
        "pkg.proof.read imports pkg.cli (line 2)",
        "pkg.proof.verify imports pkg.scheduling.emit.x (line 2)",
        "pkg binds 'helper', hiding the module pkg.helper",
        "pkg.proof.verify exports 'verify', a name equal to its own",
        "pkg.scheduling.emit exports 'emit', a name equal to its own",
    ]

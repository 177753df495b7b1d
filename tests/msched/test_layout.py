"""The package layout: imports point down the layers, no cycles, names do not shadow modules,
and no module is over `MAX_LINES` lines; for ``msched`` and for the plugin, ``pytest_msched``.

Read from the source with `pkgutil` and `ast` (nothing is imported, so an import cycle or a
side effect cannot hide a violation).  `import_map` turns the source into a map of direct
imports; the rules are functions over that map, so each is shown failing on a small map that
breaks it (the tests at the end), as well as passing on ``msched`` itself.  The layers, top
first (a layer imports only layers below it):

- ``cli`` (imported by nothing of msched but its own modules: the package of the command,
  whose modules import each other down its own order, without a cycle);
- ``testing`` (checks, strategies, the traced decoder: may use everything below);
- ``compile`` (``torch.compile`` around the pipeline; no ``testing``);
- ``pictures`` (no ``compile``, no ``testing``);
- ``scheduling`` (none of ``pictures``, ``compile``, ``testing``);
- ``proof`` (none of ``scheduling``, ``pictures``, ``compile``, ``testing``);
- ``analysis`` (none of ``scheduling``, ``proof``, ``pictures``, ``compile``, ``testing``);
- ``models`` (the reference decoders and their ops: only the top layer, ``ops``, ``errors``,
  ``limits``, ``runtime`` and the private ``_torch_internals`` / ``_lazy``; not even
  ``analysis``, so that every layer may build models);
- the top layer: ``ops``, ``errors``, ``limits``, ``runtime`` import no subpackage, and
  neither do the private top modules ``_torch_internals``, ``_lazy``, ``_version``, ``_text``.

Only ``cli`` and ``testing`` import the package itself (``import msched``, ``from msched
import schedule``: it runs everything, so below them it is an upward import by another name).
The plugin imports no part of the command (``msched.cli``).

The plugin's modules are layered too (`PLUGIN_LAYERS`, top first: the hooks; the fixtures and
assertion helpers; the session; the snapshot extension; the reading context; parametrization;
options and the private interfaces of pytest and syrupy): a module imports none of a layer
above its own, and every module has a layer.

Besides: no import cycle between modules of either package, not even through an import inside
a function; no module imports ``pytest``
(or the plugin, ``pytest_msched``); every error class is defined in ``msched.errors`` and
exported from ``msched``; no module is named like a name it exports (``msched/schedule.py``
exporting ``schedule`` made ``msched.schedule`` a function that hid the module), and no
package binds a name of one of its submodules to anything but that submodule.

Every import statement counts, inside functions and ``if TYPE_CHECKING:`` blocks too: the
layering is about what a module depends on, not about when it is loaded.  Imports are direct
only: importing ``msched.x.y`` runs ``msched/__init__.py``, which imports everything, so a
transitive closure through packages would say nothing.
"""

from __future__ import annotations

import ast
import pkgutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2] / "msched"
PLUGIN_ROOT = ROOT.parent / "pytest_msched"

# Importer (a package or a module) -> the packages or modules it must not import.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "analysis": ("scheduling", "proof", "pictures", "compile", "testing", "cli"),
    "proof": ("scheduling", "pictures", "compile", "testing", "cli"),
    "scheduling": ("pictures", "compile", "testing", "cli"),
    "pictures": ("compile", "testing", "cli"),
    "compile": ("testing", "cli"),
}
# The top layer: modules that import no subpackage of msched at all.
TOP_LAYER = ("ops", "errors", "limits", "runtime")
# The private modules at the top (torch's private interfaces, lazy code generation, the
# version, counted nouns and lists in messages): the same rule as the top layer.
PRIVATE_TOP = ("_torch_internals", "_lazy", "_version", "_text")
# The layers that may import the package itself (``import msched``, ``from msched import x``:
# it runs everything): the top, the command and the testing helpers.
FACADE_USERS = ("cli", "testing")
# Importer -> the only modules of msched it may import (besides its own package).
ONLY: dict[str, tuple[str, ...]] = {
    "models": (*TOP_LAYER, "_torch_internals", "_lazy"),
}
# Imported by no module of msched (the CLI is the top; pytest is the plugin's business).
NOWHERE = ("{package}.cli", "pytest", "_pytest", "pytest_msched")
# The plugin's modules by layer, top first: a module imports none of a layer above its own.
PLUGIN_LAYERS: tuple[tuple[str, ...], ...] = (
    ("plugin",),  # the hooks, which pytest loads: imported by no module of the plugin
    ("fixtures", "stream_fixtures", "compile_fixtures", "assertions"),
    ("_session",),
    ("snapshot",),
    ("_reading",),
    ("_params",),
    ("_options", "_pytest_internals", "_syrupy_internals"),
)
MAX_LINES = 650
# Module -> why it may be over MAX_LINES for now.  An entry whose module is no longer over the
# limit fails the test, so the list only shrinks; it is empty since cli.py was split by job.
LONG_FOR_NOW: dict[str, str] = {}


class Import(NamedTuple):
    """One imported name: ``name`` as written (relative imports resolved), its line, and
    whether the import is inside a function (deferred to the call)."""

    line: int
    name: str
    deferred: bool


ImportMap = Mapping[str, Sequence[Import]]
"""Every module and package of a package, by name, with what it imports."""


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


def imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[Import]:
    """Everything ``tree`` imports, relative imports resolved; ``from a import b`` gives
    ``a.b`` (``b`` may be a submodule), and ``a`` only when ``b`` is ``*``."""
    here = module if is_package else module.rpartition(".")[0]
    for node, deferred in _walk(tree, False):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(node.lineno, alias.name, deferred)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:
                name = base if alias.name == "*" else f"{base}.{alias.name}"
                yield Import(node.lineno, name, deferred)


def _walk(node: ast.AST, deferred: bool) -> Iterator[tuple[ast.AST, bool]]:
    """Every node below ``node``, with whether it is inside a function."""
    for child in ast.iter_child_nodes(node):
        yield child, deferred
        inside = deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _walk(child, inside)


def import_map(root: Path, package: str) -> dict[str, list[Import]]:
    """The `ImportMap` of the package in directory ``root``."""
    return {
        module: list(
            imported_names(
                ast.parse(path.read_text(), str(path)), module, path.name == "__init__.py"
            )
        )
        for module, path in sorted(find_modules(root, package).items())
    }


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _module_of(name: str, imports: ImportMap) -> str | None:
    """The module of the package that importing ``name`` names (the longest prefix that is
    one: ``pkg.a.b.f`` is ``pkg.a.b``), None for a name outside the package."""
    while name:
        if name in imports:
            return name
        name = name.rpartition(".")[0]
    return None


def layer_violations(imports: ImportMap, package: str) -> list[str]:
    """One line per import that breaks `FORBIDDEN`, `TOP_LAYER`, `PRIVATE_TOP`, `ONLY`,
    `NOWHERE` or `FACADE_USERS`."""
    subpackages = _subpackages(imports, package)
    problems = []
    for module, found in sorted(imports.items()):
        forbidden = _forbidden_for(module, package, subpackages)
        allowed = _only_for(module, package)
        facade = module != package and not any(
            _within(module, f"{package}.{user}") for user in FACADE_USERS
        )
        for line, name, _ in found:
            if (
                any(_within(name, t) and not _within(module, t) for t in forbidden)
                or (
                    allowed is not None
                    and _within(name, package)
                    and not any(_within(name, a) for a in allowed)
                )
                or (facade and _module_of(name, imports) == package)
            ):
                problems.append(f"{module} imports {name} (line {line})")
    return problems


def _subpackages(imports: ImportMap, package: str) -> list[str]:
    """The packages directly inside ``package`` (a name with modules below it)."""
    return sorted(
        {m.split(".")[1] for m in imports if m.count(".") >= 2 and m.startswith(package + ".")}
    )


def _forbidden_for(module: str, package: str, subpackages: Sequence[str]) -> list[str]:
    found = [n.format(package=package) for n in NOWHERE]
    for importer, targets in FORBIDDEN.items():
        if _within(module, f"{package}.{importer}"):
            found += [f"{package}.{t}" for t in targets]
    if any(module == f"{package}.{top}" for top in (*TOP_LAYER, *PRIVATE_TOP)):
        found += [f"{package}.{sub}" for sub in subpackages]
    return found


def _only_for(module: str, package: str) -> list[str] | None:
    for importer, targets in ONLY.items():
        if _within(module, f"{package}.{importer}"):
            return [f"{package}.{importer}", *(f"{package}.{t}" for t in targets)]
    return None


def ranked_violations(
    imports: ImportMap, package: str, layers: Sequence[Sequence[str]]
) -> list[str]:
    """One line per import of a module of ``package`` in a layer above the importer's (the
    package itself counts as the top: importing it runs everything), and one per module
    that is in no layer.  Imports within one layer are free (the cycle rule still holds)."""
    rank = {f"{package}.{m}": i for i, layer in enumerate(layers) for m in layer}
    rank[package] = -1
    problems = []
    for module, found in sorted(imports.items()):
        if module not in rank:
            problems.append(f"{module} is in no layer")
            continue
        for line, name, _ in found:
            target = _module_of(name, imports)
            if target is not None and rank.get(target, len(layers)) < rank[module]:
                problems.append(f"{module} imports {name} (line {line}), a layer above it")
    return problems


def cycle_violations(imports: ImportMap, package: str) -> list[str]:
    """One line per import cycle between modules of the package: ``a -> b -> a``, each
    module with the line of its import of the next.  An import inside a function counts
    like any other: deferring an import hides a cycle from Python, not from the reader."""
    graph = _import_graph(imports, package)
    return [
        "import cycle: "
        + " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:], strict=False))
        + f" -> {cycle[-1]}"
        for cycle in _cycles(graph)
    ]


def _import_graph(imports: ImportMap, package: str) -> dict[str, dict[str, int]]:
    """Module -> module it imports -> the line of the first such import."""
    graph: dict[str, dict[str, int]] = {module: {} for module in imports}
    for module, found in imports.items():
        for line, name, _ in found:
            target = _module_of(name, imports)
            if target is None or target == module:
                continue
            graph[module].setdefault(target, line)
    return graph


def _cycles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) through each strongly connected set of modules that
    has one, found by depth-first search in name order (deterministic)."""
    found: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        found += _search(start, graph, path, on_path, done)
    return found


def _search(
    module: str,
    graph: Mapping[str, Mapping[str, int]],
    path: list[str],
    on_path: set[str],
    done: set[str],
) -> list[list[str]]:
    path.append(module)
    on_path.add(module)
    found: list[list[str]] = []
    for target in sorted(graph[module]):
        if target in on_path:
            found.append([*path[path.index(target) :], target])
        elif target not in done:
            found += _search(target, graph, path, on_path, done)
    path.pop()
    on_path.discard(module)
    done.add(module)
    return found


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


def long_modules(
    modules: Mapping[str, Path], limit: int = MAX_LINES, for_now: Mapping[str, str] = LONG_FOR_NOW
) -> list[str]:
    """One line per module over ``limit`` lines that ``for_now`` does not name, and one per
    entry of ``for_now`` that names no module over the limit (it is stale)."""
    problems = []
    sizes = {module: len(path.read_text().splitlines()) for module, path in modules.items()}
    for module, lines in sorted(sizes.items()):
        if lines > limit and module not in for_now:
            problems.append(f"{module} has {lines} lines, more than {limit}")
    package = min(modules, key=len)
    for module in sorted(for_now):
        if module.partition(".")[0] == package and sizes.get(module, 0) <= limit:
            problems.append(f"{module} is not over {limit} lines: remove it from LONG_FOR_NOW")
    return problems


def layout_violations(root: Path, package: str) -> list[str]:
    imports = import_map(root, package)
    return (
        layer_violations(imports, package)
        + cycle_violations(imports, package)
        + name_violations(find_modules(root, package))
        + long_modules(find_modules(root, package))
    )


def command_imports(imports: ImportMap, library: str = "msched") -> list[str]:
    """One line per import of the library's command (``msched.cli``) by the plugin: the
    command is the top of the library, which nothing below it imports."""
    command = f"{library}.cli"
    return [
        f"{module} imports {name} (line {line})"
        for module, found in sorted(imports.items())
        for line, name, _ in found
        if _within(name, command)
    ]


def plugin_layout_violations(root: Path, package: str) -> list[str]:
    imports = import_map(root, package)
    return (
        ranked_violations(imports, package, PLUGIN_LAYERS)
        + command_imports(imports)
        + cycle_violations(imports, package)
        + name_violations(find_modules(root, package))
        + long_modules(find_modules(root, package))
    )


def test_msched_layout_holds() -> None:
    assert layout_violations(ROOT, "msched") == []


def test_pytest_msched_layout_holds() -> None:
    assert plugin_layout_violations(PLUGIN_ROOT, "pytest_msched") == []
    assert "pytest_msched._session" in find_modules(PLUGIN_ROOT, "pytest_msched")


def test_only_the_listed_modules_are_long_for_now() -> None:
    """`LONG_FOR_NOW` was temporary: since cli.py was split (issue 35) it is empty."""
    assert LONG_FOR_NOW == {}


def test_every_module_is_seen() -> None:
    modules = find_modules(ROOT, "msched")
    for name in ("msched.analysis.dag", "msched.scheduling.emit", "msched.compile.compiler"):
        assert name in modules
    assert all(path.is_file() for path in modules.values())


# Errors that never reach a user: `trace_streams` turns Inductor's failure, which this
# marker carries through Dynamo, into an InvalidArgumentError naming the traced function.
PRIVATE_ERRORS = {"msched.compile.tracing._InductorFailed"}


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


# --- the checker itself: each rule fails on a map that breaks it ---------------------------


def synthetic(edges: Mapping[str, Sequence[str]], deferred: Sequence[str] = ()) -> ImportMap:
    """The `ImportMap` of a package ``pkg`` whose module ``m`` imports ``edges[m]`` in order
    (lines 1, 2, ...); an import ``"m:name"`` in ``deferred`` is inside a function.  Every
    ``pkg`` name in the edges is a module, with its packages, except one whose last part is
    capitalized (``pkg.proof.b.Dialect``: a name imported from the module ``pkg.proof.b``)."""
    names = {n for m, targets in edges.items() for n in (m, *targets) if _within(n, "pkg")}
    names = {n.rpartition(".")[0] if n.rpartition(".")[2][:1].isupper() else n for n in names}
    modules = {".".join(n.split(".")[:k]) for n in names for k in range(1, n.count(".") + 2)}
    return {
        m: [Import(i + 1, n, f"{m}:{n}" in deferred) for i, n in enumerate(edges.get(m, ()))]
        for m in sorted(modules)
    }


LAYER_CASES = [
    *((f"pkg.{top}", "pkg.analysis.dag") for top in TOP_LAYER),
    ("pkg.ops", "pkg.models.decoders"),
    *(("pkg.analysis.dag", f"pkg.{t}.x") for t in ("scheduling", "proof", "pictures")),
    *(("pkg.analysis.dag", f"pkg.{t}.x") for t in ("compile", "testing")),
    *(("pkg.proof.verifier", f"pkg.{t}.x") for t in ("scheduling", "pictures", "compile")),
    ("pkg.proof.verifier", "pkg.testing.checks"),
    *(("pkg.scheduling.emit", f"pkg.{t}.x") for t in ("pictures", "compile", "testing")),
    *(("pkg.pictures.text", f"pkg.{t}.x") for t in ("compile", "testing")),
    ("pkg.compile.compiler", "pkg.testing.checks"),
    ("pkg.compile.traced", "pkg.testing.traced.TracedDecoder"),
    *(("pkg.models.decoders", f"pkg.{t}.x") for t in ("analysis", "proof", "testing")),
    ("pkg.models.decoders", "pkg.cli"),
    ("pkg.models.decoders", "pkg"),  # the package runs everything
    ("pkg.analysis.dag", "pkg.Schedule"),  # a name of the package (not of pkg.scheduling)
    ("pkg.pictures.x", "pkg"),
    ("pkg.ops", "pkg.Backend"),
    *((f"pkg.{private}", "pkg.compile.compiler") for private in PRIVATE_TOP),
    ("pkg.testing.checks", "pkg.cli.main"),
    ("pkg.pictures.demo", "pkg.cli.stack.Progress"),
    ("pkg.proof.actions", "pytest"),
    ("pkg.analysis.dag", "pytest_msched.fixtures"),
]


@pytest.mark.parametrize(("importer", "imported"), LAYER_CASES)
def test_each_layer_rule_fails_on_an_import_that_breaks_it(importer: str, imported: str) -> None:
    imports = synthetic({importer: ["torch", "pkg.errors", imported]})
    assert layer_violations(imports, "pkg") == [f"{importer} imports {imported} (line 3)"]


ALLOWED_CASES = [
    ("pkg.models.decoders", ["pkg.ops", "pkg.errors", "pkg.limits", "pkg.runtime", "torch"]),
    ("pkg.models.decoders", ["pkg._torch_internals", "pkg._lazy", "pkg.models.reference_ops"]),
    ("pkg.testing.checks", ["pkg.compile.x", "pkg.pictures.x", "pkg.scheduling.x", "pkg"]),
    ("pkg.testing.strategies", ["pkg.testing.checks", "pkg.models.decoders.TinyDecoder"]),
    ("pkg.compile.compiler", ["pkg.scheduling.x", "pkg.proof.x", "pkg.models.decoders"]),
    ("pkg.scheduling.emit", ["pkg.proof.x", "pkg.analysis.x", "pkg.ops"]),
    ("pkg.cli", ["pkg.testing.checks", "pkg.compile.x", "pkg.models"]),
    ("pkg.cli.diff", ["pkg.cli.stack", "pkg.cli.options.Parser", "pkg.pictures.x"]),
    ("pkg.ops", ["pkg.runtime", "pkg._torch_internals", "torch"]),
    ("pkg.testing.checks", ["pkg.Schedule", "pkg"]),
    ("pkg.cli.stack", ["pkg.Schedule"]),
]


@pytest.mark.parametrize(("importer", "imported"), ALLOWED_CASES)
def test_imports_down_the_layers_pass(importer: str, imported: list[str]) -> None:
    assert layer_violations(synthetic({importer: imported}), "pkg") == []


def test_the_top_layer_rule_covers_every_subpackage() -> None:
    """The top layer imports no subpackage, whatever its name: the list is read from the map."""
    imports = synthetic({"pkg.limits": ["pkg.newpart.x"], "pkg.errors": ["pkg.newpart"]})
    assert layer_violations(imports, "pkg") == [
        "pkg.errors imports pkg.newpart (line 1)",
        "pkg.limits imports pkg.newpart.x (line 1)",
    ]
    assert _subpackages(import_map(ROOT, "msched"), "msched") == [
        "analysis", "cli", "compile", "models", "pictures", "proof", "scheduling", "testing"
    ]  # fmt: skip


def test_a_cycle_is_reported_with_the_line_of_each_import() -> None:
    imports = synthetic(
        {
            "pkg.proof.a": ["torch", "pkg.proof.b.Reader"],
            "pkg.proof.b": ["pkg.proof.c"],
            "pkg.proof.c": ["pkg.errors", "pkg.proof.a"],
            "pkg.proof.d": ["pkg.proof.a"],
        }
    )
    assert cycle_violations(imports, "pkg") == [
        "import cycle: pkg.proof.a (line 2) -> pkg.proof.b (line 1) -> pkg.proof.c (line 2)"
        " -> pkg.proof.a"
    ]


def test_a_cycle_through_a_function_level_import_counts() -> None:
    edges = {"pkg.compile.x": ["pkg.compile.y"], "pkg.compile.y": ["pkg.compile.x"]}
    imports = synthetic(edges, deferred=["pkg.compile.y:pkg.compile.x"])
    assert cycle_violations(imports, "pkg") == [
        "import cycle: pkg.compile.x (line 1) -> pkg.compile.y (line 1) -> pkg.compile.x"
    ]


def test_the_real_import_map_sees_deferred_and_relative_imports() -> None:
    imports = import_map(ROOT, "msched")
    tracing = {name: deferred for _, name, deferred in imports["msched.compile.tracing"]}
    assert tracing["msched.compile.kernel_order.kernel_order_program"] is True
    assert tracing["msched.errors.InvalidArgumentError"] is False


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


PLUGIN_CASES = [
    ("pkg._options", "pkg._session.MschedSession"),
    ("pkg._reading", "pkg._session"),
    ("pkg.snapshot", "pkg._session.ReadingContext"),  # the cycle issue 35 broke
    ("pkg._session", "pkg.fixtures"),
    ("pkg.assertions", "pkg.plugin"),
    ("pkg._pytest_internals", "pkg"),  # the package runs everything
]


@pytest.mark.parametrize(("importer", "imported"), PLUGIN_CASES)
def test_a_plugin_module_importing_a_layer_above_fails(importer: str, imported: str) -> None:
    imports = synthetic({importer: ["pytest", "pkg._syrupy_internals", imported]})
    assert ranked_violations(imports, "pkg", PLUGIN_LAYERS) == [
        f"{importer} imports {imported} (line 3), a layer above it"
    ]


def test_plugin_imports_down_or_within_a_layer_pass() -> None:
    imports = synthetic(
        {
            "pkg.plugin": ["pkg._session", "pkg._options"],
            "pkg.fixtures": ["pkg.assertions", "pkg._session", "pkg.snapshot", "pkg._params"],
            "pkg.snapshot": ["pkg._reading", "pkg._syrupy_internals", "msched.pictures.text"],
        }
    )
    assert ranked_violations(imports, "pkg", PLUGIN_LAYERS) == []


def test_a_plugin_module_without_a_layer_fails() -> None:
    imports = synthetic({"pkg.newpart": ["pkg._options"]})
    assert ranked_violations(imports, "pkg", PLUGIN_LAYERS) == ["pkg.newpart is in no layer"]


def test_a_plugin_cycle_through_a_deferred_import_is_reported() -> None:
    edges = {"pkg._session": ["pkg.snapshot"], "pkg.snapshot": ["pkg._session"]}
    imports = synthetic(edges, deferred=["pkg.snapshot:pkg._session"])
    assert cycle_violations(imports, "pkg") == [
        "import cycle: pkg._session (line 1) -> pkg.snapshot (line 1) -> pkg._session"
    ]


def test_a_module_over_the_line_limit_fails(tmp_path: Path) -> None:
    for name, lines in (("__init__", 0), ("short", 650), ("long", 651), ("listed", 700)):
        (tmp_path / f"{name}.py").write_text("x = 1\n" * lines)
    modules = find_modules(tmp_path, "pkg")
    for_now = {"pkg.listed": "why", "pkg.short": "stale", "other.cli": "another package's"}
    assert long_modules(modules, 650, for_now) == [
        "pkg.long has 651 lines, more than 650",
        "pkg.short is not over 650 lines: remove it from LONG_FOR_NOW",
    ]


def test_the_plugin_may_not_import_the_command() -> None:
    imports = {"pytest_msched._options": [Import(3, "msched.cli.stack.build_stack", False)]}
    assert command_imports(imports) == [
        "pytest_msched._options imports msched.cli.stack.build_stack (line 3)"
    ]
    assert command_imports({"pytest_msched._options": [Import(1, "msched.verify", False)]}) == []

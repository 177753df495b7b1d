"""Built-in dialects come from one list, `msched.proof.BUILTIN_DIALECT_MODULES`.

A module registers its dialect with `msched.proof.dialects.register` when it is imported, and
importing ``msched.proof`` imports the listed modules.  `registering_modules` reads the source
(nothing is imported, so a module that nobody imports is seen too) and finds every module that
calls ``register`` at its top level; it must be exactly the list.
"""

from __future__ import annotations

import ast
from pathlib import Path

import msched.proof
from msched.proof import dialects
from tests.msched.test_layout import ROOT, find_modules


def _calls_register(node: ast.stmt) -> bool:
    """Whether ``node`` is a call of ``dialects.register(...)`` or ``register(...)``."""
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        return False
    return ast.unparse(node.value.func) in ("dialects.register", "register")


def registering_modules(root: Path, package: str) -> list[str]:
    """The modules below ``root`` (``package``) that call ``dialects.register`` (or a
    ``register`` imported from it) at their top level, except `msched.proof.dialects`."""
    found = []
    for module, path in sorted(find_modules(root, package).items()):
        tree = ast.parse(path.read_text())
        if module != f"{package}.proof.dialects" and any(map(_calls_register, tree.body)):
            found.append(module)
    return found


def test_every_module_that_registers_a_dialect_is_listed() -> None:
    assert registering_modules(ROOT, "msched") == sorted(msched.proof.BUILTIN_DIALECT_MODULES)


def test_the_built_in_dialects_in_the_order_of_the_list() -> None:
    """``msched`` and ``trtllm`` (registered by `msched.proof.dialects`), then the listed
    modules' dialects in the list's order: the order messages name them in."""
    assert msched.proof.BUILTIN_DIALECT_MODULES == (
        "msched.proof.torch_streams",
        "msched.proof.autodeploy_streams",
    )
    assert list(dialects.builtin_dialects()) == ["msched", "trtllm", "torch", "autodeploy"]


def test_an_unlisted_registering_module_is_found(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "proof").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "proof" / "__init__.py").write_text("")
    (package / "proof" / "dialects.py").write_text("def register(name, make): ...\n")
    (package / "proof" / "mine.py").write_text(
        "from pkg.proof import dialects\n\ndialects.register('mine', object)\n"
    )
    (package / "proof" / "theirs.py").write_text(
        "from pkg.proof.dialects import register\n\nregister('theirs', object)\n"
    )
    (package / "proof" / "reader.py").write_text(
        "def later():\n    dialects.register('not at import', object)\n"
    )
    assert registering_modules(package, "pkg") == ["pkg.proof.mine", "pkg.proof.theirs"]

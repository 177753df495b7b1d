"""Runs of pytest inside these tests must not believe they are pytest-xdist workers.

In-process ``pytester`` runs drop the modules they imported when they end.  torch._dynamo
cannot be imported twice (its ops register a TORCH_LIBRARY namespace once per process), and
the first call of a custom op imports it: import it here, before any inner run, so an inner
run that compiles cannot leave it half-unloaded for the tests after it.  Compiling imports
more modules of the same kind (AOT autograd's, parts of torch._inductor that register
themselves in torch.compiler's cache and Dynamo's backend registry): `_compiled_once` compiles
a function before the first test here, so that every inner run finds them imported, whatever
order the tests run in.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo  # noqa: F401  (see the module docstring)

XDIST_WORKER_VARIABLES = (
    "PYTEST_XDIST_WORKER",
    "PYTEST_XDIST_WORKER_COUNT",
    "PYTEST_XDIST_TESTRUNUID",
)


@pytest.fixture(scope="session", autouse=True)
def _compiled_once() -> None:
    """Import what compiling imports, before any inner run (see the module docstring)."""
    torch.compile(lambda x: x + 1, backend="aot_eager", fullgraph=True)(torch.ones(2))
    torch.compiler.reset()


@pytest.fixture(autouse=True)
def _not_an_xdist_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """When this suite runs under ``-n``, hide the worker's xdist variables from inner runs.

    syrupy (and pytest-xdist itself) read them from the environment: an inner run that sees
    them skips its snapshot report and leaves unused-snapshot handling to a controller that
    does not exist.
    """
    for name in XDIST_WORKER_VARIABLES:
        monkeypatch.delenv(name, raising=False)

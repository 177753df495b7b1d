"""Loading a user's graph: what ``msched ... --graph SPEC`` names.

``SPEC`` is ``module:function`` (a function of no arguments returning a
``torch.fx.GraphModule``, or ``(module or function, example inputs)`` that the caller captures,
with Dynamo in the CLI) or a file: a GraphModule saved with ``torch.save`` (``.pt``) or an
ExportedProgram saved with ``torch.export.save`` (``.pt2``).  A spec that names nothing
loadable is a `msched.UsageError` that says what went wrong and what is accepted.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.fx import GraphModule

from msched.errors import UsageError, one_line

__all__ = ["GRAPH_SPEC_HELP", "cwd_importable", "load_graph"]

GRAPH_SPEC_HELP = (
    "give --graph as module:function (a function of no arguments returning a "
    "torch.fx.GraphModule, or a tuple (module or function, example inputs) that is captured "
    "with Dynamo) or as a file: a GraphModule saved with torch.save (.pt) or an "
    "ExportedProgram saved with torch.export.save (.pt2)"
)


def cwd_importable() -> None:
    """Make the current directory importable, as ``python -m`` does: the user's own modules
    (``--graph``, ``--dialect``) import."""
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))


def load_graph(spec: str, capture: Callable[..., GraphModule]) -> GraphModule:
    """The graph ``--graph SPEC`` names (see `GRAPH_SPEC_HELP`); a bad spec is a `UsageError`
    that says what went wrong and what is accepted.  ``capture(fn, *example_inputs)``
    captures what a function returns as ``(module or function, example inputs)``: the CLI
    passes `msched.trace_streams` (Dynamo)."""
    path = Path(spec)
    if path.is_file():
        return _graph_from_file(path)
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(
            f"--graph {spec}: no such file, and not module:function; {GRAPH_SPEC_HELP}"
        )
    cwd_importable()
    try:
        module = importlib.import_module(module_name)
    except Exception as error:
        raise UsageError(
            f"--graph {spec}: cannot import {module_name}: "
            f"{type(error).__name__}: {one_line(error)}"
        ) from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise UsageError(f"--graph {spec}: {module_name} has no function {attribute}")
    try:
        value = function()
    except Exception as error:
        raise UsageError(f"--graph {spec}: calling it raised {type(error).__name__}: "
                         f"{one_line(error)}") from None  # fmt: skip
    return _graph_from_value(value, f"--graph {spec}", capture)


def _graph_from_value(value: Any, where: str, capture: Callable[..., GraphModule]) -> GraphModule:
    """A GraphModule as it is, or ``(fn, example_inputs)`` captured with Dynamo."""
    if isinstance(value, GraphModule):
        return value
    if isinstance(value, tuple) and len(value) == 2 and callable(value[0]):
        fn, inputs = value
        inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        return capture(fn, *inputs)
    raise UsageError(
        f"{where} returned {type(value).__name__}; return a torch.fx.GraphModule or a tuple "
        "(module or function, example inputs)"
    )


def _exported_module(program: Any) -> GraphModule:
    """The runnable module of an ExportedProgram, without the guard call torch adds (an
    opaque submodule that would be read as unknown code touching every input)."""
    try:
        module = program.module(check_guards=False)
    except TypeError:  # a torch whose module() takes no such option
        module = program.module()
    assert isinstance(module, GraphModule)
    return module


@contextlib.contextmanager
def _quiet_export_log() -> Iterator[None]:
    """``torch.export.load`` logs a file it cannot read as a warning with its traceback,
    then fails; the one-line error msched raises says it, so the warning is held back."""
    log = logging.getLogger("torch.export")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _graph_from_file(path: Path) -> GraphModule:
    """A GraphModule from ``torch.export.save`` (``.pt2``) or ``torch.save`` (a pickle)."""
    try:
        if path.suffix == ".pt2":
            with _quiet_export_log():
                program = torch.export.load(path)
            return _exported_module(program)
        value = torch.load(path, weights_only=False)
    except Exception as error:
        raise UsageError(f"--graph {path}: cannot load it: {one_line(error)}; "
                         f"{GRAPH_SPEC_HELP}") from None  # fmt: skip
    if not isinstance(value, GraphModule):
        raise UsageError(
            f"--graph {path} holds a {type(value).__name__}, not a torch.fx.GraphModule; "
            f"{GRAPH_SPEC_HELP}"
        )
    return value

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
import re
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
def _quiet_export_log() -> Iterator[list[str]]:
    """``torch.export.load`` logs a file it cannot read as a warning with its traceback,
    then fails with "check the warnings above"; the one-line error msched raises says what
    went wrong instead, so the warning is held back, and its messages are yielded."""
    log = logging.getLogger("torch.export")
    held: list[str] = []
    handler = _Holder(held)
    saved = log.handlers, log.level, log.propagate  # torch's handler is on this logger
    log.handlers, log.propagate = [handler], False
    log.setLevel(logging.WARNING)
    try:
        yield held
    finally:
        log.handlers, _, log.propagate = saved
        log.setLevel(saved[1])


class _Holder(logging.Handler):
    def __init__(self, held: list[str]) -> None:
        super().__init__(logging.WARNING)
        self.held = held

    def emit(self, record: logging.LogRecord) -> None:
        # The error is in the traceback torch logs with the record (exc_info=True).
        self.held.append(self.format(record))


# How torch.export.load says that a node's op is not registered in this process.
_UNRESOLVED_OP = re.compile(r"failed to resolve (torch\.ops\.[\w.]+) to an operator")


def _load_failure(path: Path, error: Exception, held: list[str]) -> UsageError:
    """The usage error for a file that did not load: an op it uses that is not registered
    (an engine's own op, whose module was not imported) is named, with the way to register
    it; else torch's error."""
    for message in held:
        unresolved = _UNRESOLVED_OP.search(message)
        if unresolved:
            return UsageError(
                f"--graph {path}: cannot load it: it uses {unresolved.group(1)}, which is not "
                "registered in this process; import the module that registers it before the "
                "graph loads: --dialect package.module:attribute imports its module first, "
                "or give --graph as module:function of a module that imports it"
            )
    return UsageError(f"--graph {path}: cannot load it: {one_line(error)}; {GRAPH_SPEC_HELP}")


def _graph_from_file(path: Path) -> GraphModule:
    """A GraphModule from ``torch.export.save`` (``.pt2``) or ``torch.save`` (a pickle)."""
    held: list[str] = []
    try:
        if path.suffix == ".pt2":
            with _quiet_export_log() as held:
                program = torch.export.load(path)
            return _exported_module(program)
        value = torch.load(path, weights_only=False)
    except Exception as error:
        raise _load_failure(path, error, held) from None
    if not isinstance(value, GraphModule):
        raise UsageError(
            f"--graph {path} holds a {type(value).__name__}, not a torch.fx.GraphModule; "
            f"{GRAPH_SPEC_HELP}"
        )
    return value

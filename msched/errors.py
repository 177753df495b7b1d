"""The exception hierarchy of msched: every error a user can see derives from `MschedError`.

Every class is defined here and exported from `msched`; the modules that raise them import
them from here.  `SplitOpNotFoundWarning`, `CollectiveOutsideGraphWarning` and
`UntestedVersionWarning` are warnings, not errors.
(The pytest plugin's own `pytest_msched._pytest_internals.UntestedVersionWarning` is a pytest
warning defined there: the plugin warns with it before it may import torch.)

Errors carry what their message names as data: ``nodes`` (the names of the nodes involved),
``report`` (the `msched.Report` of a failed verification), ``piece`` (the name of a piece of
a compiled graph).  This module imports no part of msched, so those attributes are typed
loosely (``report: Any`` is a `msched.Report`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any


class MschedError(Exception):
    """Base class of every error msched raises on purpose."""


class InvalidGraphError(MschedError):
    """The input graph cannot be scheduled or verified as given (no output, nodes after it, ...).

    ``nodes``: the names of the nodes the message names (empty where it names none)."""

    def __init__(self, message: str, *, nodes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.nodes = nodes


class UnreadStreamOpsError(InvalidGraphError):
    """The graph has ops that look like stream ops (`msched.proof.lookalikes`) but the dialect
    it is read in does not read them: read as compute they would order nothing, so no verdict
    on the graph can be trusted.  ``ops`` are their qualified names (``myeng::wait``),
    ``nodes`` the names of their nodes; the message says how to give the dialect: ``hint``,
    in the words of the tool that read the graph (`dialect_hint`)."""

    def __init__(
        self, message: str, *, nodes: tuple[str, ...], ops: tuple[str, ...], hint: str = ""
    ) -> None:
        super().__init__(message, nodes=nodes)
        self.ops = ops
        self.hint = hint


class InvalidArgumentError(MschedError, ValueError):
    """An argument of a public function is out of range or of the wrong type."""


class ScheduleVerificationError(MschedError):
    """`Report.raise_if_failed()` found violations; the message lists all of them and
    ``report`` is the `msched.Report` (None where there is none to give)."""

    def __init__(self, message: str, *, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class PieceVerificationError(ScheduleVerificationError):
    """`msched.backend` (``verify=True``) found violations in a scheduled piece; the message
    names the piece.  ``piece`` is its name (``graph0_piece1``), ``report`` the `msched.Report`
    of its verification (None when there was no program to verify)."""

    def __init__(self, message: str, *, piece: str, report: Any = None) -> None:
        super().__init__(message, report=report)
        self.piece = piece


class TrainingGraphError(MschedError):
    """`msched.backend` was handed a graph that needs autograd; it compiles inference graphs
    only (the message says how to run the model without autograd)."""


class NoGraphCompiledError(MschedError):
    """``torch.compile`` ran a model without handing any graph to `msched.backend` (it ran
    eagerly); the message names the model's class."""


class ReinplaceError(MschedError):
    """`msched.backend` cannot turn a functionalized call (``auto_functionalized``) back into
    the in-place call it came from; the message names the op and the node."""


class MissingDependencyError(MschedError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


class SplitOpNotFoundError(InvalidArgumentError):
    """A ``split_ops`` op never occurs in a graph the backend splits; the message names it
    and the ops of the graph that look related (what AOT autograd may have decomposed it to),
    spelled as ``split_ops`` takes them (``"aten::name.overload"``)."""


class SplitOpNotFoundWarning(UserWarning):
    """A graph the backend splits calls no ``split_ops`` op and nothing like one: one piece."""


class CollectiveOutsideGraphWarning(UserWarning):
    """Dynamo broke the graph at a collective (``torch.distributed.all_reduce(t,
    async_op=True)``, ``Work.wait()``): it runs eagerly between the compiled graphs, where
    msched neither schedules nor verifies it."""


class TorchInternalsError(MschedError):
    """A private torch interface msched relies on is missing from the installed torch (a
    release outside the tested range changed it); the message names the interface, the torch
    version and the tested range (`msched._torch_internals`)."""


class UntestedVersionWarning(UserWarning):
    """A library msched or its pytest plugin relies on (torch, pytest, pytest-xdist, syrupy) is
    installed in a version outside the range CI tests; the message names both."""


class InductorInterfaceError(MschedError):
    """A private TorchInductor interface msched's Inductor support relies on is missing in
    this torch; the message names each one and the torch version."""


class RankFailedError(MschedError):
    """A rank of `msched.testing.ranks.run_on_ranks` (or of a ``RankPool``) raised, or died
    without a result (every rank of the pool is then killed); the
    message names the rank and holds the child's traceback.  ``rank`` is its index and
    ``child_traceback`` the traceback text (empty when the process died without one)."""

    def __init__(self, message: str, *, rank: int, child_traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.child_traceback = child_traceback


class RanksTimeoutError(MschedError):
    """`msched.testing.ranks.run_on_ranks` (or a ``RankPool``) ran past its timeout, or its
    ranks took longer than that to start; every rank was killed.
    ``ranks`` are the ranks that had not finished, ``timeout`` the limit in seconds."""

    def __init__(self, message: str, *, ranks: tuple[int, ...], timeout: float) -> None:
        super().__init__(message)
        self.ranks = ranks
        self.timeout = timeout


class UsageError(MschedError):
    """A bad ``msched`` command-line argument found after parsing (exit status 2); the message
    names the option."""


LIBRARY_DIALECT_HINT = "pass dialect=... (a msched.Dialect or a dialect name)"
"""How a graph's dialect is given to msched's functions: the `dialect_hint` by default."""

_DIALECT_HINT: contextvars.ContextVar[str] = contextvars.ContextVar(
    "msched_dialect_hint", default=LIBRARY_DIALECT_HINT
)


@contextlib.contextmanager
def dialect_hint(hint: str) -> Iterator[None]:
    """While this runs, an `UnreadStreamOpsError` says to give the dialect as ``hint`` says.

    A tool that reads graphs for its user and takes the dialect its own way sets this around
    its work: the ``msched`` command (``--dialect``), the pytest plugin (its ini option).
    Outside any, the hint is `LIBRARY_DIALECT_HINT` (``dialect=``)."""
    token = _DIALECT_HINT.set(hint)
    try:
        yield
    finally:
        _DIALECT_HINT.reset(token)


def current_dialect_hint() -> str:
    """The hint of the innermost `dialect_hint` running (`LIBRARY_DIALECT_HINT` outside any)."""
    return _DIALECT_HINT.get()


def one_line(error: BaseException) -> str:
    """``error``'s message on one line (runs of whitespace, newlines included, become one
    space), for messages that quote another error."""
    return " ".join(str(error).split())

"""The exception hierarchy of msched: every error a user can see derives from `MschedError`.

Every class is defined here and exported from `msched`; the modules that raise them import
them from here.  `SplitOpNotFoundWarning` is a warning, not an error: the one warning class.
"""

from __future__ import annotations


class MschedError(Exception):
    """Base class of every error msched raises on purpose."""


class InvalidGraphError(MschedError):
    """The input graph cannot be scheduled or verified as given (no output, nodes after it, ...)."""


class InvalidArgumentError(MschedError, ValueError):
    """An argument of a public function is out of range or of the wrong type."""


class ScheduleVerificationError(MschedError):
    """`Report.raise_if_failed()` found violations; the message lists all of them."""


class PieceVerificationError(ScheduleVerificationError):
    """`msched.backend` (``verify=True``) found violations in a scheduled piece; the message
    names the piece."""


class ReinplaceError(MschedError):
    """`msched.backend` cannot turn a functionalized call (``auto_functionalized``) back into
    the in-place call it came from; the message names the op and the node."""


class SplitOpNotFoundError(InvalidArgumentError):
    """A ``split_ops`` op never occurs in a graph the backend splits; the message names it
    and the ops of the graph that look related (what AOT autograd may have decomposed it to)."""


class SplitOpNotFoundWarning(UserWarning):
    """A graph the backend splits calls no ``split_ops`` op and nothing like one: one piece."""


class InductorInterfaceError(MschedError):
    """A private TorchInductor interface msched's Inductor support relies on is missing in
    this torch; the message names each one and the torch version."""

"""The exception hierarchy of msched: every error a user can see derives from `MschedError`."""

from __future__ import annotations


class MschedError(Exception):
    """Base class of every error msched raises on purpose."""


class InvalidGraphError(MschedError):
    """The input graph cannot be scheduled or verified as given (no output, nodes after it, ...)."""


class InvalidArgumentError(MschedError, ValueError):
    """An argument of a public function is out of range or of the wrong type."""


class ScheduleVerificationError(MschedError):
    """`Report.raise_if_failed()` found violations; the message lists all of them."""

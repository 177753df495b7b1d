"""A dialect named in text: what ``msched ... --dialect`` and the plugin's ``msched_dialect``
option (ini and ``--msched-dialect``) take.

The text is a dialect name, as `msched.proof.dialects.as_dialect` takes it (a built-in
dialect, or an op namespace with msched's four-op shape), or ``package.module:attribute``
naming a `msched.Dialect` of the user's (the attribute may be dotted).  Both tools read it
with `dialect_from_text`; each says in its own words which option was wrong.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from msched._text import articled
from msched.errors import InvalidArgumentError
from msched.proof.dialects import Dialect, as_dialect, builtin_dialects

__all__ = ["DIALECT_TEXT_HELP", "dialect_from_text", "import_attribute"]

DIALECT_TEXT_HELP = (
    "a dialect name (msched, trtllm, torch, autodeploy, or an op namespace with msched's "
    "four-op shape) or package.module:attribute naming a msched.Dialect"
)


def dialect_from_text(text: str) -> Dialect:
    """The `Dialect` ``text`` names (see the module docstring).

    Raises `msched.InvalidArgumentError` saying what went wrong: an unknown name (listing the
    known ones), a module that does not import (with the error it raised), a missing
    attribute, an attribute that is no `Dialect`.
    """
    text = text.strip()
    if ":" in text:
        dialect = import_attribute(text, "attribute")
        if not isinstance(dialect, Dialect):
            raise InvalidArgumentError(
                f"{text} is {articled(type(dialect).__name__)}, not a msched.Dialect"
            )
        return dialect
    try:
        return as_dialect(text)
    except InvalidArgumentError:
        # as_dialect's message advises msched.Dialect(...), an object no text can be; the
        # tool that reads the text says which forms it takes.
        raise InvalidArgumentError(f"unknown dialect {text!r}{_did_you_mean(text)}") from None


def _did_you_mean(text: str) -> str:
    close = difflib.get_close_matches(text, list(builtin_dialects()), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def import_attribute(text: str, what: str) -> Any:
    """The object ``package.module:attribute`` names (the attribute may be dotted);
    `msched.InvalidArgumentError` when the text is not of that form (``what`` names the
    part after the colon), the module does not import, or the attribute is missing."""
    module_name, colon, attribute = text.strip().partition(":")
    parts = attribute.split(".")
    if not colon or not all(p.isidentifier() for p in module_name.split(".") + parts):
        raise InvalidArgumentError(f"expected package.module:{what}")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:
        raise InvalidArgumentError(
            f"cannot import {module_name} ({type(error).__name__}: {error})"
        ) from None
    for k, part in enumerate(parts):
        if not hasattr(target, part):
            owner = ".".join([module_name, *parts[:k]])
            raise InvalidArgumentError(f"{owner} has no attribute {part!r}")
        target = getattr(target, part)
    return target

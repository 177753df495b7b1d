"""Counted nouns and lists in messages, in correct English: the one place for both.

`counted` writes ``1 violation`` / ``2 violations``; `listed` writes ``a``, ``a and b``,
``a, b and c``; `agreeing` picks the verb form for a subject of one or more items (``is`` /
``are``); `articled` puts "a" or "an" before a noun (``an int``, ``a function``).  A message
that formats a count or a list of names uses them, so that "capture_1 and capture_3 are
emitted" never reads "capture_1, capture_3 is emitted" and no message falls back on
"violation(s)".
"""

from __future__ import annotations

from collections.abc import Iterable


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 violation``, ``0 violations``, ``2 violations`` (``plural`` when it is not
    ``noun + "s"``)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def listed(items: Iterable[object]) -> str:
    """``a``, ``a and b``, ``a, b and c``: the items' ``str``, in the order given."""
    *head, last = map(str, items)
    return f"{', '.join(head)} and {last}" if head else last


def agreeing(count: int, singular: str, plural: str) -> str:
    """``singular`` for one, else ``plural``: the verb of a subject of ``count`` items."""
    return singular if count == 1 else plural


def articled(noun: str) -> str:
    """``noun`` after its indefinite article, by its first letter: ``an int``, ``an
    OpOverload``, ``a function`` (type names, which rarely start with a silent or long
    vowel)."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


__all__ = ["agreeing", "articled", "counted", "listed"]

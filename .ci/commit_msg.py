"""The commit-msg hook (``.pre-commit-config.yaml``): a commit subject has at most 72 characters.

git passes the hook the path of the message file.  Its subject is the first line that is
neither blank nor a git comment (``#``); git's scissors line (``git commit -v``) ends the
message.  A longer subject is refused with its length; what changed goes in the subject, why
in the body, after a blank line.
"""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72
SCISSORS = "# ------------------------ >8 ------------------------"


def subject(message: str) -> str:
    """The subject of ``message``: its first line that is neither blank nor a comment."""
    for line in message.splitlines():
        if line.startswith(SCISSORS):
            break
        if line.strip() and not line.startswith("#"):
            return line.rstrip()
    return ""


def problem(message: str) -> str | None:
    """Why ``message`` is refused, or None when its subject is short enough."""
    first = subject(message)
    if len(first) <= MAX_SUBJECT:
        return None
    return (
        f"the commit subject has {len(first)} characters, more than {MAX_SUBJECT}: say what "
        f"changed in the subject and why in the body, after a blank line\n  {first}"
    )


def main(argv: list[str]) -> int:
    """Check the message file ``argv[0]``: 0 when it passes, 1 (and why) when not."""
    if len(argv) != 1:
        print("usage: commit_msg.py MESSAGE_FILE", file=sys.stderr)
        return 2
    why = problem(Path(argv[0]).read_text(encoding="utf-8"))
    if why is None:
        return 0
    print(why, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

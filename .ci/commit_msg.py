"""The commit-msg hook (``.pre-commit-config.yaml``): a commit subject has at most 72 characters.

git passes the hook the path of the message file.  Its subject is the first line that is
neither blank nor a git comment (``#``); git's scissors line (``git commit -v``) ends the
message.  A longer subject is refused with its length; what changed goes in the subject, why
in the body, after a blank line.

``commit_msg.py --since START`` is the same rule over history, for CI (``.ci/run``): the message
of START and of every commit of HEAD after it, each read as the hook reads its file, so that a
commit made without the hook fails CI.  START not in the history of a shallow clone is a
printed note and exit status 0: there is nothing to check it against.  Not in a full clone's
history (a mistyped hash) it is an error, exit status 2, so a typo cannot turn the check off.
"""

from __future__ import annotations

import subprocess
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


def _git(args: list[str], cwd: Path | None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    except OSError as error:
        raise RuntimeError(f"cannot run git: {error}") from None


def messages_since(start: str, cwd: Path | None = None) -> list[tuple[str, str]] | None:
    """(short hash, message) of ``start`` and of every commit of HEAD after it, newest first
    (``git log HEAD --not start^@``: merged branches too); None when ``start`` is not a commit
    of this clone's history."""
    if _git(["cat-file", "-e", f"{start}^{{commit}}"], cwd).returncode != 0:
        return None
    done = _git(["log", "-z", "--format=%h%n%B", "HEAD", "--not", f"{start}^@"], cwd)
    if done.returncode != 0:
        raise RuntimeError(f"git log failed: {done.stderr.strip()}")
    return [
        (short, message)
        for short, _, message in (e.lstrip("\n").partition("\n") for e in done.stdout.split("\0"))
        if short
    ]


def check_history(start: str, cwd: Path | None = None) -> int:
    """``--since START``: 0 when every message from ``start`` to HEAD passes `problem` (or
    ``start`` is cut off by a shallow clone), 1 and each refused subject with its commit when
    not, 2 when git fails or ``start`` is no commit of a full clone."""
    try:
        messages = messages_since(start, cwd)
    except RuntimeError as error:
        print(f"commit subjects not checked: {error}", file=sys.stderr)
        return 2
    if messages is None:
        if _git(["rev-parse", "--is-shallow-repository"], cwd).stdout.strip() != "true":
            print(f"commit_msg.py: {start} is no commit of this repository", file=sys.stderr)
            return 2
        print(
            f"commit subjects not checked: {start} is not in this clone's history "
            "(a shallow clone: git fetch --unshallow fetches it)"
        )
        return 0
    refused = [f"{short}: {why}" for short, m in messages if (why := problem(m)) is not None]
    if refused:
        print("\n".join(refused), file=sys.stderr)
        return 1
    print(f"{len(messages)} commit subjects since {start[:12]}: none over {MAX_SUBJECT} characters")
    return 0


def main(argv: list[str]) -> int:
    """Check the message file ``argv[0]`` (or, ``--since START``, the history from START): 0
    when it passes, 1 (and why) when not, 2 for wrong arguments or a file it cannot read."""
    if len(argv) == 2 and argv[0] == "--since":
        return check_history(argv[1])
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: commit_msg.py MESSAGE_FILE | commit_msg.py --since START", file=sys.stderr)
        return 2
    try:
        message = Path(argv[0]).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        print(f"commit_msg.py: cannot read {argv[0]}: {error}", file=sys.stderr)
        return 2
    why = problem(message)
    if why is None:
        return 0
    print(why, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

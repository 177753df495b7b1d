"""``.ci/commit_msg.py``, the commit-msg hook that keeps commit subjects to 72 characters."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "commit_msg.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("commit_msg", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


commit_msg = _load()


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Fix it\n\nWhy.\n", "Fix it"),
        ("\n\n  Fix it  \n", "  Fix it"),
        ("# Please enter the commit message\n\nFix it\n# comment\n", "Fix it"),
        ("# ------------------------ >8 ------------------------\nFix it\n", ""),
        ("", ""),
    ],
)
def test_the_subject_is_the_first_line_that_is_not_blank_or_a_comment(
    message: str, expected: str
) -> None:
    assert commit_msg.subject(message) == expected


def test_a_subject_of_72_characters_passes_and_73_is_refused_with_its_length() -> None:
    assert commit_msg.problem("x" * 72 + "\n\n" + "a long body line " * 20) is None
    why = commit_msg.problem("x" * 73 + "\n")
    assert why is not None
    assert why.startswith("the commit subject has 73 characters, more than 72")


def test_the_hook_exits_1_on_a_long_subject_and_0_on_a_short_one(tmp_path: Path) -> None:
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("y" * 80 + "\n")
    long = subprocess.run([sys.executable, SCRIPT, message], capture_output=True, text=True)
    assert (long.returncode, long.stdout) == (1, "")
    assert "80 characters" in long.stderr
    message.write_text("Short subject\n\nBody.\n")
    short = subprocess.run([sys.executable, SCRIPT, message], capture_output=True, text=True)
    assert (short.returncode, short.stderr) == (0, "")


# --- --since START: the rule over history, for CI --------------------------------------------

GIT = ["git", "-c", "user.name=ci", "-c", "user.email=ci@example.com", "-c", "commit.gpgsign=false"]
GIT += ["-c", "core.hooksPath=/dev/null", "-c", "init.defaultBranch=main"]


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run([*GIT, *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def _history(repo: Path, messages: list[str]) -> list[str]:
    """A repository at ``repo`` with one empty commit per message, oldest first; their hashes."""
    repo.mkdir()
    _git(repo, "init", "-q")
    for message in messages:
        _git(repo, "commit", "-q", "--allow-empty", "--cleanup=verbatim", "-m", message)
    return _git(repo, "log", "--reverse", "--format=%H").split()


def _since(repo: Path, start: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, SCRIPT, "--since", start]
    return subprocess.run(command, cwd=repo, capture_output=True, text=True)


def test_history_from_start_is_read_as_the_hook_reads_a_message(tmp_path: Path) -> None:
    """Before START nothing counts; START and after count, each subject its first line."""
    two_lines = "Two lines\nof a first paragraph " + "z" * 70  # git's %s would join them
    messages = ["o" * 90, "The rule", two_lines, "x" * 73 + "\n\nWhy."]
    old, start, *_ = _history(tmp_path / "repo", messages)
    read = commit_msg.messages_since(start, tmp_path / "repo")
    assert read is not None
    assert [commit_msg.subject(m) for _, m in read] == ["x" * 73, "Two lines", "The rule"]
    done = _since(tmp_path / "repo", start)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.count("characters, more than 72") == 1 and "x" * 73 in done.stderr
    assert "o" * 90 not in done.stderr
    assert _since(tmp_path / "repo", old).stderr.count("more than 72") == 2


def test_a_long_start_is_refused_and_a_clean_history_passes(tmp_path: Path) -> None:
    start, _ = _history(tmp_path / "repo", ["s" * 80, "Short"])
    assert _since(tmp_path / "repo", start).returncode == 1
    start, _ = _history(tmp_path / "clean", ["The rule", "Short"])
    done = _since(tmp_path / "clean", start)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"2 commit subjects since {start[:12]}: none over 72 characters\n"


def test_a_shallow_clone_without_start_is_a_note_not_a_failure(tmp_path: Path) -> None:
    start, *_ = _history(tmp_path / "repo", ["The rule", "Short", "y" * 80])
    url = (tmp_path / "repo").as_uri()
    _git(tmp_path, "clone", "-q", "--depth", "1", url, "shallow")
    done = _since(tmp_path / "shallow", start)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"commit subjects not checked: {start} is not in this clone's")
    _git(tmp_path, "clone", "-q", "--depth", "2", url, "two")  # START's parents cut off
    assert _since(tmp_path / "two", _git(tmp_path / "two", "rev-parse", "HEAD~1")).returncode == 1


def test_wrong_arguments_exit_2_with_the_usage(tmp_path: Path) -> None:
    for argv in ([], ["--since"], ["a", "b"], ["--other", "x"]):
        done = subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True)
        assert done.returncode == 2 and done.stderr.startswith("usage: commit_msg.py")


def test_a_start_a_full_clone_does_not_have_is_an_error_not_a_note(tmp_path: Path) -> None:
    """A mistyped hash in ``.ci/run`` must not turn the check off."""
    _history(tmp_path / "repo", ["The rule", "Short"])
    done = _since(tmp_path / "repo", "0123456789abcdef0123456789abcdef01234567")
    assert done.returncode == 2 and "is no commit of this repository" in done.stderr


def test_a_message_file_that_cannot_be_read_exits_2(tmp_path: Path) -> None:
    missing = tmp_path / "COMMIT_EDITMSG"
    done = subprocess.run([sys.executable, SCRIPT, str(missing)], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith(f"commit_msg.py: cannot read {missing}")

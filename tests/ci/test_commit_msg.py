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

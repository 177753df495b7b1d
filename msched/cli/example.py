"""``msched example DIR``: copy the downstream example (``examples/downstream/``) out.

The example is a toy inference engine with its own stream ops, multi-stream pass, tests and
reviewed snapshots: a repository to copy (docs/writing-a-pass.md).  The wheel installs it as
data files under ``share/msched/examples/downstream`` of the environment
(``[tool.setuptools.data-files]`` in pyproject.toml); in a checkout of msched it is
``examples/downstream`` beside the package.
"""

from __future__ import annotations

import argparse
import shutil
import sysconfig
from pathlib import Path
from typing import TextIO

import msched
from msched.errors import UsageError

INSTALLED = Path("share", "msched", "examples", "downstream")
"""Where the wheel puts the example, under the environment's data directory."""

EXAMPLE_DESCRIPTION = (
    "Copy msched's downstream example (a toy engine with its own stream ops, multi-stream "
    "pass, tests and snapshots) into DIR, a new or empty directory; then run "
    "`cd DIR && python -m pytest`."
)
_LEFT_OUT = shutil.ignore_patterns("__pycache__", ".pytest_cache", "*.egg-info")


def add_example_parser(sub: argparse._SubParsersAction) -> None:
    """The ``example`` subcommand."""
    example = sub.add_parser(
        "example",
        help="copy the downstream example (engine, pass, tests, snapshots) into DIR",
        description=EXAMPLE_DESCRIPTION,
    )
    example.add_argument("directory", type=Path, metavar="DIR", help="a new or empty directory")


def example_source() -> Path:
    """The example's directory: installed with the wheel, else in msched's checkout."""
    candidates = (
        Path(sysconfig.get_path("data")) / INSTALLED,
        Path(msched.__file__).resolve().parents[1] / "examples" / "downstream",
    )
    for candidate in candidates:
        if (candidate / "pyproject.toml").is_file():
            return candidate
    raise UsageError(
        "the downstream example is not installed: looked in "
        + " and ".join(str(c) for c in candidates)
        + "; reinstall pytest-msched, or copy examples/downstream from msched's repository"
    )


def cmd_example(args: argparse.Namespace, stdout: TextIO) -> int:
    target: Path = args.directory
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UsageError(f"{target} exists and is not an empty directory")
    source = example_source()
    try:
        shutil.copytree(source, target, ignore=_LEFT_OUT, dirs_exist_ok=True)
    except OSError as error:
        raise UsageError(f"cannot copy the example into {target}: {error}") from None
    stdout.write(f"copied the downstream example to {target}; run: cd {target} && pytest\n")
    return 0

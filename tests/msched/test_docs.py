"""The documents cite files that exist: every relative Markdown link of the README,
CONTRIBUTING and ``docs/`` resolves, and no source or document cites a ``DESIGN.md`` (the
design is ``docs/design.md``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([REPO / "README.md", REPO / "CONTRIBUTING.md", *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def relative_links(text: str) -> list[str]:
    """The targets of ``[text](target)`` links that are paths, not URLs."""
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(document: Path) -> None:
    missing = [
        target
        for target in relative_links(document.read_text(encoding="utf-8"))
        if not (document.parent / target).exists()
    ]
    assert missing == []


def test_nothing_cites_a_design_file_that_is_not_there() -> None:
    assert (REPO / "docs" / "design.md").is_file()
    sources = [*REPO.glob("msched/**/*.py"), *REPO.glob("pytest_msched/**/*.py"), *DOCUMENTS]
    citing = [str(p.relative_to(REPO)) for p in sources if "DESIGN.md" in p.read_text("utf-8")]
    assert citing == []


def test_relative_links_are_found() -> None:
    text = "see [the design](docs/design.md#layers), [pytest](https://pytest.org) and [a](b.md)"
    assert relative_links(text) == ["docs/design.md", "b.md"]

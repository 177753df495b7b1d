"""The documents cite files that exist: every relative Markdown link of the README,
CONTRIBUTING, the CHANGELOG and ``docs/`` resolves to a file, and a ``#anchor`` to a heading of
its page, as GitHub and the MkDocs site both spell it; no source or document cites a
``DESIGN.md`` (the design is ``docs/design.md``); the README stays a front page.  With MkDocs
installed (the ``docs`` extra) the site builds with ``--strict`` too, and every list of a
site page renders as a list (Python-Markdown, which MkDocs uses, needs a blank line before a
list; without it the items are paragraph text, and ``--strict`` does not see it)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import markdown
import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted(
    [
        REPO / "README.md",
        REPO / "CONTRIBUTING.md",
        REPO / "CHANGELOG.md",
        *(REPO / "docs").glob("*.md"),
    ]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#*$")
FENCE = re.compile(r"^ *(```|~~~)")
README_LIMIT = 15 * 1024
LIST_ITEM = re.compile(r"^\s*([-*+]|\d+\.) ")


def relative_links(text: str) -> list[str]:
    """The targets of ``[text](target)`` links that are paths or anchors, not URLs, outside
    code blocks and code spans."""
    prose = re.sub(r"`[^`\n]*`", "", "\n".join(_prose_lines(text)))
    return [t for t in LINK.findall(prose) if not re.match(r"[a-z]+:", t)]


def _prose_lines(text: str) -> list[str]:
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _heading_text(raw: str) -> str:
    """A heading as rendered text: code spans and emphasis marks gone, links by their text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    return text.replace("`", "").replace("*", "")


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but ``-``/``_`` dropped, each
    space a ``-``."""
    text = _heading_text(heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def mkdocs_slug(heading: str) -> str:
    """Python-Markdown's ``toc`` anchor (MkDocs' default): ASCII, punctuation dropped, runs of
    spaces and ``-`` one ``-``."""
    text = unicodedata.normalize("NFKD", _heading_text(heading))
    text = re.sub(r"[^\w\s-]", "", text.encode("ascii", "ignore").decode("ascii"))
    return re.sub(r"[-\s]+", "-", text.strip().lower())


def anchors(text: str) -> set[str]:
    """The anchors a page's headings get on both GitHub and the MkDocs site (a heading whose
    two spellings differ can be linked on neither reliably, so it gives none)."""
    found = set()
    for line in _prose_lines(text):
        m = HEADING.match(line)
        if m and github_slug(m.group(2)) == mkdocs_slug(m.group(2)):
            found.add(github_slug(m.group(2)))
    return found


def broken_links(document: Path) -> list[str]:
    """Each relative link of ``document`` whose file or anchor is not there, with the reason."""
    broken = []
    for link in relative_links(document.read_text(encoding="utf-8")):
        path, _, anchor = link.partition("#")
        target = (document.parent / path).resolve() if path else document
        if not target.exists():
            broken.append(f"{link}: no file {target.relative_to(REPO)}")
        elif anchor and target.suffix == ".md":
            if anchor not in anchors(target.read_text(encoding="utf-8")):
                broken.append(f"{link}: no heading of {target.relative_to(REPO)} has #{anchor}")
    return broken


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(document: Path) -> None:
    assert broken_links(document) == [], f"{document.relative_to(REPO)} links to what is not there"


def test_nothing_cites_a_design_file_that_is_not_there() -> None:
    assert (REPO / "docs" / "design.md").is_file()
    sources = [*REPO.glob("msched/**/*.py"), *REPO.glob("pytest_msched/**/*.py"), *DOCUMENTS]
    citing = [str(p.relative_to(REPO)) for p in sources if "DESIGN.md" in p.read_text("utf-8")]
    assert citing == []


def test_the_readme_is_a_front_page() -> None:
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes: move the detail into docs/"


def test_the_first_test_reads_the_same_in_the_readme_and_the_plugin_page() -> None:
    def first_test(path: Path) -> str:
        text = path.read_text(encoding="utf-8")
        return text[text.index("## A first test") :].split("```python\n")[1].split("```")[0]

    assert first_test(REPO / "README.md") == first_test(REPO / "docs" / "plugin.md")


def test_every_page_is_in_the_nav() -> None:
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert [p for p in pages if f": {p}" not in nav] == []


@pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (pip install -e '.[docs]'; .ci/run builds the site)",
)
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)]
    done = subprocess.run(build, cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def site_extensions() -> list[str]:
    """The Markdown extensions mkdocs.yml names (the site renders with them)."""
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    block = text.split("\nmarkdown_extensions:\n", 1)[1]
    names = []
    for line in block.splitlines():
        if line and not line.startswith(" "):
            break
        if m := re.match(r"  - ([\w.]+)", line):
            names.append(m.group(1))
    return names


def lists_rendered_as_text(text: str) -> list[str]:
    """The lines of ``text``'s rendered paragraphs that start like a list item: a list the
    Markdown did not make a list."""
    html = markdown.markdown(text, extensions=site_extensions())
    paragraphs = re.findall(r"<p>(.*?)</p>", html, re.S)
    return [line for p in paragraphs for line in p.splitlines() if LIST_ITEM.match(line)]


@pytest.mark.parametrize(
    "page", sorted((REPO / "docs").glob("*.md")), ids=lambda p: str(p.relative_to(REPO))
)
def test_every_list_of_a_site_page_renders_as_a_list(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert lists_rendered_as_text(text) == [], "put a blank line before the list"


def test_a_list_without_a_blank_line_before_it_is_found() -> None:
    assert site_extensions() == ["toc", "tables", "fenced_code"]
    assert lists_rendered_as_text("Text:\n- one\n- two\n\n1. first\n") == ["- one", "- two"]
    assert lists_rendered_as_text("Text:\n\n- one\n\ntext\n1. first\n") == ["1. first"]
    assert lists_rendered_as_text("Text:\n\n- one\n- two\n") == []


def test_relative_links_are_found() -> None:
    text = (
        "see [the design](docs/design.md#layers), [pytest](https://pytest.org), [a](b.md) "
        "and [below](#here); `[code](not.md)`\n```\n[fenced](no.md)\n```\n"
    )
    assert relative_links(text) == ["docs/design.md#layers", "b.md", "#here"]


def test_anchors_are_spelt_as_github_and_mkdocs_spell_them() -> None:
    text = "# Top\n## Your model's own stream code: `trace_streams`\n## `--graph` x\n```\n# no\n```"
    assert anchors(text) == {"top", "your-models-own-stream-code-trace_streams"}


def test_a_missing_file_and_a_missing_anchor_are_named(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Page\n[a](page.md#page) [b](gone.md) [c](#nowhere)\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys.modules[__name__], "REPO", tmp_path)
        assert broken_links(page) == [
            "gone.md: no file gone.md",
            "#nowhere: no heading of page.md has #nowhere",
        ]

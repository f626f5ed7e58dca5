"""The user pages of docs/ stay short enough to read in ten minutes, and every link to a section
(``page.md#anchor``) in the README and docs/ names a heading that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 350
MAX_WORDS = 2500  # outside fenced code, table rows counted: about ten minutes at 250 words a minute
# Not user pages of one task: the generated option reference, the ledger's reference and internals
# (linked from docs/ledger.md). The mathematics (docs/math.md and its section pages) is held to the limits.
EXEMPT = {"options.md", "ledger-reference.md", "ledger-internals.md"}


def _user_pages() -> list[Path]:
    pages = [*(ROOT / "docs").glob("*.md"), *(ROOT / "docs" / "math").glob("*.md")]
    return sorted(p for p in pages if p.name not in EXEMPT)


@pytest.mark.parametrize("page", _user_pages(), ids=lambda p: p.name)
def test_user_page_is_short(page):
    n = len(page.read_text().splitlines())
    assert n <= MAX_LINES, (
        f"{page.relative_to(ROOT)} has {n} lines (at most {MAX_LINES}): move studies, dated figures and long "
        "derivations to docs/research/ (listed in docs/research/README.md) or cite math.md")


@pytest.mark.parametrize("page", _user_pages(), ids=lambda p: p.name)
def test_user_page_reads_in_ten_minutes(page):
    words = len(re.sub(r"```.*?```", "", page.read_text(), flags=re.S).split())
    assert words <= MAX_WORDS, (
        f"{page.relative_to(ROOT)} has {words} words outside code blocks (at most {MAX_WORDS}, ten minutes' "
        "reading): move studies, dated figures and secondary detail to docs/research/")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    out = set()
    for title in re.findall(r"^#{1,6}\s+(.*?)\s*$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_links_to_sections_name_existing_headings():
    pages = [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), ROOT / "scripts" / "README.md"]
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
            if "://" in target:
                continue
            dest = (page.parent / target) if target else page
            if dest.suffix == ".md" and dest.exists() and anchor not in _anchors(dest):
                broken.append(f"{page.relative_to(ROOT)} -> {target}#{anchor}")
    assert not broken, broken


def test_the_research_notes_are_listed():
    readme = (ROOT / "docs" / "research" / "README.md").read_text()
    unlisted = [p.name for p in (ROOT / "docs" / "research").glob("*.md")
                if p.name != "README.md" and f"]({p.name})" not in readme]
    assert not unlisted, f"docs/research/README.md does not list {unlisted}"


@pytest.mark.parametrize("page", _user_pages(), ids=lambda p: p.name)
def test_user_page_has_no_unfilled_placeholder(page):
    """A line that is one upper-case token (``SPEED_SECTION``) is a template's hole, not text."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    holes = re.findall(r"^[A-Z][A-Z0-9]*_[A-Z0-9_]+$", text, flags=re.M)
    assert not holes, f"{page.relative_to(ROOT)} has unfilled placeholders: {holes}"


@pytest.mark.parametrize("page", [p for p in _user_pages() if p.parent.name == "docs"], ids=lambda p: p.name)
def test_user_page_links_the_research_notes_once(page):
    """Studies and superseded figures live in docs/research/, linked once from a user page."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    links = re.findall(r"\]\((?:\./)?research/[^)\s]*\)", text)
    assert len(links) <= 1, f"{page.relative_to(ROOT)} links the research notes {len(links)} times: {links}"

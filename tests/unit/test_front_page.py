"""The README is the front page: short, and a way into every page of the documentation site."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
LINKED = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", README))


def test_the_front_page_is_at_most_250_lines() -> None:
    assert len(README.splitlines()) <= 250


def test_the_front_page_links_every_docs_page() -> None:
    pages = {path.relative_to(REPO).as_posix() for path in (REPO / "docs").rglob("*.md")}
    assert pages - LINKED == set()


def test_every_docs_link_of_the_front_page_is_a_page() -> None:
    assert LINKED and all((REPO / link).is_file() for link in LINKED)

"""The documentation's text for the tests that run what it shows: README.md and the user guide.

Every command, example file and number the documentation shows is checked somewhere; the
tests find them here, by page, whether they stand in the README or in a guide page.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"


def guide_pages() -> list[Path]:
    """Every page of the user guide, in a fixed order."""
    return sorted(GUIDE.rglob("*.md"))


def page(name: str) -> str:
    """The text of guide page ``name`` (``"own-data"``, ``"extending/mechanism"``)."""
    return (GUIDE / f"{name}.md").read_text(encoding="utf-8")


def all_text() -> str:
    """README.md and every guide page, one after the other."""
    return "\n\n".join(p.read_text(encoding="utf-8") for p in [README, *guide_pages()])

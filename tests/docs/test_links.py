"""Every relative link of the README, CONTRIBUTING and the docs leads somewhere: to a file or
folder of the repository, and, with a `#fragment` into a Markdown file, to one of its headings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("docs/*.md")]
    + [p for p in ROOT.glob("*/**/README.md") if ".venv" not in p.parts and ".git" not in p.parts]
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = re.compile(r"[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    return [m.group(1) for m in LINK.finditer(text)]


def test_pages_are_found() -> None:
    assert ROOT / "README.md" in PAGES and ROOT / "docs" / "cli.md" in PAGES


def test_slugs_follow_github() -> None:
    assert slug("Operator's runbook") == "operators-runbook"
    assert slug("`gfair trace JOB`") == "gfair-trace-job"
    assert slug("Reliability, security, performance") == "reliability-security-performance"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in links(page):
        if EXTERNAL.match(target):
            continue
        path, _, fragment = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists() or not where.is_relative_to(ROOT):
            broken.append(f"{target}: no such file")
        elif fragment and where.suffix == ".md" and fragment not in anchors(where):
            broken.append(f"{target}: no heading #{fragment} in {where.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"

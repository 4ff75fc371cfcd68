"""Every relative link in the README, docs/, packaging/ and protocol/ Markdown points
at a file that exists (and a ``#heading`` anchor at a heading of that file), so the
docs stay true as files move."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("packaging/**/*.md"),
     *ROOT.glob("protocol/*.md"), *ROOT.glob("boards/*.md"), *ROOT.glob("device/*.md")]
)  # fmt: skip
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lowercased, punctuation dropped, spaces to '-'."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    out = set(re.findall(r'<a id="([^"]+)"', text))
    for h in re.findall(r"^#+\s+(.*)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def _links(page: Path):
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans are not links
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        yield target


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    bad = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_the_check_finds_links():
    links = list(_links(ROOT / "README.md"))
    assert "docs/bridge.md" in links and len(links) > 10

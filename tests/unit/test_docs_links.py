"""Every relative link of the product's docs resolves (issue 42): each markdown link in README.md and docs/**/*.md
names a file or folder of this checkout, and each ``#anchor`` a heading of its target, slugged as GitHub slugs
headings. Pages get moved (docs/real-gpu.md's dated notebook went to docs/lab/); this is what keeps the links
that point at them from rotting in silence.

Also: every ``docs/...`` path the docs name in their text (the raw results under docs/gpu/, other pages) exists,
since most of the docs cite files by path, not by link.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
_DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[A-Za-z0-9_./*-]*[A-Za-z0-9_*]")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before de-duplication): the rendered text (code spans' and links'
    text kept, their markup dropped), lower-cased, every character but letters, digits, ``_``, ``-`` and spaces
    removed, each space a ``-``."""
    text = _CODE_SPAN.sub(lambda m: m.group(2).strip(), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>", "", text)
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        m = _FENCE.match(line)
        if m:
            if fence is None:
                fence = m.group(1)
            elif m.group(1) == fence:
                fence = None
            continue
        if fence is None:
            out.append((n, line))
    return out


def anchors(text: str) -> set[str]:
    """Every anchor a page has: its headings' slugs, a repeated slug numbered ``-1``, ``-2`` ... as GitHub numbers
    them, and explicit ``<a name=...>`` / ``id=`` anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in _prose_lines(text):
        found.update(_HTML_ANCHOR.findall(line))
        m = _HEADING.match(line)
        if not m:
            continue
        slug = github_slug(m.group(2))
        if slug in seen:
            seen[slug] += 1
            found.add(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            found.add(slug)
    return found


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline and reference-definition link outside code."""
    out = []
    for n, line in _prose_lines(text):
        bare = _CODE_SPAN.sub("", line)
        out.extend((n, target) for target in _LINK.findall(bare))
        m = _REF_DEF.match(bare)
        if m:
            out.append((n, m.group(1)))
    return out


def broken(page: Path, root: Path = ROOT) -> list[str]:
    """What does not resolve among ``page``'s relative links, one line each (``file:line: target: why``, the
    file relative to ``root``)."""
    problems = []
    for n, target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("//"):
            continue  # http:, https:, mailto: ...: not this checkout's
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        where = f"{page.relative_to(root)}:{n}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file")
            continue
        if anchor and dest.is_file() and dest.suffix == ".md":
            if anchor not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{where}: no heading with this anchor in {dest.relative_to(root)}")
    return problems


def test_slug_keeps_words_digits_underscores_and_hyphens():
    """GitHub drops punctuation (colons, commas, dots, parentheses, backticks) and keeps ``_`` and ``-``: a
    heading with a code span and a date slugs to its words joined by hyphens."""
    assert github_slug("`eaglepatch doctor` on real servers (2026-12-01)") == "eaglepatch-doctor-on-real-servers-2026-12-01"
    assert github_slug("The runtime API (`eaglepatch/runtime/_eaglepatch_runtime.py`)") == (
        "the-runtime-api-eaglepatchruntime_eaglepatch_runtimepy")
    assert github_slug("Which step count, or none?") == "which-step-count-or-none"


def test_slug_keeps_a_double_hyphen_where_punctuation_stood_between_spaces():
    """Punctuation between two spaces goes, both spaces stay: ``live / restart`` gives ``live--restart`` and
    ``x - y`` gives ``x---y`` (GitHub does not collapse hyphens), so a hand-written anchor with one would not
    resolve."""
    assert github_slug("live / restart") == "live--restart"
    assert github_slug("x - y") == "x---y"


def test_repeated_headings_are_numbered_from_the_second():
    """GitHub numbers a repeated slug from its second occurrence: ``-1``, then ``-2``."""
    text = "# Limits\n\n## Limits\n\n### Limits\n"
    assert anchors(text) == {"limits", "limits-1", "limits-2"}


def test_headings_inside_fenced_code_are_not_anchors_and_links_there_not_links():
    """A ``# comment`` in a shell block is no heading, and a ``[x](y)`` shown in a code block or a code span is
    no link to check."""
    text = "# Title\n\n```\n# not a heading\n[a](missing.md)\n```\n\n`[b](missing.md)` and [c](real.md#title)\n"
    assert anchors(text) == {"title"}
    assert links(text) == [(8, "real.md#title")]


def test_a_broken_link_and_a_broken_anchor_are_reported(tmp_path):
    """The check fails on what it is for: a link to a missing file, and an anchor that no heading has; a good
    link, with or without a file, passes."""
    (tmp_path / "other.md").write_text("# Other page\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#other-page) [gone](gone.md) [bad](other.md#nope) [self](#page)\n",
                    encoding="utf-8")
    problems = broken(page, root=tmp_path)
    assert len(problems) == 2
    assert "gone.md: no such file" in problems[0]
    assert "other.md#nope: no heading" in problems[1]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path):
    """Every relative link of the page names a file of this checkout, and every anchor a heading of it."""
    assert broken(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_docs_path_named_in_the_text_exists(page: Path):
    """The docs cite raw results and other pages by path (``docs/gpu/...tar.xz``, ``docs/tuning.md``): each such
    path, relative to the checkout's root, exists (a pattern such as ``docs/gpu/sweep_*.json``: some file)."""
    missing = []
    for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for path in _DOCS_PATH.findall(line):
            if not (any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(f"{page.relative_to(ROOT)}:{n}: {path}")
    assert missing == []

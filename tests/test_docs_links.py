"""Every relative link in the repository's Markdown points at something the repository holds: results
that go (issue 34) take their links with them, or the docs point at git history instead. A link to a
section (`deploy.md#metrics`) names a heading the file has, so moving text between the README and docs/
cannot leave a link landing at the top of a page."""

import functools
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# [text](target), [text](<target>), with or without a title ("t", 't' or (t))
LINK = re.compile(r"""\]\((?:<([^>\n]*)>|([^)\s]*))(?:\s+(?:"[^"]*"|'[^']*'|\([^)]*\)))?\)""")
FENCE_LINE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
CODE_SPAN = re.compile(r"`[^`\n]*`")


def outside_fences(text: str) -> str:
    """The lines outside fenced code blocks. A fence closes on a run of its own character at least as long,
    with nothing after it; one never closed runs to the end of the file (CommonMark)."""
    kept, fence = [], None
    for line in text.splitlines():
        m = FENCE_LINE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is None:
            kept.append(line)
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2).strip():
            fence = None
    return "\n".join(kept)


def links(text: str) -> list[str]:
    return [angled or plain for angled, plain in LINK.findall(CODE_SPAN.sub("", outside_fences(text)))]


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a file's headings: lower-cased, punctuation dropped, spaces as hyphens,
    a repeated one numbered (-1, -2...)."""
    anchors, seen = set(), {}
    for line in outside_fences(text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


@functools.cache
def anchors_of(path: Path) -> set[str]:  # a page many links point into is read once
    return heading_anchors(path.read_text())


def test_heading_anchors_follow_githubs_rule():
    text = "# Serving: `/detect`\n````\n```\n# not a heading\n````\n## The page at `/`\n## Tests\n## Tests\n"
    assert heading_anchors(text) == {"serving-detect", "the-page-at-", "tests", "tests-1"}
    # A line with an info string opens a fence but never closes one.
    assert heading_anchors("```\ncode\n```python\n# inside\n```\n# after\n") == {"after"}
    said = "[a](b.md#c \"t\") [d](e.md 't') [f](g.md (t)) [h](<i j.md>) `[k](l.md)`"
    assert links(said) == ["b.md#c", "e.md", "g.md", "i j.md"]


def test_relative_links_in_markdown_resolve():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    listed = ["ls-files", "--cached", "--others", "--exclude-standard", "*.md"]  # a new doc before its commit
    docs = subprocess.run(["git", *listed], cwd=REPO, capture_output=True, text=True, check=True)
    broken = []
    for doc in docs.stdout.split():
        text = (REPO / doc).read_text()
        for link in links(text):
            if not link or link.startswith(("http://", "https://", "mailto:")):
                continue
            target, _, anchor = link.partition("#")
            path = (REPO / doc).parent.joinpath(target) if target else REPO / doc
            if not path.exists():
                broken.append(f"{doc} -> {link}")
            elif anchor and path.suffix == ".md" and anchor not in anchors_of(path.resolve()):
                broken.append(f"{doc} -> {link} (no such heading)")
    assert not broken, "broken links: " + ", ".join(broken)

"""Every relative link in the repository's Markdown points at something the repository holds: results
that go (issue 34) take their links with them, or the docs point at git history instead."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)#\s]+)")


def test_relative_links_in_markdown_resolve():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    docs = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True)
    broken = []
    for doc in docs.stdout.split():
        for target in LINK.findall((REPO / doc).read_text()):
            if (
                not target.startswith(("http://", "https://", "mailto:"))
                and not (REPO / doc).parent.joinpath(target).exists()
            ):
                broken.append(f"{doc} -> {target}")
    assert not broken, "broken links: " + ", ".join(broken)

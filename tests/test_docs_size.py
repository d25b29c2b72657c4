"""The user-facing documents stay within their bars: README.md at most 20,000 bytes with its two
set-up command blocks (CI runs them) and no issue numbers; docs/*.md at most 120,000 bytes together."""

from __future__ import annotations

import re

from tests.conftest import REPO


def test_the_readme_is_at_most_20000_bytes_and_keeps_its_set_up_blocks():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.encode()) <= 20_000
    for block in ("ci:install", "ci:test"):
        assert f"<!-- {block} -->\n```bash\n" in text and f"<!-- /{block} -->" in text
    assert not re.search(r"\bissues? #?\d+|#\d{2,}\b", text, re.IGNORECASE)


def test_the_docs_are_at_most_120000_bytes():
    assert sum(len(p.read_bytes()) for p in (REPO / "docs").glob("*.md")) <= 120_000

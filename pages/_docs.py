"""Sections of the docs/ manual shown on a page, so the page and the docs say a thing once."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def section(file: str, name: str) -> str:
    """The Markdown between ``<!-- app:NAME:start -->`` and ``<!-- app:NAME:end -->`` in docs/FILE."""
    path = DOCS / file
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    mark = re.escape(name)
    found = re.search(rf"<!-- app:{mark}:start -->\n(.*?)<!-- app:{mark}:end -->", text, re.S)
    if not found:
        return f"*This part of the guide is in `docs/{file}`, which this server does not have.*"
    return found.group(1).strip()

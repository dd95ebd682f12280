"""Text that is safe to show a public audience: user values escaped for Markdown, absolute paths cut."""

from __future__ import annotations

import re

# CommonMark lets ASCII punctuation be escaped with a backslash. Escaped here: what makes links and
# images (brackets), HTML and autolinks (angle brackets), code spans (backticks), LaTeX ($), tables
# (|), the backslash itself and Streamlit's :material/...: icons (its :color[...] directives need a
# bracket). Emphasis stays possible (harmless); dots, commas and underscores stay readable.
_PUNCTUATION = re.compile(r"([\\`\[\]<>$|]|:(?=material/))")
# GFM's bare-URL and e-mail autolinks are found in the rendered text, after escapes are resolved
# (Streamlit's renderer links "https\://x" all the same): a zero-width space breaks the pattern.
_AUTOLINK = re.compile(r"(?<=:)(?=//)|(?<=www)(?=\.)|(?<=@)(?=[\w-])", re.IGNORECASE)
ZWSP = "\u200b"
_PATH = re.compile(r"(?<![\w:/.~-])/(?:[^\s/\"'<>:;,()\[\]{}]+/)+([^\s/\"'<>:;,()\[\]{}]+)")


def escape_markdown(text: object) -> str:
    """``text`` with every Markdown-significant character backslash-escaped, autolinks broken by a
    zero-width space; newlines as spaces."""
    return _AUTOLINK.sub(ZWSP, _PUNCTUATION.sub(r"\\\1", " ".join(str(text).split())))


def code_span(text: object, limit: int = 40) -> str:
    """``text`` (cut to ``limit`` characters) as an inline code span, whatever backticks it holds."""
    value = " ".join(str(text)[:limit].split()) or " "
    fence = "`" * (max((len(m) for m in re.findall(r"`+", value)), default=0) + 1)
    return f"{fence} {value} {fence}"


def strip_paths(text: str) -> str:
    """Absolute file paths cut to their last two parts (``…/remat_lab/models.py``)."""
    def short(m: re.Match) -> str:
        parts = m.group(0).rstrip("/").split("/")
        return "…/" + "/".join(parts[-2:])
    return _PATH.sub(short, text)


def strip_paths_in(result: dict) -> dict:
    """A result whose program ``texts`` (jaxprs, HLO: source file metadata) carry no absolute paths."""
    texts = result.get("texts")
    if not texts:
        return result
    return {**result, "texts": {k: strip_paths(v) if isinstance(v, str) else v for k, v in texts.items()}}

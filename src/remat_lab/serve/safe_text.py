"""Text safe to show a public audience: user values escaped for Markdown, absolute paths cut, no settings.

``for_visitor`` takes out of an engine message what only the server's owner can act on (a command
line flag, an environment variable of the app): a web visitor of a public server reads what to
change in the page, never how the server was started.
"""

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
_SETTING = re.compile(r"(?<![\w-])--[a-z][\w-]*|\$?REMAT_LAB_[A-Z_]+")
_ASIDE = re.compile(r"\s*\(([^()]*)\)")
_PATH = re.compile(r"(?<![\w:/.~-])/(?:[^\s/\"'<>:;,()\[\]{}]+/)+([^\s/\"'<>:;,()\[\]{}]+)")


def escape_markdown(text: object) -> str:
    """``text`` with every Markdown-significant character backslash-escaped, autolinks broken by a
    zero-width space; newlines as spaces."""
    return _AUTOLINK.sub(ZWSP, _PUNCTUATION.sub(r"\\\1", " ".join(str(text).split())))


def for_visitor(text: str, public: bool | None = None) -> str:
    """``text`` without the flags and environment variables it names, on a public server (``public``
    None: ``quotas.private()`` decides); as is on a private one. An aside naming one goes; a clause
    naming one (after ``; `` or ``: ``) goes to the end of its sentence; a sentence with nothing
    before it goes whole."""
    from remat_lab.serve import quotas

    if not (public if public is not None else not quotas.private()):
        return text
    text = _ASIDE.sub(lambda m: "" if _SETTING.search(m.group(1)) else m.group(0), text)
    while m := _SETTING.search(text):
        head, end = text[:m.start()], text.find(". ", m.end())
        tail = text[end + 2:] if end >= 0 else ""
        cut = max(head.rfind("; "), head.rfind(": "))
        if cut > 0:
            text = head[:cut].rstrip(" ,;:.") + "." + (" " + tail if tail else "")
        else:
            start = head.rfind(". ")
            text = (head[:start + 1] + (" " + tail if tail else "")) if start >= 0 else tail
    return text.strip() or "This server cannot do that."


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

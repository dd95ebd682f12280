"""Safe text: URL values with links, images, HTML and backticks render as text; no paths, no tracebacks."""

import re
import tomllib
from pathlib import Path

import pytest

from remat_lab.serve.safe_text import code_span, escape_markdown, strip_paths, strip_paths_in

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = ["[click me](https://evil.example)", "![x](https://evil.example/x.png)",
           "<img src=x onerror=alert(1)>", "`` ` ``<b>bold</b>", "www.evil.example",
           ":red[alarm] :material/home:", "$x^2$ | a | b |", "\\[a](b)"]


def _html(markdown: str) -> str:
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark").render(markdown)


@pytest.mark.parametrize("value", HOSTILE)
def test_escaped_and_code_span_values_render_as_their_own_text(value):
    for md in (escape_markdown(value), f"URL parameter `width` = {code_span(value, 80)} is not valid"):
        html = _html(md)
        assert "<a " not in html and "<img" not in html and "<b>" not in html, html
    text = _html(escape_markdown(value))
    assert "https\\:" not in text and "www\\." not in text  # escapes are consumed by the renderer
    assert not re.search(r"(?<!\\)(:material/|https://|www\.)", escape_markdown(value))


def test_code_span_survives_backticks_and_newlines():
    assert code_span("a`b``c") == "``` a`b``c ```"
    assert code_span("x\ny") == "` x y `"
    assert _html(code_span("a`b")).strip() == "<p><code>a`b</code></p>"


def test_paths_are_cut_to_their_last_two_parts():
    hlo = ('%dot = f32[8]{0} dot(...), metadata={op_name="jit(step)/dot" '
           'source_file="/work/app/src/remat_lab/models.py" source_line=42}')
    assert strip_paths(hlo).endswith('source_file="…/remat_lab/models.py" source_line=42}')
    assert "/work" not in strip_paths("File /root/.venv/lib/python3.11/site-packages/jax/x.py, line 3")
    for kept in ("a/b", "x / y", "https://example.org/a/b", "jit(step)/jvp(dot)/dot_general"):
        assert strip_paths(kept) == kept
    doc = strip_paths_in({"texts": {"compiled_hlo": hlo}, "config": {}})
    assert "/work/app" not in doc["texts"]["compiled_hlo"]


def test_public_instance_shows_no_tracebacks():
    with open(ROOT / ".streamlit" / "config.toml", "rb") as fh:
        cfg = tomllib.load(fh)
    assert cfg["client"]["showErrorDetails"] in ("type", "none")


def test_hostile_url_values_show_as_text_in_the_sidebar_warnings():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / "guide.py"), default_timeout=60)
    at.query_params.update(width="[click me](https://evil.example)", batch="![x](https://e.example/x.png)",
                           seq="<b>hi</b>", depth="`` `x` ``", policy="www.evil.example")
    at.run()
    assert not at.exception
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 5, warnings
    for w in warnings:
        html = _html(w)
        assert "<a " not in html and "<img" not in html and "<b>" not in html, w


def test_inspect_shows_programs_without_absolute_paths():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / "1_inspect.py"), default_timeout=120)
    at.query_params.update(width="16", batch="2", depth="1", repeats="1")
    at.run()
    assert not at.exception and not at.error
    codes = "\n".join(c.value for c in at.code)
    assert "source_file=" in codes or "dot_general" in codes
    assert not re.search(r'source_file="/', codes), re.findall(r'source_file="[^"]*"', codes)[:3]
    assert str(ROOT) not in codes

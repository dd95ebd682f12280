"""Text from a URL, an upload or the history (another session's runs) reaches Markdown only escaped.

Every page is fed the injection strings from each source; no Markdown element may carry them raw
(a link, an image, HTML, Streamlit's colour and icon directives, LaTeX, a bare URL that would
become a link). ``serve.safe_text.escape_markdown`` is the one escaping path.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from remat_lab.config import RunConfig
from remat_lab.store import history

ROOT = Path(__file__).resolve().parents[1]
PAYLOADS = ["[click me](https://evil.example/p)", "![pic](https://evil.example/i.png)",
            "<img src=x onerror=alert(1)><b>bold</b>", ":red[colour] :material/warning:",
            "$$x^2$$ and $y$", "see https://evil.example/plain"]
MARKERS = ("[click me](", "![pic](", "<img", "<b>", ":red[", ":material/warning", "$$x", "https://evil")
PAGES = ["pages/explore.py", "pages/compare.py", "pages/sweep.py", "pages/advisor.py",
         "pages/1_inspect.py", "pages/history.py", "pages/results.py", "pages/guide.py",
         "pages/targets.py"]
URL_KEYS = ["model", "width", "batch", "seq", "heads", "depth", "stack", "dtype", "policy", "save_names",
            "offload_names", "objective", "repeats", "warmup", "seed", "mesh", "target"]
SMALL = dict(width="16", batch="4", depth="1", repeats="2", warmup="0")


def rendered(at: AppTest) -> list[str]:
    """Every string the page hands to Markdown (body text, captions, alerts, titles, toasts)."""
    out = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success", "title", "header",
                 "subheader", "toast", "exception"):
        out += [str(getattr(el, "value", el)) for el in getattr(at, kind, [])]
    return out


CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)  # inline code: Markdown shows it as typed


def raw(at: AppTest) -> list[str]:
    """The rendered strings that would carry a payload as Markdown: outside code spans, with every
    backslash-escaped character (shown as typed) taken out."""
    visible = lambda t: re.sub(r"\\.", "\u00a7", CODE_SPAN.sub("", t), flags=re.S)
    return [t for t in rendered(at) if any(m in visible(t) for m in MARKERS)]


def _app(page: str, **params) -> AppTest:
    at = AppTest.from_file(str(ROOT / page), default_timeout=180)
    for key, value in params.items():
        at.query_params[key] = value
    return at


@pytest.mark.parametrize("page", PAGES)
def test_url_values_reach_markdown_escaped(page):
    params = {key: PAYLOADS[i % len(PAYLOADS)] for i, key in enumerate(URL_KEYS)}
    at = _app(page, **params).run()
    assert not at.exception, at.exception
    if page not in ("pages/history.py", "pages/results.py"):  # pages that read the configuration
        warned = " ".join(w.value for w in at.warning)
        assert "not valid" in warned or "Using the default" in warned, warned  # values refused
    assert raw(at) == []


def _poisoned(doc: dict) -> dict:
    """``doc`` with injection strings in every free-text field a view shows."""
    doc = copy.deepcopy(doc)
    doc["environment"]["device_kind"] = PAYLOADS[0]
    doc["environment"]["backend"] = PAYLOADS[3]
    doc["notes"] = list(PAYLOADS)
    doc.setdefault("hlo", {})["identical_to"] = PAYLOADS[1]
    doc.pop("texts", None)
    return doc


@pytest.fixture(scope="module")
def poisoned_doc(run):
    return _poisoned(run(RunConfig(width=16, batch=4, repeats=2, warmup=0), timing=True))


@pytest.fixture(scope="module")
def poisoned_studies() -> list[dict]:
    """A comparison and an advice whose free text (reasons, notes, failures, sources) is hostile."""
    from remat_lab.studies.advisor import advise
    from remat_lab.studies.compare import compare_policies

    tiny = RunConfig(width=8, batch=2, repeats=2, warmup=0)
    cmp = json.loads(json.dumps(compare_policies(tiny, ["no_remat", "nothing_saveable"], rounds=2)))
    cmp.update(fastest_reason=PAYLOADS[0], failed=[{"policy": PAYLOADS[3], "error": PAYLOADS[4]}])
    cmp["environment"]["device_kind"] = PAYLOADS[5]
    adv = json.loads(json.dumps(advise(tiny.replace(depth=2), 1 << 18, policies=["no_remat"],
                                       time_budget_s=0.3)))
    adv.update(reason=PAYLOADS[1], notes=list(PAYLOADS), budget_source=PAYLOADS[2], peak_source=PAYLOADS[3])
    return [cmp, adv]


def test_an_uploaded_file_reaches_markdown_escaped(poisoned_doc, poisoned_studies):
    bad_policy = {**poisoned_doc, "config": {**poisoned_doc["config"], "policy": PAYLOADS[2]}}
    docs = [poisoned_doc, bad_policy, *poisoned_studies]
    data = "".join(json.dumps(d) + "\n" for d in docs).encode()
    at = _app("pages/results.py").run()
    at.file_uploader(key="results_files").set_value([(f"{PAYLOADS[0]}.jsonl", data, "application/json")])
    at.run()
    assert not at.exception, at.exception
    shown = " ".join(rendered(at))
    assert "Recommended" in shown or "recommend" in shown.lower()  # the advice was drawn
    assert raw(at) == []


def test_another_sessions_runs_reach_markdown_escaped(poisoned_doc, monkeypatch, tmp_path):
    monkeypatch.setenv("REMAT_LAB_HOME", str(tmp_path))
    rid = history.record(poisoned_doc, source="cli")
    history.share([rid])
    for public in ("0", "1"):  # the operator's own view and a visitor's (shared runs only)
        monkeypatch.setenv("REMAT_LAB_PUBLIC", public)
        at = _app("pages/history.py").run()
        assert not at.exception, at.exception
        assert raw(at) == []

"""Public mode by choice (``REMAT_LAB_PUBLIC``), a visitor's token kept by the browser, and a
cached result shown again adding no history row."""

from __future__ import annotations

from pathlib import Path

import pytest

from remat_lab.store import history

ROOT = Path(__file__).resolve().parents[1]
TOKEN_A, TOKEN_B = "A" * 32, "B" * 32
pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from pages import _record  # noqa: E402


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("REMAT_LAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("REMAT_LAB_PUBLIC", raising=False)
    return tmp_path / "home"


def _doc(width: int) -> dict:
    return {"schema": 1, "config": {"model": "mlp", "width": width, "batch": 4, "policy": "no_remat"},
            "environment": {"backend": "cpu", "device_kind": "cpu", "device_count": 1, "jax": "0"},
            "step_time_s": {"median": 0.001}, "memory": {"peak_bytes": 1000}}


@pytest.mark.parametrize("value, public", [
    (None, True), ("", True), ("1", True), ("yes", True), ("true", True), ("on", True), ("junk", True),
    ("0", False), ("false", False), (" No ", False), ("OFF", False)])
def test_public_mode_is_chosen_by_the_environment_and_public_by_default(monkeypatch, value, public):
    if value is None:
        monkeypatch.delenv("REMAT_LAB_PUBLIC", raising=False)
    else:
        monkeypatch.setenv("REMAT_LAB_PUBLIC", value)
    assert history.public_mode() is public


def _history_page(monkeypatch, cookie: str | None) -> AppTest:
    monkeypatch.setattr(_record, "_cookie_token", lambda: cookie)  # what st.context.cookies holds
    return AppTest.from_file(str(ROOT / "pages/history.py"), default_timeout=60).run()


def test_the_visitor_token_keeps_a_visitors_runs_and_hides_others(home, monkeypatch):
    mine = history.record(_doc(8), source="app", session_id=TOKEN_A)
    history.record(_doc(16), source="app", session_id=TOKEN_B)
    history.share([history.record(_doc(32), source="cli")])
    for cookie, widths in ((TOKEN_A, [8, 32]), (TOKEN_B, [16, 32]), (None, [32])):
        at = _history_page(monkeypatch, cookie)  # a reload: a new session, the same browser cookie
        assert not at.exception
        assert sorted(at.dataframe[0].value["width"]) == widths, cookie
        assert at.session_state["_visitor"] == (cookie or at.session_state["_visitor"])
    assert mine
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "0")  # a private instance: every run
    at = _history_page(monkeypatch, TOKEN_A)
    assert sorted(at.dataframe[0].value["width"]) == [8, 16, 32]


def _cookie_scripts(at: AppTest) -> list[str]:
    texts = [str(getattr(e, "proto", "")) for e in at.main]
    return [t for t in texts if "document.cookie" in t]


def test_a_new_browser_gets_a_token_cookie_and_never_a_token_in_the_url(home, monkeypatch):
    history.share([history.record(_doc(32), source="cli")])
    at = _history_page(monkeypatch, None)
    token = at.session_state["_visitor"]
    assert _record._TOKEN.match(token) and token not in (TOKEN_A, TOKEN_B)
    scripts = _cookie_scripts(at)
    assert len(scripts) == 1 and f"remat_lab_visitor={token}" in scripts[0]
    assert "SameSite=Strict" in scripts[0] and "Max-Age=31536000" in scripts[0]
    assert all(token not in v for v in at.query_params.values())  # a shared link cannot carry it
    at = _history_page(monkeypatch, TOKEN_A)  # the cookie came back: nothing to set
    assert at.session_state["_visitor"] == TOKEN_A and not _cookie_scripts(at)


@pytest.mark.parametrize("value, token", [(TOKEN_A, TOKEN_A), ("short", None), ("x'; alert(1); '" * 3, None),
                                          (None, None)])
def test_only_a_well_formed_cookie_is_taken_as_a_token(monkeypatch, value, token):
    from types import SimpleNamespace

    cookies = {} if value is None else {"remat_lab_visitor": value}
    monkeypatch.setattr(_record, "st", SimpleNamespace(context=SimpleNamespace(cookies=cookies)))
    assert _record._cookie_token() == token


def test_the_history_page_shows_no_folder_when_the_file_is_damaged(home, monkeypatch):
    home.mkdir(parents=True)
    (home / "history.sqlite3").write_bytes(b"\x00garbage" * 512)
    for public in ("1", "0"):
        monkeypatch.setenv("REMAT_LAB_PUBLIC", public)
        at = _history_page(monkeypatch, TOKEN_A)
        texts = [w.value for w in at.warning] + [c.value for c in at.caption]
        assert any("History is off" in t for t in texts)
        assert not any(str(home) in t for t in texts), texts


def test_a_cached_result_viewed_again_adds_no_history_row(home, monkeypatch):
    params = {"width": "8", "batch": "2", "depth": "1", "repeats": "1", "warmup": "0",
              "policy": "nothing_saveable"}
    counts = []
    for cookie in (TOKEN_A, TOKEN_A, TOKEN_B):  # a reload, then another visitor: both from the cache
        monkeypatch.setattr(_record, "_cookie_token", lambda cookie=cookie: cookie)
        at = AppTest.from_file(str(ROOT / "pages/explore.py"), default_timeout=180)
        at.query_params.update(params)
        at.run()
        assert not at.exception and not at.error
        counts.append(history.count())
    assert counts == [1, 1, 1]
    run = history.list_runs()[0]["id"]
    for cookie in (TOKEN_A, TOKEN_B):  # each visitor still finds the run they saw
        assert [r["id"] for r in history.list_runs(session_id=cookie, public=True)] == [run]


def test_a_private_instance_runs_a_job_per_core_and_a_public_one_takes_turns():
    """Issue 46: with REMAT_LAB_PUBLIC=0 (one owner, several tabs) jobs run side by side, one worker
    per core up to two (a worker is recycled above half the memory: two fit); a public server keeps
    one worker, visitors' jobs in turn."""
    from remat_lab.serve.quotas import default_workers

    assert default_workers({"REMAT_LAB_PUBLIC": "0"}, cores=2) == 2
    assert default_workers({"REMAT_LAB_PUBLIC": "0"}, cores=16) == 2
    assert default_workers({"REMAT_LAB_PUBLIC": "0"}, cores=1) == 1
    assert default_workers({"REMAT_LAB_PUBLIC": "1"}, cores=16) == default_workers({}, cores=16) == 1

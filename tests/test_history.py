"""Run history: round trip, visibility in a public deployment, concurrent writers, a damaged file."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from remat_lab.store import history

ROOT = Path(__file__).resolve().parents[1]


def _doc(width: int, policy: str = "no_remat", backend: str = "cpu", tag: str = "") -> dict:
    return {"schema": 1, "config": {"model": "mlp", "width": width, "batch": 4, "seq": 16, "depth": 1,
                                    "stack": "scan", "dtype": "float32", "policy": policy,
                                    "objective": "value_and_grad"},
            "environment": {"backend": backend, "device_kind": backend, "device_count": 1, "jax": "0.10.2"},
            "step_time_s": {"median": 0.002}, "memory": {"peak_bytes": 1024 * width},
            "gradient_check": {"ok": True}, "tag": tag, "texts": {"hlo": "not stored"}}


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("REMAT_LAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("REMAT_LAB_PUBLIC", raising=False)
    return tmp_path / "home"


def test_record_list_filter_documents_and_delete(home):
    a = history.record(_doc(64), source="cli")
    b = history.record(_doc(128, "nothing_saveable", backend="gpu"), source="app", session_id="s1")
    assert history.db_path() == home / "history.sqlite3" and history.count() == 2
    runs = history.list_runs()
    assert [r["id"] for r in runs] == [b, a]  # newest first
    assert runs[0]["median_ms"] == pytest.approx(2.0) and runs[0]["peak_bytes"] == 128 * 1024
    assert [r["id"] for r in history.list_runs(backend="gpu")] == [b]
    assert [r["id"] for r in history.list_runs(policy="no_remat", model="mlp")] == [a]
    docs = history.documents([a, b])
    assert docs[a]["config"]["width"] == 64 and "texts" not in docs[a]
    # the same document from the same session is stored once (the app's cache answers repeats)
    assert history.record(_doc(128, "nothing_saveable", backend="gpu"), session_id="s1") is None
    con = sqlite3.connect(home / "history.sqlite3")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # several sessions write safely
    con.close()
    assert history.delete([a]) == 1 and [r["id"] for r in history.list_runs()] == [b]
    compared = {"config": {"model": "mlp", "width": 8}, "policies": ["no_remat", "nothing_saveable"],
                "rows": [{"peak_bytes": 300}, {"peak_bytes": 200}], "environment": {"backend": "cpu"}}
    c = history.record(compared, kind="compare")
    row = history.list_runs(limit=1)[0]
    assert (row["id"], row["kind"], row["policy"], row["peak_bytes"]) == (
        c, "compare", "no_remat,nothing_saveable", 200)


def test_a_public_deployment_shows_a_visitor_their_session_and_shared_runs(home, monkeypatch):
    mine = history.record(_doc(8), source="app", session_id="me")
    theirs = history.record(_doc(16), source="app", session_id="stranger")
    cli = history.record(_doc(32), source="cli")
    assert history.share([cli]) == 1
    seen = {r["id"] for r in history.list_runs(session_id="me", public=True)}
    assert seen == {mine, cli}
    assert set(history.documents([mine, theirs, cli], session_id="me", public=True)) == {mine, cli}
    assert {r["id"] for r in history.list_runs(session_id="me")} == {mine, theirs, cli}  # locally: all
    monkeypatch.delenv("REMAT_LAB_PUBLIC", raising=False)  # the tests' conftest sets 0
    assert history.public_mode() is True  # unset: public, whatever address the server listens on
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "0")
    assert history.public_mode() is False
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "1")
    assert history.public_mode() is True


def test_concurrent_writers_threads_and_two_processes_lose_no_row(home):
    history.record(_doc(1))  # the file exists before the race (creation is tested above)
    script = ("import sys; from remat_lab.store import history\n"
              "print('ready', flush=True); sys.stdin.readline()\n"
              "for i in range(40): history.record({'config': {'width': i}, 'p': sys.argv[1]})\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    procs = [subprocess.Popen([sys.executable, "-c", script, name], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("p1", "p2")]
    for p in procs:  # imported: now all writers start together
        assert p.stdout.readline().strip() == "ready"
    errors = []

    def write(t: int) -> None:
        try:
            for i in range(25):
                history.record(_doc(i, tag=f"t{t}"), session_id=f"thread{t}")
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(6)]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    assert not errors, errors
    assert history.count() == 1 + 6 * 25 + 2 * 40


def test_a_damaged_file_is_a_clear_error_and_recording_says_so(home):
    home.mkdir(parents=True)
    (home / "history.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(history.HistoryError, match="cannot be used .*Move the file away"):
        history.list_runs()
    problem = history.try_record(_doc(8))
    assert problem and "history.sqlite3" in problem and str(home) not in problem  # no folder shown
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cli = subprocess.run([sys.executable, "-m", "remat_lab", "history", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 1 and cli.stdout == ""
    assert cli.stderr.count("\n") == 1 and "Traceback" not in cli.stderr, cli.stderr


def test_history_page_lists_runs_locally_and_hides_strangers_runs_in_public(home, monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    history.record(_doc(64), source="cli")
    history.share([history.record(_doc(128), source="cli")])
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "0")
    at = AppTest.from_file(str(ROOT / "pages/history.py"), default_timeout=60).run()
    assert not at.exception and not at.error
    assert sorted(at.dataframe[0].value["width"]) == [64, 128]
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "1")
    at = AppTest.from_file(str(ROOT / "pages/history.py"), default_timeout=60).run()
    assert not at.exception
    assert list(at.dataframe[0].value["width"]) == [128]  # only the shared one
    assert any("nothing can be deleted" in c.value for c in at.caption)


def test_history_page_and_sweep_keep_serving_with_a_damaged_file(home):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    home.mkdir(parents=True)
    (home / "history.sqlite3").write_bytes(b"\x00garbage" * 512)
    at = AppTest.from_file(str(ROOT / "pages/history.py"), default_timeout=60).run()
    assert not at.exception
    assert any("History is off" in w.value and "Move the file away" in w.value for w in at.warning)
    at = AppTest.from_file(str(ROOT / "pages/sweep.py"), default_timeout=120)
    at.query_params.update(repeats="1", warmup="0")
    at.run()
    at.multiselect(key="sweep_widths").set_value([8])
    at.multiselect(key="sweep_batches").set_value([1])
    at.multiselect(key="sweep_policies").set_value(["no_remat"])
    at.button(key="sweep_run").click().run()
    assert not at.exception and not at.error
    assert any("median_ms" in df.value.columns for df in at.dataframe)  # the run is shown anyway
    assert "cannot be used" in at.session_state["_history_off"]  # recording off, said once in a toast


def test_the_history_file_is_held_to_its_bound_oldest_runs_out(home, monkeypatch):
    monkeypatch.setenv("REMAT_LAB_HISTORY_MAX_BYTES", "300K")
    ids = []
    for i in range(120):  # ~12.5 KB each, as an app run: 1.5 MB unbounded
        doc = {**_doc(i), "pad": f"x{i}" * 4000}
        ids.append(history.record(doc, source="app", session_id="v"))
    with history.connect() as con:
        assert history.used_bytes(con) <= 300 << 10
    kept = {r["id"] for r in history.list_runs(limit=1000)}
    assert ids[-1] in kept and ids[0] not in kept and 10 < len(kept) < 120
    assert kept == set(ids[-len(kept):])  # the newest ones, oldest out first
    files = [p for p in home.iterdir() if p.name.startswith("history.sqlite3")]
    assert sum(p.stat().st_size for p in files) < 2 * (300 << 10) + (4 << 20)  # + WAL before checkpoint
    monkeypatch.setenv("REMAT_LAB_HISTORY_MAX_BYTES", "0")  # no bound
    assert history.max_bytes() is None


def test_a_result_shown_again_adds_no_row_only_a_visitor_link(home):
    doc = _doc(64)
    first = history.record(doc, source="app", session_id="visitor-a")
    assert history.record(doc, source="app", session_id="visitor-a") is None  # a reload
    assert history.record(doc, source="app", session_id="visitor-b") is None  # another visitor, cached
    assert history.record(doc, source="cli") is None
    assert history.count() == 1
    for who in ("visitor-a", "visitor-b"):  # both saw it: both find it in their history
        assert [r["id"] for r in history.list_runs(session_id=who, public=True)] == [first]
        assert set(history.documents([first], session_id=who, public=True)) == {first}
    assert history.list_runs(session_id="visitor-c", public=True) == []
    assert history.delete([first]) == 1 and history.count() == 0
    with history.connect() as con:
        assert con.execute("SELECT COUNT(*) FROM visitors").fetchone()[0] == 0


def test_a_locked_history_skips_the_write_quickly_without_a_path(home):
    history.record(_doc(1))
    holder = sqlite3.connect(home / "history.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        t0 = time.perf_counter()
        err = history.try_record_error(_doc(2), source="app", session_id="v", timeout=0.3)
        took = time.perf_counter() - t0
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert isinstance(err, history.HistoryBusy) and took < 5, took
    assert "busy" in str(err) and str(home) not in str(err) and "history.sqlite3" in str(err)
    assert history.count() == 1


def test_history_errors_name_the_file_never_its_folder(home):
    home.mkdir(parents=True)
    con = sqlite3.connect(home / "history.sqlite3")
    con.execute("PRAGMA user_version = 99")
    con.close()
    with pytest.raises(history.HistoryError) as newer:
        history.count()
    (home / "history.sqlite3").unlink()
    (home / "history.sqlite3").mkdir()  # a folder where the file should be
    with pytest.raises(history.HistoryError) as unusable:
        history.count()
    for err in (newer.value, unusable.value):
        assert "history.sqlite3" in str(err) and str(home) not in str(err) and "/" not in str(err), err

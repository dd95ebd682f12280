"""The history's file on disk, not only its used pages, stays under its bound: freed pages are given back."""

from __future__ import annotations

import sqlite3

from remat_lab.store import history


def test_freed_pages_are_given_back_so_the_file_stays_under_its_bound(tmp_path, monkeypatch):
    monkeypatch.setenv("REMAT_LAB_HOME", str(tmp_path))
    monkeypatch.setenv("REMAT_LAB_HISTORY_MAX_BYTES", "256K")
    for i in range(60):  # ~8 KB each: ~480 KB unbounded, so the bound deletes runs many times
        doc = {"schema": 1, "config": {"model": "mlp", "width": 8 + i, "batch": 1, "policy": "no_remat"},
               "pad": f"x{i}" * 2000}
        history.record(doc, source="app", session_id="v")
    db = tmp_path / "history.sqlite3"
    con = sqlite3.connect(db)  # the last writer closed: the WAL is checkpointed into the file
    try:
        free = con.execute("PRAGMA freelist_count").fetchone()[0]
        deleted = 60 - con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    finally:
        con.close()
    assert deleted > 10  # the bound did delete runs
    assert free == 0, f"{free} freed pages kept in the file"
    assert db.stat().st_size <= 256 << 10

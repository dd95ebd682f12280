"""The sweep file: one writer at a time, and rows cut by a kill dropped wherever they stand."""

from __future__ import annotations

import json
import multiprocessing

import pytest

from remat_lab.studies import sweep


def _row(width: int) -> str:
    return json.dumps({"schema": 1, "config": {"width": width}, "step_time_s": {"median": 1e-3}}) + "\n"


def test_a_row_cut_in_the_middle_is_dropped_and_the_rest_resume(tmp_path):
    path = tmp_path / "s.jsonl"
    cut = _row(2)[:25]  # a kill mid-write, then a resumed sweep appended after it without repair
    path.write_text(_row(1) + cut + "\n" + _row(3) + _row(4)[:10])
    rows = sweep.read_rows(path)
    assert [r["config"]["width"] for r in rows] == [1, 3]
    sweep.repair(path)
    assert path.read_text() == _row(1) + _row(3)
    assert sweep.done_keys(sweep.read_rows(path)) == {sweep.config_key({"width": w}) for w in (1, 3)}


def test_a_file_that_is_not_a_sweep_is_still_refused(tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_text(_row(1) + "my notes\n")
    with pytest.raises(sweep.SweepFileError, match="line 2 is not a sweep row"):
        sweep.read_rows(path)


def _hold(path, ready, release):
    f = sweep.claim(path)
    ready.set()
    release.wait(30)
    f.close()


def test_a_second_sweep_on_the_same_file_is_refused(tmp_path):
    path = tmp_path / "s.jsonl"
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(path), ready, release))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(sweep.SweepFileError, match="another sweep is writing to"):
            sweep.claim(path)
    finally:
        release.set()
        holder.join(30)
    sweep.claim(path).close()  # free again once the first sweep ended

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
    release.wait(300)
    f.close()


def test_a_second_sweep_on_the_same_file_is_refused(tmp_path):
    path = tmp_path / "s.jsonl"
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(path), ready, release))
    holder.start()
    try:
        assert ready.wait(300)  # a spawned interpreter's imports: over 60 s on 2 loaded cores
        with pytest.raises(sweep.SweepFileError, match="another sweep is writing to"):
            sweep.claim(path)
    finally:
        release.set()
        holder.join(30)
    sweep.claim(path).close()  # free again once the first sweep ended


def _run_row(policy: str, median: float, ci: tuple[float, float] | None) -> dict:
    """A sweep row as a file holds it: before the intervals (``ci`` None) or after."""
    from remat_lab.config import RunConfig

    step = {"median": median, "p25": median * 0.9, "p75": median * 1.1, "min": median * 0.8,
            "max": median * 1.2, "repeats": 3, "warmup": 1, "samples": [median * 0.9, median, median * 1.1]}
    if ci:
        step.update(ci_low=ci[0], ci_high=ci[1])
    return {"schema": 1, "config": RunConfig(width=8, batch=2, policy=policy).as_dict(),
            "environment": {"backend": "cpu", "device_kind": "cpu", "device_count": 1, "jax": "0"},
            "step_time_s": step,
            "memory": {f"{p}_bytes": 1024 for p in ("argument", "output", "alias", "temp", "generated_code",
                                                    "peak")}}


def test_old_rows_without_intervals_still_load_and_draw(tmp_path):
    from remat_lab.present import charts, tables
    from remat_lab.store import results

    old = [_run_row("no_remat", 1e-3, None), _run_row("nothing_saveable", 2e-3, None)]
    new = [_run_row("no_remat", 1e-3, (0.9e-3, 1.1e-3)),
           _run_row("nothing_saveable", 1.05e-3, (1e-3, 1.2e-3))]
    for rows, noise in ((old, False), (new, True)):
        path = tmp_path / "s.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert len(sweep.read_rows(path)) == 2
        loaded = results.load("s.jsonl", path.read_bytes())
        assert len(loaded.runs) == 2 and not loaded.problems, loaded.problems
        df = tables.summary_frame(loaded.runs)
        rel = tables.relative_frame(df, "median_ms").set_index("policy")
        assert rel.loc["nothing_saveable", "within_noise"] == noise
        fig = charts.make_relative_heatmap_figure(rel.reset_index(), "t")
        assert len(fig.layout.annotations) == 2
    assert loaded.runs[1]["step_time_s"]["ci_low"] == 1e-3  # kept by the compact reader
    bad = _run_row("no_remat", 1e-3, (0.9e-3, "soon"))
    refused = results.load("s.jsonl", (json.dumps(bad) + "\n").encode())
    assert not refused.runs and "ci_high" in refused.problems[0]

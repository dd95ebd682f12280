"""Sweeps: the grid, error rows, the JSON-lines file, and ``python -m remat_lab sweep`` killed and resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remat_lab.config import ConfigError, RunConfig
from remat_lab.program.backend import ExecutionError
from remat_lab.studies import sweep

ROOT = Path(__file__).resolve().parents[1]
GRID = ["--widths", "8,16", "--batches", "2,4", "--policies", "no_remat,nothing_saveable",
        "--repeats", "2", "--warmup", "0"]


def _cli(tmp_path: Path, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "REMAT_LAB_HOME": str(tmp_path / "home"),
           "REMAT_LAB_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.Popen([sys.executable, "-m", "remat_lab", "sweep", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _rows(path: Path) -> list[dict]:
    text = path.read_text()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]  # every line a whole document


def _keys(rows: list[dict]) -> list[str]:
    return [sweep.config_key(r["config"]) for r in rows]


def test_grid_is_the_product_without_duplicates():
    base = RunConfig(width=8, batch=2, seq=16)
    grid = sweep.build_grid(base, width=[8, 16], batch=[2, 4], policy=["no_remat", "nothing_saveable"])
    assert len(grid) == 8 and len(set(map(sweep.config_key, grid))) == 8
    # the mlp ignores seq: two seqs must not double the runs
    assert len(sweep.build_grid(base, width=[8], seq=[16, 32], model=["mlp", "seq_mixer"])) == 3
    with pytest.raises(ValueError, match="unknown sweep axis"):
        sweep.build_grid(base, widths=[8])
    # a row's config (input_shape derived from the batch) has the key of its grid entry: resumable
    assert all(sweep.config_key(RunConfig(**c).as_dict()) == sweep.config_key(c) for c in grid)
    assert sweep.cell_key(grid[0]) == sweep.cell_key({**grid[0], "policy": "no_remat"})


def test_refused_and_failed_configurations_become_rows_and_the_sweep_goes_on(tmp_path):
    grid = sweep.build_grid(RunConfig(width=8, batch=2), width=[8, 16, 24])
    grid.insert(1, {**grid[0], "model": "transformer", "width": 6, "heads": 4})  # 6 % 4: refused

    def run(cfg: RunConfig) -> dict:
        if cfg.width == 16:
            raise ExecutionError("XLA failed while compiling: RESOURCE_EXHAUSTED")
        if cfg.width == 24:
            raise ConfigError("over the budget")
        return {"config": cfg.as_dict(), "environment": {"backend": "cpu"}, "texts": {"hlo": "..."}}

    out = tmp_path / "r.jsonl"
    with open(out, "a") as f:
        outcomes = list(sweep.run_grid(grid, run, write=lambda row: sweep.append_row(f, row)))
    rows = _rows(out)
    assert [json.loads(json.dumps(o.row)) for o in outcomes] == rows
    assert [(r.get("error") or {}).get("kind") for r in rows] == [None, "refused", "failed", "refused"]
    assert "divisible" in rows[1]["error"]["message"] and rows[0]["schema"] == 1
    assert "texts" not in rows[0]
    assert sweep.done_keys(rows) == set(_keys(rows))
    assert sweep.done_keys(rows, retry_failed=True) == {_keys(rows)[0]}


@pytest.mark.parametrize("content, args, message", [
    ("name,width\n1,2\n", [], "line 1 is not a sweep row"),
    (None, ["--memory-budget", "lots"], "memory budget 'lots' is not a size"),
], ids=["not-a-sweep-file", "bad-budget"])
def test_cli_sweep_refuses_a_foreign_out_file_and_a_bad_budget(tmp_path, capsys, content, args, message):
    from remat_lab.cli import main

    out = tmp_path / "r.csv"
    if content is not None:
        out.write_text(content)
    assert main(["sweep", "--widths", "8", "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err
    assert out.read_text() == (content or "") if content else not out.exists()
    assert main(["sweep", "--widths", "8", "--out", str(tmp_path / "no" / "dir.jsonl")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_a_line_cut_by_a_kill_is_dropped_and_repaired(tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text('{"config": {"width": 8}}\n{"config": {"wid')
    assert len(sweep.read_rows(out)) == 1
    sweep.repair(out)
    assert out.read_text() == '{"config": {"width": 8}}\n'
    assert sweep.read_rows(tmp_path / "missing.jsonl") == []


def _stop_after(proc: subprocess.Popen, out: Path, rows: int, how: signal.Signals) -> str:
    """Send ``how`` once ``out`` holds ``rows`` lines; the process's stderr."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if out.exists() and out.read_text().count("\n") >= rows:
            proc.send_signal(how)
            break
        time.sleep(0.01)
    return proc.communicate(timeout=60)[1]


def test_cli_sweep_killed_then_interrupted_resumes_to_eight_rows_without_repeats(tmp_path):
    """2 x 2 x 2 grid: SIGKILL after 2 rows, rerun and Ctrl-C after 2 more, rerun to the end (8 rows,
    none twice, the finished ones untouched, a progress bar on stderr), and once more: nothing to run."""
    out = tmp_path / "r.jsonl"
    err = _stop_after(_cli(tmp_path, *GRID, "--out", "r.jsonl"), out, 2, signal.SIGKILL)
    killed = sweep.read_rows(out)  # whole rows (a kill may leave a cut last line: dropped on resume)
    assert 2 <= len(killed) < 8, f"the sweep was not stopped midway ({len(killed)} rows): {err}"

    proc = _cli(tmp_path, *GRID, "--out", "r.jsonl")
    err = _stop_after(proc, out, len(killed) + 2, signal.SIGINT)
    interrupted = _rows(out)  # Ctrl-C: every line a whole row
    assert proc.returncode == 130 and "run the same command again to resume" in err, err
    assert f"{len(killed)} already in r.jsonl" in err
    assert len(killed) + 2 <= len(interrupted) < 8, err
    assert interrupted[: len(killed)] == killed

    proc = _cli(tmp_path, *GRID, "--out", "r.jsonl")
    out_text, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    rows = _rows(out)
    left = 8 - len(interrupted)
    assert f"{len(interrupted)} already in r.jsonl, {left} to run" in err
    assert f"{left}/{left}" in err and "━" in err, err  # rich's bar on stderr; stdout stays empty
    assert out_text == ""
    assert len(rows) == 8 and len(set(_keys(rows))) == 8  # nothing run twice
    assert rows[: len(interrupted)] == interrupted  # the finished rows were kept, not redone
    assert all(r["schema"] == 1 and r["step_time_s"]["median"] > 0 and "error" not in r for r in rows)
    assert {(r["config"]["width"], r["config"]["batch"], r["config"]["policy"]) for r in rows} == {
        (w, b, p) for w in (8, 16) for b in (2, 4) for p in ("no_remat", "nothing_saveable")}

    before = out.read_bytes()
    proc = _cli(tmp_path, *GRID, "--out", "r.jsonl")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "8 already in r.jsonl, 0 to run" in err, err
    assert out.read_bytes() == before


def test_cli_sweep_records_refusals_and_its_runs_in_the_history(tmp_path):
    proc = _cli(tmp_path, "--widths", "8,16", "--batches", "2", "--memory-budget", "1", "--out", "r.jsonl")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    rows = _rows(tmp_path / "r.jsonl")
    assert [r["error"]["kind"] for r in rows] == ["refused", "refused"]
    assert "budget" in rows[0]["error"]["message"] and rows[0]["environment"]["backend"]
    assert "ran 2, of which 2 refused or failed" in err
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "REMAT_LAB_HOME": str(tmp_path / "home")}
    listed = subprocess.run([sys.executable, "-m", "remat_lab", "history", "--json"], env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["runs"] == []  # refusals are rows of the file, not runs


def test_sweep_page_selections_survive_leaving_the_page():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)
    at.query_params.update(width="8", batch="2", repeats="2", warmup="0", depth="1")
    at.run()  # Explore, tiny
    at.switch_page("pages/sweep.py").run()
    at.multiselect(key="sweep_widths").set_value([8, 32])
    at.multiselect(key="sweep_batches").set_value([1])
    at.multiselect(key="sweep_policies").set_value(["no_remat"]).run()
    at.switch_page("pages/guide.py").run()
    assert "sweep_widths" not in at.session_state  # Streamlit dropped the widget's own state ...
    at.switch_page("pages/sweep.py").run()
    assert not at.exception
    assert at.multiselect(key="sweep_widths").value == [8, 32]  # ... and the page restored it
    assert at.multiselect(key="sweep_batches").value == [1]
    assert at.multiselect(key="sweep_policies").value == ["no_remat"]
    assert at.button(key="sweep_run").label == "Run sweep (2 runs)"


def test_sweep_page_resumes_from_its_rows_without_running_them_again(monkeypatch, tmp_path):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from remat_lab.store import history
    from remat_lab.studies import experiment

    monkeypatch.setenv("REMAT_LAB_HOME", str(tmp_path))

    calls = []
    real = experiment.run_experiment
    monkeypatch.setattr(experiment, "run_experiment",
                        lambda cfg, **kw: calls.append(cfg.width) or real(cfg, **kw))
    at = AppTest.from_file(str(ROOT / "pages/sweep.py"), default_timeout=120)
    at.query_params.update(repeats="2", warmup="0", seed="16", depth="1")  # a seed no other test caches
    at.run()
    at.multiselect(key="sweep_widths").set_value([8])
    at.multiselect(key="sweep_batches").set_value([1])
    at.multiselect(key="sweep_policies").set_value(["no_remat"]).run()
    at.button(key="sweep_run").click().run()
    assert not at.exception and calls == [8]
    assert at.button(key="sweep_run").label == "Sweep done (1 run)"
    at.multiselect(key="sweep_widths").set_value([8, 16]).run()  # as if a sweep of two was cut short
    assert at.button(key="sweep_run").label == "Resume sweep (1 of 2 left)"
    assert any("Partial sweep: 1 of 2" in w.value for w in at.warning)
    at.button(key="sweep_run").click().run()
    assert not at.exception and calls == [8, 16]  # the finished row was not run again
    rows = next(df.value for df in at.dataframe if "median_ms" in df.value.columns)
    assert sorted(rows["width"]) == [8, 16]
    recorded = history.list_runs()  # each row once in the run history, with this browser session
    assert sorted(r["width"] for r in recorded) == [8, 16]
    assert {(r["source"], r["kind"]) for r in recorded} == {("app", "sweep")} and recorded[0]["session_id"]


def test_each_cell_is_timed_interleaved_and_rows_carry_95_percent_intervals(monkeypatch, tmp_path):
    """Two cells (batch 2 and 4) of two policies: one ``interleaved`` call per cell, holding both
    policies' executables, ``repeats`` rounds; every row ci_low <= median <= ci_high, read back."""
    import numpy as np

    from remat_lab.present import tables
    from remat_lab.store import results
    from remat_lab.studies import compare
    from remat_lab.studies.experiment import run_experiment

    calls, real = [], compare.interleaved
    monkeypatch.setattr(compare, "interleaved",
                        lambda ex, **kw: calls.append((len(ex), kw["rounds"], kw["calls"])) or real(ex, **kw))
    base = RunConfig(width=16, batch=2, repeats=3, warmup=0, depth=1)
    grid = sweep.build_grid(base, batch=[2, 4], policy=["no_remat", "nothing_saveable"])
    out = tmp_path / "r.jsonl"
    with open(out, "a") as f:
        outcomes = list(sweep.run_grid(grid, lambda cfg: run_experiment(cfg, timing=False),
                                       write=lambda row: sweep.append_row(f, row),
                                       time_cell=sweep.time_interleaved))
    assert calls == [(2, 3, compare.CALLS_PER_ROUND)] * 2  # one call per cell, both policies in it
    rows = _rows(out)
    assert len(rows) == 4 and [o.row["config"]["batch"] for o in outcomes] == [2, 2, 4, 4]
    for r in rows:
        st = r["step_time_s"]
        assert "error" not in r and 0 < st["ci_low"] <= st["median"] <= st["ci_high"]
        assert len(st["samples"]) == 3 * compare.CALLS_PER_ROUND and st["repeats"] == 3
        assert st["median"] == pytest.approx(float(np.median(st["samples"])), rel=1e-12)
        assert st["p25"] <= st["median"] <= st["p75"]
        assert r["achieved_flops_per_s"] == pytest.approx(r["flops"] / st["median"], rel=1e-9)
        assert r["roofline"]["median_s"] == st["median"]
    loaded = results.load("r.jsonl", out.read_bytes())  # the Open results page reads them back
    assert len(loaded.runs) == 4 and not loaded.problems
    df = tables.summary_frame(loaded.runs)
    assert (df["ci_low_ms"] <= df["median_ms"]).all() and (df["median_ms"] <= df["ci_high_ms"]).all()


def test_a_cell_is_written_whole_and_a_failed_timing_makes_failed_rows(tmp_path):
    from remat_lab.program.backend import ExecutionError

    grid = sweep.build_grid(RunConfig(width=8, batch=2), width=[8, 16],
                            policy=["no_remat", "nothing_saveable"])
    cells, written = [], []

    def time_cell(cfgs, docs):
        cells.append([(c.width, c.policy) for c in cfgs])
        if cfgs[0].width == 16:
            raise ExecutionError("XLA failed while running: boom")
        for d in docs:
            d["step_time_s"] = {"median": 1.0, "ci_low": 0.9, "ci_high": 1.1}

    run = lambda cfg: {"config": cfg.as_dict(), "environment": {"backend": "cpu"}}
    first = next(sweep.run_grid(grid, run, write=written.append, time_cell=time_cell))
    assert len(written) == 2 and first.row is written[0]  # the whole cell before its first outcome
    outcomes = list(sweep.run_grid(grid, run, time_cell=time_cell,
                                   skip={sweep.config_key(grid[0])}))
    assert [o.skipped for o in outcomes] == [True, False, False, False]
    assert cells[1:] == [[(8, "nothing_saveable")], [(16, "no_remat"), (16, "nothing_saveable")]]
    assert outcomes[1].row["step_time_s"]["median"] == 1.0
    assert [o.row["error"]["kind"] for o in outcomes[2:]] == ["failed", "failed"]
    assert "boom" in outcomes[2].row["error"]["message"]


def test_sweep_page_times_each_cell_interleaved_with_intervals():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages/sweep.py"), default_timeout=120)
    at.query_params.update(repeats="3", warmup="0", seed="17", depth="1")  # a seed no other test caches
    at.run()
    assert "timed together, interleaved" in at.caption[0].value and "95 % interval" in at.caption[0].value
    at.multiselect(key="sweep_widths").set_value([16])
    at.multiselect(key="sweep_batches").set_value([2])
    at.multiselect(key="sweep_policies").set_value(["no_remat", "nothing_saveable"]).run()
    at.button(key="sweep_run").click().run()
    assert not at.exception
    rows = list(at.session_state["sweep_docs"].values())
    assert len(rows) == 2
    for r in rows:
        st = r["step_time_s"]
        assert st["interleaved_with"] == 2 and st["ci_low"] <= st["median"] <= st["ci_high"]
    table = next(df.value for df in at.dataframe if "median_ms" in df.value.columns)
    assert table["ci_low_ms"].notna().all() and (table["ci_low_ms"] <= table["ci_high_ms"]).all()

"""XLA's native log lines and JAX's warnings are captured and summarized, never printed raw."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import os, sys, warnings
    from remat_lab.program.native_log import captured_logs
    with captured_logs() as logs:
        os.write(2, b"W1201 hlo_rematerialization.cc:3231] Can't reduce memory use below 60GiB\\n")
        warnings.warn("compilation cache is not initialized", UserWarning)
        print("3/7 minimal: compiling batch 8", file=sys.stderr)
    print("remat_lab: note: " + logs.summary(), file=sys.stderr)
""")


def _stderr(env: dict) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_native_lines_and_warnings_are_kept_and_the_lab_s_own_lines_pass():
    err = _stderr({"REMAT_LAB_SHOW_LOGS": "0"})
    assert "3/7 minimal: compiling batch 8" in err
    assert "Can't reduce" not in err and "UserWarning" not in err
    assert "1 XLA log line and 1 JAX warning kept from this terminal" in err
    assert "rematerialization pass" in err and "REMAT_LAB_SHOW_LOGS=1" in err


def test_on_request_they_are_shown_raw():
    err = _stderr({"REMAT_LAB_SHOW_LOGS": "1"})
    assert "Can't reduce memory use below 60GiB" in err
    assert "UserWarning: compilation cache is not initialized" in err


def test_advise_into_a_file_prints_progress_lines_and_no_raw_log_or_warning(tmp_path):
    err = tmp_path / "err.txt"
    with open(err, "w") as f:
        done = subprocess.run([sys.executable, "-m", "remat_lab", "advise", "--target", "h100", "--model",
                               "mlp", "--width", "16384", "--depth", "8", "--dtype", "bfloat16",
                               "--policies", "no_remat", "--max-batch", "65536", "--budget", "150G",
                               "--json"],
                              stdout=subprocess.PIPE, stderr=f, text=True, timeout=600,
                              env={**os.environ, "REMAT_LAB_SHOW_LOGS": "0"})
    assert done.returncode == 0
    log = json.loads(done.stdout)["log"]  # the advice document carries the summary
    assert log["xla_remat_lines"]
    assert all(".cc:" in ln and not ln.startswith("W") for ln in log["xla_remat_lines"])  # absl's prefix off
    lines = err.read_text().splitlines()
    steps = [ln for ln in lines if ln.startswith("[") and " s] " in ln and "compiling batch" in ln]
    assert len(steps) >= 3, lines  # one plain line per compile, with the time since the start
    # over the H100's 80 GB (a 150 GB budget) XLA's pass ran (its C++ warning): summarized, not raw
    assert not any(".cc:" in ln or "UserWarning" in ln or "absl" in ln for ln in lines), lines
    assert any("from XLA's own rematerialization pass" in ln for ln in lines), lines


NESTED = textwrap.dedent("""
    import json, os, sys, warnings
    from remat_lab.program.native_log import captured_logs, logged

    @logged("compile.log")
    def run():
        for t in ("12:00:00.000001   4242", "12:00:07.000002   4243"):  # one message twice
            os.write(2, f"W1201 {t} hlo_rematerialization.cc:3231] Can't reduce memory use\\n".encode())
        warnings.warn("compilation cache is not initialized", UserWarning)
        return {"compile": {"compile_s": 1.0}}

    with captured_logs() as logs:
        os.write(2, b"before the run\\n")
        doc = run()
    print(json.dumps(doc))
    print("remat_lab: note: " + logs.summary(), file=sys.stderr)
""")


def test_a_document_carries_its_own_summary_inside_the_commands_capture():
    done = subprocess.run([sys.executable, "-c", NESTED], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "REMAT_LAB_SHOW_LOGS": "0"})
    assert done.returncode == 0, done.stderr
    log = json.loads(done.stdout)["compile"]["log"]
    assert log["lines"] == 2 and log["xla_lines"] == []  # the line before the run is not the run's
    assert log["xla_remat_lines"] == ["hlo_rematerialization.cc:3231] Can't reduce memory use"]
    assert log["warnings"] == ["UserWarning: compilation cache is not initialized"]
    assert log["warnings_total"] == 1
    assert "3 XLA log lines and 1 JAX warning kept" in done.stderr  # the command's, all of them
    assert "Can't reduce" not in done.stderr and "before the run" not in done.stderr


def test_a_run_over_the_h100s_memory_says_in_its_document_what_xla_logged():
    """~139 GiB of no_remat activations on one H100 (80 GB): XLA's rematerialization pass logs that
    it cannot reach the limit; the run document keeps that line (compile.log), results files read it."""
    from remat_lab.config import RunConfig
    from remat_lab.store import results
    from remat_lab.studies.experiment import run_experiment

    cfg = RunConfig(model="mlp", width=16384, depth=8, stack="scan", dtype="bfloat16", target="h100",
                    batch=65536, policy="no_remat")
    doc = run_experiment(cfg)
    log = doc["compile"]["log"]
    assert doc["compile"]["xla_remat"]["applied"]
    assert any("hlo_rematerialization.cc" in ln and "Can't reduce memory use" in ln
               for ln in log["xla_remat_lines"]), log
    assert log["lines"] >= len(log["xla_remat_lines"]) >= 1
    doc.pop("texts")
    loaded = results.load("run.json", json.dumps(doc).encode())
    assert not loaded.problems and loaded.runs[0]["compile"]["log"] == log


def _compile_details_script():
    import streamlit as st

    from pages import _compile_log

    _compile_log.compile_details(st, {"compile": {
        "xla_remat": {"applied": True, "instructions": 12},
        "log": {"lines": 2, "warnings_total": 1, "shown_with": "REMAT_LAB_SHOW_LOGS=1",
                "xla_remat_lines": ["hlo_rematerialization.cc:3231] Can't reduce memory use below **60GiB**"],
                "xla_lines": ["<a href='x'>gpu_compiler.cc</a>"], "warnings": ["UserWarning: cache"]}}})


def test_explore_shows_the_compile_log_on_request_as_code():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_compile_details_script, default_timeout=60).run()
    assert not at.exception
    assert at.expander[0].label == "Compiler log: 2 XLA lines, 1 warning"
    codes = [c.value for c in at.code]
    assert codes == ["hlo_rematerialization.cc:3231] Can't reduce memory use below **60GiB**",
                     "<a href='x'>gpu_compiler.cc</a>", "UserWarning: cache"]  # as written, not rendered
    assert any("**rewrote** this program (12 instructions cloned)" in m.value for m in at.markdown)

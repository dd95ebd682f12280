"""Validation, the memory guard and the command line's handling of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from remat_lab.cli import main
from remat_lab.config import (
    ConfigError,
    MemoryBudgetError,
    RunConfig,
    check_budget,
    coerce_config,
    estimate_bytes,
    parse_bytes,
    resolve_budget,
)
from remat_lab.studies.experiment import run_experiment


@pytest.mark.parametrize("changes, words", [
    ({"width": 0}, "width must be from 1 to 16384"),
    ({"width": 16385}, "width must be from 1 to 16384"),
    ({"batch": -1}, "batch must be from 0 to 65536"),
    ({"seq": 0}, "seq must be from 1 to 4096"),
    ({"depth": 17}, "depth must be from 1 to 16"),
    ({"width": 2.5}, "width must be a whole number"),
    ({"width": True}, "width must be a whole number"),
    ({"policy": "save_anything_except_these_names"}, "unknown policy"),
    ({"model": "resnet"}, "unknown model"),
    ({"dtype": "float16"}, "unknown dtype"),
    ({"objective": "loss"}, "unknown objective"),
    ({"model": "seq_mixer", "batch": 0}, "only for the mlp model"),
])
def test_bad_config_is_refused_with_a_sentence(changes, words):
    with pytest.raises(ConfigError, match=words):
        RunConfig(**changes)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError) and issubclass(MemoryBudgetError, ConfigError)


def test_coerce_config_reads_strings_and_refuses_the_rest():
    cfg = coerce_config({"width": "128", "batch": " 0 ", "policy": "nothing_saveable"})
    assert (cfg.width, cfg.batch, cfg.policy) == (128, 0, "nothing_saveable")
    for raw in ({"width": "abc"}, {"width": "1e3"}, {"width": "10**12"}, {"width": "-3"},
                {"policy": "rm -rf /"}, {"colour": "red"}, {"width": "9" * 40}):
        with pytest.raises(ConfigError):
            coerce_config(raw)


def test_estimate_grows_with_size():
    small = estimate_bytes(RunConfig(width=64, batch=8))
    assert estimate_bytes(RunConfig(width=128, batch=8)) > small
    assert estimate_bytes(RunConfig(width=64, batch=64)) > small
    assert estimate_bytes(RunConfig(width=64, batch=8, depth=4)) > small
    assert estimate_bytes(RunConfig(width=64, batch=8, dtype="bfloat16")) < small


@pytest.mark.parametrize("config", [
    RunConfig(width=256, batch=64), RunConfig(width=128, batch=256, depth=4),
    RunConfig(width=512, batch=8, policy="no_remat"), RunConfig(width=64, batch=0),
    RunConfig(model="seq_mixer", width=64, batch=8, seq=64, policy="dots_saveable"),
    RunConfig(width=256, batch=32, dtype="bfloat16", policy="nothing_saveable"),
])
def test_estimate_bounds_the_compiled_peak(run, config):
    peak = run(config)["memory"]["peak_bytes"]
    estimate = estimate_bytes(config)
    assert peak <= estimate <= 12 * peak + (2 << 20), (peak, estimate)


@pytest.mark.parametrize("policy", ["dots_with_no_batch_dims_saveable", "no_remat", "full"])
def test_llm_estimate_within_one_and_a_half_times_the_compiled_peak(policy):
    """The guard's estimate of a preset's training step (its own compile on XLA CPU, abstract
    inputs: nothing allocated) is above the compiled peak and within 1.5x of it."""
    from remat_lab.analysis.costs import memory_report
    from remat_lab.program.step import jit_program, problem_for, program_args

    config = RunConfig.from_preset("gpt2-small", step="train", seq=256, batch=16, policy=policy)
    problem = problem_for(config.replace(compile_only=True))
    peak = memory_report(jit_program(problem).lower(*program_args(problem)).compile())["peak_bytes"]
    assert peak <= estimate_bytes(config) <= 1.5 * peak, (estimate_bytes(config) / peak)


def test_compiled_guard_names_the_compiled_figure():
    from remat_lab.config import check_compiled

    config = RunConfig(width=64, batch=8)
    check_compiled(config, {"peak_bytes": 1 << 20}, 2 << 20)  # fits: nothing raised
    with pytest.raises(MemoryBudgetError, match="compiled program needs 3.0 MiB .* budget of 2.0 MiB"):
        check_compiled(config, {"peak_bytes": 3 << 20}, 2 << 20)


def test_over_budget_is_refused_fast_and_before_tracing(monkeypatch):
    from remat_lab.studies import experiment

    monkeypatch.setattr(experiment, "build_problem", lambda c: pytest.fail("traced"))
    started = time.perf_counter()
    with pytest.raises(MemoryBudgetError, match="over the memory budget of 1.0 MiB"):
        run_experiment(RunConfig(width=16384, batch=65536), budget="1M")
    assert time.perf_counter() - started < 1.0


def test_budget_sources(monkeypatch):
    monkeypatch.delenv("REMAT_LAB_MEMORY_BUDGET", raising=False)
    # on an accelerator the device's whole memory: its compile's memory analysis answers it
    assert resolve_budget(device_limit=8 << 30) == 8 << 30
    monkeypatch.setenv("REMAT_LAB_MEMORY_BUDGET", "256M")
    assert resolve_budget() == 256 << 20
    assert resolve_budget("1G") == 1 << 30
    assert parse_bytes("1.5GiB") == 3 << 29 and parse_bytes("4096") == 4096
    for bad in ("lots", "-1G", "0", "nan", 10 ** 5000):  # the last: an int too long to print
        with pytest.raises(ConfigError):
            parse_bytes(bad)
    with pytest.raises(MemoryBudgetError):
        check_budget(RunConfig(width=4096, batch=4096), 256 << 20)


@pytest.mark.parametrize("argv, words", [
    (["run", "--width", "-3"], "width must be from 1 to 16384"),
    (["run", "--width", "abc"], "width must be a whole number"),
    (["run", "--policy", "rm -rf"], "invalid choice"),
    (["run", "--model", "seq_mixer", "--batch", "0"], "only for the mlp model"),
    (["run", "--width", "16384", "--batch", "65536", "--memory-budget", "1G"], "memory budget"),
    (["run", "--memory-budget", "lots"], "not a size"),
    (["explain", "--depth", "0"], "depth must be from 1 to 16"),
    (["frobnicate"], "invalid choice"),
])
def test_cli_bad_input_exits_2_with_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        code = main(argv)
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_cli_subprocess_bad_input_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "remat_lab", "run", "--width", "-3"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "remat_lab: error: width must be from 1 to 16384; got -3."


def test_cli_json_document(tmp_path, monkeypatch):
    monkeypatch.setenv("REMAT_LAB_CACHE_DIR", str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "remat_lab", "run", "--width", "64", "--batch", "8",
                           "--repeats", "3", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["config"]["width"] == 64 and doc["config"]["policy"] == "dots_with_no_batch_dims_saveable"
    assert set(doc["compile"]) == {"lower_s", "compile_s", "timeline_s", "xla_remat", "log"}
    assert doc["compile"]["xla_remat"]["applied"] is False  # XLA CPU has no such pass
    assert {"source", "instructions", "points", "by_phase", "peak_index", "peak_live_bytes", "at_peak",
            "phases_from", "note"} == set(doc["memory_timeline"])
    assert {"median", "p25", "p75", "min", "max", "repeats", "warmup"} <= set(doc["step_time_s"])
    assert set(doc["memory"]) == {
        "argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "generated_code_bytes",
        "host_argument_bytes", "host_output_bytes", "host_alias_bytes", "host_temp_bytes",
        "host_generated_code_bytes", "peak_bytes", "xla_peak_memory_bytes",
        "by_kind", "by_kind_source", "by_kind_other"}  # what fills the memory at the peak, and "other"
    assert {"parameters", "optimizer_state", "gradients", "activations", "logits", "other",
            "method"} == set(doc["memory"]["by_kind"])
    assert {"reference", "independent", "loss_err", "grad_max_abs_err", "grad_max_rel_err", "rtol", "atol",
            "remat_applied", "remat_expected", "ok", "failures"} <= set(doc["gradient_check"])
    assert {"dot_count", "excess_dots_vs_no_remat", "excess_flops_vs_no_remat", "identical_to",
            "fingerprint"} <= set(doc["hlo"])
    assert {"activation_residual_bytes", "parameter_residual_bytes", "zero_cost_residual_bytes"} <= set(
        doc["totals"])
    assert {"recomputed_in_compiled", "offloaded_in_compiled"} <= set(doc["dots"][0])
    assert len(doc["dots"]) == 2 and doc["residuals"]
    assert any(tmp_path.iterdir()), "the persistent compilation cache was not written"


def test_cli_policies_lists_the_registry(capsys):
    assert main(["policies"]) == 0
    out = capsys.readouterr().out
    assert "dots_with_no_batch_dims_saveable" in out and "offload_dot_with_no_batch_dims" in out
    assert "save_anything_except_these_names" not in out

"""Reliability: the memory guard over a grid, XLA failures, concurrency, interrupted sweeps and
reproducibility. (Validation and a few estimate-vs-peak cases live in test_config.py.)"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import pytest
from jax.errors import JaxRuntimeError
from streamlit.testing.v1 import AppTest

from remat_lab.analysis.costs import memory_report
from remat_lab.cli import main
from remat_lab.config import MemoryBudgetError, RunConfig, estimate_bytes
from remat_lab.program import timing
from remat_lab.program.backend import ExecutionError
from remat_lab.program.step import build_problem, make_step
from remat_lab.studies import experiment

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pages import _running  # noqa: E402

EXPLORE = str(ROOT / "pages" / "explore.py")
SWEEP = str(ROOT / "pages" / "sweep.py")
OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00TiB."
# (estimate - 1 MiB) / compiled peak on CPU: 1.5 .. 4.6 over the full 420-config grid (README,
# "Limits and safety"); the test allows 6.
MAX_FACTOR = 6


def _key(cfg: RunConfig) -> tuple:
    return tuple(sorted(cfg.as_dict().items()))


def _stable(result: dict) -> dict:
    """A result without the numbers that legitimately change run to run (timings, FLOP/s)."""
    drop = {"step_time_s", "compile", "achieved_flops_per_s", "roofline", "texts"}
    return {k: v for k, v in result.items() if k not in drop}


@pytest.fixture(scope="module")
def tiny_result():
    return experiment.run_experiment(RunConfig(width=8, batch=1, repeats=1, warmup=0))


def _fake_result(tiny: dict, cfg: RunConfig) -> dict:
    result = copy.deepcopy(tiny)
    result["config"] = cfg.as_dict()
    return result


# ---------------------------------------------------------------- memory guard over a grid


def _grid() -> list[RunConfig]:
    """Both models; widths 8..256, batches 0..256, depth 1..3; four policies rotated over the
    corners, all four at the middle point. (The full product is measured for the README.)"""
    policies = ["no_remat", "nothing_saveable", "dots_with_no_batch_dims_saveable",
                "offload_dot_with_no_batch_dims"]
    out = []
    for model in ("mlp", "seq_mixer"):
        corners = itertools.product((8, 256), (0, 1, 256), (1, 3))
        corners = [(w, b, d) for w, b, d in corners if not (model == "seq_mixer" and b == 0)]
        for i, (w, b, d) in enumerate(corners):
            out.append(RunConfig(model=model, width=w, batch=b, depth=d, seq=16,
                                 policy=policies[i % 4]))
        out += [RunConfig(model=model, width=64, batch=16, depth=2, seq=16, policy=p)
                for p in policies]
    out.append(RunConfig(width=128, batch=32, depth=2, dtype="bfloat16", policy="nothing_saveable"))
    return out


def test_estimate_bounds_the_compiled_peak_over_a_grid():
    factors = []
    for cfg in _grid():
        problem = build_problem(cfg)
        compiled = jax.jit(make_step(problem)).lower(*problem.args).compile()
        peak = memory_report(compiled)["peak_bytes"]
        estimate = estimate_bytes(cfg)
        assert peak <= estimate, (cfg, peak, estimate)
        # The estimate's fixed 1 MiB allowance dominates tiny configurations; bound the rest.
        assert estimate - (1 << 20) <= MAX_FACTOR * peak, (cfg, peak, estimate)
        factors.append((estimate - (1 << 20)) / peak)
    assert max(factors) > 1.0  # the guard is an upper estimate, not a copy of the peak


def test_over_budget_grid_is_refused_before_tracing(monkeypatch):
    monkeypatch.setattr(experiment, "build_problem", lambda c: pytest.fail("traced"))
    for w, b, d in itertools.product((4096, 16384), (4096, 65536), (1, 16)):
        cfg = RunConfig(width=w, batch=b, depth=d)
        started = time.perf_counter()
        with pytest.raises(MemoryBudgetError, match="over the memory budget of 64.0 MiB"):
            experiment.run_experiment(cfg, budget="64M")
        assert time.perf_counter() - started < 1.0


def test_default_budget_is_half_a_1gb_container(monkeypatch):
    """A 1 GB cgroup limit (e.g. Streamlit Community Cloud) gives a 512 MiB budget."""
    from remat_lab import config
    from remat_lab.config import limits

    monkeypatch.setattr(limits, "cgroup_memory", lambda root="/": {"limit": 1 << 30})
    monkeypatch.delenv(config.BUDGET_ENV, raising=False)
    assert config.resolve_budget(None, None) == 512 << 20
    assert config.resolve_budget(None, 80 << 30) == 80 << 30  # a GPU's bytes_limit wins, whole


def test_small_budget_is_refused_in_the_app(monkeypatch):
    monkeypatch.setenv("REMAT_LAB_MEMORY_BUDGET", "1M")
    monkeypatch.setattr(experiment, "build_problem", lambda c: pytest.fail("traced"))
    _running._cached_run.clear()
    at = AppTest.from_file(EXPLORE, default_timeout=60)
    at.query_params.update(width="256", batch="64", repeats="1")
    at.run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "cannot run" in errors[0], errors
    assert "over the memory budget of 1.0 MiB" in errors[0]
    assert not at.metric  # nothing half-rendered


def test_lowering_the_budget_refuses_a_cached_configuration(monkeypatch):
    monkeypatch.delenv("REMAT_LAB_MEMORY_BUDGET", raising=False)
    _running._cached_run.clear()
    at = AppTest.from_file(EXPLORE, default_timeout=120)
    at.query_params.update(width="64", batch="8", repeats="1")
    at.run()
    assert not at.exception and not at.error and at.metric  # computed and cached
    monkeypatch.setenv("REMAT_LAB_MEMORY_BUDGET", "1K")
    at.run()
    assert not at.exception
    assert any("over the memory budget of 1.0 KiB" in e.value for e in at.error), at.error


# ---------------------------------------------------------------- XLA failures


def _raise_oom(*args, **kwargs):
    raise JaxRuntimeError(OOM)


def test_cli_compile_failure_exits_3_and_the_next_run_works(monkeypatch, capsys):
    """Out of memory exits 3 (each failure's own status: tests/test_failures.py)."""
    argv = ["explain", "--width", "24", "--batch", "2", "--no-jaxpr", "--no-cache"]
    with monkeypatch.context() as mp:
        mp.setattr(jax.stages.Lowered, "compile", _raise_oom)
        assert main(argv) == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "XLA failed while compiling: RESOURCE_EXHAUSTED" in err
    assert "ran out of memory: lower width, batch, seq or depth" in err
    assert main(argv) == 0
    assert "Per-dot table" in capsys.readouterr().out


def test_run_failure_releases_the_timing_lock(monkeypatch, capsys):
    argv = ["run", "--width", "20", "--batch", "2", "--repeats", "1", "--warmup", "0", "--no-cache"]
    with monkeypatch.context() as mp:
        mp.setattr(jax.stages.Compiled, "__call__", _raise_oom)
        assert main(argv) == 3
    err = capsys.readouterr().err
    assert "XLA failed while running: RESOURCE_EXHAUSTED" in err and "Traceback" not in err
    assert not timing.TIMING_LOCK.locked()
    assert main(argv) == 0


def test_app_shows_xla_failure_and_recomputes_after_it(monkeypatch):
    """The failed run is not cached (st.cache_data never caches exceptions): the retry compiles."""
    _running._cached_run.clear()
    compiles = []
    real_compile = jax.stages.Lowered.compile

    def failing(self, *args, **kwargs):
        compiles.append("failed")
        raise JaxRuntimeError(OOM)

    def counting(self, *args, **kwargs):
        compiles.append("ok")
        return real_compile(self, *args, **kwargs)

    at = AppTest.from_file(EXPLORE, default_timeout=120)
    at.query_params.update(width="40", batch="2", repeats="1")
    monkeypatch.setattr(jax.stages.Lowered, "compile", failing)
    at.run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "XLA failed" in errors[0] and "RESOURCE_EXHAUSTED" in errors[0]
    assert not at.metric
    # the step's compile failed (and the witness compiles started beside it, if they got that far)
    failed = len(compiles)
    assert failed >= 1 and set(compiles) == {"failed"}

    monkeypatch.setattr(jax.stages.Lowered, "compile", counting)
    at.run()  # same session, same configuration: the retry computes fresh and succeeds
    assert not at.exception and not at.error
    # The step, the no_remat baseline and the gradient reference (compiled, not cached).
    assert len(compiles) - failed >= 2 and set(compiles[failed:]) == {"ok"}
    assert at.metric and at.metric[0].label == "Median step time"
    done = list(compiles)
    at.run()  # now it is cached
    assert compiles == done and not at.error


def test_cached_entry_point_does_not_cache_failures(monkeypatch, tiny_result):
    calls = []

    def flaky(cfg, **kwargs):
        calls.append(cfg)
        if len(calls) == 1:
            raise ExecutionError("XLA failed while compiling: RESOURCE_EXHAUSTED.")
        return _fake_result(tiny_result, cfg)

    monkeypatch.setattr(experiment, "run_experiment", flaky)
    _running._cached_run.clear()
    key = _key(RunConfig(width=8, batch=5, repeats=1))
    with pytest.raises(ExecutionError):
        _running._cached_run(key)
    assert _running._cached_run(key)["config"]["batch"] == 5
    assert _running._cached_run(key)["config"]["batch"] == 5
    assert len(calls) == 2


# ---------------------------------------------------------------- concurrency

CONCURRENT = [
    RunConfig(width=8, batch=1, repeats=2, warmup=1),
    RunConfig(width=16, batch=2, repeats=2, warmup=1),
    RunConfig(width=24, batch=0, repeats=2, warmup=1),
    RunConfig(width=32, batch=4, depth=2, repeats=2, warmup=1),
    RunConfig(width=12, batch=3, policy="nothing_saveable", repeats=2, warmup=1),
    RunConfig(width=20, batch=1, policy="no_remat", objective="grad", repeats=2, warmup=1),
    RunConfig(model="seq_mixer", width=8, batch=1, seq=4, repeats=2, warmup=1),
    RunConfig(model="seq_mixer", width=16, batch=2, seq=8, policy="dots_saveable", repeats=2,
              warmup=1),
]


def test_eight_threads_through_the_cached_entry_point(monkeypatch):
    serial = {cfg: _stable(experiment.run_experiment(cfg)) for cfg in CONCURRENT}

    intervals, lock_held = [], []
    real_time = experiment.time_keeping_output

    def recording(*args, **kwargs):
        lock_held.append(timing.TIMING_LOCK.locked())
        start = time.perf_counter()
        try:
            return real_time(*args, **kwargs)
        finally:
            intervals.append((start, time.perf_counter()))

    monkeypatch.setattr(experiment, "time_keeping_output", recording)
    _running._cached_run.clear()
    results, errors = {}, []
    barrier = threading.Barrier(len(CONCURRENT))

    def work(cfg):
        try:
            barrier.wait(timeout=60)
            results[cfg] = _running._cached_run(_key(cfg))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append((cfg, repr(err)))

    threads = [threading.Thread(target=work, args=(c,), daemon=True) for c in CONCURRENT]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 300
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "deadlock: a run did not finish in 300 s"
    assert not errors, errors
    assert set(results) == set(CONCURRENT)
    for cfg in CONCURRENT:
        assert _stable(results[cfg]) == serial[cfg], cfg
        assert results[cfg]["step_time_s"]["repeats"] == cfg.repeats
    assert len(intervals) == len(CONCURRENT) and all(lock_held)
    spans = sorted(intervals)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "two timings overlapped"
    assert not timing.TIMING_LOCK.locked()


def test_two_sessions_on_one_configuration_compute_it_once(monkeypatch, tiny_result):
    calls = []

    def slow_run(cfg, **kwargs):
        calls.append(cfg)
        time.sleep(1.0)  # long enough for the second session to ask while the first computes
        return _fake_result(tiny_result, cfg)

    monkeypatch.setattr(experiment, "run_experiment", slow_run)
    _running._cached_run.clear()
    sessions = [AppTest.from_file(EXPLORE, default_timeout=120) for _ in range(2)]
    for at in sessions:
        at.query_params.update(width="48", batch="3", repeats="1")
    threads = [threading.Thread(target=at.run, daemon=True) for at in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    for at in sessions:
        assert not at.exception and not at.error
        assert at.metric and at.metric[0].label == "Median step time"
    assert len(calls) == 1 and calls[0].width == 48


# ---------------------------------------------------------------- interrupted sweep


def test_interrupted_sweep_keeps_completed_rows_and_a_clean_cache(monkeypatch, tiny_result):
    from streamlit.runtime.scriptrunner_utils.exceptions import StopException

    calls = []

    def run(cfg, *, progress=None, **kwargs):
        calls.append(cfg)
        progress("compiling")
        if len(calls) == 3:  # the user presses Stop (or changes a widget) during the third run
            raise StopException()
        return _fake_result(tiny_result, cfg)

    monkeypatch.setattr(experiment, "run_experiment", run)
    _running._cached_untimed.clear()
    at = AppTest.from_file(SWEEP, default_timeout=60)
    at.query_params.update(model="mlp", depth="1", repeats="1")
    at.run()
    at.multiselect(key="sweep_widths").set_value([8, 16])
    at.multiselect(key="sweep_batches").set_value([1])
    at.multiselect(key="sweep_policies").set_value(["no_remat", "nothing_saveable"])
    at.run()
    at.button(key="sweep_run").click().run()
    assert not at.exception
    assert len(calls) == 3
    rows = list(at.session_state["sweep_docs"].values())  # kept per configuration for the session
    assert [(r["config"]["width"], r["config"]["policy"]) for r in rows] == [
        (8, "no_remat"), (8, "nothing_saveable")]

    # The cache holds the two completed runs and nothing for the interrupted one.
    completed, interrupted = calls[0], calls[2]
    assert _running._cached_untimed(_key(completed))["config"] == completed.as_dict()
    assert len(calls) == 3
    assert _running._cached_untimed(_key(interrupted))["config"] == interrupted.as_dict()
    assert len(calls) == 4  # computed fresh: no half-written entry

    at.run()  # the next script run shows the partial sweep
    assert not at.exception and not at.error
    assert any("Partial sweep: 2 of 4 runs completed" in w.value for w in at.warning)
    table = [df for df in at.dataframe if "median_ms" in df.value.columns][0].value
    assert list(table["width"]) == [8, 8] and table["median_ms"].notna().all()


# ---------------------------------------------------------------- reproducibility

# One process per repetition: the step's loss and gradients hashed (JAX fresh in the process, no
# persistent cache on), then the CLI's ``run`` (``python -m remat_lab``'s ``main``) on its argv.
GRADS_THEN_CLI = """
import hashlib, sys, jax, numpy as np
from remat_lab.config import RunConfig
from remat_lab.program.step import build_problem, make_step
cfg = RunConfig(width=32, batch=4, policy=sys.argv[1])
p = build_problem(cfg)
loss, grads = jax.jit(make_step(p))(*p.args)
h = hashlib.sha256(np.asarray(loss).tobytes())
for g in grads:
    h.update(np.asarray(g).tobytes())
print(h.hexdigest(), flush=True)
from remat_lab.cli import main
sys.exit(main(sys.argv[2:]))
"""


def test_same_config_and_seed_reproduce_across_processes(tmp_path):
    env = {**os.environ, "REMAT_LAB_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-c", GRADS_THEN_CLI, "nothing_saveable", "run", "--width", "32",
            "--batch", "4", "--repeats", "2", "--warmup", "1", "--seed", "7", "--json"]
    docs, hashes = [], []
    for _ in range(2):  # the second process reads the persistent compilation cache
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr
        digest, _, doc = proc.stdout.partition("\n")
        hashes.append(digest.strip())
        docs.append(json.loads(doc))
    a, b = (_stable(d) for d in docs)
    for part in ("loss", "gradient_check", "residuals", "dots", "totals", "memory", "hlo",
                 "flops", "config", "notes"):
        assert a[part] == b[part], part
    assert a == b
    assert a["config"]["seed"] == 7 and a["residuals"] and a["dots"]
    assert len(hashes[0]) == 64 and hashes[0] == hashes[1]
    digest = hashlib.sha256(json.dumps(a, sort_keys=True).encode()).hexdigest()
    assert digest == hashlib.sha256(json.dumps(b, sort_keys=True).encode()).hexdigest()

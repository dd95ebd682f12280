"""The witness compiles (no_remat's program, the gradient reference) run beside the main compile, and
the run's document is the same as when they run after it."""

from __future__ import annotations

import threading

import jax
import pytest

from remat_lab.analysis.costs import program_flops
from remat_lab.config import RunConfig
from remat_lab.program.step import jit_step, problem_for
from remat_lab.studies import experiment
from remat_lab.studies import witness_compiles as witness

CFG = RunConfig(width=32, batch=4, depth=2, stack="scan", policy="nothing_saveable", objective="grad",
                repeats=1, warmup=0)
SAME = ("hlo", "baseline", "gradient_check", "dots", "residuals", "totals", "notes", "memory", "flops")


def _run(parallel: bool, monkeypatch) -> dict:
    experiment.baseline_program.cache_clear()
    with monkeypatch.context() as mp:
        mp.setattr(experiment, "Witnesses",
                   lambda cfg, problem, **kw: witness.Witnesses(cfg, problem, parallel=parallel, **kw))
        doc = experiment.run_experiment(CFG, timing=False)
    doc.pop("texts")
    return doc


def test_the_witnesses_give_the_same_document_beside_or_after_the_main_compile(monkeypatch):
    beside, after = _run(True, monkeypatch), _run(False, monkeypatch)
    for key in SAME:
        assert beside[key] == after[key], key
    # The witness is no_remat's program: its flops equal a second, independent compile's.
    problem = problem_for(CFG.replace(policy="no_remat"))
    compiled = jit_step(problem).trace(*problem.args).lower().compile()
    assert beside["baseline"]["flops"] == program_flops(compiled, compiled.as_text())[0]
    assert beside["hlo"]["excess_dots_vs_no_remat"] > 0  # nothing_saveable recomputes under grad


def test_the_no_remat_witness_compiles_in_a_thread_of_its_own(monkeypatch):
    threads = []
    real = witness._baseline.__wrapped__

    def spy(ref_cfg):
        threads.append(threading.current_thread().name)
        return real(ref_cfg)

    monkeypatch.setattr(witness, "_baseline", spy)
    doc = experiment.run_experiment(CFG.replace(width=24), timing=False)
    assert threads and threads[0].startswith("remat_lab_witness"), threads
    assert doc["baseline"]["policy"] == "no_remat" and doc["gradient_check"]["ok"] is True


def test_a_failing_witness_is_reported_as_before(monkeypatch):
    def broken(ref_cfg):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: injected")

    monkeypatch.setattr(witness, "_baseline", broken)
    with pytest.raises(experiment.ExecutionError, match="no_remat baseline"):
        experiment.run_experiment(CFG.replace(width=20), timing=False)


def test_a_witness_that_meets_an_occupied_tracing_store_is_traced_again_alone(monkeypatch):
    """Should JAX's ``StoreException`` still reach a witness thread (issue 46), the witness is
    traced again in the run's own thread and the document's notes say so."""
    from jax._src.linear_util import StoreException

    real = witness._baseline.__wrapped__

    def racy(ref_cfg):
        if threading.current_thread().name.startswith("remat_lab_witness"):
            raise StoreException("Store occupied")
        return real(ref_cfg)

    monkeypatch.setattr(witness, "_baseline", racy)
    doc = experiment.run_experiment(CFG.replace(width=28), timing=False)
    assert doc["baseline"]["policy"] == "no_remat" and doc["baseline"]["flops"] > 0
    assert any("Store occupied" in n and "traced again alone" in n for n in doc["notes"])
    # a witness's other failures are not retried: they are reported as before
    monkeypatch.setattr(witness, "_baseline", lambda ref_cfg: (_ for _ in ()).throw(ValueError("x")))
    with pytest.raises(experiment.ExecutionError, match="no_remat baseline"):
        experiment.run_experiment(CFG.replace(width=12), timing=False)


def test_main_program_and_witnesses_traced_at_once_beside_a_cpu_hog_never_collide():
    """Issue 46's race: the main program and its no_remat witness traced in threads at once (splash
    attention's shared Pallas kernel on a TPU target, where 'Store occupied' was seen), many times,
    while another process keeps a core busy. ``program/tracing`` serialises the traces; none fails.
    (With its lock replaced by a no-op, one of three runs of this test raised StoreException.)"""
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    from remat_lab.program.tracing import trace_and_lower

    cfg = RunConfig(model="llm", width=256, heads=2, kv_heads=1, depth=1, seq=512, vocab=256,
                    mlp_dim=256, batch=1, step="train", attention="flash", dtype="bfloat16",
                    target="tpu-v5e", target_devices=1, compile_only=True, policy="save_qkv_proj")

    def trace(policy):
        problem = problem_for(cfg.replace(policy=policy))
        _, lowered = trace_and_lower(jit_step(problem), *problem.args)
        return "tpu_custom_call" in lowered.as_text() or "splash" in lowered.as_text()

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            done = list(pool.map(trace, ["save_qkv_proj", "no_remat", "full", "no_remat"] * 3))
    finally:
        hog.kill()
        hog.wait()
    assert len(done) == 12 and all(done)  # every trace lowered splash's kernel, none raised

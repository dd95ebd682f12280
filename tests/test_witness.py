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

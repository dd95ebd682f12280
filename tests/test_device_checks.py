"""A run's checks fitted to its device: the gradient check on a smaller step, the allocator's peak."""

from __future__ import annotations

import jax
import pytest

from remat_lab.config import RunConfig
from remat_lab.program.step import build_problem, jit_step
from remat_lab.studies import device_checks
from remat_lab.studies.device_checks import allocator_report, fitted_check, smaller


def test_smaller_halves_the_batch_then_the_depth():
    sizes = [(c.batch, c.depth) for c in smaller(RunConfig(width=32, batch=8, depth=4))]
    assert sizes == [(4, 4), (2, 4), (1, 4), (1, 2), (1, 1)]
    # with accumulation the batch stays a multiple of the microbatches
    acc = RunConfig(width=32, batch=12, depth=2, microbatches=3)
    assert [(c.batch, c.depth) for c in smaller(acc)] == [(6, 2), (3, 2), (3, 1)]


def _step(config: RunConfig):
    problem = build_problem(config)
    fn = jit_step(problem)
    out = fn(*problem.args)
    traced = fn.trace(*problem.args)
    loss, grads = (None, out) if config.objective == "grad" else (float(out[0]), out[1])
    return problem, jax.device_get(grads), loss, traced.jaxpr


def test_a_reference_the_device_cannot_hold_is_checked_on_a_smaller_step(monkeypatch):
    """Where the whole step's reference runs out of device memory (simulated: XLA's words), the
    check runs the policy's own step and the reference again at half the batch, and says so."""
    real = device_checks.check_gradients

    def check(problem, grads, loss, jaxpr):
        if problem.config.batch > 2:
            raise RuntimeError("RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to "
                               "allocate 1.00G. That was not possible.")
        return real(problem, grads, loss, jaxpr)

    monkeypatch.setattr(device_checks, "check_gradients", check)
    config = RunConfig(width=32, batch=8, depth=2, policy="dots_saveable")
    result = fitted_check(*_step(config))
    assert result["ok"] is True, result["failures"]
    assert result["checked"] == {"batch": 2, "depth": 2, "of_batch": 8, "of_depth": 2,
                                 "why": result["checked"]["why"]}
    assert "RESOURCE_EXHAUSTED" in result["checked"]["why"]
    assert "batch 2" in result["scope"] and "configured: batch 8" in result["scope"]


def test_the_whole_step_is_checked_when_it_fits_and_a_failing_reference_is_skipped(monkeypatch):
    config = RunConfig(width=32, batch=4, depth=2)
    args = _step(config)
    whole = fitted_check(*args)
    assert whole["ok"] is True and whole["scope"].startswith("the step as configured (batch 4")

    def broken(*_):
        raise ValueError("the reference is broken")

    monkeypatch.setattr(device_checks, "check_gradients", broken)
    skipped = fitted_check(*args)
    assert skipped["ok"] is None and skipped["skipped"] is True
    assert "ValueError: the reference is broken" in skipped["reason"]


# The gradient step of gpt2-small (seq 1024, batch 8, nothing_saveable) measured on a TPU v5e chip
# (JAX 0.10.2, 2026-12-07; benchmarks/chip): the runtime counts the program's buffers in use and
# reserves its temporaries apart (bytes_reserved).
_BEFORE = {"peak_bytes_in_use": 1482885120, "bytes_in_use": 1482885120, "bytes_reserved": 0}
_AFTER = {"peak_bytes_in_use": 2000479744, "bytes_in_use": 1482885120, "bytes_reserved": 1560379392}
_COMPILED = {"peak_bytes": 2512685568, "argument_bytes": 494284800}


def test_the_allocator_measure_adds_the_runtime_reservation():
    report = allocator_report(_BEFORE, _COMPILED, "gradient step", after=_AFTER)
    other = _BEFORE["bytes_in_use"] - _COMPILED["argument_bytes"]
    assert report["buffers_bytes"] == _AFTER["peak_bytes_in_use"] - other
    assert report["measured_peak_bytes"] == report["buffers_bytes"] + _AFTER["bytes_reserved"]
    assert report["exact"] and report["step_set_peak"]
    # the chip's own figure within 5 % of XLA's memory analysis
    assert report["difference_bytes"] / _COMPILED["peak_bytes"] == pytest.approx(0.0, abs=0.05)
    assert "reserved for its temporaries" in report["text"] and "above" in report["text"]


def test_an_earlier_peak_makes_the_measure_an_upper_bound():
    before = {**_BEFORE, "peak_bytes_in_use": 9 << 30, "bytes_reserved": 1560379392}
    after = {**_AFTER, "peak_bytes_in_use": 9 << 30}
    report = allocator_report(before, _COMPILED, "gradient step", after=after)
    assert not report["exact"] and "upper bound" in report["text"]
    assert allocator_report(None, _COMPILED, "gradient step") is None  # CPU: no allocator figures

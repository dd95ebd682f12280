"""The independent gradient check: its reference, its bounds, and the errors it must catch."""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import numpy as np
import pytest

from remat_lab.analysis import gradcheck, gradcheck_bounds
from remat_lab.analysis.gradcheck import (
    REFERENCE,
    bound_parameters,
    check_gradients,
    reference_loss_and_grads,
    remat_applied,
)
from remat_lab.config import RunConfig
from remat_lab.model.policies import POLICIES
from remat_lab.program.step import build_problem, make_step

KEYS = {"reference", "independent", "loss_err", "grad_max_abs_err", "grad_max_rel_err", "rtol",
        "atol", "remat_applied", "remat_expected", "ok", "failures", "max_abs_err", "max_rel_err"}


@functools.lru_cache(maxsize=64)
def _run(cfg: RunConfig):
    """(problem, loss or None, grads as float64 arrays, traced jaxpr) of the real step."""
    problem = build_problem(cfg)
    step = jax.jit(make_step(problem))
    out = step(*problem.args)
    loss, grads = (None, out) if cfg.objective == "grad" else out
    grads = [np.asarray(g, dtype=np.float64) for g in grads]
    return problem, None if loss is None else float(loss), grads, step.trace(*problem.args).jaxpr


def _check(cfg: RunConfig, grads=None, loss="step"):
    problem, step_loss, step_grads, jaxpr = _run(cfg)
    return check_gradients(problem, step_grads if grads is None else grads,
                           step_loss if loss == "step" else loss, jaxpr)


def _cfg(**kw) -> RunConfig:
    base = dict(model="mlp", width=16, batch=4, seq=4, depth=1, stack="loop", dtype="float32",
                policy="nothing_saveable", repeats=1, warmup=0)
    return RunConfig(**{**base, **kw})


# --- the reference -----------------------------------------------------------------------------

@pytest.mark.parametrize("stack", ["loop", "scan"])
@pytest.mark.parametrize("model,batch,depth", [("mlp", 0, 1), ("mlp", 4, 3), ("seq_mixer", 2, 1),
                                               ("seq_mixer", 3, 3)])
def test_reference_equals_nnx_no_remat_step(model, batch, depth, stack):
    problem, loss, grads, _ = _run(_cfg(model=model, batch=batch, depth=depth, stack=stack,
                                        policy="no_remat"))
    ref_loss, ref_grads, _ = reference_loss_and_grads(problem)
    assert len(ref_grads) == len(grads) == (4 * depth if stack == "loop" or depth == 1 else 4)
    assert ref_loss == pytest.approx(loss, rel=1e-6)
    for path, g, r in zip(problem.paths, grads, ref_grads):
        assert g.shape == r.shape, path
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6 * np.max(np.abs(r)), err_msg=path)


def _numpy_mlp_truth(problem) -> tuple[float, list[np.ndarray]]:
    """Loss and gradients of the MLP stack, forward and backward by hand in float64 NumPy."""
    p = {k: np.asarray(v, dtype=np.float64) for k, v in zip(problem.paths, problem.leaves)}
    depth = problem.config.depth
    h = np.asarray(problem.x, dtype=np.float64).reshape(-1, problem.config.width)  # batch 0: 1 row
    names = [f"blocks.{i}." if depth > 1 else "" for i in range(depth)]
    saved = []
    for pre in names:
        z1 = h @ p[pre + "l1.kernel"] + p[pre + "l1.bias"]
        a1 = np.maximum(z1, 0)
        z2 = a1 @ p[pre + "l2.kernel"] + p[pre + "l2.bias"]
        saved.append((h, z1, a1, z2))
        h = np.maximum(z2, 0)
    grads, dh = {}, np.ones_like(h)
    for pre, (h_in, z1, a1, z2) in reversed(list(zip(names, saved))):
        dz2 = dh * (z2 > 0)
        grads[pre + "l2.kernel"], grads[pre + "l2.bias"] = a1.T @ dz2, dz2.sum(0)
        dz1 = (dz2 @ p[pre + "l2.kernel"].T) * (z1 > 0)
        grads[pre + "l1.kernel"], grads[pre + "l1.bias"] = h_in.T @ dz1, dz1.sum(0)
        dh = dz1 @ p[pre + "l1.kernel"].T
    return float(h.sum()), [grads[k] for k in problem.paths]


@pytest.mark.parametrize("batch,depth", [(4, 1), (4, 2), (0, 2)])
def test_float64_numpy_truth_agrees_with_float32_step(batch, depth):
    cfg = _cfg(width=8, batch=batch, depth=depth, policy="nothing_saveable")
    problem, loss, grads, _ = _run(cfg)
    true_loss, true_grads = _numpy_mlp_truth(problem)
    b = bound_parameters(cfg)
    tol = 8 * math.sqrt(b["d"] * b["K"]) * b["u"]  # float32 rounding through d chained K-sums
    assert abs(loss - true_loss) <= tol * max(abs(true_loss), 1.0)
    for path, g, t in zip(problem.paths, grads, true_grads):
        assert np.max(np.abs(g - t)) <= tol * np.max(np.abs(t)), path
    assert _check(cfg)["ok"]


# --- real policies pass ------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [dict(model="mlp", width=32, batch=8, depth=2),
                                   dict(model="seq_mixer", width=32, batch=4, seq=8, depth=3,
                                        seed=1)])
def test_every_policy_passes(dtype, shape):
    for policy in POLICIES:
        result = _check(_cfg(dtype=dtype, policy=policy, **shape))
        assert set(result) == KEYS
        assert result["ok"], (policy, result["failures"])
        assert result["reference"] == REFERENCE and result["independent"] is True
        assert result["remat_applied"] == result["remat_expected"] == (policy != "no_remat")
        assert result["max_rel_err"] == result["grad_max_rel_err"]
        assert result["loss_err"] is not None


def _failures_against(cfg: RunConfig, **how) -> list[str]:
    """The check's failures against one reference evaluation (``gradcheck._reference``'s options)."""
    problem, loss, grads, _ = _run(cfg)
    return gradcheck._compare(problem, grads, loss, gradcheck._reference(problem, **how))["failures"]


def test_excess_precision_and_recomputation_are_the_freedoms_allowed():
    """Two roundings beyond the default reference's bound, each within another evaluation's.
    everything_saveable rounds the softmax's exp to bf16 where no_remat keeps it in float32: within
    the bound of the fully rounded reference (XLA 0.10: bit for bit; XLA 0.12 fuses it otherwise,
    1.3 u * S from it). nothing_saveable's recomputation, which XLA 0.12 keeps, rounds in other
    fusions than the forward: bit for bit the reference evaluated with each block remat'd."""
    mixer = dict(model="seq_mixer", width=32, batch=4, seq=8, depth=3, seed=1, dtype="bfloat16")
    everything, nothing = (_cfg(policy=p, **mixer) for p in ("everything_saveable", "nothing_saveable"))
    assert _failures_against(everything) and not _failures_against(everything, excess_precision=False)
    assert _failures_against(nothing) and _failures_against(nothing, excess_precision=False)
    assert not _failures_against(nothing, remat=True)
    problem, _, grads, _ = _run(nothing)
    remat = reference_loss_and_grads(problem, remat=True)[1]
    assert all(np.array_equal(g, r) for g, r in zip(grads, remat))
    assert _check(everything)["ok"] and _check(nothing)["ok"]
    # no_remat is the default evaluation itself, bit for bit.
    problem, _, grads, _ = _run(_cfg(policy="no_remat", **mixer))
    assert all(np.array_equal(g, r) for g, r in zip(grads, reference_loss_and_grads(problem)[1]))


# --- injected errors fail ----------------------------------------------------------------------

def _injected(cfg: RunConfig, path: str, change) -> dict:
    problem, _, grads, _ = _run(cfg)
    grads = [change(g) if p == path else g for p, g in zip(problem.paths, grads)]
    return _check(cfg, grads=grads)


BF16 = _cfg(width=64, batch=8, dtype="bfloat16")
BF16_MIXER = _cfg(model="seq_mixer", width=32, batch=4, seq=8, depth=3, seed=1, dtype="bfloat16",
                  policy="everything_saveable")
F32 = _cfg(width=64, batch=8)


def _zero_small(g):
    return np.where(np.abs(g) < 0.02 * np.max(np.abs(g)), 0.0, g)


def _bump_max(g, rel=1e-4):
    g = g.copy()
    i = np.unravel_index(np.argmax(np.abs(g)), g.shape)
    g[i] += rel * np.max(np.abs(g))
    return g


@pytest.mark.parametrize("cfg,path,change", [
    (BF16, "l1.kernel", lambda g: g * 1.01),
    (BF16, "l2.kernel", lambda g: g * 1.01),
    (BF16_MIXER, "blocks.0.l1.kernel", lambda g: g * 1.01),
    (BF16, "l1.kernel", lambda g: g * 1.03),
    (BF16, "l2.bias", lambda g: g * 1.03),
    (BF16, "l1.kernel", _zero_small),
    (BF16_MIXER, "blocks.2.l2.kernel", _zero_small),
    (F32, "l1.kernel", lambda g: g * (1 + 1e-4)),
    (F32, "l2.bias", lambda g: g * (1 + 1e-4)),
    (F32, "l2.kernel", _bump_max),
    (BF16, "l1.bias", lambda g: np.where(np.arange(g.size) == 3, np.nan, g)),
], ids=["bf16-1%", "bf16-1%-l2", "bf16-mixer-1%", "bf16-3%", "bf16-3%-bias", "bf16-zero<2%",
        "bf16-mixer-zero<2%", "f32-1e-4", "f32-1e-4-bias", "f32-1e-4-one-entry", "nan"])
def test_injected_error_fails(cfg, path, change):
    assert _check(cfg)["ok"]
    result = _injected(cfg, path, change)
    assert not result["ok"]
    assert result["failures"] and all(f.startswith(path + ":") for f in result["failures"])


def test_remat_silently_disabled_fails():
    problem, loss, grads, jaxpr = _run(_cfg(policy="no_remat"))
    assert remat_applied(jaxpr) is False
    labelled = dataclasses.replace(problem, config=problem.config.replace(policy="nothing_saveable"))
    result = check_gradients(labelled, grads, loss, jaxpr)
    assert result["remat_applied"] is False and result["remat_expected"] is True
    assert not result["ok"] and result["failures"] == [
        "remat: policy nothing_saveable expects a remat equation, the traced step has none"]
    # and the converse: a remat step labelled no_remat
    _, _, _, remat_jaxpr = _run(_cfg(policy="nothing_saveable"))
    assert not check_gradients(problem, grads, loss, remat_jaxpr)["ok"]
    assert not check_gradients(problem, grads, loss, None)["ok"]


def test_loss_reported_apart_and_none_for_grad_objective():
    result = _check(_cfg(objective="grad", dtype="bfloat16"))
    assert result["ok"] and result["loss_err"] is None and set(result) == KEYS
    problem, loss, grads, jaxpr = _run(_cfg())
    bad = check_gradients(problem, grads, loss * 1.01, jaxpr)
    assert not bad["ok"] and bad["failures"][0].startswith("loss:")
    assert bad["grad_max_rel_err"] == bad["max_rel_err"] == 0.0  # the loss is in neither


# --- the faults of issue 24 ------------------------------------------------------------------------

BF16_WIDE = _cfg(width=64, batch=32, dtype="bfloat16")


@pytest.mark.parametrize("cfg", [BF16_WIDE, BF16_MIXER], ids=["mlp", "seq_mixer"])
def test_a_bf16_loss_off_by_a_tenth_of_a_percent_fails(cfg):
    problem, loss, grads, jaxpr = _run(cfg)
    assert check_gradients(problem, grads, loss, jaxpr)["ok"]
    bad = check_gradients(problem, grads, loss * 1.001, jaxpr)
    assert not bad["ok"] and [f[:5] for f in bad["failures"]] == ["loss:"]
    # The bound is the statistical one, far below the old one (two ulps of sum|out|).
    _, _, abs_out, l2_out = gradcheck._reference(problem)
    bound = gradcheck_bounds.loss_bound(cfg, abs_out, l2_out)
    assert bound < 0.001 * abs(loss) and bound < 2 * 2.0**-8 * abs_out / 5


BF16_DEEP = _cfg(model="transformer", width=32, batch=2, seq=4, heads=2, depth=8, stack="scan",
                 dtype="bfloat16", policy="dots_saveable")


def _one_entry(rel):
    def change(g):
        g = g.copy()
        i = np.unravel_index(np.argmax(np.abs(g)) // 2, g.shape)  # an entry that is not the max
        g[i] += rel * np.max(np.abs(g))
        return g
    return change


def _flip_small(frac):
    return lambda g: np.where(np.abs(g) < frac * np.max(np.abs(g)), -g, g)


@pytest.mark.parametrize("path,change,says", [
    ("blocks.wi_0.kernel", _one_entry(0.05), "entries out of bound"),
    ("blocks.q_proj.kernel", _flip_small(0.02), "signs flipped"),
    ("blocks.wo.kernel", _flip_small(0.02), "signs flipped"),
], ids=["one-entry-5%", "flip<2%-q", "flip<2%-wo"])
def test_deep_bf16_transformer_faults_fail(path, change, says):
    # Depth 8, the depth: the per-element allowance grows as depth**0.3 (11.2 u), below
    # the 12.8 u of one entry off by 5 % of the leaf's max; flips of entries too small for the
    # per-element test are caught by the small-entry sign test.
    assert _check(BF16_DEEP)["ok"], _check(BF16_DEEP)["failures"]
    problem, _, grads, _ = _run(BF16_DEEP)
    changed = dict(zip(problem.paths, grads))[path]
    assert np.sum(change(changed) != changed) >= 1
    result = _injected(BF16_DEEP, path, change)
    assert not result["ok"] and any(says in f for f in result["failures"]), result["failures"]
    assert all(f.startswith(path + ":") for f in result["failures"])


def test_small_entry_sign_test_on_synthetic_leaves():
    rng = np.random.default_rng(0)
    u = 2.0**-8
    r = rng.standard_normal((64, 64))
    atol = 11 * u  # the per-element allowance of a deep transformer, in units of the leaf max
    scale = np.max(np.abs(r))
    noisy = r + rng.uniform(-3, 3, r.shape) * u * scale  # rounding noise within the allowance
    assert gradcheck_bounds._leaf_errors("w", noisy, r, 2 * u, atol, u, 0.0)[2] == []
    hidden = np.abs(r) < atol * scale / 2  # a flip here is within the per-element allowance
    assert hidden.sum() >= gradcheck_bounds.FLIP_MIN_ENTRIES
    flipped = np.where(hidden, -r, noisy)
    failures = gradcheck_bounds._leaf_errors("w", flipped, r, 2 * u, atol, u, 0.0)[2]
    assert len(failures) == 1 and "signs flipped" in failures[0]
    zeroed = np.where(hidden, 0.0, noisy)  # zeroing (projection -1) is not a flip
    assert gradcheck_bounds._leaf_errors("w", zeroed, r, 2 * u, atol, u, 0.0)[2] == []

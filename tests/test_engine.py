"""The measurement engine: correctness of every policy, compiled-program facts, memory, timing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from remat_lab.analysis.costs import memory_report
from remat_lab.config import RunConfig
from remat_lab.model.models import build_model
from remat_lab.model.policies import POLICIES
from remat_lab.program.step import build_problem, make_step


def _independent_reference(config: RunConfig):
    """Loss and grads of the plain model (no remat, no engine code), straight from Flax."""
    dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}[config.dtype]
    model = build_model(config.model, config.width, config.depth, seed=config.seed, dtype=dtype)
    x = jax.random.normal(jax.random.key(config.seed + 1), config.input_shape, dtype=dtype)

    def loss(m):
        return jnp.sum(m(x) if config.depth == 1 else _stack(m, x), dtype=jnp.float32)

    value, grads = nnx.value_and_grad(loss)(model)
    return float(value), [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]


def _stack(m, x):
    for block in m.blocks:
        x = block(x)
    return x


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("model", ["mlp", "seq_mixer"])
@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_policy_keeps_the_gradients(policy, model, dtype):
    config = RunConfig(model=model, width=32, batch=4, seq=6, dtype=dtype, policy=policy)
    problem = build_problem(config)
    loss, grads = jax.jit(make_step(problem))(*problem.args)
    ref_loss, ref_grads = _independent_reference(config)
    rtol, atol = {"float32": (1e-5, 1e-5), "bfloat16": (2e-2, 2e-2)}[dtype]
    np.testing.assert_allclose(float(loss), ref_loss, rtol=rtol, atol=atol * max(1, abs(ref_loss)))
    assert len(grads) == len(ref_grads) == 4
    for got, ref in zip(grads, ref_grads):
        scale = max(1.0, float(np.abs(ref).max()))
        np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=rtol, atol=atol * scale)


def test_gradients_differ_when_the_model_differs():
    """The comparison above can fail: a different seed gives different gradients."""
    a = _independent_reference(RunConfig(width=32, batch=4))
    b = _independent_reference(RunConfig(width=32, batch=4, seed=1))
    assert not np.allclose(a[1][1], b[1][1], rtol=1e-5)


def test_result_document_has_every_key(run):
    result = run(RunConfig(width=32, batch=4, repeats=3, warmup=1), True)
    assert set(result) >= {"config", "environment", "compile", "step_time_s", "flops",
                           "achieved_flops_per_s", "loss", "memory", "hlo", "gradient_check"}
    st = result["step_time_s"]
    assert st["repeats"] == 3 and st["warmup"] == 1 and len(st["samples"]) == 3
    assert 0 < st["min"] <= st["p25"] <= st["median"] <= st["p75"] <= st["max"]
    assert result["compile"]["lower_s"] > 0 and result["compile"]["compile_s"] > 0
    assert result["flops"] > 0 and result["achieved_flops_per_s"] > 0
    assert result["gradient_check"]["ok"] is True
    roof = result["roofline"]
    assert roof["peak_source"] in ("calibrated", "spec")
    if roof["peak_flops_per_s"]:
        assert 0 < roof["achieved_fraction"] <= 1, roof  # a calibrated peak is never exceeded
        if not roof["stale_calibration"]:
            assert roof["achieved_fraction"] == pytest.approx(
                result["achieved_flops_per_s"] / roof["peak_flops_per_s"])
    assert roof["arithmetic_intensity"] > 0 and roof["bound"] in ("compute", "memory")
    assert result["gradient_check"]["independent"] is True
    assert result["gradient_check"]["remat_applied"] is True  # the default policy remats
    env = result["environment"]
    assert env["backend"] == jax.default_backend() and env["device_count"] >= 1
    assert env["jax"] == jax.__version__


def test_forward_equality_is_not_policy_equality():
    """Same forward values, different compiled programs (the seed's warning)."""
    cfgs = [RunConfig(width=256, batch=64, policy=p)
            for p in ("nothing_saveable", "dots_with_no_batch_dims_saveable")]
    forwards, dots = [], []
    for cfg in cfgs:
        problem = build_problem(cfg)
        forwards.append(np.asarray(jax.jit(problem.loss)(*problem.args)))
        text = jax.jit(make_step(problem)).lower(*problem.args).compile().as_text()
        dots.append(sum(" dot(" in line for line in text.splitlines()))
    np.testing.assert_allclose(forwards[0], forwards[1], rtol=1e-6)
    assert dots == [7, 5]


def _plain_grad_temp_bytes(width: int, batch: int, policy) -> int:
    """XLA's temp bytes for ``jax.grad`` of a plain jax.numpy copy of the mlp (no NNX, no lab code),
    the block under ``jax.checkpoint(policy=...)`` or none: an independent compile."""
    def block(p, x):
        return jax.nn.relu(jax.nn.relu(x @ p[0] + p[1]) @ p[2] + p[3])

    def loss(p, x):
        return jnp.sum(block(p, x) if policy is None else jax.checkpoint(block, policy=policy)(p, x))

    p = [jnp.ones((width, width)), jnp.ones(width), jnp.ones((width, width)), jnp.ones(width)]
    compiled = jax.jit(jax.grad(loss)).lower(p, jnp.ones((batch, width))).compile()
    return compiled.memory_analysis().temp_size_in_bytes


def test_grad_only_at_depth_one_compiles_every_policy_to_the_same_products(run):
    results = {p: run(RunConfig(width=256, batch=64, objective="grad", policy=p)) for p in POLICIES}
    counts = {p: r["hlo"]["dot_count"] for p, r in results.items()}
    assert len(set(counts.values())) == 1, counts
    # The same peak too, but for everything_saveable: under JAX/XLA 0.12 it holds a relu's mask as
    # booleans where the others keep the float32 value it is compared from (XLA 0.10: all alike).
    # A plain jax.numpy compile of the same mlp shows the same difference: the compiler's, not the lab's.
    peaks = {p: r["memory"]["peak_bytes"] for p, r in results.items()}
    assert {p for p, v in peaks.items() if v != peaks["no_remat"]} == {"everything_saveable"}, peaks
    plain = {name: _plain_grad_temp_bytes(256, 64, policy) for name, policy in
             (("no_remat", None), ("everything_saveable", jax.checkpoint_policies.everything_saveable))}
    assert (peaks["no_remat"] - peaks["everything_saveable"]
            == plain["no_remat"] - plain["everything_saveable"] == 64 * 256 * (4 - 1))
    # ... whereas value_and_grad tells them apart at the same size.
    vg = {p: run(RunConfig(width=256, batch=64, policy=p))["hlo"]["dot_count"]
          for p in ("nothing_saveable", "dots_with_no_batch_dims_saveable")}
    assert vg["nothing_saveable"] > vg["dots_with_no_batch_dims_saveable"]


def test_grad_objective_has_no_loss_and_checks_gradients(run):
    result = run(RunConfig(width=32, batch=4, objective="grad", policy="nothing_saveable"))
    assert result["gradient_check"]["ok"]
    assert result["loss"] is None and result["gradient_check"]["loss_err"] is None
    ref = run(RunConfig(width=32, batch=4, policy="no_remat"))
    assert ref["loss"] is not None and ref["gradient_check"]["loss_err"] is not None


def test_memory_analysis_fields_and_peak_formula(run):
    mem = run(RunConfig(width=64, batch=8))["memory"]
    for prefix in ("", "host_"):
        for name in ("argument", "output", "alias", "temp", "generated_code"):
            value = mem[f"{prefix}{name}_bytes"]
            assert isinstance(value, int) and value >= 0
    assert mem["peak_bytes"] == (mem["generated_code_bytes"] + mem["argument_bytes"]
                                 + mem["output_bytes"] - mem["alias_bytes"] + mem["temp_bytes"])
    # Arguments are the parameters and x: 2*(64*64+64) + 8*64 float32 values.
    assert mem["argument_bytes"] == 4 * (2 * (64 * 64 + 64) + 8 * 64)
    assert mem["xla_peak_memory_bytes"] is None or mem["xla_peak_memory_bytes"] > 0


def test_memory_report_handles_backends_without_analysis():
    class NoAnalysis:
        def memory_analysis(self):
            return None

    class Broken:
        def memory_analysis(self):
            raise NotImplementedError

    assert memory_report(NoAnalysis()) is None
    assert memory_report(Broken()) is None


def test_remat_trades_memory_for_dots_at_depth(run):
    """Deeper stacks: saving nothing holds fewer residual bytes than saving the dots."""
    save = run(RunConfig(width=128, batch=64, depth=3))
    none = run(RunConfig(width=128, batch=64, depth=3, policy="nothing_saveable"))
    assert none["totals"]["residual_bytes"] < save["totals"]["residual_bytes"]


def test_bfloat16_gradient_check_tolerance_follows_the_dtype(run):
    bf16 = run(RunConfig(width=32, batch=4, dtype="bfloat16", policy="nothing_saveable"))[
        "gradient_check"]
    f32 = run(RunConfig(width=32, batch=4, policy="nothing_saveable"))["gradient_check"]
    assert bf16["ok"] and f32["ok"]
    assert bf16["rtol"] == 2 * 2.0**-8 and f32["rtol"] == 2 * 2.0**-24


def test_time_executable_warms_up_by_count_and_by_time(monkeypatch):
    from remat_lab.program.timing import time_executable

    calls = []

    def fake(x):
        calls.append(x)
        return jnp.zeros(())

    samples = time_executable(fake, (1,), warmup=3, repeats=4)
    assert len(calls) == 7 and samples.shape == (4,) and bool(np.all(samples > 0))
    calls.clear()

    # A fake clock that each call moves by exactly 2**-8 s (binary-exact, so sums do not round): the
    # count cannot depend on the host's load (a real 5 ms sleep overran on a busy CI machine).
    import types

    from remat_lab.program import timing

    now, step = [0.0], 2.0**-8

    def slow(x):
        calls.append(x)
        now[0] += step
        return jnp.zeros(())

    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    samples = time_executable(slow, (1,), warmup=1, repeats=2, min_warmup_s=10 * step)
    # warm-up runs until 10 steps have passed (10 calls, beyond the one asked for), then 2 timed
    assert len(calls) == 10 + 2
    assert samples.tolist() == [step, step]


def test_the_timed_loop_keeps_only_the_last_output_and_the_run_checks_it():
    """The gradient check reads the last timed call's output: one output alive at a time (each
    released before the next call), and no extra call after the timed ones."""
    import weakref

    from remat_lab.program.timing import time_keeping_output

    class Out:
        pass

    alive, made = [], []

    def fake(x):
        alive.append(sum(r() is not None for r in made))  # outputs still held when called
        out = Out()
        made.append(weakref.ref(out))
        return out

    samples, last = time_keeping_output(fake, (1,), warmup=2, repeats=3)
    assert samples.shape == (3,) and len(made) == 5 and last is made[-1]()
    assert alive == [0, 0, 0, 0, 0]
    assert time_keeping_output(fake, (1,), warmup=0, repeats=0)[1] is None

    from remat_lab.studies import device_checks, experiment

    kept, checked = [], []
    real_time, real_check = experiment.time_keeping_output, device_checks.check_gradients

    def timing(*args, **kwargs):
        samples, out = real_time(*args, **kwargs)
        kept.append(out)
        return samples, out

    def check(problem, grads, loss, jaxpr):
        checked.append(grads)
        return real_check(problem, grads, loss, jaxpr)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(experiment, "time_keeping_output", timing)
        mp.setattr(device_checks, "check_gradients", check)  # the run's check (fitted to the device)
        result = experiment.run_experiment(RunConfig(width=16, batch=2, repeats=3, warmup=1))
    assert result["gradient_check"]["ok"] and len(kept) == len(checked) == 1
    assert all(a is b for a, b in zip(checked[0], kept[0][1]))  # the last timed call's gradients

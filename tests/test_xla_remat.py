"""XLA's own rematerialization: read from the HLO, priced by a second compile, out of model flops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from remat_lab.analysis.xla_remat import rematerialized, report, sentence
from remat_lab.config import RunConfig
from remat_lab.program.analysis_compile import compile_for_analysis, compile_unlimited
from remat_lab.program.targets import target_devices
from remat_lab.studies import advisor
from remat_lab.studies.advisor import search as advisor_search
from remat_lab.studies.advisor.sizing import xla_free

# An 8-block scanned MLP at width 16384 and batch 65536 in bfloat16: no_remat needs ~139 GiB on
# one H100 (80 GB), so XLA's pass rewrites it; nothing_saveable needs far less.
BIG = dict(model="mlp", width=16384, depth=8, stack="scan", dtype="bfloat16", target="h100")


def hand_flops(batch: int, width: int, depth: int) -> float:
    """Two width x width products per block: forward 2BW^2 each, backward twice that."""
    return 3 * depth * 2 * (2.0 * batch * width * width)


def _plain_mlp_step(width: int, depth: int, batch: int):
    """The same computation written in plain JAX (no lab code): a scan of relu(x @ W1) @ W2
    blocks with biases, the mean as the loss, its gradient with respect to the weights."""
    dev = target_devices("h100", 1)[0]
    sharding = jax.sharding.SingleDeviceSharding(dev)
    w = jax.ShapeDtypeStruct((depth, width, width), jnp.bfloat16, sharding=sharding)
    x = jax.ShapeDtypeStruct((batch, width), jnp.bfloat16, sharding=sharding)

    def loss(w1, w2, x):
        def block(h, ws):
            return jax.nn.relu(jax.nn.relu(h @ ws[0]) @ ws[1]), None
        h, _ = jax.lax.scan(block, x, (w1, w2))
        return jnp.mean(h.astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1))).trace(w, w, x).lower()


def test_plain_jax_program_over_an_h100_is_rewritten_by_xla_and_the_lifted_compile_is_not():
    lowered = _plain_mlp_step(16384, 8, 65536)
    normal = compile_for_analysis(lowered)
    free = compile_unlimited(lowered, "cuda")
    assert rematerialized(normal.as_text()), "XLA's pass should rewrite a program of ~139 GiB"
    assert rematerialized(free.as_text()) == []
    # the lifted compile's products are exactly the model's; the pass's clones add more
    from remat_lab.analysis import hlo
    count = lambda c: sum(m["flops"] * max(m["executions"], 1) for m in hlo.matmuls(c.as_text()))
    assert count(free) == pytest.approx(hand_flops(65536, 16384, 8), rel=1e-9)
    assert count(normal) > count(free)


def test_under_the_limit_the_lifted_compile_is_the_same_program():
    lowered = _plain_mlp_step(1024, 2, 256)
    assert compile_for_analysis(lowered).as_text() == compile_unlimited(lowered, "cuda").as_text()
    assert rematerialized(compile_for_analysis(lowered).as_text()) == []


def test_local_programs_have_no_xla_remat_and_no_false_positive(small):
    # JAX's own checkpoint names nothing *.remat*: only XLA's pass does
    cfg = small.replace(policy="nothing_saveable", compile_only=True)
    assert rematerialized(advisor_search.compile_abstract(cfg).as_text()) == []


def test_probe_reports_xla_remat_and_model_flops_leave_it_out():
    advisor_search.clear_cache()
    cfg = RunConfig(**BIG, batch=65536, policy="no_remat")
    found = advisor_search.probe(cfg)
    assert found["xla_remat"]["applied"] and found["xla_remat"]["instructions"] > 0
    free = xla_free(cfg)
    assert free["flops"] == pytest.approx(hand_flops(65536, 16384, 8), rel=1e-9)
    assert found["flops"] > free["flops"]
    assert free["xla_remat"]["extra_flops"] == pytest.approx(found["flops"] - free["flops"])
    assert free["xla_remat"]["from_bytes"] and free["xla_remat"]["to_bytes"]


def test_a_pass_that_leaves_the_program_over_the_device_tried_and_failed():
    """Issue 45 (8): at depth 16 the pass takes no_remat from 138.5 to 138.0 GiB, over the H100's
    79.1 either way: it tried and failed to fit, and says so."""
    advisor_search.clear_cache()
    remat = xla_free(RunConfig(**{**BIG, "depth": 16}, batch=65536, policy="no_remat"))["xla_remat"]
    assert remat["applied"] and remat["to_bytes"] > remat["device_bytes"] == 84942979072
    assert remat["from_bytes"] > remat["device_bytes"]  # as written, the lifted compile's
    assert remat["failed"] is True
    note = sentence(remat, lambda x: f"{x:.3g}")
    assert "tried and failed to fit" in note and "over the device's 79.11 GiB" in note
    assert " to fit: the policy alone" not in note


@pytest.mark.parametrize("to, failed, words", [
    (70 << 30, False, "to fit: the policy alone does not fit (XLA's pass took the peak from 90.00"),
    (85 << 30, True, "tried and failed to fit: neither the policy nor XLA's rewrite fits (XLA's "
                     "pass took the peak from 90.00 GiB to 85.00 GiB, over the device's 80.00 GiB)"),
    (90 << 30, True, "did not lower the peak: from 90.00 GiB to 90.00 GiB"),
    (95 << 30, True, "raised the peak from 90.00 GiB to 95.00 GiB"),
])
def test_the_pass_is_described_as_what_it_did(to, failed, words):
    found = report(3, 2e12, to, {"flops": 1e12, "peak_bytes": 90 << 30}, device_bytes=80 << 30)
    assert found["failed"] is failed and found["extra_flops"] == 1e12
    assert words in sentence(found, lambda x: f"{x:.3g}")
    assert report(0, 1e12, 1 << 30)["failed"] is False
    assert report(3, 1e12, 1 << 30)["failed"] is None  # the lifted compile unknown: not said


def test_advice_recompute_overhead_is_the_policys_own_when_no_remat_is_rewritten():
    """An advice row at batch 65536: nothing_saveable fits there, no_remat (its model flops) is over
    the H100 and rewritten by XLA; the row's overhead is read from the program as written."""
    from remat_lab.studies.advisor.sizing import model_flops_at

    advisor_search.clear_cache()
    base = RunConfig(**BIG, batch=65536, policy="no_remat")
    model, _ = model_flops_at(base, {65536})
    assert model[65536] == pytest.approx(hand_flops(65536, 16384, 8), rel=1e-9)
    at = base.replace(policy="nothing_saveable")
    row = {"no_remat_flops": model[65536], "hardware_flops": advisor_search.probe(at)["flops"]}
    advisor._overheads(row, xla_free(at))
    # nothing_saveable recomputes both products of every block's forward: + one forward of three
    assert row["recompute_overhead"] == pytest.approx(1 / 3, abs=1e-3)
    assert row["recompute_overhead"] == pytest.approx(
        row["policy_recompute_overhead"] + row["xla_recompute_overhead"], abs=1e-12)
    assert row["xla_remat"]["applied"] is False and row["xla_recompute_overhead"] == 0
    # the rewritten no_remat's own count would have made it look cheaper than it is
    assert advisor_search.probe(base)["flops"] / model[65536] - 1 > 0.1


def test_model_flops_past_every_probe_when_the_largest_end_is_rewritten():
    """Issue 45 (6): a batch above every probe no_remat's pass left alone, below an end XLA's pass
    rewrote (over the H100), was looked up between two counts of which one was missing:
    ``min() arg is an empty sequence``. It is read on the line to the end's lifted count."""
    from remat_lab.studies.advisor.sizing import model_flops_at

    advisor_search.clear_cache()
    base = RunConfig(**BIG, batch=1, policy="no_remat")
    for b in (2, 4):  # what no_remat's search probed
        advisor_search.probe(base.replace(batch=b))
    got, on_line = model_flops_at(base, {2, 4, 8, 2000, 65536})
    assert advisor_search.probe(base.replace(batch=65536))["xla_remat"]["applied"]
    assert on_line == 1  # 2000: between 8 (compiled) and 65536 (its lifted compile)
    for b, f in got.items():
        assert f == pytest.approx(hand_flops(b, 16384, 8), rel=1e-9), b


def test_train_step_on_a_mesh_reports_one_memory_per_device_in_both_places():
    from remat_lab.studies.experiment import run_experiment

    cfg = RunConfig(target="h100", target_devices=2, mesh="fsdp=2", policy="nothing_saveable",
                    model="mlp", width=64, batch=4, depth=2, dtype="bfloat16", step="train")
    doc = run_experiment(cfg)
    assert doc["sharding"]["per_device"] is doc["memory"]
    assert doc["memory"]["peak_bytes"] != doc["memory_gradient_step"]["peak_bytes"]
    assert doc["compile"]["xla_remat"]["applied"] is False


def test_a_lifted_compile_the_chip_refuses_is_a_finding_not_an_error(monkeypatch):
    """libtpu refuses a program whose own rematerialization was lifted when, as written, it is over
    the chip's HBM (Mixtral 8x7B on 256 v6e chips, qkv_proj_offloaded at per-device batch 5, as
    advise met it after 38 minutes): the Advisor's row keeps XLA's rewrite and says its flops as
    written are unknown, rather than the whole answer ending in that error."""
    from remat_lab.program.backend import xla_error
    from remat_lab.studies.advisor import sizing as advisor_sizing

    cfg = RunConfig(model="mlp", width=64, depth=2, batch=8, target="tpu-v5e")
    monkeypatch.setattr(advisor_sizing, "probe", lambda c: {
        "flops": 1.0e9, "peak_bytes": 15 * 2**30, "xla_remat": {"applied": True, "instructions": 3}})

    def refused(config, unlimited=False):
        assert unlimited
        raise xla_error("compiling with XLA's remat limit lifted", RuntimeError(
            "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
            "temporaries (31.50G) exceeds available HBM (31.24G)."))

    monkeypatch.setattr(advisor_sizing, "compile_abstract", refused)
    advisor_sizing._UNLIMITED.clear()
    found = xla_free(cfg)
    assert found["flops"] is None  # the program as written was not compiled: no count
    assert found["xla_remat"]["applied"] and found["xla_remat"]["from_bytes"] is None
    assert "recomputed" in sentence(found["xla_remat"], str)

    def broken(config, unlimited=False):
        raise xla_error("compiling with XLA's remat limit lifted", RuntimeError("INTERNAL: boom"))

    monkeypatch.setattr(advisor_sizing, "compile_abstract", broken)
    advisor_sizing._UNLIMITED.clear()
    with pytest.raises(Exception, match="boom"):  # any other failure still surfaces
        xla_free(cfg)
    advisor_sizing._UNLIMITED.clear()

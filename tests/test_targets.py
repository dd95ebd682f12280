"""Deviceless targets: real compiles for an H100 and a TPU v5e that are not attached, checked against
independent plain-JAX programs compiled for the same target, and the HLO itself."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat_lab.analysis import hlo
from remat_lab.analysis.costs import memory_report
from remat_lab.config import ConfigError, RunConfig, get_target
from remat_lab.program import targets
from remat_lab.studies.experiment import run_experiment

SMALL = dict(model="mlp", stack="scan", width=256, batch=512, depth=4, dtype="bfloat16")
POLICIES = {"no_remat": None, "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
            "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


@functools.cache  # a compile-only program is never in the persistent cache: each compiled once here
def plain_scan_mlp(target: str, policy: str, *, width: int, batch: int, depth: int, dtype: str):
    """The same step written without NNX: depth MLP blocks (two biased dense layers with ReLU) under
    ``lax.scan`` with ``jax.checkpoint`` in the body, value_and_grad of the float32 sum, compiled for
    ``target`` on abstract inputs (each program compiled once in this module)."""
    dt = jnp.dtype(dtype)

    def block(h, p):
        h = jax.nn.relu(h @ p["k1"] + p["b1"])
        return jax.nn.relu(h @ p["k2"] + p["b2"])

    body = block if POLICIES[policy] is None else jax.checkpoint(block, policy=POLICIES[policy])

    def loss(params, x):
        out, _ = jax.lax.scan(lambda h, p: (body(h, p), None), x, params)
        return jnp.sum(out, dtype=jnp.float32)

    device = targets.target_devices(target, 1)[0]
    at = jax.sharding.SingleDeviceSharding(device)
    sds = lambda shape: jax.ShapeDtypeStruct(shape, dt, sharding=at)
    params = {"k1": sds((depth, width, width)), "b1": sds((depth, width)),
              "k2": sds((depth, width, width)), "b2": sds((depth, width))}
    return jax.jit(jax.value_and_grad(loss)).lower(params, sds((batch, width))).compile()


@functools.cache
def _h100_doc(policy: str) -> dict:
    """run_experiment's document of SMALL on the H100 (its compile shared by the tests below)."""
    return run_experiment(RunConfig(target="h100", policy=policy, **SMALL))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_h100_temp_bytes_match_a_plain_jax_build(policy):
    doc = _h100_doc(policy)
    ref = memory_report(plain_scan_mlp("h100", policy, width=256, batch=512, depth=4, dtype="bfloat16"))
    assert doc["target"]["name"] == "h100" and doc["target"]["platform"] == "cuda"
    assert doc["timing"]["measured"] is False and doc["step_time_s"] is None
    assert doc["timing"]["estimate_s"] > 0 and "estimate" in doc["timing"]["estimate_basis"]
    assert doc["gradient_check"]["ok"] is None and "nothing was run" in doc["gradient_check"]["reason"]
    assert doc["memory"]["temp_bytes"] == pytest.approx(ref["temp_bytes"], rel=0.10)
    assert doc["memory"]["argument_bytes"] == ref["argument_bytes"]


def test_h100_policies_keep_their_order_and_recompute_products():
    """nothing_saveable needs less temp than no_remat on the H100 and runs more products: the
    extra products equal the plain builds' difference, counted in their HLO."""
    docs = {p: _h100_doc(p) for p in ("no_remat", "nothing_saveable")}
    assert docs["nothing_saveable"]["memory"]["temp_bytes"] < docs["no_remat"]["memory"]["temp_bytes"]
    texts = {p: plain_scan_mlp("h100", p, width=256, batch=512, depth=4, dtype="bfloat16").as_text()
             for p in docs}
    runs = {p: sum(max(m["executions"], 1) for m in hlo.matmuls(t)) for p, t in texts.items()}
    extra = runs["nothing_saveable"] - runs["no_remat"]
    assert extra == 2 * 4  # the two forward products of each of the 4 scanned blocks, again
    assert docs["nothing_saveable"]["hlo"]["excess_dots_vs_no_remat"] == extra


def test_tpu_v5e_compiles_and_names_the_tpu():
    cfg = RunConfig(target="tpu-v5e", policy="nothing_saveable", model="mlp", stack="scan", width=128,
                    batch=128, depth=2, dtype="bfloat16")
    doc = run_experiment(cfg)
    ref = memory_report(plain_scan_mlp("tpu-v5e", "nothing_saveable", width=128, batch=128, depth=2,
                                       dtype="bfloat16"))
    assert doc["target"]["platform"] == "tpu" and "v5" in doc["target"]["device_kind"].lower()
    assert doc["memory"]["temp_bytes"] == pytest.approx(ref["temp_bytes"], rel=0.10, abs=64 << 10)
    assert doc["timing"]["measured"] is False
    # Products are convolutions on a TPU, and XLA TPU leaves scans' trip counts unannotated (read
    # from the loop condition): the recomputed products, counted in plain-JAX builds' HLO.
    runs = {p: sum(max(m["executions"], 1) for m in hlo.matmuls(plain_scan_mlp(
        "tpu-v5e", p, width=128, batch=128, depth=2, dtype="bfloat16").as_text()))
        for p in ("no_remat", "nothing_saveable")}
    assert runs["nothing_saveable"] - runs["no_remat"] == 2 * 2
    assert doc["hlo"]["excess_dots_vs_no_remat"] == 2 * 2


def test_eight_h100_fsdp_shards_parameters_and_counts_all_gathers():
    cfg = RunConfig(target="h100", target_devices=8, mesh="fsdp=8", policy="nothing_saveable",
                    model="mlp", stack="scan", width=256, batch=64, depth=2, dtype="bfloat16")
    sh = run_experiment(cfg)["sharding"]
    assert sh["devices"] == 8
    assert sh["param_bytes_per_device"] * 8 == sh["param_bytes_total"]
    gathers = sh["collectives"]["all-gather"]
    assert gathers["forward"]["count"] > 0
    assert sum(c["count"] for c in gathers.values()) == sh["collective_counts"]["all-gather"]


def test_offload_on_a_gpu_target_goes_to_host_memory():
    doc = run_experiment(RunConfig(target="h100", policy="offload_dot_with_no_batch_dims", model="mlp",
                                   stack="scan", width=256, batch=64, depth=2, dtype="bfloat16"))
    assert doc["memory"]["host_temp_bytes"] > 0  # XLA placed buffers in host memory (S(5))
    assert doc["dots"] and all(d["offloaded_in_compiled"] for d in doc["dots"])
    assert hlo.uses_host_memory(doc["texts"]["compiled_hlo"])


def test_a_bad_target_is_one_clear_error():
    with pytest.raises(ConfigError, match="unknown target 'h1000'; choose one of: local, h100"):
        RunConfig(target="h1000")
    with pytest.raises(ConfigError, match="need a mesh over all of them"):
        RunConfig(target="h100", target_devices=8)
    with pytest.raises(ConfigError, match="target_devices is for a named target"):
        RunConfig(target_devices=2)
    with pytest.raises(ConfigError, match="cannot be read"):
        targets.config_text("h100", "/nonexistent/gpu.txtpb")


def test_every_target_has_figures_and_a_source():
    for name in ("h100", "h200", "a100-80g", "a100-40g", "l4", "b200", "tpu-v4", "tpu-v5e", "tpu-v5p",
                 "tpu-v6e"):
        t = get_target(name)
        assert t.memory_bytes > 1 << 30 and t.bandwidth_bytes_per_s > 1e11 and t.source
        assert t.peak_flops["bfloat16"] > t.peak_flops["float32"] > 1e12
        assert 0 < t.usable_bytes() < t.memory_bytes
        # across slices or hosts: slower than within them, and sourced
        assert 1e9 < t.dcn_bytes_per_s < t.interconnect_bytes_per_s and t.dcn_source
    assert np.isclose(get_target("h100").memory_bytes / 2**30, 79.1, atol=0.1)


def test_advisor_on_h100_is_exact_to_one_batch():
    """The largest batch fits the budget and the next does not, each checked by its own compile for
    the H100 through the run path; the default budget is the H100's usable memory. The budget,
    5,830,000 B, lies between no_remat's compiled peaks at batches 3 and 4 (5,822,348 and 5,835,148
    B with XLA 0.12): each policy's search ends at a single-digit batch in 4 compiles (8 in all; "6M"
    took 15, to batches 20 and 23); whatever the peaks, the run path's compiles decide the claim."""
    from remat_lab.studies.advisor import advice_budget, advise

    cfg = RunConfig(target="h100", model="mlp", stack="scan", width=512, depth=2, dtype="bfloat16",
                    batch=1, policy="no_remat")
    doc = advise(cfg, 5_830_000, policies=["no_remat", "nothing_saveable"], timing=True)
    assert doc["timed"] is False and doc["target"]["name"] == "h100"
    for row in doc["rows"]:
        b = row["max_batch"]
        assert 0 < b < 65536
        at = lambda n, p=row["policy"]: run_experiment(cfg.replace(policy=p, batch=n))["memory"]["peak_bytes"]
        assert at(b) <= doc["budget_bytes"] < at(b + 1)
        assert row["examples_per_s_estimate"] > 0 and row["step_time_s"] is None
    assert "by the prediction" in doc["reason"] and "roofline bound" in doc["reason"]
    usable, source = advice_budget(target="h100")
    assert usable == int(0.75 * get_target("h100").memory_bytes) and "75%" in source


_FIRST_COMPILES = """
import json
from remat_lab.config import RunConfig
from remat_lab.program import targets
from remat_lab.studies.experiment import run_experiment

def kib(field):
    return next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith(field + ":"))

import sys
from remat_lab.analysis import roofline
from remat_lab.program import backend

backend.enable_compilation_cache(sys.argv[1])  # as a worker starts (serve/in_worker.py)
targets.start_backend_quietly()
run_experiment(RunConfig(width=16, batch=2, repeats=1, warmup=0))  # its first local run
roofline.calibrate()  # this machine's roofs: measured once per machine, before the first estimate
out = {}
for name in ("h100", "tpu-v5e"):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS (VmHWM) starts again from the RSS now
    out[name] = [kib("VmRSS")]
    run_experiment(RunConfig(target=name), timing=False)
    out[name].append(kib("VmHWM"))
print(json.dumps(out))
"""


def test_what_a_first_compile_for_a_target_adds_to_a_worker_is_within_its_need(tmp_path):
    """The per-click need of a compile-only run (``targets.compile_only_bytes``) bounds what the
    first compile for each platform adds to a worker's peak RSS, measured in a fresh process."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    if not Path("/proc/self/status").exists():
        pytest.skip("reads /proc/self/status (Linux)")
    proc = subprocess.run([sys.executable, "-c", _FIRST_COMPILES, str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    kib = json.loads(proc.stdout.strip().splitlines()[-1])
    need = targets.COMPILE_ONLY_BYTES
    (gpu0, gpu1), (tpu0, tpu1) = kib["h100"], kib["tpu-v5e"]
    assert 0 < (gpu1 - gpu0) << 10 <= targets.compile_only_bytes("h100") == need["cuda"]
    assert 0 < (tpu1 - tpu0) << 10 <= targets.compile_only_bytes("tpu-v5e") == need["tpu"]
    assert targets.compile_only_bytes("no-such-target") == max(targets.COMPILE_ONLY_BYTES.values())


def test_programs_for_an_absent_target_stay_out_of_the_compile_cache(tmp_path):
    """JAX cannot read a compile-only program back from its persistent cache, so the lab keeps them
    out: compiled twice with the cache on, no entry is written and nothing warns or logs; a CPU program
    still gets its entry."""
    import subprocess
    import sys

    code = """
import os, sys, warnings
import jax, jax.numpy as jnp
from remat_lab.program import backend, targets
backend.enable_compilation_cache(sys.argv[1])
def f(x):
    return jnp.tanh(x @ x).sum()
on_gpu = jax.sharding.SingleDeviceSharding(targets.target_devices("h100", 1)[0])
with warnings.catch_warnings():
    warnings.filterwarnings("error", message=".*persistent compilation cache.*")
    for _ in range(2):  # a fresh function each time: the second would read the first's entry
        jax.jit(lambda x: f(x)).lower(jax.ShapeDtypeStruct((256, 256), jnp.float32,
                                                            sharding=on_gpu)).compile()
    before = len(os.listdir(sys.argv[1]))
    jax.jit(lambda x: f(x)).lower(jax.ShapeDtypeStruct((256, 256), jnp.float32)).compile()
print(before, len(os.listdir(sys.argv[1])))
"""
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    gpu_entries, after_cpu = map(int, proc.stdout.split()[-2:])
    assert gpu_entries == 0 and after_cpu == 1
    assert "_get_cache" not in proc.stderr  # JAX's own line for each such compile is kept quiet

"""The step-time estimate on named targets ranks policies by what they cost: offload pays its host
transfers, float32 products run at the rate XLA uses (TF32 on a GPU, bf16 passes on a TPU), memory
bytes are counted where a deviceless compile gives no cost analysis. Checked against plain-JAX
programs compiled for the same targets and counts made here from their HLO text."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat_lab.analysis import hlo
from remat_lab.analysis.estimate import estimate_step, rate_class
from remat_lab.analysis.traffic import traffic_of
from remat_lab.config import RunConfig, get_target
from remat_lab.program import targets
from remat_lab.studies.advisor import search as advisor_search
from remat_lab.studies.experiment import run_experiment

OFFLOADS = dict(model="mlp", stack="scan", width=1024, batch=4096, depth=8, dtype="bfloat16")
OFFLOAD = "offload_dot_with_no_batch_dims"
F64 = float(np.finfo(np.float64).eps) * 64  # sums and ratios of float64 figures
# A host buffer XLA allocates for offloaded residuals: ``bf16[8,4096,1024]{2,1,0:S(5)} custom-call()``.
HOST_BUFFER = re.compile(r"= (\w+)\[([\d,]+)\]\{[^}]*S\(5\)[^}]*\} custom-call\(\), "
                         r'custom_call_target="AllocateBuffer"')


def on(target: str):
    return jax.sharding.SingleDeviceSharding(targets.target_devices(target, 1)[0])


def plain_mlp_step(target: str, offload: bool, *, width: int, batch: int, depth: int, dtype: str):
    """Depth MLP blocks (two biased dense layers, ReLU) under ``lax.scan``, each under
    ``jax.checkpoint`` with JAX's offload_dot_with_no_batch_dims (or none), value_and_grad of the
    float32 sum, compiled for ``target`` on abstract inputs: the lab's program written without NNX."""
    dt, at = jnp.dtype(dtype), on(target)

    def block(h, p):
        h = jax.nn.relu(h @ p["k1"] + p["b1"])
        return jax.nn.relu(h @ p["k2"] + p["b2"])

    policy = jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")
    body = jax.checkpoint(block, policy=policy) if offload else block

    def loss(params, x):
        out, _ = jax.lax.scan(lambda h, p: (body(h, p), None), x, params)
        return jnp.sum(out, dtype=jnp.float32)

    sds = lambda shape: jax.ShapeDtypeStruct(shape, dt, sharding=at)
    params = {"k1": sds((depth, width, width)), "b1": sds((depth, width)),
              "k2": sds((depth, width, width)), "b2": sds((depth, width))}
    return jax.jit(jax.value_and_grad(loss)).lower(params, sds((batch, width))).compile()


def host_buffer_bytes(text: str) -> int:
    """Bytes of the host-memory buffers a compiled program allocates, read from its text here."""
    size = {"bf16": 2, "f16": 2, "f32": 4}
    total = 0
    for dtype, dims in HOST_BUFFER.findall(text):
        n = size[dtype]
        for d in dims.split(","):
            n *= int(d)
        total += n
    return total


@pytest.fixture(scope="module")
def offload_docs():
    return {p: run_experiment(RunConfig(target="h100", policy=p, **OFFLOADS)) for p in ("no_remat", OFFLOAD)}


def test_offload_is_never_free_on_h100(offload_docs):
    """The offloading policy's estimate exceeds no_remat's: its host transfers (every host buffer
    written once in the forward pass and read once in the backward, as the plain-JAX program's HLO
    holds them) over the H100's PCIe Gen5 link take longer than its whole compute."""
    base = offload_docs["no_remat"]["timing"]["estimate"]
    off = offload_docs[OFFLOAD]["timing"]["estimate"]
    held = host_buffer_bytes(plain_mlp_step("h100", True, width=1024, batch=4096, depth=8,
                                            dtype="bfloat16").as_text())
    assert held == 2 * 8 * 4096 * 1024 * 2  # two dots' results a block, 8 blocks, bf16
    assert host_buffer_bytes(offload_docs[OFFLOAD]["texts"]["compiled_hlo"]) == held
    assert off["offload_bytes"] == {"to_host": held, "from_host": held}
    h100 = get_target("h100")
    assert off["offload_s"] == pytest.approx(2 * held / h100.host_bandwidth_bytes_per_s, rel=F64)
    assert base["offload_s"] == 0.0 and base["offload_bytes"] == {"to_host": 0, "from_host": 0}
    assert off["compute_s"] == pytest.approx(base["compute_s"], rel=F64)  # the same products
    assert off["bound"] == "offload" and off["estimate_s"] == off["offload_s"]
    assert off["estimate_s"] > 2 * base["estimate_s"]
    assert offload_docs[OFFLOAD]["timing"]["estimate_s"] == off["estimate_s"]


def test_a_gpu_estimate_has_every_term(offload_docs):
    """A deviceless H100 compile has no cost analysis: memory is counted in the HLO, every term is
    reported, and the products counted are the lab's own count (``hlo.matmuls``) of the flops."""
    doc = offload_docs["no_remat"]
    est = doc["timing"]["estimate"]
    assert doc["flops_xla"] is None and est["memory_source"].startswith("counted in the optimized HLO")
    assert all(est[k] is not None for k in ("compute_s", "memory_s", "offload_s", "collectives_s"))
    assert est["memory_s"] == pytest.approx(est["memory_bytes"] / 3.35e12, rel=F64)
    assert est["bound"] in ("compute", "memory") and "unknown" not in est["bound"]
    text = doc["texts"]["compiled_hlo"]
    counted = sum(r["flops"] * r["executions"] for r in hlo.matmuls(text))
    assert est["rates"]["bfloat16"]["flops"] == pytest.approx(counted, rel=F64) == doc["flops"]
    # the model's products: 6 dots a block (2 forward, 4 backward) of 2 x batch x width^2 each
    assert counted == 6 * 8 * 2 * 4096 * 1024 * 1024


def test_float32_runs_at_tf32_on_h100():
    """A compute-bound step costs about tf32/bf16 = 2x more in float32 than in bfloat16, not the
    14.8x of the FP32 figure: the compiled f32 products carry DEFAULT precision (no
    operand_precision, no algorithm), which XLA's GPU backend runs as TF32."""
    t = get_target("h100")
    est = {}
    for dtype in ("float32", "bfloat16"):
        cfg = RunConfig(target="h100", policy="no_remat", model="mlp", stack="scan", width=4096,
                        batch=4096, depth=2, dtype=dtype)
        found = advisor_search.probe(cfg)
        est[dtype] = estimate_step(found["flops"], found.get("bytes_accessed"), t, dtype, found["traffic"])
        assert est[dtype]["bound"] == "compute"
        assert [(p["dtype"], p["precision"]) for p in found["traffic"]["products"]] == [
            ({"float32": "f32", "bfloat16": "bf16"}[dtype], "DEFAULT")]
    assert set(est["float32"]["rates"]) == {"tf32"} and set(est["bfloat16"]["rates"]) == {"bfloat16"}
    ratio = est["float32"]["estimate_s"] / est["bfloat16"]["estimate_s"]
    assert ratio < 4
    assert ratio == pytest.approx(t.peak_flops["bfloat16"] / t.peak_flops["tf32"], rel=F64)


@pytest.mark.parametrize("target", ["h100", "tpu-v5e"])
def test_precision_read_from_the_compiled_products(target):
    """A plain f32 jnp.dot at DEFAULT and at HIGHEST precision, compiled for the target: the
    precision is read from the HLO and priced as XLA runs it."""
    at = on(target)
    a = jax.ShapeDtypeStruct((512, 1024), jnp.float32, sharding=at)
    b = jax.ShapeDtypeStruct((1024, 512), jnp.float32, sharding=at)
    t = get_target(target)
    for precision, expected in ((None, "tf32" if target == "h100" else "bfloat16"),
                                (jax.lax.Precision.HIGHEST, "float32")):
        text = jax.jit(lambda x, y, p=precision: jnp.dot(x, y, precision=p)).lower(a, b).compile().as_text()
        rows = traffic_of(text)["products"]
        assert len(rows) == 1 and rows[0]["dtype"] == "f32"
        assert rows[0]["flops"] == 2 * 512 * 1024 * 512
        assert ("highest" in text.lower()) == (precision is not None)
        assert rate_class(t, rows[0]["dtype"], rows[0]["precision"]) == expected


def test_memory_of_one_gpu_product_is_its_operands_and_result():
    """One jnp.dot compiled for the H100 moves its two operands and its result (a split-K tiling
    would add its partial products: within a small factor)."""
    at = on("h100")
    for m, k, n in ((2048, 2048, 2048), (1024, 2048, 512)):
        a = jax.ShapeDtypeStruct((m, k), jnp.bfloat16, sharding=at)
        b = jax.ShapeDtypeStruct((k, n), jnp.bfloat16, sharding=at)
        compiled = jax.jit(jnp.dot).lower(a, b).compile()
        assert compiled.cost_analysis() is None  # nothing from XLA: the count is the HLO's
        moved = traffic_of(compiled.as_text())["memory_bytes"]
        held = (m * k + k * n + m * n) * 2  # bf16 operands and result
        assert held <= moved <= 4 * held
        if m == k == n:
            assert moved == held  # one GEMM kernel: each operand read once, the result written once
    assert moved > held  # the second shape splits K on the H100: partial products written and read
    est = estimate_step(2 * m * k * n, None, get_target("h100"), "bfloat16",
                        traffic_of(compiled.as_text()))
    assert est["memory_s"] == pytest.approx(moved / 3.35e12, rel=F64)


def test_collectives_on_an_h100_mesh_are_priced_by_the_ring():
    """fsdp=8: the all-gathers and reduce-scatters of eight H100s, each over a group of 8 read from
    the HLO's replica groups, at NVLink's 450 GB/s each way with NCCL's ring factors."""
    cfg = RunConfig(target="h100", target_devices=8, mesh="fsdp=8", policy="nothing_saveable",
                    model="mlp", stack="scan", width=256, batch=64, depth=2, dtype="bfloat16")
    found = advisor_search.probe(cfg)
    tr = found["traffic"]
    assert tr["devices"] == 8 and {"all-gather", "reduce-scatter"} <= set(tr["collectives"])
    assert all(c["group"] == 8 for c in tr["collectives"].values())
    est = estimate_step(found["flops"], found.get("bytes_accessed"), get_target("h100"), "bfloat16", tr)
    factor = {"all-gather": 7 / 8, "reduce-scatter": 7.0, "all-reduce": 2 * 7 / 8}
    ring = sum(factor[k] * c["bytes"] for k, c in tr["collectives"].items())
    assert est["collectives_s"] == pytest.approx(ring / 450e9, rel=F64) and est["collectives_s"] > 0
    single = advisor_search.probe(cfg.replace(target_devices=1, mesh=""))
    assert single["traffic"]["collectives"] == {}


def test_unknown_terms_are_said():
    t = get_target("h100")
    assert estimate_step(None, None, t, "float32")["estimate_s"] is None
    est = estimate_step(1e12, None, t, "float32")  # no program text
    assert est["compute_s"] == pytest.approx(1e12 / t.peak_flops["tf32"], rel=F64)
    assert est["memory_s"] is None and est["offload_s"] is None
    assert est["bound"].startswith("compute (of the terms known; unknown: memory")


def test_every_target_has_a_sourced_host_link_and_interconnect():
    for name in ("h100", "h200", "a100-80g", "a100-40g", "l4", "b200", "tpu-v4", "tpu-v5e", "tpu-v5p",
                 "tpu-v6e"):
        t = get_target(name)
        # a v4 compile-only device is one TensorCore: half its chip's host link (8 of 16 GB/s)
        floor = 8e9 if name == "tpu-v4" else 1e10
        assert floor <= t.host_bandwidth_bytes_per_s < t.bandwidth_bytes_per_s
        assert t.host_bandwidth_bytes_per_s <= t.interconnect_bytes_per_s < t.bandwidth_bytes_per_s
        assert t.host_link_source and t.interconnect_source
        assert t.as_dict()["host_bandwidth_bytes_per_s"] == t.host_bandwidth_bytes_per_s
    # PCIe Gen5 x16 carries twice Gen4 x16; NVLink 4 (H100) 1.5x NVLink 3 (A100)
    h100, a100 = get_target("h100"), get_target("a100-80g")
    assert h100.host_bandwidth_bytes_per_s == 2 * a100.host_bandwidth_bytes_per_s
    assert h100.interconnect_bytes_per_s == 1.5 * a100.interconnect_bytes_per_s


_SPARSECORE_GATHER = '''HloModule m

ENTRY %main (p0: bf16[1024,256], p1: s32[4096]) -> bf16[4096,256] {
  %p0 = bf16[1024,256]{1,0} parameter(0)
  %p1 = s32[4096]{0} parameter(1)
  %s = ((), (), (s32[8]{0})) custom-call-start(), async_execution_thread="sparsecore"
  %u = ((bf16[1024,256]{1,0}, s32[4096]{0}), bf16[4096,256]{1,0}, (s32[8]{0})) custom-call-update(%s,%p0,%p1)
  ROOT %d = bf16[4096,256]{1,0} custom-call-done(%u)
}
'''


def test_an_async_gather_with_an_update_is_counted_once_at_its_done():
    """libtpu writes a SparseCore gather (a mixture of experts' dispatch and combine on v5p and v6e)
    as custom-call-start, -update, -done; the update's tuple result holds its operands beside the
    gathered rows. Its bytes are the done's: what the update reads (the table, the indices, the
    start's small state) and the rows written, once (counted at the update and again at the done
    they were 2.5 times a gather's bytes in Qwen3-30B-A3B's program)."""
    from remat_lab.analysis.kernels import kernels_of

    table, indices, state, rows = 1024 * 256 * 2, 4096 * 4, 8 * 4, 4096 * 256 * 2
    kernels = kernels_of(_SPARSECORE_GATHER)
    assert [(k["name"], k["runs"]) for k in kernels] == [("d", 1)]
    assert kernels[0]["bytes"] == table + indices + state + rows
    assert traffic_of(_SPARSECORE_GATHER)["memory_bytes"] == table + indices + state + rows

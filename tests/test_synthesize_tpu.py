"""The synthesizer on a TPU, where no_remat over the HBM has no flop count; its saved answer redone."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from remat_lab.config import ConfigError, RunConfig
from remat_lab.studies.synthesize.costs import Meter, measure
from remat_lab.studies.synthesize.doc import at_named_batch
from remat_lab.studies.synthesize.refine import objective
from remat_lab.studies.synthesize.solve import Plan

SAVED = Path(__file__).parent / "load" / "synthesize-seq_mixer-tpu-v5e-2026-12-02.json"
GIB = 2**30


class _Table(Meter):
    """A meter whose 'compiles' are a table: no_remat's peak 1 GiB + 1 GiB per example, every name
    recomputed 1 GiB + 0.5 GiB per example, each name saved 0.25 GiB more per example; flops 10 per
    example for no_remat, 14 recomputing everything, 1 spared per name saved; a program over
    ``hbm`` has no flop count (libtpu's refusal), as has every no_remat when ``no_remat_flops`` is
    False."""

    def __init__(self, config: RunConfig, hbm: float, no_remat_flops: bool = True):
        super().__init__(config)
        self.hbm, self.no_remat_flops = hbm, no_remat_flops

    def plan(self, plan: Plan, batch: int, written: bool = True) -> dict:
        if plan.remat_layers == 0:
            peak, flops = (1 + batch) * GIB, 10.0 * batch
        else:
            n = len(plan.save) + len(plan.offload)
            peak, flops = (1 + (0.5 + 0.25 * n) * batch) * GIB, (14.0 - n) * batch
        if peak > self.hbm or (plan.remat_layers == 0 and not self.no_remat_flops):
            flops = None
        return {"peak_bytes": int(peak), "flops": flops, "written_peak_bytes": int(peak),
                "written_flops": flops, "host_bytes": 0.0, "xla_remat": False}


V5E = RunConfig(model="transformer", width=64, seq=64, heads=4, depth=2, stack="scan",
                target="tpu-v5e", batch=1)


def test_on_a_tpu_the_names_are_probed_where_no_remat_fits():
    """A 6 GiB budget: every name recomputed fits 10 per device, no_remat 5. libtpu compiles
    nothing over its HBM as written, so the names are probed at 5, where every plan (each keeps at
    most what no_remat keeps) compiles with a flop count, no_remat's included."""
    model, rows = measure(_Table(V5E, 16 * GIB), ("a", "b"), False, True, 6 * GIB)
    assert {r["batch"] for r in rows if r["what"] == "save a"} == {5}
    assert model.recompute == pytest.approx(4.0) and model.recompute_basis == "no_remat at 5 per device"
    assert model.layer_counts == (0, 1, 2)
    assert model.flops[("a", "save")] == pytest.approx(1.0)
    assert model.bytes[("a", "save")] == pytest.approx(0.25 * GIB, rel=1e-9)


def test_no_remat_over_the_hbm_at_the_goal_batch_is_measured_at_batch_one():
    """min-recompute at 10 per device on an 8 GiB HBM: no_remat there needs 11 GiB, refused, no
    flop count; recompute-everything's recomputation per example is read at batch 1 (14 - 10 = 4),
    where both compiled, and the model says so."""
    model, rows = measure(_Table(V5E, 8 * GIB), ("a", "b"), False, True, 6 * GIB, at=10)
    assert model.recompute == pytest.approx(4.0)
    assert model.recompute_basis.startswith("no_remat at 1 per device (no_remat at 10 per device "
                                            "needs 11.0 GiB, over the tpu-v5e's HBM")
    assert model.layer_counts == (0, 1, 2)
    assert {r["batch"] for r in rows if r["what"] == "no_remat"} == {1, 2, 10}


def test_no_remat_refused_at_every_batch_leaves_every_layer_remat_d():
    """No no_remat flop count anywhere: the remat'd layer count cannot be priced, so only plans
    with every layer remat'd are solved for, ranked by the flops the names spare (their own
    compiled figures); the basis says so, no no_remat figure is made up."""
    model, _ = measure(_Table(V5E, 16 * GIB, no_remat_flops=False), ("a", "b"), False, True, 6 * GIB)
    assert model.layer_counts == (2,)
    assert model.recompute == pytest.approx(2.0)  # the names' spared flops: 1 + 1
    assert model.recompute_basis.startswith("the names' own spared flops")


def test_off_a_tpu_a_missing_flop_count_is_still_an_error():
    cfg = V5E.replace(target="h100")
    with pytest.raises(ConfigError, match="this backend's compiled programs give no flop count"):
        measure(_Table(cfg, 16 * GIB, no_remat_flops=False), ("a",), False, True, 6 * GIB)


def test_plans_at_one_batch_rank_by_their_own_flops_and_are_compared_with_the_named_there():
    named = {"policy": "nothing_saveable", "max_batch": 8, "fits": True, "flops": 100.0,
             "recomputed_flops": None, "peak_bytes": 5}
    rows = [{"plan": {"save": ["a"]}, "batch": 8, "max_batch": 8, "fits": True, "flops": 90.0,
             "recomputed_flops": None, "peak_bytes": 6, "source": "refine"},
            {"plan": {"save": ["a", "b"]}, "batch": 8, "max_batch": 8, "fits": False, "flops": 80.0,
             "recomputed_flops": None, "peak_bytes": 9, "source": "refine"}]
    assert objective(rows[0], "max-batch") < objective(named, "max-batch")
    at = at_named_batch(rows, named, "max-batch")
    assert at["plan"] == {"save": ["a"]} and at["fewer_flops"] == 10.0 and at["baseline"] == "named"
    assert at["fewer_recomputed_share"] is None  # no no_remat figure: no share of it


def _plain(config: dict, save: list[str], offload: list[str], remat_layers: int, global_batch: int,
           policy=None) -> tuple[int, float, int]:
    """The lab's blocks (seq_mixer's, transformer's) compiled without the lab's policies, stacks or
    step, for the TPU target's compile-only devices over the same mesh: the stacked blocks split by hand, a
    ``lax.scan`` over the first ``remat_layers`` under ``jax.checkpoint`` with
    ``save_and_offload_only_these_names`` (or ``policy``, a JAX policy), the rest under a plain
    scan; each block's parameters gathered (replicated) inside the checkpoint, as FSDP gathers for
    use; the loss the output's float32 sum, its value and gradient. The parameters stored by the
    lab's sharding rules (fsdp over the width axis), the batch over fsdp. ``(peak, flops, XLA's
    generated code bytes)``."""
    from remat_lab.analysis.costs import program_flops
    from remat_lab.model.models import build_model
    from remat_lab.program.mesh import param_specs
    from remat_lab.program.targets import target_devices

    n = config["target_devices"]
    mesh = jax.sharding.Mesh(target_devices(config["target"], n), ("fsdp",))
    dtype = jnp.bfloat16 if config["dtype"] == "bfloat16" else jnp.float32
    model = nnx.eval_shape(lambda: build_model(config["model"], config["width"], config["depth"], seed=0,
                                               dtype=dtype, stack="scan", heads=config["heads"]))
    graphdef, state = nnx.split(model.blocks)
    cfg = RunConfig(model=config["model"], width=config["width"], seq=config["seq"],
                    heads=config["heads"], depth=config["depth"], mesh=f"fsdp={n}", batch=n)
    leaves, treedef = jax.tree.flatten(state)
    specs = param_specs(state, cfg)
    assert len(specs) == len(leaves)
    shardings = [NamedSharding(mesh, s) for s in specs]
    policy = policy or jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=save, names_which_can_be_offloaded=offload,
        offload_src="device", offload_dst="pinned_host")
    replicated = NamedSharding(mesh, PartitionSpec())

    def apply(st, h):
        st = jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, replicated), st)
        return nnx.merge(graphdef, st)(h)

    remat = jax.checkpoint(apply, policy=policy)

    def loss(flat, x):
        st = jax.tree.unflatten(treedef, flat)
        head = jax.tree.map(lambda a: a[:remat_layers], st)
        tail = jax.tree.map(lambda a: a[remat_layers:], st)
        if remat_layers:
            x, _ = jax.lax.scan(lambda h, s: (remat(s, h), None), x, head)
        if config["depth"] > remat_layers:
            x, _ = jax.lax.scan(lambda h, s: (apply(s, h), None), x, tail)
        return jnp.sum(x, dtype=jnp.float32)

    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(leaves, shardings)]
    x = jax.ShapeDtypeStruct((global_batch, config["seq"], config["width"]), dtype,
                             sharding=NamedSharding(mesh, PartitionSpec("fsdp", None, None)))
    step = jax.jit(jax.value_and_grad(loss), out_shardings=(replicated, shardings))
    compiled = step.lower(abstract, x).compile()
    ma = compiled.memory_analysis()
    fixed = (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
             + ma.generated_code_size_in_bytes)
    # libtpu's HBM: the smaller of the fields' sum and its peak_memory_in_bytes (which also counts
    # on-chip VMEM) + code, as its own over-HBM check counts (analysis/costs.py measured it)
    peak = min(fixed + ma.temp_size_in_bytes, max(ma.peak_memory_in_bytes + ma.generated_code_size_in_bytes,
                                                  fixed))
    return peak, program_flops(compiled, compiled.as_text())[0], ma.generated_code_size_in_bytes


def test_the_saved_tpu_answer_compiles_again_as_plain_jax_checkpoint():
    """The saved synthesis on 4 x v5e (fsdp=4) repeated by plain compiles for the same target and
    mesh: the best plan compiled at the best named policy's batch, and that policy, each as plain
    ``jax.checkpoint`` (``save_and_offload_only_these_names`` on the same names, or the JAX policy
    itself): the plan's peak is the lab's and within the budget, and it has fewer flops than the
    named policy's plain compile at the same batch; the answer's batch is at least the named
    policy's. The peaks may differ by XLA's generated code only: nnx.remat is jax.checkpoint and
    the lab's flat parameter list and this tree are the same buffers, so the optimized programs
    and their buffer assignments are the same (a tiny transformer's, checked by hand: equal to the
    byte, with and without offload and partial remat)."""
    doc = json.loads(SAVED.read_text())
    cfg, vs, rec = doc["config"], doc["best_named"], doc["refine"]
    assert cfg["target"] == "tpu-v5e" and cfg["mesh"] == f"fsdp={cfg['target_devices']}"
    named = next(r for r in doc["named"] if r["policy"] == vs["policy"])
    assert doc["per_device_batch"] >= named["per_device_batch"]
    at = vs["at_named_batch"]
    p, b = at["plan"], at["max_batch"]
    lab = next(c for c in doc["candidates"] if c["plan"] == p and c["batch"] == b and c["fits"])
    peak, flops, code = _plain(cfg, p["save"], p["offload"], p["remat_layers"], b)
    assert abs(lab["peak_bytes"] - peak) <= code, (lab["peak_bytes"], peak, code)
    assert peak <= doc["budget_bytes"]
    if rec["from"] == vs["policy"]:  # the named policy as the per-name plan it is
        s = rec["start"]
        named_peak, named_flops, code = _plain(cfg, s["save"], s["offload"], s["remat_layers"], b)
    else:  # a JAX policy that decides per primitive: itself
        policy = getattr(jax.checkpoint_policies, vs["policy"])
        named_peak, named_flops, code = _plain(cfg, [], [], cfg["depth"], b, policy=policy)
    assert abs(named["peak_bytes"] - named_peak) <= code, (named["peak_bytes"], named_peak, code)
    assert flops < named_flops, (flops, named_flops)


def test_the_note_claims_a_named_baseline_only_where_a_plan_was_compared_at_that_batch():
    from remat_lab.studies.synthesize.doc import _baseline_note

    answer = {"recomputed_flops": None, "flops": 5.0}
    alone = _baseline_note(answer, {}, V5E)
    assert "over the tpu-v5e's HBM" in alone and "never estimated" in alone
    assert "recomputed_baseline" not in alone  # the answer is the named policy: no comparison made
    at = {"max_batch": 8, "fewer_flops": 2e9}
    said = _baseline_note(answer, {"policy": "nothing_saveable", "at_named_batch": at}, V5E)
    assert "against nothing_saveable at its batch 8, 2 GFLOP fewer per step" in said
    assert _baseline_note({"recomputed_flops": 1.0, "flops": 5.0}, {}, V5E) is None

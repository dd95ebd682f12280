"""The llm on a device mesh: its rules, loss and gradients against one device, the sharded training
step, and the advisor sizing per device (exact: checked by two more compiles of its own).

The multi-device cases run in one subprocess with 4 emulated CPU devices (``XLA_FLAGS`` must be set
before JAX starts), which prints one JSON document the tests read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remat_lab.config import ConfigError, RunConfig

SRC = str(Path(__file__).resolve().parents[1] / "src")
TINY = dict(model="llm", vocab=256, width=64, depth=2, heads=4, kv_heads=2, seq=8, batch=8,
            repeats=1, warmup=0)
# A mixture of experts (model/moe.py) that drops tokens and adds its load-balance loss.
MOE = dict(experts=4, experts_per_token=2, capacity_factor=1.25, load_balance_loss_weight=0.01,
           moe_dispatch="dense")


def test_the_llm_step_train_microbatches_and_compile_only_are_allowed_on_a_mesh():
    cfg = RunConfig(**TINY, mesh="fsdp=2,tensor=2", step="train", microbatches=2, compile_only=True)
    assert cfg.mesh == "fsdp=2,tensor=2"


@pytest.mark.parametrize("changes, words", [
    (dict(mesh="tensor=4"), "kv_heads 2 cannot be split over tensor = 4"),
    (dict(mesh="fsdp=2", microbatches=8), "multiple of 16"),
    (dict(mesh="tensor=2", vocab=255), "vocab 255 cannot be split over tensor = 2"),
    (dict(mesh="fsdp=8", batch=8, width=60, heads=2, kv_heads=1),
     "width 60 cannot be split over fsdp = 8"),
])
def test_meshes_the_llm_cannot_split_are_refused_with_a_sentence(changes, words):
    with pytest.raises(ConfigError, match=words):
        RunConfig(**{**TINY, **changes})


@pytest.mark.parametrize("moe", [{}, MOE | {"shared_experts": 1}], ids=["dense", "experts"])
def test_every_llm_parameter_has_a_rule(moe):
    from remat_lab.program.mesh import RULES, _in_block
    from remat_lab.program.step import abstract_problem

    paths = abstract_problem(RunConfig(**TINY | moe, compile_only=True)).paths
    assert {_in_block(p) for p in paths} <= set(RULES["llm"]), paths
    for stack in ("scan", "loop"):  # a loop stack's layer index is not a list member's
        assert {_in_block(p) for p in abstract_problem(
            RunConfig(**TINY | moe | {"stack": stack}, compile_only=True)).paths} <= set(RULES["llm"])


SCRIPT = r"""
import json
import re
import jax, numpy as np
from remat_lab.analysis.costs import memory_report
from remat_lab.config import RunConfig
from remat_lab.program.step import (abstract_problem, build_problem, device_model_report,
                                    jit_program, jit_step, model_report, program_args)
from remat_lab.studies.advisor.search import device_fields, probe
from remat_lab.studies.advisor.batch_search import largest_batch

assert jax.device_count() == 4, jax.devices()
tiny = json.loads(%r)
out = {}


def grads(cfg):
    p = build_problem(cfg)
    loss, g = jit_step(p)(*p.args)
    return float(loss), [np.asarray(a, np.float64) for a in g], p


l0, g0, _ = grads(RunConfig(**tiny, policy="minimal"))
l1, g1, p1 = grads(RunConfig(**tiny, policy="minimal", mesh="fsdp=2,tensor=2", microbatches=2))
out["loss"] = [l0, l1]
out["grad_rel_diff"] = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(g1, g0))
out["specs"] = dict(zip(p1.paths, [str(a.sharding.spec) for a in p1.leaves]))
# A mixture of experts on the same mesh: its experts split as the dense MLP.
moe = {**tiny, **json.loads(%r)}
m0, h0, _ = grads(RunConfig(**moe, policy="minimal"))
m1, h1, q1 = grads(RunConfig(**moe, policy="minimal", mesh="fsdp=2,tensor=2"))
out["moe_loss"] = [m0, m1]
out["moe_grad_rel_diff"] = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(h1, h0))
out["moe_specs"] = dict(zip(q1.paths, [str(a.sharding.spec) for a in q1.leaves]))
# The expert axis: 2 experts a device, the batch over fsdp x expert outside the experts.
from remat_lab.analysis.collectives import rows as collective_rows
q2 = build_problem(RunConfig(**moe, policy="minimal", mesh="fsdp=2,expert=2"))
expert_step = jit_step(q2).lower(*q2.args).compile()
m2, h2 = expert_step(*q2.args)
out["expert_loss"] = float(m2)
out["expert_grad_rel_diff"] = max(float(np.max(np.abs(np.asarray(a, np.float64) - b)) / np.max(np.abs(b)))
                                  for a, b in zip(h2, h0))
out["expert_specs"] = dict(zip(q2.paths, [str(a.sharding.spec) for a in q2.leaves]))
out["expert_collectives"] = sorted({(r["kind"], r["group"]) for r in collective_rows(expert_step.as_text())})
# The grouped dispatch (ragged_dot on each device's own tokens, a shard_map) on the expert axis.
grouped = {**moe, "moe_dispatch": "grouped", "capacity_factor": 0.0}
n0, k0, _ = grads(RunConfig(**grouped, policy="minimal"))
n2, k2, _ = grads(RunConfig(**grouped, policy="minimal", mesh="fsdp=2,expert=2"))
out["grouped_loss"] = [n0, n2]
out["grouped_grad_rel_diff"] = max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(k2, k0))
# Each collective inside the experts' block, by kind and the scope it came from (dispatch, wo, ...).
from remat_lab.analysis import hlotext
from remat_lab.analysis.collectives import KINDS as kinds
out["expert_moe_collectives"] = sorted({
    (ins.opcode.removesuffix("-start"), hlotext.op_name(ins.rest).split("/moe/")[1].split("/")[0])
    for _, ins in hlotext.instructions(expert_step.as_text())
    if ins.opcode.removesuffix("-start") in kinds and "/moe/" in (hlotext.op_name(ins.rest) or "")})

# The whole training step on the mesh: parameters and AdamW moments sharded, donated.
train = RunConfig(**tiny, policy="minimal", mesh="fsdp=2,tensor=2", step="train")
p = build_problem(train)
compiled = jit_program(p).lower(*program_args(p)).compile()
text = compiled.as_text()
entry = text[text.index("ENTRY"):]
entry = entry[:entry.index("\n}")]
out["entry_params"] = [line.split("=")[1].split()[0].split("{")[0] for line in entry.splitlines()
                       if " parameter(" in line]
# The scanned blocks' carry (a block's input and output): rows over fsdp, width over tensor.
out["while_carries"] = sorted({m.group(1) for m in re.finditer(r"= \(s32\[\], (f32\[[\d,]+\])", text)})
out["shapes"] = {s: s in text for s in ("f32[8,8,64]", "f32[8,8,256]", "f32[4,8,32]")}
lines = text.splitlines()
out["whole_batch"] = []  # (opcode, op_names of its users) of each whole-batch activation computed
for line in lines:
    m = re.match(r"\s*(?:ROOT )?%%([\w.\-]+) = f32\[8,8,64\]\S* ([\w\-]+)\(", line)
    if m and m.group(2) != "parameter":  # not a fused computation's parameter (its operand is here)
        use = re.compile("%%" + re.escape(m.group(1)) + r"(?![\w.\-])")
        users = {(re.search(r'op_name="([^"]*)"', u) or [None, ""])[1] for u in lines
                 if use.search(u) and u is not line}
        out["whole_batch"].append([m.group(2), sorted(users)])
loss, leaves, state = compiled(*program_args(p))
out["train_loss"] = float(loss)
out["state_specs"] = sorted({str(a.sharding.spec) for a in jax.tree.leaves(state)})
out["shard_bytes"] = [sum(a.addressable_shards[0].data.nbytes for a in jax.tree.leaves(t))
                      for t in (leaves, state)]
out["model"], out["device_model"] = model_report(p), device_model_report(p)
out["alias_bytes"] = memory_report(compiled)["alias_bytes"]

# The advisor's search on the mesh, compile-only on the local devices: per device, exact to one.
cfg = RunConfig(**tiny, policy="minimal", mesh="fsdp=4", step="train", compile_only=True)
q1, q2 = probe(cfg.replace(batch=4))["peak_bytes"], probe(cfg.replace(batch=8))["peak_bytes"]
budget = q1 + 5 * (q2 - q1) // 2
row = largest_batch(cfg, budget, max_batch=64)
row.update(device_fields(cfg, row))
out["budget"], out["row"] = budget, row
# Two separate compiles, outside the advisor's caches, at its answer and one per device above.
peak = lambda c: memory_report(jit_program(q := abstract_problem(c)).lower(
    *program_args(q)).compile())["peak_bytes"]
out["at_max"] = peak(cfg.replace(batch=row["max_batch"]))
out["above_max"] = peak(cfg.replace(batch=row["max_batch"] + 4))
out["abstract_device_model"] = device_model_report(abstract_problem(cfg))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """SCRIPT's document, run with 4 emulated CPU devices (one subprocess for the module)."""
    env = {**os.environ, "PYTHONPATH": SRC,
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4",
           "REMAT_LAB_CACHE_DIR": str(tmp_path_factory.mktemp("jaxcache"))}
    env.pop("REMAT_LAB_HOST_DEVICES", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT % (json.dumps(TINY), json.dumps(MOE))], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sharded_loss_and_gradients_equal_one_device(four):
    """fsdp x tensor with two microbatches against one device, one microbatch (float32: a few
    units in the last place of each leaf's largest entry, summed over the reordered reductions)."""
    one, mesh = four["loss"]
    assert mesh == pytest.approx(one, rel=1e-6)
    assert four["grad_rel_diff"] < 1e-5


def test_a_mixture_of_experts_on_the_mesh_equals_one_device(four):
    """Experts that drop tokens (capacity 1.25) with the load-balance loss, on fsdp x tensor: the
    loss and every gradient as one device's (float32, as above); each expert's weights split as the
    dense MLP's, the expert axis whole. (One microbatch: the load-balance loss of a microbatch is
    its own tokens' statistics, as in MaxText, so microbatches change its gradient.)"""
    one, mesh = four["moe_loss"]
    assert mesh == pytest.approx(one, rel=1e-6)
    assert four["moe_grad_rel_diff"] < 1e-5
    specs = four["moe_specs"]
    assert specs["layers.blocks.moe.wi_0"] == "P(None, None, 'fsdp', 'tensor')"
    assert specs["layers.blocks.moe.wo"] == "P(None, None, 'tensor', 'fsdp')"
    assert specs["layers.blocks.moe.gate"] == "P(None, 'fsdp', None)"


def test_the_expert_axis_splits_the_experts_and_moves_tokens_with_all_to_alls(four):
    """fsdp=2 x expert=2 on the same mixture of experts: its loss and gradients as one device's; each
    device holds 2 of the 4 experts (their width over fsdp alone), every other parameter split over
    fsdp x expert as MaxText's ``embed``; the dispatched tokens go to their experts' devices and
    back by all-to-alls over the expert axis's 2 devices (``mesh.expert_layout``), read from the
    compiled program by the collectives table, and nothing else moves them: no all-gather or
    reduce-scatter in the dispatch, the experts or the combine (only the router's scores are
    gathered, for the load-balance loss's mean over every token; the experts' weight gradients are
    summed over fsdp). Without the layout XLA's partitioner gathers the dispatched values and the
    experts' hidden values as well."""
    one, _ = four["moe_loss"]
    assert four["expert_loss"] == pytest.approx(one, rel=1e-6)
    assert four["expert_grad_rel_diff"] < 1e-5
    specs = four["expert_specs"]
    assert specs["layers.blocks.moe.wi_0"] == "P(None, 'expert', 'fsdp', None)"
    assert specs["layers.blocks.moe.wo"] == "P(None, 'expert', None, 'fsdp')"
    assert specs["layers.blocks.q_proj.kernel"] == "P(None, ('fsdp', 'expert'), None, None)"
    assert ["all-to-all", 2] in four["expert_collectives"], four["expert_collectives"]
    moe = {tuple(c) for c in four["expert_moe_collectives"]}
    assert {("all-to-all", "dispatch"), ("all-to-all", "wo")} <= moe, moe
    assert {scope for kind, scope in moe if kind == "all-to-all"} == {"dispatch", "wo"}, moe
    assert not {(kind, scope) for kind, scope in moe
                if kind in ("all-gather", "reduce-scatter") and scope != "router"}, moe


def test_the_grouped_dispatch_on_the_expert_axis_equals_one_device(four):
    """fsdp=2 x expert=2, the grouped dispatch (each device sorts and multiplies its own tokens):
    the loss and every gradient as one device's, float32."""
    assert four["grouped_loss"][1] == pytest.approx(four["grouped_loss"][0], rel=1e-6)
    assert four["grouped_grad_rel_diff"] < 1e-5


def test_parameters_follow_maxtexts_axes(four):
    specs = four["specs"]
    assert specs["embed.embedding"] == "P('tensor', 'fsdp')"
    assert specs["lm_head.kernel"] == "P('fsdp', 'tensor')"
    assert specs["layers.blocks.q_proj.kernel"] == "P(None, 'fsdp', 'tensor', None)"
    assert specs["layers.blocks.o_proj.kernel"] == "P(None, 'tensor', None, 'fsdp')"
    assert specs["layers.blocks.wo.kernel"] == "P(None, 'tensor', 'fsdp')"


def test_the_compiled_training_step_takes_one_devices_shards(four):
    """The compiled program's entry parameters are shards: the embedding (256, 64) arrives as
    (128, 32) on each of the fsdp=2 x tensor=2 devices, never whole; the AdamW moments too."""
    params = four["entry_params"]
    assert params.count("f32[128,32]") == 3, params  # the embedding and its two moments
    assert "f32[256,64]" not in params and "f32[64,256]" not in params
    assert "P('tensor', 'fsdp')" in four["state_specs"]
    model, dev = four["model"], four["device_model"]
    # One device's bytes: what device 0 holds of the step's outputs (norms are split by fsdp only).
    assert [dev["parameter_bytes"], dev["optimizer_state_bytes"]] == four["shard_bytes"]
    assert 2 * dev["parameter_bytes"] < model["parameter_bytes"]
    assert four["alias_bytes"] >= dev["parameter_bytes"] + dev["optimizer_state_bytes"] - 64


def test_activations_and_logits_are_split_over_the_batch(four):
    """Batch 8 on fsdp=2 x tensor=2: the compiled step holds each device's rows of the activations
    (4 of 8, and 32 of the width 64: MaxText's activation_embed on tensor) and never the whole
    logits. No value is the whole batch at the whole width: before the width was split over tensor,
    XLA 0.12's partitioner all-gathered the blocks' input gradient (f32[8,8,64]) over fsdp for the
    embedding's gradient; now that gradient arrives split over tensor. (The embedding's own gather
    and scatter-add still see the whole batch's rows at the table's fsdp half of the width.)"""
    assert four["shapes"] == {"f32[8,8,64]": False, "f32[8,8,256]": False, "f32[4,8,32]": True}
    assert four["whole_batch"] == []


def test_a_blocks_input_and_output_are_split_over_tensor(four):
    """MaxText's ``activation_embed`` -> ``tensor``: on fsdp=2 x tensor=2 the scanned blocks'
    carry, forward and backward, is one device's 4 of 8 rows and 32 of the width 64, never the
    whole width every tensor device would otherwise hold."""
    assert four["while_carries"] == ["f32[4,8,32]"]


def test_the_advisor_sizes_per_device_exactly(four):
    budget, row = four["budget"], four["row"]
    assert row["max_batch"] >= 4 and row["max_batch"] % 4 == 0
    assert row["per_device_batch"] == row["max_batch"] // 4
    assert row["next_batch"] == row["max_batch"] + 4
    assert four["at_max"] <= budget < four["above_max"]  # its own two compiles
    assert row["peak_bytes"] == four["at_max"]
    assert row["tokens_per_step"] == row["max_batch"] * TINY["seq"] and row["devices"] == 4
    kinds = row["by_kind"]
    assert sum(kinds.values()) == row["peak_bytes"]
    assert kinds["parameters"] == four["abstract_device_model"]["parameter_bytes"]
    assert kinds["optimizer_state"] == four["abstract_device_model"]["optimizer_state_bytes"]

"""The dissection: residuals and per-dot saved / offloaded / recomputed, jaxpr and compiled."""

from __future__ import annotations

import numpy as np
import pytest
from jax._src import ad_checkpoint

from remat_lab.analysis.layers import layer_of
from remat_lab.cli import main
from remat_lab.config import RunConfig
from remat_lab.program.step import build_problem


def _dots(run, **kw):
    return run(RunConfig(**{"width": 32, "batch": 4, **kw}))["dots"]


def _flags(dots, key):
    return [d[key] for d in dots]


@pytest.mark.parametrize("batch", [4, 0])
def test_mlp_dots_with_no_batch_dims_saves_both(run, batch):
    dots = _dots(run, batch=batch)
    assert _flags(dots, "layer") == ["l1", "l2"]
    assert _flags(dots, "has_batch_dims") == [False, False]
    assert _flags(dots, "policy_verdict") == ["save", "save"]
    assert _flags(dots, "saved") == [True, True]
    assert _flags(dots, "recomputed") == [False, False]


@pytest.mark.parametrize("policy", ["nothing_saveable", "nnx_remat_default"])
@pytest.mark.parametrize("batch", [4, 0])
def test_mlp_saving_nothing_recomputes_both(run, policy, batch):
    dots = _dots(run, batch=batch, policy=policy)
    assert _flags(dots, "policy_verdict") == ["recompute", "recompute"]
    assert _flags(dots, "saved") == [False, False]
    assert _flags(dots, "recomputed") == [True, True]


@pytest.mark.parametrize("policy", ["everything_saveable", "no_remat"])
def test_saving_everything_recomputes_nothing(run, policy):
    dots = _dots(run, policy=policy)
    assert _flags(dots, "recomputed") == [False, False]
    assert _flags(dots, "recomputed_in_compiled") == [False, False]


def test_seq_mixer_batch_dims_rule(run):
    cfg = dict(model="seq_mixer", width=32, batch=4, seq=8)
    dots = _dots(run, **cfg)
    assert _flags(dots, "layer") == ["l1", "mix", "mix", "l2"]
    assert _flags(dots, "has_batch_dims") == [False, True, True, False]
    assert dots[1]["batch_dims"] == [[0], [0]]
    assert _flags(dots, "policy_verdict") == ["save", "recompute", "recompute", "save"]
    assert _flags(dots, "saved") == [True, False, False, True]
    assert any(d["recomputed"] for d in dots if d["layer"] == "mix")
    # (B, N, D) @ (D, F) products compile to 2-D dots; they are found, not reported as rewritten.
    assert not any("rewrote" in d["note"] for d in dots)
    assert not any(d["recomputed"] for d in dots if d["layer"] != "mix")
    # dots_saveable ignores batch dims: the mixing products become saveable and are saved.
    saveable = _dots(run, policy="dots_saveable", **cfg)
    assert _flags(saveable, "policy_verdict") == ["save"] * 4
    assert _flags(saveable, "saved") == [True] * 4
    assert not any(_flags(saveable, "recomputed"))


def test_offload_marks_dot_residuals_host(run):
    result = run(RunConfig(width=32, batch=4, policy="offload_dot_with_no_batch_dims"))
    dots = result["dots"]
    assert _flags(dots, "policy_verdict") == ["offload", "offload"]
    assert _flags(dots, "offloaded") == [True, True] and _flags(dots, "saved") == [True, True]
    host = [r for r in result["residuals"] if r["memory_kind"] == "host"]
    assert [(r["kind"], r["layer"]) for r in host] == [("dot_general", "l1"), ("dot_general", "l2")]
    assert result["totals"]["residual_host_bytes"] == sum(r["bytes"] for r in host) == 2 * 4 * 32 * 4


@pytest.mark.parametrize("policy", ["dots_with_no_batch_dims_saveable", "nothing_saveable"])
def test_depth_three_attributes_blocks_and_layers(run, policy):
    result = run(RunConfig(width=32, batch=4, depth=3, stack="loop", policy=policy))
    assert _flags(result["dots"], "layer") == ["0.l1", "0.l2", "1.l1", "1.l2", "2.l1", "2.l2"]
    args = [r for r in result["residuals"] if r["kind"] == "argument" and r["layer"] != "input"]
    assert {r["layer"] for r in args} == {f"{b}.{n}" for b in range(3) for n in ("l1", "l2")}
    for r in args:  # the parameter path names the same block and layer
        block, layer = r["layer"].split(".")
        assert r["source"].startswith(f"argument blocks.{block}.{layer}.")
    if policy == "dots_with_no_batch_dims_saveable":
        saved = [r["layer"] for r in result["residuals"] if r["kind"] == "dot_general"]
        assert saved == ["0.l1", "0.l2", "1.l1", "1.l2", "2.l1", "2.l2"]


def test_seq_mixer_attribution_distinguishes_l1_and_l2(run):
    result = run(RunConfig(model="seq_mixer", width=16, batch=2, seq=4))
    saved = [(r["layer"], r["shape"]) for r in result["residuals"] if r["kind"] == "dot_general"]
    assert saved == [("l1", [2, 4, 16]), ("l2", [2, 4, 16])]


@pytest.mark.parametrize("model", ["mlp", "seq_mixer"])
@pytest.mark.parametrize("policy", ["no_remat", "nothing_saveable", "dots_with_no_batch_dims_saveable",
                                    "offload_dot_with_no_batch_dims", "dots_saveable"])
def test_residuals_agree_with_jax_saved_residuals(run, model, policy):
    """An independent check: JAX's own saved_residuals on the same function."""
    cfg = RunConfig(model=model, width=16, batch=2, seq=4, policy=policy)
    problem = build_problem(cfg)
    theirs = ad_checkpoint.saved_residuals(problem.loss, *problem.args)
    ours = run(cfg)["residuals"]
    assert len(ours) == len(theirs)
    nbytes = lambda aval: int(np.prod(aval.shape)) * aval.dtype.itemsize
    assert sum(r["bytes"] for r in ours) == sum(nbytes(a) for a, _ in theirs)
    assert sorted(tuple(r["shape"]) for r in ours) == sorted(tuple(a.shape) for a, _ in theirs)
    # JAX names an offloaded dot by the device_put that moves it to the host.
    assert sum(r["kind"] == "dot_general" for r in ours) == sum(
        "output of dot_general" in s or "output of device_put" in s for _, s in theirs)
    assert sum(r["memory_kind"] == "host" for r in ours) == sum(
        "host" in str(getattr(a, "memory_space", "")).lower() for a, _ in theirs)


def test_compiled_level_recomputation_at_width_256(run):
    none = run(RunConfig(width=256, batch=64, policy="nothing_saveable"))
    save = run(RunConfig(width=256, batch=64))
    assert _flags(none["dots"], "recomputed_in_compiled") == [True, True]
    assert _flags(save["dots"], "recomputed_in_compiled") == [False, False]
    assert (none["hlo"]["excess_dots_vs_no_remat"], save["hlo"]["excess_dots_vs_no_remat"]) == (2, 0)
    assert none["totals"]["recompute_flops"] == 2 * (2 * 64 * 256 * 256)
    assert none["totals"]["recompute_flops_in_compiled"] == 2 * (2 * 64 * 256 * 256)


def test_recomputation_kept_at_small_size_and_merged_under_grad_is_explained(run):
    """XLA 0.12's CPU compiler expands JAX's remat barrier only after scheduling, so at a small size
    the recomputation survives (XLA 0.10 merged it back into the forward product). With objective
    grad the forward products are dead code: the recomputations do not happen, and the notes say so."""
    kept = run(RunConfig(width=64, batch=8, policy="nothing_saveable"))
    assert _flags(kept["dots"], "recomputed") == [True, True]
    assert _flags(kept["dots"], "recomputed_in_compiled") == [True, True]
    assert kept["hlo"]["excess_dots_vs_no_remat"] == 2
    assert _flags(kept["dots"], "note") == ["", ""]
    assert not any("do not happen" in n for n in kept["notes"])
    merged = run(RunConfig(width=64, batch=8, policy="nothing_saveable", objective="grad"))
    assert _flags(merged["dots"], "recomputed") == [True, True]
    assert _flags(merged["dots"], "recomputed_in_compiled") == [False, False]
    assert all("no more products of its size than no_remat" in d["note"] for d in merged["dots"])
    assert any("2 recomputation(s) do not happen" in n and "dead code" in n for n in merged["notes"])


def _plain_mlp_dots(width: int, policy) -> int:
    """Products in the compiled value-and-grad of a plain jax.numpy MLP on one vector (no NNX, no lab
    code), the block under ``jax.checkpoint(policy=...)`` or none: an independent compile."""
    import re

    import jax
    import jax.numpy as jnp

    def block(p, x):
        return jnp.maximum(jnp.maximum(x @ p[0] + p[1], 0) @ p[2] + p[3], 0)

    def loss(p, x):
        f = block if policy is None else jax.checkpoint(block, policy=policy)
        return jnp.sum(f(p, x) ** 2)

    p = [jnp.ones((width, width)), jnp.ones(width), jnp.ones((width, width)), jnp.ones(width)]
    text = jax.jit(jax.value_and_grad(loss)).lower(p, jnp.ones(width)).compile().as_text()
    return len(re.findall(r"= f32\[[0-9,]*\]\{[0-9,]*\} dot\(", text))


def test_seed_case_single_vector_compiles_five_dots_two_recomputed(run):
    """The seed's own case: width 128, one vector. XLA 0.12 keeps both recomputations: 5 products
    against no_remat's 3, 49 % more flops (the Guide's lesson 3; XLA 0.10 compiled no_remat's 3)."""
    result = run(RunConfig(width=128, batch=0, policy="nothing_saveable"))
    base = run(RunConfig(width=128, batch=0, policy="no_remat"))
    assert (result["hlo"]["dot_count"], base["hlo"]["dot_count"]) == (5, 3)
    assert result["hlo"]["excess_dots_vs_no_remat"] == 2
    assert _flags(result["dots"], "recomputed") == [True, True]
    assert _flags(result["dots"], "recomputed_in_compiled") == [True, True]
    assert result["totals"]["dots_recomputed_in_compiled"] == 2
    assert result["totals"]["recompute_flops_in_compiled"] == 2 * (2 * 128 * 128)
    assert round(100 * (result["flops"] / base["flops"] - 1)) == 49
    assert not any("rewrote" in d["note"] for d in result["dots"])
    # The compiler's doing, not the lab's: the same counts from a plain jax.numpy compile.
    import jax
    assert (_plain_mlp_dots(128, jax.checkpoint_policies.nothing_saveable),
            _plain_mlp_dots(128, None)) == (5, 3)


def test_objective_grad_program_runs_no_remat_products_and_recomputes_nothing(run):
    """With objective grad the forward products are dead code: nothing_saveable compiles to
    no_remat's products, flops and peak (XLA 0.12 fuses the relu's derivative differently, so the
    two programs' fingerprints need not be equal)."""
    result = run(RunConfig(width=256, batch=64, policy="nothing_saveable", objective="grad"))
    base = run(RunConfig(width=256, batch=64, policy="no_remat", objective="grad"))
    assert result["hlo"]["dot_count"] == base["hlo"]["dot_count"] == 5
    assert result["hlo"]["excess_dots_vs_no_remat"] == 0
    assert result["hlo"]["excess_flops_vs_no_remat"] == 0 and result["flops"] == base["flops"]
    assert result["memory"]["peak_bytes"] == base["memory"]["peak_bytes"]
    assert result["totals"]["recompute_flops_in_compiled"] == 0
    assert not any(d["recomputed_in_compiled"] for d in result["dots"])


def test_seq_equal_to_width_is_not_attributed_by_size(run):
    """bnd,bmd->bnm and bnm,bmd->bnd have the same size when seq == width: say so, don't guess."""
    result = run(RunConfig(model="seq_mixer", width=16, batch=2, seq=16, policy="nothing_saveable"))
    mix = [d for d in result["dots"] if d["layer"] == "mix"]
    excess = result["hlo"]["excess_dots_vs_no_remat"]
    kept = [d["recomputed_in_compiled"] for d in mix]
    # Either both mixing products are attributed (when every recomputation survived) or neither.
    assert kept in ([None, None], [True, True], [False, False])
    if kept == [None, None]:
        assert 0 < excess and any("not attributable" in n for n in result["notes"])
    # With seq != width the two mixing products differ in size and are attributed one by one.
    other = run(RunConfig(model="seq_mixer", width=16, batch=2, seq=8, policy="nothing_saveable"))
    assert None not in [d["recomputed_in_compiled"] for d in other["dots"] if d["layer"] == "mix"]


def test_offload_is_a_no_op_on_cpu(run):
    import jax
    if jax.default_backend() != "cpu":
        pytest.skip("the no-op is a CPU fact")
    result = run(RunConfig(width=32, batch=4, policy="offload_dot_with_no_batch_dims"))
    assert _flags(result["dots"], "offloaded") == [True, True]
    assert _flags(result["dots"], "offloaded_in_compiled") == [False, False]
    assert result["hlo"]["host_memory"] is False
    assert "S(5)" not in result["texts"]["compiled_hlo"]
    assert result["totals"]["residual_host_bytes_in_compiled"] == 0
    assert any("no-op" in n for n in result["notes"])


def test_residual_split_separates_parameters_and_zero_constants(run):
    result = run(RunConfig(width=64, batch=8, depth=2, stack="loop", policy="no_remat"))
    t = result["totals"]
    params = sum(r["bytes"] for r in result["residuals"] if r["source"].startswith("argument blocks"))
    assert t["parameter_residual_bytes"] == params > 0
    assert t["input_residual_bytes"] == 8 * 64 * 4
    # relu's jvp keeps a broadcast zero per layer: built from a literal, it takes no memory.
    assert t["zero_cost_residual_bytes"] == 4 * 8 * 64 * 4
    assert (t["activation_residual_bytes"] + t["parameter_residual_bytes"] + t["input_residual_bytes"]
            + t["zero_cost_residual_bytes"]) == t["residual_bytes"]


def test_totals_add_up(run):
    result = run(RunConfig(model="seq_mixer", width=16, batch=2, seq=4))
    t, residuals = result["totals"], result["residuals"]
    assert t["residual_bytes"] == sum(r["bytes"] for r in residuals)
    assert sum(t["residual_bytes_by_kind"].values()) == t["residual_bytes"]
    assert sum(t["residual_bytes_by_layer"].values()) == t["residual_bytes"]
    assert t["dots_saved"] == sum(d["saved"] for d in result["dots"])
    assert t["recompute_flops"] == sum(d["flops"] for d in result["dots"] if d["recomputed"])


def test_texts_mark_recomputed_equations(run):
    texts = run(RunConfig(width=64, batch=8, policy="nothing_saveable"))["texts"]
    assert "rematted_computation" in texts["step_jaxpr"]
    assert "dot_general" in texts["forward_jaxpr"]
    assert "HloModule" in texts["compiled_hlo"]


def test_layer_of():
    assert layer_of("jvp(block1)/l2", 3) == "1.l2" and layer_of("jvp(block0)/mix", 1) == "mix"


def _table_rows(out: str) -> list[list[str]]:
    """The first two rows of the printed per-dot table, split into cells."""
    lines = [line.replace(", ", ",").split() for line in out.splitlines()]
    return [cells for cells in lines if cells[:1] in (["0"], ["1"])][:2]


def test_explain_prints_two_saved_rows(capsys):
    assert main(["explain", "--width", "256", "--batch", "64", "--no-jaxpr"]) == 0
    out = capsys.readouterr().out
    rows = _table_rows(out)
    assert [r[1] for r in rows] == ["l1", "l2"]
    assert [r[7:11] for r in rows] == [["save", "True", "False", "False"]] * 2
    assert main(["explain", "--width", "256", "--batch", "64", "--policy", "nothing_saveable",
                 "--no-jaxpr"]) == 0
    out = capsys.readouterr().out
    rows = _table_rows(out)
    assert [r[7:12] for r in rows] == [["recompute", "False", "False", "True", "True"]] * 2

"""Mixed precision: AdamW's two moments in the optimizer dtype (on one device and laid out on a mesh),
presets and the CLI's llm training step in the common recipe unless dtypes are given, memory by kind
at each kind's dtype, the gradient check's bound from the compute dtype, the precision in the summary."""

from __future__ import annotations

import shlex

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from remat_lab.analysis.by_kind import memory_by_kind
from remat_lab.analysis.costs import memory_report
from remat_lab.analysis.gradcheck import check_gradients
from remat_lab.analysis.gradcheck_bounds import bound_parameters
from remat_lab.cli import build_parser
from remat_lab.cli.common import config_from
from remat_lab.config import RunConfig
from remat_lab.config.catalog import RECIPE, RECIPE_TEXT
from remat_lab.present.reproduce import cli_command
from remat_lab.program.footprint import static_bytes
from remat_lab.program.step import (
    LEARNING_RATE,
    abstract_problem,
    build_problem,
    device_model_report,
    jit_program,
    jit_step,
    logits_bytes,
    model_report,
    optimizer,
    program_args,
)
from remat_lab.studies.advisor.decision import decide

SMALL = dict(model="llm", vocab=512, width=128, depth=2, heads=4, kv_heads=2, seq=32, batch=4,
             policy="minimal", step="train")
MIXED = dict(dtype="bfloat16", param_dtype="float32")
TINY = {**SMALL, "vocab": 256, "width": 64, "seq": 16, "batch": 2}  # for the compiled steps


def _moments(state) -> tuple:
    adam = state[0]  # optax.adamw's chain: Adam's scaling first
    return jax.tree.leaves(adam.mu), jax.tree.leaves(adam.nu)


@pytest.mark.parametrize("param, moments", [("float32", "bfloat16"), ("bfloat16", "float32"),
                                            ("float32", "float32")])
def test_both_moments_are_in_the_optimizer_dtype_after_an_update(param, moments):
    cfg = RunConfig(**{**SMALL, "dtype": param, "param_dtype": param, "optimizer_dtype": moments})
    params = [jnp.linspace(-1, 1, 24, dtype=param).reshape(4, 6)]
    grads = [jnp.cos(jnp.arange(24.0)).astype(param).reshape(4, 6)]
    tx = optimizer(cfg)
    state = tx.init(params)
    assert {a.dtype.name for a in sum(_moments(state), [])} == {moments}
    updates, state = jax.jit(tx.update)(grads, state, params)
    mu, nu = _moments(state)
    assert mu[0].dtype.name == nu[0].dtype.name == moments
    # After one step the moments are (1 - b1) g and (1 - b2) g^2, within the rounding of the
    # narrower of the gradients' and the moments' dtypes: the constant, the square, the product
    # and the store each round once (4 u).
    g = np.asarray(grads[0], np.float64)
    u = 2.0**-8 if "bfloat16" in (param, moments) else 2.0**-24
    for got, want in ((mu[0], (1 - 0.9) * g), (nu[0], (1 - 0.999) * g * g)):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=4 * u, atol=0)


def test_in_float32_it_is_optax_adamw_step_for_step():
    cfg = RunConfig(**SMALL)
    params = {"w": jnp.linspace(-1, 1, 12).reshape(3, 4)}
    ours, theirs = optimizer(cfg), optax.adamw(LEARNING_RATE)
    s1, s2 = ours.init(params), theirs.init(params)
    assert jax.tree.structure(s1) == jax.tree.structure(s2)
    for k in range(3):
        g = {"w": jnp.sin(jnp.arange(12.0) + k).reshape(3, 4)}
        u1, s1 = ours.update(g, s1, params)
        u2, s2 = theirs.update(g, s2, params)
        np.testing.assert_array_equal(np.asarray(u1["w"]), np.asarray(u2["w"]))


def test_the_training_step_keeps_each_dtype_and_memory_by_kind_counts_it():
    cfg = RunConfig(**TINY, **MIXED, optimizer_dtype="bfloat16")
    problem = build_problem(cfg)
    compiled = jit_program(problem).lower(*program_args(problem)).compile()
    leaves, state, x = program_args(problem)
    loss, leaves, state = compiled(leaves, state, x)
    assert np.isfinite(float(loss))
    assert {a.dtype.name for a in leaves} == {"float32"}  # the master weights stay float32
    assert {a.dtype.name for a in sum(_moments(state), [])} == {"bfloat16"}
    report = model_report(problem)
    n = report["parameters"]
    assert report["parameter_bytes"] == report["gradient_bytes"] == 4 * n
    assert report["optimizer_state_bytes"] == 2 * 2 * n + 4  # two bf16 moments + the step count
    assert report["precision"] == {"params": "float32", "compute": "bfloat16", "optimizer": "bfloat16"}
    memory = memory_report(compiled)
    kinds = memory_by_kind(memory, report, train=True, logits_bytes=logits_bytes(cfg))
    assert kinds["parameters"] == 4 * n and kinds["gradients"] == 4 * n  # float32
    assert kinds["optimizer_state"] == 2 * 2 * n + 4  # bfloat16 moments
    assert kinds["logits"] == cfg.batch * cfg.seq * cfg.vocab * 2  # bfloat16 compute
    assert sum(v for k, v in kinds.items() if k != "method") == memory["peak_bytes"]
    assert ("parameters and gradients float32, optimizer state bfloat16, activations and logits "
            "bfloat16") in kinds["method"]


def test_on_a_mesh_the_moments_are_laid_out_like_their_parameters():
    """4 TPU v5e compile-only: each bf16 moment is sharded like its float32 parameter; one device's
    state is a quarter, as footprint's count from the configuration alone says; the compiled
    training step takes those shards (entry parameters of the sharded shapes)."""
    cfg = RunConfig(**{**SMALL, **MIXED, "optimizer_dtype": "bfloat16", "batch": 4}, mesh="fsdp=4",
                    target="tpu-v5e", target_devices=4)
    problem = abstract_problem(cfg)
    mu, nu = _moments(problem.opt_state)
    for leaf, m, v in zip(problem.leaves, mu, nu):
        assert m.sharding.spec == v.sharding.spec == leaf.sharding.spec
        assert m.dtype == v.dtype == jnp.bfloat16 and leaf.dtype == jnp.float32
    dev = device_model_report(problem)
    assert dev["optimizer_state_bytes"] == static_bytes(cfg)["optimizer_state_bytes"]
    assert dev["optimizer_state_bytes"] == 2 * 2 * dev["parameters"] // 4 + 4
    compiled = jit_program(problem).lower(*program_args(problem)).compile()
    text = compiled.as_text()
    entry = text[text.index("ENTRY"):]
    entry = entry[:entry.index("\n}")]
    params = [line.split("=")[1].split()[0].split("{")[0] for line in entry.splitlines()
              if " parameter(" in line]
    assert params.count("bf16[512,32]") == 2, params  # the embedding's two moments, width / 4
    assert "f32[512,32]" in params and "bf16[512,128]" not in params
    assert memory_report(compiled)["argument_bytes"] >= dev["parameter_bytes"] + dev["optimizer_state_bytes"]


def test_presets_and_the_llm_training_step_start_from_the_recipe():
    cfg = RunConfig.from_preset("llama3-8b")
    assert (cfg.dtype, cfg.param_dtype_used, cfg.optimizer_dtype_used) == (
        "bfloat16", "float32", "float32") == tuple(RECIPE.values())
    # A dtype given replaces that field only: the recipe's others stay (issue 65).
    assert RunConfig.from_preset("llama3-8b", dtype="bfloat16").param_dtype_used == "float32"
    assert RunConfig.from_preset("llama3-8b", dtype="float32").optimizer_dtype_used == "float32"
    assert RunConfig.from_preset("llama3-8b", param_dtype="bfloat16").dtype == "bfloat16"
    parse = build_parser().parse_args
    for argv, want in [
        (["run", "--preset", "llama3.2-1b"], ("bfloat16", "float32", "float32")),
        (["run", "--model", "llm", "--step", "train"], ("bfloat16", "float32", "float32")),
        (["run", "--model", "llm"], ("float32", "float32", "float32")),  # the gradient step: as given
        (["run", "--model", "mlp", "--step", "train"], ("float32", "float32", "float32")),
        (["run", "--preset", "llama3.2-1b", "--dtype", "float32"], ("float32", "float32", "float32")),
        (["run", "--model", "llm", "--step", "train", "--optimizer-dtype", "bfloat16"],
         ("bfloat16", "float32", "bfloat16")),
        # one dtype flag on a preset changes that field only: the compute stays bfloat16
        (["run", "--preset", "mixtral-8x7b", "--param-dtype", "bfloat16"],
         ("bfloat16", "bfloat16", "float32")),
        (["run", "--preset", "llama3.2-1b", "--optimizer-dtype", "bfloat16"],
         ("bfloat16", "float32", "bfloat16")),
        (["run", "--model", "llm", "--step", "train", "--dtype", "float32"],
         ("float32", "float32", "float32")),
        (["run", "--preset", "llama3.2-1b", "--dtype", "bfloat16", "--param-dtype", "float32",
          "--optimizer-dtype", "bfloat16"], ("bfloat16", "float32", "bfloat16")),
    ]:
        c = config_from(parse(argv))
        assert (c.dtype, c.param_dtype_used, c.optimizer_dtype_used) == want, argv
        # the app's command line for it gives the same configuration back
        again = config_from(parse(shlex.split(cli_command(c))[3:]))
        assert again == c, argv


def test_the_gradient_check_of_mixed_precision_is_bounded_by_the_compute_dtype():
    cfg = RunConfig(**{**TINY, **MIXED, "step": "grad"})
    assert bound_parameters(cfg)["u"] == 2.0**-8 == bound_parameters(cfg.replace(param_dtype=""))["u"]
    problem = build_problem(cfg)
    step = jit_step(problem)
    loss, grads = step(*problem.args)
    assert {g.dtype.name for g in grads} == {"float32"}  # gradients in the parameters' dtype
    check = check_gradients(problem, grads, loss, step.trace(*problem.args).jaxpr)
    assert check["ok"], check["failures"]
    bad = [g * 1.03 if i == 3 else g for i, g in enumerate(grads)]
    assert not check_gradients(problem, bad, loss, step.trace(*problem.args).jaxpr)["ok"]


def test_the_decision_names_the_precision():
    row = {"policy": "minimal", "max_batch": 8, "per_device_batch": 1, "devices": 8,
           "peak_bytes": 50 << 30, "probes": []}
    doc = {"rows": [row], "budget_bytes": 60 << 30, "recommended": "minimal", "reason": "r",
           "precision": {"params": "float32", "compute": "bfloat16", "optimizer": "float32"}}
    why = decide(doc, [])["why"]
    assert why.startswith("minimal fits batch 1 per device (8 global)")
    assert why.endswith("Precision: float32 master weights and moments, bfloat16 compute (the common "
                        "mixed-precision recipe).")
    assert RECIPE_TEXT.startswith("recipe: float32 master weights and moments, bfloat16 compute")
    doc["precision"] = {"params": "bfloat16", "compute": "bfloat16", "optimizer": "float32"}
    assert "Precision: bfloat16 master weights, float32 moments, bfloat16 compute." in decide(doc, [])["why"]


def test_the_app_starts_a_preset_from_the_recipe_and_says_so():
    from pathlib import Path

    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    page = str(Path(__file__).resolve().parents[1] / "pages" / "guide.py")
    at = AppTest.from_file(page, default_timeout=300)
    at.query_params.update(model="llm", preset="llama3.2-1b", seq="64", batch="1")
    at.run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert at.radio(key="dtype").value == "bfloat16"
    assert (at.selectbox(key="param_dtype").value, at.selectbox(key="optimizer_dtype").value) == (
        "float32", "float32")
    assert any(c.value == "Recipe: float32 master weights and moments, bfloat16 compute (the common "
               "mixed-precision recipe)." for c in at.sidebar.caption)
    assert (at.query_params["param_dtype"], at.query_params["optimizer_dtype"]) == ("float32", "float32")
    # A link that gives a dtype replaces that one only: the recipe's others stay.
    given = AppTest.from_file(page, default_timeout=300)
    given.query_params.update(model="llm", preset="llama3.2-1b", seq="64", batch="1", param_dtype="bfloat16")
    given.run()
    assert given.radio(key="dtype").value == "bfloat16"
    assert given.selectbox(key="param_dtype").value == "bfloat16"
    assert given.selectbox(key="optimizer_dtype").value == "float32"
    # Choosing another preset in the sidebar starts it from the recipe again.
    given.selectbox(key="preset").set_value("gpt2-small").run()
    assert given.radio(key="dtype").value == "bfloat16"
    assert given.selectbox(key="param_dtype").value == "float32"


def test_the_estimate_sizes_the_moments_in_the_optimizer_dtype():
    from remat_lab.config import RunConfig
    from remat_lab.config.budget import optimizer_state_bytes

    cfg = RunConfig(model="llm", width=64, heads=2, seq=8, vocab=128, depth=2, step="train",
                    dtype="bfloat16", param_dtype="float32", optimizer_dtype="float32")
    assert optimizer_state_bytes(cfg.replace(optimizer_dtype="bfloat16")) * 2 == optimizer_state_bytes(cfg)

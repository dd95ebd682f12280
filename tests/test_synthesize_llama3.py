"""The llama3-8b synthesis (8 x H100, fsdp=8, train): its answer redone as a plain jax.checkpoint step."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from remat_lab.config import RunConfig
from remat_lab.studies.advisor.search import probe

SAVED = Path(__file__).parent / "load" / "synthesize-llama3-8b-2026-12-04-refined.json"
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
GAP = 1 << 20  # the lab's program against the plain one, JAX 0.12 (see the test's docstring)


def _plain_train_step(config: RunConfig, policy) -> tuple[int, float, int]:
    """llama3-8b's training step written without the lab's policies, stacks, step or optimizer, for
    the target's compile-only devices: the lab's model (its blocks, attention kernel and chunked
    loss: what is compiled, not how it is remat'd), the stacked blocks split by hand into a
    ``lax.scan`` whose body is ``jax.checkpoint(policy=...)``; inside it each block's parameters
    gathered (replicated), as FSDP gathers them for use, and the activations' batch over fsdp;
    ``optax.adamw`` with float32 moments; parameters and state donated, laid out by the lab's
    sharding rules (fsdp). ``(peak, flops, XLA's generated code bytes)`` of the compiled program."""
    from remat_lab.analysis.costs import program_flops
    from remat_lab.model.attention import for_config
    from remat_lab.model.llm import chunked_next_token_loss
    from remat_lab.model.models import build_model, llm_options
    from remat_lab.program.mesh import param_specs
    from remat_lab.program.optimizer import LEARNING_RATE, WEIGHT_DECAY
    from remat_lab.program.targets import target_devices

    n = config.target_devices
    mesh = jax.sharding.Mesh(target_devices(config.target, n), ("fsdp",))
    model = nnx.eval_shape(lambda: build_model("llm", config.width, config.depth, seed=0,
                                               dtype=DTYPES[config.dtype], stack="scan",
                                               heads=config.heads, **llm_options(config, DTYPES)))
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    shardings = [NamedSharding(mesh, s) for s in param_specs(state, config)]
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = lambda a: jax.lax.with_sharding_constraint(  # the batch axis over fsdp
        a, NamedSharding(mesh, PartitionSpec("fsdp", *(None,) * (a.ndim - 1))))
    attention = for_config(config, mesh, "fsdp")

    def loss(flat, tokens):
        llm = nnx.merge(graphdef, jax.tree.unflatten(treedef, flat))
        llm.layers.blocks.attention = attention
        block_def, stacked = nnx.split(llm.layers.blocks)

        def block(st, h):
            st = jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, replicated), st)
            return rows(nnx.merge(block_def, st)(rows(h)))

        remat = jax.checkpoint(block, policy=policy)
        h, _ = jax.lax.scan(lambda h, st: (remat(st, h), None), llm.embed(tokens), stacked)
        return chunked_next_token_loss(lambda c: rows(llm.head(c)), h, tokens, config.loss_chunks)

    tx = optax.adamw(LEARNING_RATE, weight_decay=WEIGHT_DECAY, mu_dtype=jnp.float32)

    def train(flat, opt_state, tokens):
        value, grads = jax.value_and_grad(loss)(flat, tokens)
        updates, opt_state = tx.update(grads, opt_state, flat)
        return value, optax.apply_updates(flat, updates), opt_state

    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(leaves, shardings)]
    opt_state = jax.eval_shape(tx.init, abstract)
    opt_shardings = (optax.ScaleByAdamState(count=replicated, mu=shardings, nu=shardings),
                     optax.EmptyState(), optax.EmptyState())
    assert jax.tree.structure(opt_shardings) == jax.tree.structure(opt_state)
    assert {a.dtype for a in jax.tree.leaves(opt_state)} == {jnp.dtype(jnp.int32), jnp.dtype(jnp.float32)}
    opt_abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                opt_state, opt_shardings)
    tokens = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32,
                                  sharding=NamedSharding(mesh, PartitionSpec("fsdp", None)))
    step = jax.jit(train, donate_argnums=(0, 1), out_shardings=(replicated, shardings, opt_shardings))
    compiled = step.lower(abstract, opt_abstract, tokens).compile()
    ma = compiled.memory_analysis()
    peak = (ma.generated_code_size_in_bytes + ma.argument_size_in_bytes + ma.output_size_in_bytes
            - ma.alias_size_in_bytes + ma.temp_size_in_bytes)
    return peak, program_flops(compiled, compiled.as_text())[0], ma.generated_code_size_in_bytes


@pytest.mark.slow
def test_the_saved_llama3_8b_answer_compiles_again_as_plain_jax_checkpoint():
    """The saved llama3-8b synthesis (JAX 0.12.0.1, its own command rerun on 2026-12-04: 46 compiles,
    2,577 s) repeated by a plain training step compiled for 8 x H100 (fsdp=8). Its answer is a named
    policy, nnx.remat's default (13 per device, batch 104: no synthesized plan fits more, and the
    refinement equals it); MaxText's qkv_proj_offloaded fits 12 (read from the file only). The
    answer is compiled as a plain ``jax.checkpoint`` (nothing_saveable) at its batch: the lab's peak
    within XLA's generated code of the plain one and within the budget. The file's ``plan`` and
    ``run_command`` are the solver's candidate's, as the synthesizer wrote them before issue 45's
    fix; they are not read here. Under JAX 0.10 the two peaks were equal to the byte (an H100
    compile has no generated code); under 0.12, before cuDNN's library was installed, the plain
    step held 489,472 B more at batch 104 (0.0008 %), not explained; with cuDNN they are equal to
    the byte again (2026-12-05): ``GAP`` still allows 1 MiB. Since cuDNN's library is installed
    (issue 47) a deviceless H100 compile of flash attention is cuDNN's fused kernel, not the chunked
    stand-in the file was searched with: the plain program now peaks 204,035,840 B (0.3 %) above
    the file's figure, so the lab's peak is compiled again and held against the plain one, the
    file's answer against the budget.

    Two compiles, not four: qkv_proj_offloaded's plain and lab compiles (each about as slow as the
    answer's: a 2-layer, width-256 llm's for 8 H100s took 12 s against 14 s) only repeated, for a
    second policy, what is checked at small size: a lab policy that offloads names to pinned host
    memory peaks exactly as plain ``jax.checkpoint`` with ``save_and_offload_only_these_names`` on
    the same compile-only H100 (tests/test_synthesize.py's H100 test, whose answer offloads a
    name), and XLA puts what is offloaded in host memory (tests/test_targets.py's offload test)."""
    doc = json.loads(SAVED.read_text())
    cfg = {k: v for k, v in doc["config"].items() if k != "input_shape"}
    assert (cfg["preset"], cfg["target"], cfg["mesh"], cfg["step"]) == (
        "llama3-8b", "h100", "fsdp=8", "train")
    assert doc["answer"] == doc["best_named"]["policy"] == "nnx_remat_default"
    assert doc["refine"]["outcome"] == "equals" and doc["per_device_batch"] == 13
    named = {r["policy"]: r for r in doc["named"]}
    assert named["qkv_proj_offloaded"]["per_device_batch"] == 12

    config = RunConfig(**{**cfg, "batch": doc["max_batch"]})
    peak, flops, code = _plain_train_step(config, jax.checkpoint_policies.nothing_saveable)
    lab = probe(config.replace(policy=doc["answer"]))["peak_bytes"]
    assert abs(lab - peak) <= code + GAP, (lab, peak, code)
    assert peak <= doc["budget_bytes"]
    # (the file's flops predate the count of data-dependent loops, issue 45: not compared here)
    assert flops > doc["flops"]

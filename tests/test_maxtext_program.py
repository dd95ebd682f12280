"""MaxText's program where the published runs depend on it: its vocabulary loss (``num_vocab_tiling``
1) against plain ``jax.numpy``, what XLA makes of it on a TPU, and the ``decoder_layer_input`` name."""

from __future__ import annotations

import glob
import shutil
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat_lab.analysis.dissect import dissect
from remat_lab.config import RunConfig, names_of
from remat_lab.model.llm import IGNORE, cross_entropy_with_logits, next_token_loss
from remat_lab.program.step import build_problem, jit_step, problem_for

F32_TOL = 8 * float(jnp.finfo(jnp.float32).eps)  # a few float32 roundings of values near 1


def _plain_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """The mean next-token cross-entropy in plain jax.numpy: log_softmax, the label's entry picked."""
    lf = logits[:, :-1].astype(jnp.float32)
    logp = jax.nn.log_softmax(lf, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def _case(dtype, b=3, n=7, v=11, seed=0):
    k1, k2 = jax.random.split(jax.random.key(seed))
    logits = (4 * jax.random.normal(k1, (b, n, v), jnp.float32)).astype(dtype)
    return logits, jax.random.randint(k2, (b, n), 0, v)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_the_loss_and_its_gradient_are_the_plain_cross_entropys(dtype):
    """The value in float32 either way (bfloat16 logits are cast exactly); the custom gradient
    ``softmax - one_hot`` against autodiff of the plain loss, rounded once to the logits' dtype."""
    logits, tokens = _case(dtype)
    ours, plain = next_token_loss(logits, tokens), _plain_loss(logits, tokens)
    assert ours.dtype == jnp.float32
    np.testing.assert_allclose(ours, plain, rtol=F32_TOL)
    g_ours = jax.grad(next_token_loss)(logits, tokens).astype(jnp.float32)
    g_plain = jax.grad(_plain_loss)(logits, tokens).astype(jnp.float32)
    ulp = 2.0 ** -8 if dtype == jnp.bfloat16 else F32_TOL  # bfloat16: one rounding of each entry
    scale = float(jnp.max(jnp.abs(g_plain)))
    np.testing.assert_allclose(g_ours, g_plain, atol=ulp * scale)
    assert float(jnp.max(jnp.abs(g_ours[:, -1]))) == 0.0  # the last position has no label


def test_cross_entropy_with_logits_is_minus_the_labels_log_probability():
    logits, tokens = _case(jnp.float32, seed=1)
    one_hot = jax.nn.one_hot(tokens, logits.shape[-1])
    ce = cross_entropy_with_logits(logits, one_hot)
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(ce, -picked, rtol=F32_TOL, atol=F32_TOL)
    # IGNORE's one-hot row is all zeros: no loss and no gradient at that position
    ignored = jax.nn.one_hot(jnp.full(tokens.shape, IGNORE), logits.shape[-1])
    assert float(jnp.max(jnp.abs(cross_entropy_with_logits(logits, ignored)))) == 0.0


# --- what XLA makes of it on a TPU (libtpu, compile-only) ------------------------------------------

def _tpu_compile(cfg: RunConfig):
    problem = problem_for(cfg)
    lowered = jit_step(problem).trace(*problem.args).lower()
    folder = tempfile.mkdtemp()
    try:
        compiled = lowered.compile(compiler_options={"xla_dump_to": folder})
        report = open(glob.glob(folder + "/*memory-usage-report.txt")[0]).read()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return compiled.memory_analysis(), report


TPU_LLM = dict(model="llm", width=128, heads=2, kv_heads=1, dtype="bfloat16", param_dtype="float32",
               step="train", policy="full", loss_chunks=1, target="tpu-v6e", compile_only=True)


def test_on_a_tpu_the_step_holds_one_logits_sized_buffer():
    """MaxText's compiled step holds the logits (bfloat16) and no other buffer of their size: XLA
    fuses the float32 cross-entropy's gradient into the vocabulary projection's two backward
    products (measured at llama3-8b scale: MaxText 0.2.5 and the lab agree to 0.1 %, README). With
    constant loss weights XLA writes that gradient out: a second logits-sized buffer."""
    # b x n = 512 > 2 x width: the bfloat16 logits outweigh each float32 vocabulary-sized table (at 256
    # they tie); the float32 attention scores (2 heads) are half their size
    b, n, v = 8, 64, 1024
    _, report = _tpu_compile(RunConfig(**TPU_LLM, vocab=v, depth=1, seq=n, batch=b))
    logits_bytes = b * n * v * 2
    sizes = [_bytes(line.split(";")[1]) for line in report.splitlines() if line.count(";") >= 4
             and "%)" in line]
    assert len([s for s in sizes if s >= logits_bytes]) == 1, report[:2000]
    assert f"bf16[{b},{n},{v}]" in report and f"f32[{b},{n},{v}]" not in report


def _bytes(text: str) -> float:
    """A memory-usage report's size ("64.00MiB", "32B") in bytes."""
    text = text.strip()
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10), ("B", 1)):
        if text.endswith(unit):
            return float(text[: -len(unit)]) * scale
    raise ValueError(text)


def test_decoder_layer_input_names_each_blocks_input_and_a_policy_can_offload_it():
    """The name is in the traced step (inside the scanned block); a custom policy offloading it
    moves every layer's input to the TPU's pinned host memory: the compiled program's host
    temporaries are exactly depth x batch x seq x width in the dtype."""
    assert names_of("llm")[1] == "decoder_layer_input"
    small = RunConfig(model="llm", vocab=256, width=64, depth=2, heads=4, kv_heads=2, seq=16, batch=2,
                      policy="custom", offload_names=("decoder_layer_input",))
    problem = build_problem(small)
    assert "name=decoder_layer_input" in str(jax.make_jaxpr(problem.loss)(*problem.args))
    rows = {r["name"]: r for r in dissect(problem, "").residuals if r["name"]}
    assert rows["decoder_layer_input"]["memory_kind"] == "host"
    saved = dissect(build_problem(small.replace(offload_names=(), save_names=("decoder_layer_input",))),
                    "").residuals
    named = {r["name"]: r["memory_kind"] for r in saved if r["name"]}
    assert named["decoder_layer_input"] == "device"
    assert set(named) <= {"decoder_layer_input", "embed", "logits"}  # no other block name saved
    depth, b, n, width = 2, 2, 32, 128
    base = RunConfig(**TPU_LLM, vocab=256, depth=depth, seq=n, batch=b)
    full, _ = _tpu_compile(base)
    off, _ = _tpu_compile(base.replace(policy="custom", offload_names=("decoder_layer_input",)))
    assert full.host_temp_size_in_bytes == 0
    assert off.host_temp_size_in_bytes == depth * b * n * width * 2

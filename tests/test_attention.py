"""The llm's attention kernels: chunked equals full (loss and gradients), compiles to a fraction of
full's memory, keeps the checkpoint names; flash picks the target's fused kernel or says why not."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from remat_lab.analysis import hlotext, kernel_flops
from remat_lab.analysis.gradcheck import UNIT_ROUNDOFF, check_gradients
from remat_lab.config import ConfigError, RunConfig
from remat_lab.model.attention import full_attention, select, splash_attention
from remat_lab.program import mesh as sharding
from remat_lab.program.step import (
    build_problem,
    jit_program,
    jit_step,
    make_step,
    model_report,
    problem_for,
    program_args,
)
from remat_lab.program.targets import target_devices

SMALL = dict(model="llm", vocab=512, width=64, depth=2, heads=4, kv_heads=2, batch=2,
             policy="nothing_saveable")
ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=16)
def _run(cfg: RunConfig):
    """(loss, gradients as float64, problem, traced jaxpr) of the real gradient step."""
    problem = build_problem(cfg)
    step = jit_step(problem)
    loss, grads = step(*problem.args)
    return float(loss), [np.asarray(g, np.float64) for g in grads], problem, step.trace(*problem.args).jaxpr


def _rtol(cfg: RunConfig) -> float:
    """4 u sqrt(K), per leaf norm-wise: K the longest reduction of attention and the projections
    (float32: ~2e-6; bfloat16: chunked rounds each block's probabilities to the dtype and adds the
    blocks in float32, full rounds the normalized ones: the same size of rounding, elsewhere)."""
    return 4 * UNIT_ROUNDOFF[cfg.dtype] * math.sqrt(max(cfg.seq, cfg.width))


@pytest.mark.parametrize("dtype,seq,block", [("float32", 32, 16), ("float32", 30, 16),
                                             ("float32", 24, 64), ("bfloat16", 40, 16)],
                         ids=["f32-2-blocks", "f32-padded", "f32-one-block", "bf16-padded"])
def test_chunked_equals_full(dtype, seq, block):
    full = RunConfig(**SMALL, dtype=dtype, seq=seq)
    chunked = full.replace(attention="chunked", attention_block=block)
    loss, grads, problem, _ = _run(full)
    c_loss, c_grads, _, _ = _run(chunked)
    rtol = _rtol(full)
    assert abs(c_loss - loss) <= rtol * abs(loss), (c_loss, loss)
    for path, g, c in zip(problem.paths, grads, c_grads):
        err = np.linalg.norm(c - g) / np.linalg.norm(g)
        assert err <= rtol, (path, err, rtol)


@pytest.mark.parametrize("changes", [dict(attention="chunked", attention_block=16),
                                     dict(attention="flash", dtype="bfloat16", policy="save_qkv_proj")],
                         ids=["chunked-f32", "flash-fallback-bf16"])
def test_the_gradient_check_passes_with_every_kernel(changes):
    loss, grads, problem, jaxpr = _run(RunConfig(**{**SMALL, "seq": 48, **changes}))
    check = check_gradients(problem, grads, loss, jaxpr)
    assert check["ok"], check["failures"]


def test_chunked_compiles_under_half_of_full():
    """seq 2048: full's (B, G, R, N, N) float32 scores dominate; chunked holds (blk x blk) blocks."""
    base = dict(model="llm", width=256, heads=4, depth=2, vocab=512, batch=2, seq=2048,
                compile_only=True, policy="nothing_saveable")
    temp, texts = {}, {}
    for attention in ("full", "chunked"):
        problem = problem_for(RunConfig(**base, attention=attention))
        compiled = jit_program(problem).lower(*program_args(problem)).compile()
        temp[attention], texts[attention] = compiled.memory_analysis().temp_size_in_bytes, compiled.as_text()
    assert temp["chunked"] < temp["full"] / 2, temp
    square = re.compile(r"f32\[[\d,]*2048,2048\]")  # the independent check: the HLO's own shapes
    assert square.search(texts["full"]) and not square.search(texts["chunked"])


def test_names_stay_and_saving_context_keeps_the_kernel_forward():
    """``context`` tags the output (and, in the forward rule, the log-sum-exp): a policy saving it
    leaves the backward pass with the kernel's backward loop only, as no_remat."""
    base = RunConfig(**{**SMALL, "depth": 1, "seq": 64, "attention": "chunked", "attention_block": 16})
    loops = {}
    for policy in (dict(policy="no_remat"), dict(policy="custom", save_names=("context",)),
                   dict(policy="nothing_saveable")):
        problem = problem_for(base.replace(compile_only=True, **policy))
        text = str(jax.make_jaxpr(make_step(problem))(*problem.args))
        assert "name=context" in text and "name=query_proj" in text
        loops[policy["policy"]] = text.count("while[")
    assert loops["custom"] == loops["no_remat"] < loops["nothing_saveable"], loops


def test_flash_on_this_cpu_is_chunked_and_says_so():
    cfg = RunConfig(**SMALL, seq=32, attention="flash")
    used = model_report(build_problem(cfg))["attention_used"]
    assert used.startswith("chunked") and "in place of flash" in used and "cpu" in used
    assert model_report(build_problem(cfg.replace(attention="full")))["attention_used"].startswith("full")


def test_splash_matches_full_in_pallas_interpret_mode():
    """The splash wrapper's layout, scale and grouped heads, run by Pallas' interpreter on CPU."""
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (1, 128, 4, 128))
    k, v = (jax.random.normal(key, (1, 128, 2, 128)) for key in keys[1:])
    loss = lambda fn: (lambda *a: jnp.sum(fn(*a) ** 2))
    got = jax.value_and_grad(loss(functools.partial(splash_attention, interpret=True)), (0, 1, 2))(q, k, v)
    want = jax.value_and_grad(loss(full_attention), (0, 1, 2))(q, k, v)
    rtol = 8 * UNIT_ROUNDOFF["float32"] * math.sqrt(128)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert float(jnp.linalg.norm(a - b)) <= rtol * float(jnp.linalg.norm(b))


def _grad_compile(attention, shape_q, shape_kv, sharding_):
    q = jax.ShapeDtypeStruct(shape_q, jnp.bfloat16, sharding=sharding_)
    kv = jax.ShapeDtypeStruct(shape_kv, jnp.bfloat16, sharding=sharding_)
    fn = jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v).astype(jnp.float32)), argnums=(0, 1, 2))
    return jax.jit(fn).lower(q, kv, kv).compile()


def test_flash_is_pallas_splash_on_a_tpu_and_compiles_deviceless():
    one = jax.sharding.SingleDeviceSharding(target_devices("tpu-v5e", 1)[0])
    shape_q, shape_kv = (1, 512, 2, 128), (1, 512, 1, 128)
    flash = select("flash", 512, "tpu", shape_q, shape_kv, "bfloat16")
    assert flash.used == "splash" and not flash.note
    assert "tpu_custom_call" in _grad_compile(flash, shape_q, shape_kv, one).as_text()
    assert "tpu_custom_call" not in _grad_compile(full_attention, shape_q, shape_kv, one).as_text()
    assert select("flash", 512, "tpu", (1, 200, 2, 128), (1, 200, 1, 128), "bfloat16").used == "chunked"


def test_splash_runs_per_device_on_a_mesh():
    mesh = sharding.build_mesh("data=2,tensor=2", target_devices("tpu-v5e", 4))
    spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None, "tensor", None))
    shape_q, shape_kv = (4, 256, 4, 128), (4, 256, 2, 128)
    flash = select("flash", 512, "tpu", shape_q, shape_kv, "bfloat16", mesh, "data", "tensor")
    text = _grad_compile(flash, shape_q, shape_kv, spec).as_text()
    assert "tpu_custom_call" in text and "all-gather" not in text  # one device's batch and heads
    assert re.search(r"bf16\[2,2,256,128\]", text)  # (batch / 2, heads / 2, seq, head) per device


def test_flash_on_a_gpu_target_is_cudnn_or_names_why_not():
    """cuDNN's fused attention where jax can trace it (it reads the cuDNN library's version), else
    chunked with the reason; either compiles for the H100 without the device."""
    shape_q, shape_kv = (2, 1024, 4, 64), (2, 1024, 2, 64)
    flash = select("flash", 512, "cuda", shape_q, shape_kv, "bfloat16")
    text = _grad_compile(flash, shape_q, shape_kv,
                         jax.sharding.SingleDeviceSharding(target_devices("h100", 1)[0])).as_text()
    if flash.used == "cudnn":
        assert "__cudnn$fmha" in text
        # the program as this JAX writes it: causal calls counted as half the square (a causal mask
        # written '"mask_type": "CAUSAL"' was missed, every causal call counted as the whole square)
        calls = [ins for _, ins in hlotext.instructions(hlotext.joined(text))
                 if kernel_flops.is_cudnn_attention(ins)]
        (b, t, h, d) = shape_q
        square = 4 * b * h * t * t * d
        for ins in calls:
            back = "backward" in hlotext.call_target(ins.rest).lower()
            want = square / 2 * (kernel_flops.CUDNN_BACKWARD_FACTOR if back else 1)
            assert kernel_flops.cudnn_flops(ins) == want
        assert {"backward" in hlotext.call_target(i.rest).lower() for i in calls} == {True, False}
    else:
        assert flash.used == "chunked" and "cuDNN" in flash.note and "__cudnn" not in text


def test_only_the_llm_takes_other_attention_or_loss_chunks():
    with pytest.raises(ConfigError, match="the llm's"):
        RunConfig(model="transformer", attention="chunked")
    with pytest.raises(ConfigError, match="the llm's"):
        RunConfig(loss_chunks=2)
    with pytest.raises(ConfigError, match="attention_block"):
        RunConfig(model="llm", attention="chunked", attention_block=8)


def test_the_sidebar_reads_and_writes_the_attention_settings():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / "guide.py"), default_timeout=300)
    for key, value in dict(model="llm", seq="64", batch="1", attention="chunked",
                           attention_block="256", loss_chunks="4").items():
        at.query_params[key] = value
    at.run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert at.selectbox(key="attention").value == "chunked"
    assert at.number_input(key="attention_block").value == 256
    assert at.number_input(key="loss_chunks").value == 4
    assert (at.query_params["attention"], at.query_params["loss_chunks"]) == ("chunked", "4")

"""The chunked vocabulary loss: the same loss and gradients as the whole logits, one chunk's logits
live (compiled memory, the HLO's shapes, logits_bytes, the estimate), presets' default, the flags."""

from __future__ import annotations

import functools
import math
import re
import shlex

import numpy as np
import pytest

from remat_lab.analysis.gradcheck import UNIT_ROUNDOFF, check_gradients
from remat_lab.cli import build_parser
from remat_lab.cli.common import config_from
from remat_lab.config import PRESETS, RunConfig, estimate_bytes
from remat_lab.present.reproduce import cli_command
from remat_lab.program.step import (
    build_problem,
    jit_program,
    jit_step,
    logits_bytes,
    problem_for,
    program_args,
)

SMALL = dict(model="llm", vocab=512, width=64, depth=2, heads=4, kv_heads=2, batch=2,
             policy="nothing_saveable")


@functools.lru_cache(maxsize=16)
def _run(cfg: RunConfig):
    problem = build_problem(cfg)
    step = jit_step(problem)
    loss, grads = step(*problem.args)
    return float(loss), [np.asarray(g, np.float64) for g in grads], problem, step.trace(*problem.args).jaxpr


@pytest.mark.parametrize("dtype,seq,chunks", [("float32", 32, 4), ("float32", 30, 4), ("float32", 8, 16),
                                              ("bfloat16", 32, 8)],
                         ids=["f32-even", "f32-padded", "f32-more-chunks-than-tokens", "bf16"])
def test_chunked_loss_equals_the_whole_one(dtype, seq, chunks):
    whole = RunConfig(**SMALL, dtype=dtype, seq=seq)
    loss, grads, problem, _ = _run(whole)
    c_loss, c_grads, _, _ = _run(whole.replace(loss_chunks=chunks))
    # 4 u sqrt(K), K the vocabulary (the log-sum-exp's reduction): the chunks add the same float32
    # terms in another order; in bfloat16 each chunk's logits round as the whole ones do.
    rtol = 4 * UNIT_ROUNDOFF[dtype] * math.sqrt(whole.vocab)
    assert abs(c_loss - loss) <= 4 * UNIT_ROUNDOFF["float32"] * seq * abs(loss), (c_loss, loss)
    for path, g, c in zip(problem.paths, grads, c_grads):
        assert np.linalg.norm(c - g) <= rtol * np.linalg.norm(g), path


@pytest.mark.parametrize("changes", [dict(loss_chunks=3), dict(loss_chunks=4, dtype="bfloat16",
                                                                attention="chunked", attention_block=16)],
                         ids=["f32", "bf16-chunked-attention"])
def test_the_gradient_check_passes(changes):
    loss, grads, problem, jaxpr = _run(RunConfig(**{**SMALL, "seq": 32, **changes}))
    assert "name=logits" in str(jaxpr)  # each chunk's logits keep the name
    check = check_gradients(problem, grads, loss, jaxpr)
    assert check["ok"], check["failures"]


@pytest.mark.parametrize("seq,chunks", [(32, 4), (30, 4), (8, 16)])
def test_the_reference_s_chunked_loss_is_the_whole_one_in_float32(seq, chunks):
    """The gradient check's reference takes the loss in the model's slices (their rounding points in
    bfloat16); in float32 that is the whole loss up to the order of float32 sums."""
    import jax

    from remat_lab.analysis.reference_llm import llm_loss_and_abs

    problem = build_problem(RunConfig(**SMALL, seq=seq))
    params = {p: np.asarray(v, np.float32) for p, v in zip(problem.paths, problem.leaves)}
    tokens = np.asarray(problem.x)
    run = jax.jit(jax.value_and_grad(llm_loss_and_abs, has_aux=True), static_argnums=(2, 3))
    (loss, _), grads = run(params, tokens, SMALL["depth"], 1)
    (c_loss, c_abs), c_grads = run(params, tokens, SMALL["depth"], chunks)
    rtol = 4 * UNIT_ROUNDOFF["float32"] * math.sqrt(SMALL["vocab"] * seq)
    assert abs(float(c_loss) - float(loss)) <= rtol * abs(float(loss))
    assert float(c_abs) == float(c_loss)  # ce >= 0: the mean |ce| is the loss
    for path in problem.paths:
        g, c = np.asarray(grads[path], np.float64), np.asarray(c_grads[path], np.float64)
        assert np.linalg.norm(c - g) <= rtol * np.linalg.norm(g), path


def test_only_one_chunks_logits_are_live():
    base = RunConfig(model="llm", width=64, heads=4, depth=1, vocab=8192, batch=2, seq=512,
                     compile_only=True, policy="nothing_saveable")
    temp, texts = {}, {}
    for chunks in (1, 8):
        problem = problem_for(base.replace(loss_chunks=chunks))
        compiled = jit_program(problem).lower(*program_args(problem)).compile()
        temp[chunks], texts[chunks] = compiled.memory_analysis().temp_size_in_bytes, compiled.as_text()
    whole_f32 = 2 * 512 * 8192 * 4
    assert temp[1] - temp[8] > whole_f32 / 2, temp  # at least half the float32 logits gone
    assert re.search(r"f32\[2,512,8192\]", texts[1]) and not re.search(r"\[2,512,8192\]", texts[8])
    assert re.search(r"f32\[2,64,8192\]", texts[8])  # one chunk: 512 / 8 tokens
    assert logits_bytes(base.replace(loss_chunks=8)) * 8 == logits_bytes(base) == 2 * 512 * 8192 * 4
    whole, chunked = (estimate_bytes(base.replace(loss_chunks=c, compile_only=False)) for c in (1, 8))
    assert whole - chunked >= 7 / 8 * 2 * 512 * 8192 * (2 * 4 + 8)  # the estimate's logits term


def test_presets_choose_8_where_the_logits_are_large_and_flags_override():
    parse = build_parser().parse_args
    for name, preset in PRESETS.items():
        want = 8 if preset["seq"] * preset["vocab"] > 2**27 else 1
        assert RunConfig.from_preset(name).loss_chunks == preset["loss_chunks"] == want, name
    assert config_from(parse(["run", "--preset", "llama3-8b"])).loss_chunks == 8
    cfg = config_from(parse(["run", "--preset", "llama3-8b", "--loss-chunks", "1", "--attention",
                             "flash", "--attention-block", "256"]))
    assert (cfg.loss_chunks, cfg.attention, cfg.attention_block) == (1, "flash", 256)
    assert cfg.preset_overrides["loss_chunks"] == (8, 1)
    again = config_from(parse(shlex.split(cli_command(cfg))[3:]))
    assert again == cfg.replace(warmup=again.warmup, seed=again.seed)  # the printed command reproduces
    assert "--loss-chunks 1" in cli_command(cfg) and "--attention flash" in cli_command(cfg)
    assert "--attention" not in cli_command(cfg.replace(attention="full", attention_block=512))


def test_the_run_document_names_the_kernel_and_dissects_padded_chunks():
    from remat_lab.studies.experiment import run_experiment

    cfg = RunConfig(**{**SMALL, "seq": 40, "attention": "chunked", "attention_block": 16,
                       "loss_chunks": 3, "compile_only": True, "policy": "minimal"})
    doc = run_experiment(cfg, timing=False)
    assert doc["model"]["attention_used"] == "chunked (block 16)"
    assert doc["residuals"] and doc["memory"]["peak_bytes"] > 0

"""The decoder LM: loss and gradients against the plain-jax.numpy reference, the loss at init, the
training step's memory (optimizer state, donation), microbatches, compile-only at 8B, the flags."""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from remat_lab.analysis.costs import memory_report
from remat_lab.analysis.gradcheck import UNIT_ROUNDOFF, check_gradients
from remat_lab.cli import build_parser
from remat_lab.cli.common import config_from
from remat_lab.config import APP_DEFAULT, ConfigError, RunConfig, names_of, optimizer_state_bytes
from remat_lab.program.step import (
    build_problem,
    jit_program,
    jit_step,
    model_report,
    program_args,
)

SMALL = dict(model="llm", vocab=512, width=128, depth=2, heads=4, kv_heads=2, seq=32, batch=4,
             policy="minimal")


@functools.cache  # SMALL (scan-gqa, vocab 512) is traced, compiled and run once for the module
def _run(cfg: RunConfig):
    problem = build_problem(cfg)
    step = jit_step(problem)
    traced = step.trace(*problem.args)
    loss, grads = step(*problem.args)
    return problem, loss, grads, traced.jaxpr


@pytest.mark.parametrize("changes", [
    dict(stack="scan"),
    dict(stack="loop", tie_embeddings=True, policy="nothing_saveable"),
    dict(depth=1, kv_heads=4, policy="no_remat"),
    dict(dtype="bfloat16", policy="save_qkv_proj"),
], ids=["scan-gqa", "loop-tied", "one-block-mha", "bf16"])
def test_loss_and_gradients_match_the_reference(changes):
    problem, loss, grads, jaxpr = _run(RunConfig(**{**SMALL, **changes}))
    check = check_gradients(problem, grads, loss, jaxpr)
    assert check["ok"], check["failures"]
    assert check["loss_err"] <= 4 * UNIT_ROUNDOFF[problem.config.dtype] * float(loss)


def test_the_check_catches_a_one_percent_error():
    problem, loss, grads, jaxpr = _run(RunConfig(**SMALL))
    i = problem.paths.index("layers.blocks.k_proj.kernel")
    bad = [g * 1.01 if j == i else g for j, g in enumerate(grads)]
    check = check_gradients(problem, bad, loss, jaxpr)
    assert not check["ok"] and any("k_proj" in f for f in check["failures"])
    assert not check_gradients(problem, grads, loss * 1.01, jaxpr)["ok"]


def test_loss_at_init_is_close_to_ln_vocab():
    for vocab in (512, 4096):
        _, loss, _, _ = _run(RunConfig(**{**SMALL, "vocab": vocab}))
        assert abs(float(loss) - math.log(vocab)) < 0.05 * math.log(vocab), (vocab, float(loss))


def test_checkpoint_names_are_in_the_catalog():
    problem = build_problem(RunConfig(**SMALL))
    text = str(jax.make_jaxpr(problem.loss)(*problem.args))
    for name in names_of("llm"):
        assert f"name={name}" in text, name


def _memory(cfg: RunConfig) -> dict:
    problem = build_problem(cfg)
    return memory_report(jit_program(problem).lower(*program_args(problem)).compile())


def test_the_training_step_holds_the_optimizer_state_and_donates():
    grad = RunConfig(**SMALL)
    train = grad.replace(step="train")
    g, t = _memory(grad), _memory(train)
    opt = optimizer_state_bytes(train)
    report = model_report(build_problem(train))
    assert opt == 2 * report["parameter_bytes"]
    assert 0 <= report["optimizer_state_bytes"] - opt <= 8  # adamw's step count
    # The state is in the training program's arguments (and, donated, its outputs).
    assert t["argument_bytes"] - g["argument_bytes"] >= opt
    # Its peak grows by the state less what the gradient step's output gradients cost: in the
    # training step they are temporaries that the fused update consumes (measured on XLA CPU at
    # this size: +4.72 MB for 4.99 MB of state and 2.49 MB of gradients).
    assert t["peak_bytes"] - g["peak_bytes"] >= opt - report["parameter_bytes"]
    assert t["peak_bytes"] > g["peak_bytes"] + opt // 2
    # parameters and optimizer state are donated: the outputs reuse their buffers
    assert t["alias_bytes"] >= report["parameter_bytes"] + opt
    assert g["alias_bytes"] == 0


def test_the_training_step_runs_and_lowers_the_loss():
    problem = build_problem(RunConfig(**{**SMALL, "step": "train"}))
    step = jit_program(problem)
    leaves, state, x = program_args(problem)
    losses = []
    for _ in range(3):
        loss, leaves, state = step(leaves, state, x)
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    assert all(not a.is_deleted() for a in problem.leaves)  # the cached parameters were copied


def test_microbatches_give_the_same_loss_and_gradients_in_less_memory():
    one = RunConfig(**{**SMALL, "batch": 16})
    four = one.replace(microbatches=4)
    p1, l1, g1, _ = _run(one)
    p4, l4, g4, _ = _run(four)
    assert abs(float(l1) - float(l4)) <= 1e-5 * float(l1)
    for path, a, b in zip(p1.paths, g1, g4):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.max(np.abs(a - b)) <= 1e-4 * np.max(np.abs(a)), path
    m1, m4 = _memory(one), _memory(four)
    assert m4["peak_bytes"] < m1["peak_bytes"], (m4["peak_bytes"], m1["peak_bytes"])


def test_microbatched_gradients_of_the_summed_models_add_up():
    cfg = RunConfig(model="transformer", width=32, heads=2, seq=8, batch=8, depth=2)
    _, l1, g1, _ = _run(cfg)
    _, l2, g2, _ = _run(cfg.replace(microbatches=2))
    assert abs(float(l1) - float(l2)) <= 1e-5 * abs(float(l1))
    for a, b in zip(g1, g2):
        assert np.allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(a))))


@pytest.mark.parametrize("changes, message", [
    (dict(kv_heads=3), "not divisible by kv_heads"),
    (dict(microbatches=3), "microbatches"),
    (dict(seq=1), "seq of 2"),
    (dict(step="train", objective="grad"), "step train"),
    (dict(width=130, heads=4), "head_dim"),
    (dict(head_dim=33), "odd"),
    (dict(tie_embeddings=1), "true or false"),
    (dict(param_dtype="float16"), "param_dtype"),
])
def test_bad_llm_settings_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        RunConfig(**{**SMALL, **changes})


def test_defaults_keep_the_existing_models():
    cfg = RunConfig()
    assert (cfg.step, cfg.microbatches, cfg.param_dtype_used, cfg.compile_only, cfg.preset) == (
        "grad", 1, cfg.dtype, False, "")
    with pytest.raises(ConfigError, match="only for the llm"):
        RunConfig(param_dtype="bfloat16")


def test_flags_fill_the_configuration():
    parse = build_parser().parse_args
    cfg = config_from(parse(["run", "--preset", "llama3.2-1b", "--seq", "128", "--batch", "2",
                             "--step", "train", "--microbatches", "2", "--compile-only",
                             "--param-dtype", "float32", "--dtype", "bfloat16", "--depth", "4"]))
    assert (cfg.model, cfg.width, cfg.depth, cfg.seq, cfg.kv_heads, cfg.tie_embeddings) == (
        "llm", 2048, 4, 128, 8, True)
    assert (cfg.step, cfg.microbatches, cfg.compile_only, cfg.param_dtype) == (
        "train", 2, True, "float32")
    cfg = config_from(parse(["run", "--model", "llm", "--vocab", "1000", "--kv-heads", "2",
                             "--mlp-dim", "96", "--no-tie-embeddings", "--width", "64"]))
    assert (cfg.vocab, cfg.kv_heads, cfg.mlp_dim, cfg.tie_embeddings) == (1000, 2, 96, False)
    assert config_from(parse(["run"])) == APP_DEFAULT  # the app's opening configuration


def test_cli_compile_only_gives_the_run_document_without_running():
    out = subprocess.run([sys.executable, "-m", "remat_lab", "run", "--preset", "llama3.2-1b",
                          "--seq", "32", "--batch", "1", "--depth", "2", "--step", "train",
                          "--compile-only", "--no-cache", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["config"]["preset"] == "llama3.2-1b" and doc["timing"]["measured"] is False
    assert doc["step_time_s"] is None and doc["gradient_check"]["ok"] is None
    kinds = doc["memory"]["by_kind"]
    assert kinds["optimizer_state"] == doc["model"]["optimizer_state_bytes"] > 0
    assert sum(v for k, v in kinds.items() if k != "method") == doc["memory"]["peak_bytes"]
    assert doc["dots"] and doc["hlo"]  # the compiled dissection of the gradient step
    # 2 of 16 blocks: embedding (tied) + 2 blocks + final norm
    assert doc["model"]["parameters"] == 128256 * 2048 + 2 * 60821504 + 2048
    assert doc["memory"]["alias_bytes"] >= doc["model"]["parameter_bytes"]


RSS_SCRIPT = """
import os, sys, time
def rss(): return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
from remat_lab.config import RunConfig
from remat_lab.program.step import jit_program, model_report, problem_for, program_args
import jax; jax.devices()
cfg = RunConfig.from_preset('llama3-8b', seq=256, batch=1, step='train', policy='minimal',
                            compile_only=True, dtype='bfloat16', param_dtype='bfloat16',
                            optimizer_dtype='bfloat16')
before = rss()
p = problem_for(cfg)
compiled = jit_program(p).lower(*program_args(p)).compile()
m = compiled.memory_analysis()
print(rss() - before, model_report(p)['parameter_bytes'], m.argument_size_in_bytes)
"""


def test_an_8b_model_compiles_without_allocating():
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT], capture_output=True, text=True,
                         timeout=900, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    growth, param_bytes, argument_bytes = map(int, out.stdout.split()[-3:])
    assert param_bytes == 8030261248 * 2  # bfloat16
    assert argument_bytes > 3 * param_bytes  # parameters + adamw's two moments, in the program
    assert growth < param_bytes / 16, (growth, param_bytes)  # < 1 GB for 16 GB of parameters

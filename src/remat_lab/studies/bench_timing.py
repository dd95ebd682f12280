"""Timing fidelity and call overhead: the engine's step against bare loops on one compiled executable."""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import numpy as np

from remat_lab.analysis.roofline import xla_cost
from remat_lab.config import RunConfig
from remat_lab.program.step import build_problem, make_step
from remat_lab.program.timing import step_time_summary, time_executable


def compile_step(config: RunConfig):
    """The step compiled as ``run_experiment`` compiles it; (compiled, args, problem)."""
    problem = build_problem(config)
    compiled = jax.jit(make_step(problem)).trace(*problem.args).lower().compile()
    return compiled, problem.args, problem


def bare_loop(fn: Callable, args: tuple, *, warmup: int, repeats: int) -> np.ndarray:
    """The reference loop: ``fn(*args)`` + ``block_until_ready``, nothing else."""
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    out = np.empty(repeats)
    clock = time.perf_counter
    for i in range(repeats):
        t0 = clock()
        jax.block_until_ready(fn(*args))
        out[i] = clock() - t0
    return out


def interleave(contenders: dict[str, Callable[[], np.ndarray]], rounds: int) -> dict[str, np.ndarray]:
    """Run each contender once per round, rotating the order; all samples per contender."""
    names = list(contenders)
    samples: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(contenders[name]())
    return {n: np.concatenate(s) for n, s in samples.items()}


def fidelity(config: RunConfig, *, rounds: int, repeats: int) -> dict:
    """Engine-reported median vs bare-loop median on one compiled executable."""
    compiled, args, _ = compile_step(config)
    warmup = max(config.warmup, 1)
    got = interleave({
        "engine": lambda: time_executable(compiled, args, warmup=warmup, repeats=repeats),
        "bare": lambda: bare_loop(compiled, args, warmup=warmup, repeats=repeats),
    }, rounds)
    engine = step_time_summary(got["engine"], warmup)["median"]
    bare = float(np.median(got["bare"]))
    cost = xla_cost(compiled)
    flops = cost["flops"]
    return {"config": {"width": config.width, "batch": config.batch, "policy": config.policy},
            "engine_median_s": engine, "bare_median_s": bare, "ratio": engine / bare,
            "rounds": rounds, "repeats": repeats, "flops": flops,
            "bytes_accessed": cost["bytes_accessed"],
            "achieved_flops_per_s": flops / engine if flops else None}


def overhead(config: RunConfig, *, rounds: int, repeats: int) -> dict:
    """Per-call time: engine step, bare compiled call, jax.jit on nnx.State, nnx.jit on module."""
    from flax import nnx

    compiled, args, problem = compile_step(config)
    leaves, x = args
    state = jax.tree_util.tree_unflatten(problem.treedef, leaves)
    model = nnx.merge(problem.graphdef, state)

    def loss_of_state(st, x):
        return problem.loss(jax.tree_util.tree_leaves(st), x)

    jit_state = jax.jit(jax.value_and_grad(loss_of_state))

    @nnx.jit
    def nnx_step(m, x):
        return nnx.value_and_grad(lambda m, x: loss_of_state(nnx.state(m), x))(m, x)

    warmup = max(config.warmup, 1)
    got = interleave({
        "engine": lambda: time_executable(compiled, args, warmup=warmup, repeats=repeats),
        "bare_compiled": lambda: bare_loop(compiled, args, warmup=warmup, repeats=repeats),
        "jax_jit_state": lambda: bare_loop(jit_state, (state, x), warmup=warmup, repeats=repeats),
        "nnx_jit_module": lambda: bare_loop(nnx_step, (model, x), warmup=warmup, repeats=repeats),
    }, rounds)
    med = {k: float(np.median(v)) for k, v in got.items()}
    return {"per_call_s": med, "ratio": med["engine"] / med["bare_compiled"],
            "vs_jax_jit_state": med["engine"] / med["jax_jit_state"],
            "vs_nnx_jit_module": med["engine"] / med["nnx_jit_module"],
            "rounds": rounds, "repeats": repeats}

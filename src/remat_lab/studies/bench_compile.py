"""Compile-side figures: a sweep's throughput through ``run_experiment``, the memory timeline's cost."""

from __future__ import annotations

import time

import jax
import numpy as np

from remat_lab.analysis.timeline import compile_dumped, memory_timeline, uncached
from remat_lab.config import RunConfig
from remat_lab.model.models import names_of
from remat_lab.program.step import build_problem, make_step
from remat_lab.studies.experiment import run_experiment

# ---------------------------------------------------------------- memory timeline overhead


def timeline_overhead(config: RunConfig, *, rounds: int = 5) -> dict:
    """What the memory timeline adds to the step's compile at ``config`` (medians, cache off).

    ``ratio``: as ``run_experiment`` builds it after a compile that misses the persistent cache
    (the compile with XLA's dump on, then the timeline from that dump) over a plain compile, minus
    one. ``cache_hit_ratio``: after a cache hit (nothing dumped; an uncached copy is compiled)
    over a plain compile. Each measurement lowers afresh (``Lowered.compile`` remembers its
    executable); the three are interleaved round by round.
    """
    problem = build_problem(config)
    label = {"depth": config.depth, "names": names_of(config.model), "paths": problem.paths}
    samples: dict[str, list[float]] = {"plain": [], "dumped": [], "copy": []}
    for _ in range(rounds):
        lowered = [jax.jit(make_step(problem)).trace(*problem.args).lower() for _ in range(3)]
        with uncached():
            t0 = time.perf_counter()
            lowered[0].compile()
            t1 = time.perf_counter()
            compiled, dump = compile_dumped(lowered[1])
            memory_timeline(lowered[1], compiled=compiled, dump=dump, **label)
            t2 = time.perf_counter()
        memory_timeline(lowered[2], **label)
        t3 = time.perf_counter()
        for key, s in zip(samples, (t1 - t0, t2 - t1, t3 - t2)):
            samples[key].append(s)
    plain, dumped, copy = (float(np.median(samples[k])) for k in samples)
    return {"rounds": rounds, "compile_s": plain, "compile_dumped_and_timeline_s": dumped,
            "uncached_copy_and_timeline_s": copy, "ratio": dumped / plain - 1.0,
            "cache_hit_ratio": copy / plain}


# ---------------------------------------------------------------- 4: sweep throughput


def sweep(widths, batches, policies, *, repeats: int, warmup: int) -> dict:
    configs = [RunConfig(width=w, batch=b, policy=p, repeats=repeats, warmup=warmup)
               for w in widths for b in batches for p in policies]
    compile_s = lower_s = 0.0
    t0 = time.perf_counter()
    for cfg in configs:
        r = run_experiment(cfg)
        compile_s += r["compile"]["compile_s"]
        lower_s += r["compile"]["lower_s"]
    total = time.perf_counter() - t0
    return {"configs": len(configs), "total_s": total, "s_per_config": total / len(configs),
            "compile_s": compile_s, "lower_s": lower_s, "compile_share": compile_s / total}

"""``python -m remat_lab bench [--quick] [--json]``: how faithful and how fast the engine is.

Five measurements, side by side in one process, each reported as a ratio with its target:

1. **Timing fidelity**: the engine's reported median step time (``time_executable`` +
   ``step_time_summary``, exactly what ``run_experiment`` reports) over a bare loop
   (``compiled(state, x)`` + ``block_until_ready``) on the same compiled executable, interleaved
   round by round (alternating which goes first) so drift and neighbours' load hit both alike.
2. **Call overhead** at width 64, batch 8: the engine's step vs the bare compiled call, ``jax.jit``
   on the split ``nnx.State`` and ``nnx.jit`` on the module (same loss, same policy).
3. **Cold and warm latency** through the Explore page's path (``pages/_running.run_config``, an
   ``st.cache_data`` wrapper around ``run_experiment``; an equivalent in-process cache when the
   app is not next to the package). Cold = first request for a configuration in a running process
   (fresh persistent cache, in-process caches cleared); warm = the same request again.
4. **Sweep throughput**: widths x batches x every policy through ``run_experiment``, once with an
   empty persistent compilation cache and once more with it filled (in-process caches cleared in
   between, as in a new session).
5. **Roofline**: XLA's flop count over the engine's median, as a fraction of the device's
   calibrated peak (``roofline.calibrate``: the best jitted float32 matmul rate, measured once
   per machine and cached; its source, "calibrated" or "spec", is reported), with the step's
   arithmetic intensity and bound from ``roofline.roofline_report``.
6. **Memory timeline overhead**: what ``timeline.memory_timeline`` adds to the step's compile
   (XLA's dump written and parsed), and what it costs after a persistent-cache hit (an uncached
   copy compiled), over a plain compile at the default size, the persistent cache off.
7. **Advisor**: ``advisor.advise`` for JAX's 7 named policies at the app's default model (scanned
   8-block mlp, width 256) with a 64 MiB budget (largest batches ~2000-3800), each with an empty
   persistent cache: with timing (``advise_s``) and without (``advise_no_time_s``); and the median
   of compile-only probes at the default size, each a new program (``probe_s``).

Timings on a shared machine are noisy: every figure is a median, the two sides of each ratio are
interleaved, and the load average before and after is recorded in ``machine``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import pickle
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from remat_lab.analysis.roofline import (
    calibrate,
    cpu_count,
    cpu_info,
    physical_core_count,
    roofline_report,
    xla_cost,
)
from remat_lab.analysis.timeline import compile_dumped, memory_timeline, uncached
from remat_lab.config import RunConfig
from remat_lab.model.models import names_of
from remat_lab.model.policies import POLICIES
from remat_lab.program import step
from remat_lab.program.backend import enable_compilation_cache, environment
from remat_lab.program.step import build_problem, make_step
from remat_lab.program.timing import step_time_summary, time_executable
from remat_lab.studies import experiment
from remat_lab.studies.experiment import run_experiment

DEFAULT = RunConfig(width=512, batch=256)  # one block, about 4 ms a step on 2 cores
SMALL = RunConfig(width=64, batch=8)
TARGETS = {  # key -> (comparison, bound, meaning)
    "fidelity_ratio_default": ("<=", 1.03, "engine median / bare loop median, default size"),
    "fidelity_ratio_small": ("<=", None, "engine median / bare loop median, width 64 batch 8"),
    "overhead_ratio": ("<=", 1.2, "engine per call / bare compiled call, width 64 batch 8"),
    "warm_latency_s": ("<=", 0.3, "repeat request through the app's cached path"),
    "cold_latency_s": ("", None, "first request: build, lower, compile, time, check, dissect"),
    "dissect_overhead_ratio": ("<=", 1.25, "(lower+compile+time+check+dissect+cache) / "
                               "(lower+compile+time), default size"),
    "sweep_s_per_config": ("", None, "seconds per configuration, empty compile cache"),
    "cache_speedup": (">=", 3.0, "first sweep / second sweep (persistent compile cache)"),
    "achieved_flops_fraction": ("", None, "achieved FLOP/s / calibrated peak FLOP/s, default size"),
    "timeline_overhead_ratio": ("<=", 0.15, "compile time the memory timeline adds (dump + parse) / "
                                "step compile, default size"),
    "timeline_overhead_ratio_cache_hit": ("", None, "memory timeline after a persistent-cache hit "
                                          "(an uncached copy) / step compile, default size"),
    "advise_s": ("<=", 30.0, "advice for 7 policies at the app's default model, 64 MiB, timed"),
    "advise_no_time_s": ("<=", 10.0, "the same advice, compile-only (--no-time)"),
    "probe_s": ("<=", 0.5, "one compile-only probe (abstract inputs), app's default model, median"),
}
ADVISE_MODEL = RunConfig(width=256, batch=128, depth=8, stack="scan")  # the app's default
ADVISE_BUDGET = 64 << 20


# ---------------------------------------------------------------- machine and peak


def machine() -> dict:
    """This process's machine and its roofs (``roofline.calibrate``: cached, else measured now)."""
    cpu = cpu_info()
    roofs = calibrate()
    env = environment()
    return {**env, "cpu_model": cpu["model"], "cores": cpu_count(),
            "physical_cores": physical_core_count(), "cpu_mhz": cpu["mhz"],
            "vector_flags": sorted(cpu["flags"] & {"avx512f", "avx2", "fma", "avx"}),
            "python": platform.python_version(), "peak_flops": roofs["peak_flops_per_s"],
            "peak_source": roofs["peak_source"], "peak_note": roofs["peak_note"],
            "bandwidth_bytes_per_s": roofs["bandwidth_bytes_per_s"],
            "calibrated_at": roofs["measured_at"], "loadavg_start": _loadavg()}


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------- caches


def clear_caches() -> None:
    """Forget every in-process compile and trace (JAX's and the engine's), as a new session."""
    jax.clear_caches()
    experiment.baseline_program.cache_clear()
    for name in ("_parameters", "_input"):
        fn = getattr(step, name, None)
        if fn is not None and hasattr(fn, "cache_clear"):
            fn.cache_clear()


def use_cache_dir(path: str) -> str:
    """Point JAX's persistent compilation cache at ``path`` (re-initialised if already in use)."""
    from jax._src import compilation_cache  # pinned jax; needed to switch directories

    path = enable_compilation_cache(path)
    compilation_cache.reset_cache()
    return path


@contextlib.contextmanager
def temporary_cache_dir(path: str | None = None):
    """A fresh (or given) persistent cache directory for the block; the previous one after it.

    A directory made here is deleted afterwards.
    """
    previous = jax.config.jax_compilation_cache_dir
    own = path is None
    path = path or tempfile.mkdtemp(prefix="remat_lab_bench_cache_")
    try:
        yield use_cache_dir(path)
    finally:
        from jax._src import compilation_cache

        jax.config.update("jax_compilation_cache_dir", previous)
        compilation_cache.reset_cache()
        if own:
            shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- 1 and 2: fidelity, overhead


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


# ---------------------------------------------------------------- 3: cold and warm latency


class _Status:
    """Stands in for ``st.status``: records when each stage label appears."""

    def __init__(self, labels: dict[str, str]):
        self.labels, self.marks = labels, []

    def update(self, label: str = "", **_):
        stage = next((s for s, text in self.labels.items() if text in label), label)
        self.marks.append((stage, time.perf_counter()))


def _app_runner() -> tuple[Callable[[RunConfig, _Status], dict], Callable[[], None], str, dict]:
    """(run, clear, description, stage labels): the Explore page's cached run, else an equivalent.

    The app module is imported lazily (streamlit is not a dependency of the engine) and runs in
    streamlit's bare mode, where ``st.cache_data`` works without a server.
    """
    running = Path(__file__).resolve().parents[2] / "pages" / "_running.py"
    if running.exists():
        try:
            import logging

            for name in ("streamlit", "streamlit.runtime"):
                logging.getLogger(name).setLevel(logging.ERROR)
            spec = importlib.util.spec_from_file_location("remat_lab_bench_running", running)
            mod = importlib.util.module_from_spec(spec)
            root = str(running.parent.parent)  # for its ``from pages._sidebar import ...``
            sys.path.insert(0, root)
            try:
                spec.loader.exec_module(mod)
            finally:
                sys.path.remove(root)
            run = lambda cfg, status: mod.run_config(cfg, status, keep_texts=False)  # noqa: E731
            return (run, mod._cached_run.clear,
                    "pages/_running.run_config (st.cache_data, bare mode)", dict(mod.STAGE_TEXT))
        except Exception as err:  # noqa: BLE001 - fall back, and say so
            why = f"app wrapper unavailable ({type(err).__name__}: {str(err)[:80]})"
    else:
        why = "app wrapper not found"
    store: dict = {}

    def run(cfg: RunConfig, status: _Status) -> dict:
        # Like st.cache_data: key on the config, store the pickled result, return a fresh copy.
        key = tuple(sorted(cfg.as_dict().items()))
        if key not in store:
            store[key] = pickle.dumps(run_experiment(cfg, progress=lambda s: status.update(s)))
        return pickle.loads(store[key])

    return run, store.clear, f"in-process pickle cache around run_experiment ({why})", \
        {s: s for s in experiment.STAGES}


def _timed_run(run, config: RunConfig, labels: dict) -> dict:
    """One request through ``run``: total seconds, seconds per stage and the overhead ratio.

    ``core_s`` = the engine's own lower_s + compile_s + the timing stage; ``build_s`` = model
    initialisation (reported, kept out of the ratio: it is neither dissection nor bookkeeping).
    """
    status = _Status(labels)
    t0 = time.perf_counter()
    result = run(config, status)
    t_end = time.perf_counter()
    marks = [("start", t0), *status.marks, ("end", t_end)]
    stages: dict[str, float] = {}
    for (name, t), (_, t_next) in zip(marks, marks[1:]):
        stages[name] = stages.get(name, 0.0) + t_next - t
    total = t_end - t0
    core = (result["compile"]["lower_s"] + result["compile"]["compile_s"]
            + stages.get("timing", 0.0))
    build = stages.get("start", 0.0) + stages.get("building", 0.0)
    return {"total_s": total, "stages_s": stages, "build_s": build, "core_s": core,
            "overhead_ratio": (total - build) / core if core else None,
            "reported_median_s": result["step_time_s"]["median"]}


def latency(config: RunConfig, *, warm_repeats: int = 5) -> dict:
    """Cold and warm latency of ``config`` through the app's cached run path.

    Cold: a new model in a running process (in-process caches cleared). Also a policy change on
    that model (its parameters and no_remat reference already cached), the common Explore step.
    """
    run, clear, how, labels = _app_runner()
    clear()
    clear_caches()
    cold = _timed_run(run, config, labels)
    warm = []
    for _ in range(warm_repeats):
        t = time.perf_counter()
        run(config, _Status(labels))
        warm.append(time.perf_counter() - t)
    other = "nothing_saveable" if config.policy != "nothing_saveable" else "dots_saveable"
    switch = _timed_run(run, config.replace(policy=other), labels)
    return {"path": how, "cold_s": cold["total_s"], "warm_s": float(np.median(warm)),
            "warm_samples_s": warm, "cold": cold, "policy_change": switch,
            "dissect_overhead_ratio": cold["overhead_ratio"],
            "reported_median_s": cold["reported_median_s"]}


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


def sweep_pair(widths, batches, policies, *, repeats: int, warmup: int,
               cache_dir: str | None = None) -> dict:
    """The sweep with an empty persistent cache, then again with it filled (new-session-like)."""
    with temporary_cache_dir(cache_dir):
        clear_caches()
        first = sweep(widths, batches, policies, repeats=repeats, warmup=warmup)
        clear_caches()
        second = sweep(widths, batches, policies, repeats=repeats, warmup=warmup)
    return {"widths": list(widths), "batches": list(batches), "policies": len(policies),
            "repeats": repeats, "warmup": warmup, "first": first, "second": second,
            "speedup": first["total_s"] / second["total_s"]}


# ---------------------------------------------------------------- all together


def advise_bench(config: RunConfig = ADVISE_MODEL, budget: int = ADVISE_BUDGET, *,
                 probes: int = 7, policies: int = 7) -> dict:
    """The advisor's figures (7.): the whole advice with and without timing, each from an empty
    persistent cache and probe cache, and compile-only probes at new batches (new programs)."""
    from remat_lab.studies import advisor

    chosen = ["no_remat", "nothing_saveable", *(p for p, spec in POLICIES.items() if spec.group == "jax"
                                                and p not in ("no_remat", "nothing_saveable"))]
    out = {}
    for key, timing in (("no_time", False), ("timed", True)):
        with temporary_cache_dir():
            clear_caches()
            advisor.clear_cache()
            t0 = time.perf_counter()
            doc = advisor.advise(config, budget, timing=timing, policies=chosen[:policies])
            out[key] = {"s": time.perf_counter() - t0, "search_s": doc["search_s"],
                        "max_batch": {r["policy"]: r["max_batch"] for r in doc["rows"]},
                        "compiles": sum(r["compiles"] for r in doc["rows"]),
                        "recommended": doc["recommended"]}
    with temporary_cache_dir():
        advisor.clear_cache()
        seconds = [advisor.probe(config.replace(batch=config.batch + i))["s"] for i in range(probes)]
    out["probe_s"] = float(np.median(seconds))
    out["probe_samples_s"] = seconds
    return out


def run_all(quick: bool = False, progress: Callable[[str], None] | None = None) -> dict:
    say = progress or (lambda msg: None)
    m = machine()
    # A fresh persistent cache: nothing below is served from an earlier session.
    with temporary_cache_dir():
        say("warming up the process")
        run_experiment(RunConfig(width=8, batch=1, repeats=1, warmup=0))
        say("3/5 cold and warm latency")
        lat = latency(DEFAULT.replace(repeats=20, warmup=3))
        say("1/5 timing fidelity")
        # Many short interleaved chunks: on a shared machine the step time flips between
        # levels for tens of milliseconds at a time, so long blocks would compare different
        # levels; short alternating chunks see the same ones.
        scale = 1 if quick else 2
        fid_default = fidelity(DEFAULT, rounds=10 * scale, repeats=5)
        fid_small = fidelity(SMALL, rounds=40 * scale, repeats=25)
        say("2/5 call overhead")
        ovh = overhead(SMALL, rounds=40 * scale, repeats=25)
        say("4/5 sweep throughput")
        widths, batches = ((32, 64, 128), (4, 16, 64)) if quick else ((128, 256, 512),
                                                                      (32, 128, 256))
        sw = sweep_pair(widths, batches, list(POLICIES), repeats=5 if quick else 10,
                        warmup=1 if quick else 2, cache_dir=None)
        say("memory timeline overhead")
        tl = timeline_overhead(DEFAULT, rounds=3 if quick else 7)
        say("advisor")
        adv = advise_bench()
    roof = roofline_report(fid_default["flops"], fid_default["bytes_accessed"],
                           fid_default["engine_median_s"])
    m["loadavg_end"] = _loadavg()
    return {
        "fidelity_ratio_default": fid_default["ratio"],
        "fidelity_ratio_small": fid_small["ratio"],
        "overhead_ratio": ovh["ratio"],
        "warm_latency_s": lat["warm_s"],
        "cold_latency_s": lat["cold_s"],
        "dissect_overhead_ratio": lat["dissect_overhead_ratio"],
        "sweep_s_per_config": sw["first"]["s_per_config"],
        "cache_speedup": sw["speedup"],
        "achieved_flops_fraction": roof["achieved_fraction"],
        "timeline_overhead_ratio": tl["ratio"],
        "timeline_overhead_ratio_cache_hit": tl["cache_hit_ratio"],
        "advise_s": adv["timed"]["s"],
        "advise_no_time_s": adv["no_time"]["s"],
        "probe_s": adv["probe_s"],
        "dissect_overhead_ratio_policy_change": lat["policy_change"]["overhead_ratio"],
        "policy_change_latency_s": lat["policy_change"]["total_s"],
        "sweep_compile_share": sw["first"]["compile_share"],
        "achieved_flops_per_s": roof["achieved_flops_per_s"],
        "peak_flops_per_s": roof["peak_flops_per_s"],
        "peak_source": roof["peak_source"],
        "roofline": roof,
        "quick": quick,
        "machine": m,
        "details": {"fidelity_default": fid_default, "fidelity_small": fid_small,
                    "overhead": ovh, "latency": lat, "sweep": sw, "timeline": tl,
                    "advise": adv},
    }


def verdict(key: str, value) -> tuple[str, str]:
    op, bound, _ = TARGETS[key]
    if bound is None or value is None:
        return "-", "report"
    ok = value <= bound if op == "<=" else value >= bound
    return f"{op} {bound:g}", "PASS" if ok else "MISS"


def _fmt(key: str, value) -> str:
    if value is None:
        return "n/a"
    if key.endswith("_s") or key == "sweep_s_per_config":
        return f"{value:.3f} s"
    if key == "achieved_flops_fraction":
        return f"{value:.1%}"
    return f"{value:.3f}"


def format_report(doc: dict) -> str:
    m, d = doc["machine"], doc["details"]
    rows = [("figure", "value", "target", "verdict", "meaning")]
    for key, (_, _, meaning) in TARGETS.items():
        target, ok = verdict(key, doc[key])
        rows.append((key, _fmt(key, doc[key]), target, ok, meaning))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"Remat Lab bench{' (quick)' if doc['quick'] else ''} on {m['cpu_model']}, "
             f"{m['cores']} cores, {m['backend']} ({m['device_kind']}), jax {m['jax']}; "
             f"load average {m['loadavg_start']} -> {m['loadavg_end']}", ""]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 7)
    fd, fs, ov, lat, sw = (d["fidelity_default"], d["fidelity_small"], d["overhead"],
                           d["latency"], d["sweep"])
    us = lambda s: f"{s * 1e6:.1f} us"  # noqa: E731
    lines += [
        "",
        f"fidelity: default engine {us(fd['engine_median_s'])} vs bare {us(fd['bare_median_s'])}; "
        f"small engine {us(fs['engine_median_s'])} vs bare {us(fs['bare_median_s'])} "
        f"({fd['rounds']} interleaved rounds)",
        "per call (width 64, batch 8): " + ", ".join(f"{k} {us(v)}"
                                                     for k, v in ov["per_call_s"].items()),
        f"latency via {lat['path']}: cold {lat['cold_s']:.3f} s = "
        + ", ".join(f"{k} {v:.3f}" for k, v in lat["cold"]["stages_s"].items())
        + f"; warm {lat['warm_s'] * 1e3:.1f} ms; policy change {lat['policy_change']['total_s']:.3f}"
        f" s (overhead ratio {lat['policy_change']['overhead_ratio']:.2f})",
        f"sweep {len(sw['widths'])}x{len(sw['batches'])}x{sw['policies']} = "
        f"{sw['first']['configs']} configs (repeats {sw['repeats']}): first "
        f"{sw['first']['total_s']:.1f} s (compile share {sw['first']['compile_share']:.0%}), "
        f"second {sw['second']['total_s']:.1f} s (compile share "
        f"{sw['second']['compile_share']:.0%})",
        _roofline_line(doc["roofline"]),
        f"memory timeline (default size): plain compile {d['timeline']['compile_s']:.3f} s; with "
        f"XLA's dump and the timeline {d['timeline']['compile_dumped_and_timeline_s']:.3f} s; after a "
        f"cache hit (uncached copy) {d['timeline']['uncached_copy_and_timeline_s']:.3f} s",
        f"advisor (7 policies, default model, 64 MiB): {d['advise']['no_time']['compiles']} "
        f"compiles; largest batches {d['advise']['timed']['max_batch']}; recommended "
        f"{d['advise']['timed']['recommended']}",
    ]
    return "\n".join(lines)


def _roofline_line(roof: dict) -> str:
    """The roofline in one line: peak (and its source), bandwidth, achieved, intensity, bound."""
    text = f"peak ({roof['peak_source'] or 'unknown'}): "
    if roof["peak_flops_per_s"]:
        text += f"{roof['peak_flops_per_s'] / 1e9:.0f} GFLOP/s"
    if roof["bandwidth_bytes_per_s"]:
        text += f", bandwidth {roof['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s"
    if roof["achieved_flops_per_s"]:
        text += f"; achieved {roof['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s"
    if roof["arithmetic_intensity"]:
        text += f" at {roof['arithmetic_intensity']:.1f} FLOP/byte ({roof['bound']}-bound)"
    if roof["stale_calibration"]:
        text += "; above the calibrated peak (stale calibration, fraction capped at 1)"
    return text + (f" [{roof['peak_note']}]" if roof.get("peak_note") else "")


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj


def main(quick: bool = False, as_json: bool = False) -> int:
    say = (lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
    doc = _jsonable(run_all(quick=quick, progress=say))
    print(json.dumps(doc, indent=2) if as_json else format_report(doc))
    return 0

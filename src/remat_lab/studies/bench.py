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
   of compile-only probes at the default size, each a new program (``probe_s``). Then the
   issue's real task (``bench_advise``): every policy on a transformer (width 512, seq 256, 8
   heads, depth 8) in 2 GiB, compile-only (``advise_transformer_no_time_s``) and timed
   (``advise_transformer_s``).
8. **Synthesizer** (``bench_synthesize``, not in ``--quick``): the same transformer in 2 GiB
   (``synthesize_transformer_s``) and llama3-8b on 8 x H100, fsdp=8 (``synthesize_llama3_8b_s``).

Timings on a shared machine are noisy: every figure is a median, the two sides of each ratio are
interleaved, and the load average before and after is recorded in ``machine``.

This module runs them all (``run_all``, ``main``) and holds the pieces that need a throwaway cache
directory or the pickle round trip; the rest lives in ``bench_timing`` (1, 2), ``bench_latency`` (3),
``bench_compile`` (4, 6), ``bench_env`` (machine, caches) and ``bench_report`` (targets, table).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import jax
import numpy as np

from remat_lab.analysis.roofline import calibration_path, roofline_report
from remat_lab.config import RunConfig
from remat_lab.model.policies import POLICIES
from remat_lab.studies import experiment
from remat_lab.studies.bench_advise import advise_transformer
from remat_lab.studies.bench_compile import sweep, timeline_overhead
from remat_lab.studies.bench_env import clear_caches, loadavg, machine, use_cache_dir
from remat_lab.studies.bench_latency import Status, timed_run
from remat_lab.studies.bench_report import TARGETS, format_report, jsonable, verdict
from remat_lab.studies.bench_synthesize import synthesize_bench
from remat_lab.studies.bench_timing import bare_loop, compile_step, fidelity, interleave, overhead
from remat_lab.studies.experiment import run_experiment

_jsonable = jsonable  # the name the bench test and older callers use

# The bench_* modules' names are re-exported here. ``run_all`` reads DEFAULT, SMALL, sweep_pair,
# advise_bench and advise_transformer from this module's namespace, so replacing ``bench.X`` changes
# what it runs.
__all__ = [
    "ADVISE_BUDGET", "ADVISE_MODEL", "DEFAULT", "SMALL", "TARGETS", "_app_runner", "_jsonable", "jsonable",
    "advise_bench", "advise_transformer", "bare_loop", "clear_caches", "compile_step", "fidelity",
    "format_report",
    "interleave", "latency", "machine", "main", "overhead", "run_all", "sweep", "sweep_pair",
    "temporary_cache_dir", "timeline_overhead", "use_cache_dir", "verdict",
]

DEFAULT = RunConfig(width=512, batch=256)  # one block, about 4 ms a step on 2 cores
SMALL = RunConfig(width=64, batch=8)
ADVISE_MODEL = RunConfig(width=256, batch=128, depth=8, stack="scan")  # the app's default
ADVISE_BUDGET = 64 << 20


# ---------------------------------------------------------------- a throwaway persistent cache


@contextlib.contextmanager
def temporary_cache_dir(path: str | None = None):
    """A fresh (or given) persistent cache directory for the block; the previous one after it.

    A directory made here is deleted afterwards. Worker processes started in the block (the
    app's run path: the latency figures) use it too (``$REMAT_LAB_CACHE_DIR``): a "cold" request
    must not be served from an earlier session's cache on disk. The machine's roofline
    calibration (``calibration.json``, a property of the machine, not a compiled program) is
    carried into it, so a worker's first timed run does not measure the machine again.
    """
    previous = jax.config.jax_compilation_cache_dir
    previous_env = os.environ.get("REMAT_LAB_CACHE_DIR")
    calibration = calibration_path()
    own = path is None
    path = path or tempfile.mkdtemp(prefix="remat_lab_bench_cache_")
    try:
        if calibration.is_file() and not os.path.exists(os.path.join(path, calibration.name)):
            shutil.copyfile(calibration, os.path.join(path, calibration.name))
        os.environ["REMAT_LAB_CACHE_DIR"] = path
        yield use_cache_dir(path)
    finally:
        from jax._src import compilation_cache

        if previous_env is None:
            os.environ.pop("REMAT_LAB_CACHE_DIR", None)
        else:
            os.environ["REMAT_LAB_CACHE_DIR"] = previous_env
        jax.config.update("jax_compilation_cache_dir", previous)
        compilation_cache.reset_cache()
        if own:
            shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------- 3: cold and warm latency


def _app_runner() -> tuple[Callable[[RunConfig, Status], dict], Callable[[], None], str, dict]:
    """(run, clear, description, stage labels): the Explore page's cached run, else an equivalent.

    The app module is imported lazily (streamlit is not a dependency of the engine) and runs in
    streamlit's bare mode, where ``st.cache_data`` works without a server.
    """
    running = Path(__file__).resolve().parents[3] / "pages" / "_running.py"  # [3]: the repository root
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

    def run(cfg: RunConfig, status: Status) -> dict:
        # Like st.cache_data: key on the config, store the pickled result, return a fresh copy.
        key = tuple(sorted(cfg.as_dict().items()))
        if key not in store:
            store[key] = pickle.dumps(run_experiment(cfg, progress=lambda s: status.update(s)))
        return pickle.loads(store[key])

    return run, store.clear, f"in-process pickle cache around run_experiment ({why})", \
        {s: s for s in experiment.STAGES}


def latency(config: RunConfig, *, warm_repeats: int = 5) -> dict:
    """Cold and warm latency of ``config`` through the app's cached run path.

    Cold: a new model in a running process (in-process caches cleared). Also a policy change on
    that model (its parameters and no_remat reference already cached), the common Explore step.
    """
    run, clear, how, labels = _app_runner()
    clear()
    clear_caches()
    cold = timed_run(run, config, labels)
    warm = []
    for _ in range(warm_repeats):
        t = time.perf_counter()
        run(config, Status(labels))
        warm.append(time.perf_counter() - t)
    other = "nothing_saveable" if config.policy != "nothing_saveable" else "dots_saveable"
    switch = timed_run(run, config.replace(policy=other), labels)
    return {"path": how, "cold_s": cold["total_s"], "warm_s": float(np.median(warm)),
            "warm_samples_s": warm, "cold": cold, "policy_change": switch,
            "dissect_overhead_ratio": cold["overhead_ratio"],
            "reported_median_s": cold["reported_median_s"]}


# ---------------------------------------------------------------- 4: sweep throughput


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


# ---------------------------------------------------------------- 7: advisor


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


# ---------------------------------------------------------------- all together


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
        say("advisor on the transformer (every policy, 2 GiB)")
        adv_tf = advise_transformer(cache=temporary_cache_dir, timed=not quick)
        say("synthesizer: the transformer, llama3-8b on 8 x H100")
        syn = {} if quick else synthesize_bench(cache=temporary_cache_dir)
    roof = roofline_report(fid_default["flops"], fid_default["bytes_accessed"],
                           fid_default["engine_median_s"])
    m["loadavg_end"] = loadavg()
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
        "advise_transformer_s": adv_tf["timed"]["s"] if "timed" in adv_tf else None,
        "advise_transformer_no_time_s": adv_tf["no_time"]["s"],
        "synthesize_transformer_s": syn["transformer"]["s"] if syn else None,
        "synthesize_llama3_8b_s": syn["llama3_8b"]["s"] if syn else None,
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
                    "advise": adv, "advise_transformer": adv_tf, "synthesize": syn},
    }


def main(quick: bool = False, as_json: bool = False) -> int:
    say = (lambda msg: print(f"bench: {msg}", file=sys.stderr, flush=True))
    doc = jsonable(run_all(quick=quick, progress=say))
    print(json.dumps(doc, indent=2) if as_json else format_report(doc))
    return 0

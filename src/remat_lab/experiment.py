"""A frozen config -> build, lower, compile, time, size and dissect -> one JSON-ready result.

``run_experiment`` is the one entry point used by the CLI, the app and the benchmarks, so every
number the app shows can be reproduced with ``python -m remat_lab run --json``.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

import flax
import jax
import jaxlib
import numpy as np

from . import hlo
from .config import RunConfig, check_budget, resolve_budget
from .dissect import Dissection, dissect
from .gradcheck import check_gradients
from .models import names_of
from .roofline import roofline_report
from .step import build_problem, jit_step
from .timeline import compile_dumped, memory_timeline

MEMORY_FIELDS = ("argument", "output", "alias", "temp", "generated_code")
STAGES = ("waiting", "building", "lowering", "compiling", "timing", "checking", "dissecting")

# One timing at a time in this process: concurrent timings would share the cores and corrupt
# each other's numbers.
TIMING_LOCK = threading.Lock()

Progress = Callable[[str], None]


class ExecutionError(RuntimeError):
    """XLA failed to compile or run a configuration; the message says what to change."""


def enable_compilation_cache(path: str | None = None) -> str:
    """Turn on JAX's persistent compilation cache (default ``~/.cache/remat_lab/jax``)."""
    path = path or os.environ.get("REMAT_LAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "remat_lab", "jax")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def environment() -> dict:
    """Backend, devices and versions of this process."""
    devices = jax.devices()
    return {
        "backend": jax.default_backend(), "device_kind": devices[0].device_kind,
        "device_count": len(devices), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
        "flax": flax.__version__, "cpu_count": os.cpu_count(),
    }


def device_memory_limit() -> int | None:
    """Bytes the default device may use, when the backend says (GPU/TPU); None on CPU."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def memory_report(compiled) -> dict | None:
    """Every field of ``compiled.memory_analysis()`` plus the peak; None when unavailable.

    ``peak_bytes = generated_code + argument + output - alias + temp`` is XLA's own lower bound.
    ``xla_peak_memory_bytes`` is XLA's ``peak_memory_in_bytes`` field (on CPU it leaves out temp).
    """
    try:
        ma = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        return None
    if ma is None:
        return None
    out = {}
    for prefix in ("", "host_"):
        for name in MEMORY_FIELDS:
            out[f"{prefix}{name}_bytes"] = int(getattr(ma, f"{prefix}{name}_size_in_bytes", 0) or 0)
    out["peak_bytes"] = (out["generated_code_bytes"] + out["argument_bytes"] + out["output_bytes"]
                         - out["alias_bytes"] + out["temp_bytes"])
    peak = getattr(ma, "peak_memory_in_bytes", None)
    out["xla_peak_memory_bytes"] = None if peak is None else int(peak)
    return out


def cost_of(compiled) -> dict:
    """XLA's cost analysis of the compiled step: ``flops`` and ``bytes_accessed`` (None if absent).

    XLA counts a while loop's body once (a ``scan`` over layers): callers scale by the trip count.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:
        cost = None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    cost = cost or {}
    get = lambda key: float(cost[key]) if key in cost else None
    return {"flops": get("flops"), "bytes_accessed": get("bytes accessed")}


def step_flops(xla_flops: float | None, text: str) -> float | None:
    """The step's flops: XLA's count plus the products it leaves out by counting each while-loop
    (scan) body once. Element-wise work inside a loop body stays counted once (a few per cent)."""
    return None if xla_flops is None else xla_flops + hlo.loop_flops_left_out(text)


def flops_of(compiled) -> float | None:
    """XLA's cost-analysis flop count of the compiled step."""
    return cost_of(compiled)["flops"]


MIN_WARMUP_S = 0.02  # warm up for at least this long as well as for ``warmup`` calls


def time_executable(compiled, args, *, warmup: int, repeats: int,
                    min_warmup_s: float = 0.0) -> np.ndarray:
    """Seconds per call of ``compiled(*args)``, each ended by ``block_until_ready`` on all outputs.

    Warm-up: ``warmup`` calls, then more until ``min_warmup_s`` seconds have passed (at most 1000
    calls): a microsecond step needs more than a few calls before its time settles.
    """
    clock = time.perf_counter
    start, done = clock(), 0
    while done < warmup or (clock() - start < min_warmup_s and done < 1000):
        jax.block_until_ready(compiled(*args))
        done += 1
    samples = np.empty(repeats)
    for i in range(repeats):
        t0 = clock()
        jax.block_until_ready(compiled(*args))
        samples[i] = clock() - t0
    return samples


def step_time_summary(samples: np.ndarray, warmup: int) -> dict:
    p25, med, p75 = np.percentile(samples, [25, 50, 75])
    return {"median": float(med), "p25": float(p25), "p75": float(p75),
            "min": float(samples.min()), "max": float(samples.max()),
            "repeats": int(samples.size), "warmup": warmup, "samples": samples.tolist()}


def baseline_program(config: RunConfig) -> dict:
    """The ``no_remat`` compile of ``config``'s model with the same objective, not run.

    The witness for what a policy's compiled program recomputes (``dissect.compare_compiled``):
    ``{"text", "flops", "memory"}``. Cached per model and objective, so a sweep over policies
    compiles it once.
    """
    return _baseline(config.replace(policy="no_remat", repeats=1, warmup=0))


@functools.lru_cache(maxsize=16)
def _baseline(ref_cfg: RunConfig) -> dict:
    problem = build_problem(ref_cfg)
    compiled = jit_step(problem).trace(*problem.args).lower().compile()
    text = compiled.as_text()
    return {"text": text, "flops": step_flops(cost_of(compiled)["flops"], text),
            "memory": memory_report(compiled)}


baseline_program.cache_clear = _baseline.cache_clear  # type: ignore[attr-defined]


@contextmanager
def timing_slot(progress: Progress):
    """Hold the process-wide timing lock, telling ``progress`` when we have to wait for it."""
    if not TIMING_LOCK.acquire(blocking=False):
        progress("waiting")
        TIMING_LOCK.acquire()
    try:
        yield
    finally:
        TIMING_LOCK.release()


def _xla_error(stage: str, err: Exception) -> ExecutionError:
    text = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
    hint = ("the device ran out of memory: lower width, batch, seq or depth"
            if "RESOURCE_EXHAUSTED" in str(err) or "out of memory" in str(err).lower()
            else "try a smaller or different configuration")
    return ExecutionError(f"XLA failed while {stage}: {text}. {hint.capitalize()}.")


def _check_sharded(problem, grads, loss, jaxpr) -> tuple[dict, float]:
    """The gradient check of a step on a mesh: its loss and gradients, gathered whole into this
    process, against the same single-device reference (on the same values, gathered too); and
    the gradients' global L2 norm."""
    from .sharding import to_host

    leaves, x, grads = to_host((problem.leaves, problem.x, grads))
    gathered = type(problem)(**{**vars(problem), "leaves": list(leaves), "x": x, "mesh": None,
                                "specs": None})  # the same problem, whole on this host
    check = check_gradients(gathered, list(grads), loss, jaxpr)
    return check, float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in grads)))


def run_experiment(config: RunConfig, *, budget: str | int | None = None, timing: bool = True,
                   progress: Progress | None = None) -> dict:
    """Everything about one configuration, as the JSON document of ``remat_lab run --json``.

    Raises ``ConfigError`` (over budget) before anything is allocated and ``ExecutionError`` when
    XLA fails. With ``timing=False`` the step is compiled and dissected but not timed.
    """
    progress = progress or (lambda stage: None)
    check_budget(config, resolve_budget(budget, device_memory_limit()))

    progress("building")
    problem = build_problem(config)
    step = jit_step(problem)  # on a mesh: explicit shardings (sharding.py)
    progress("lowering")
    t0 = time.perf_counter()
    try:
        # Trace once: the same jaxpr is lowered here and read by the dissection.
        traced = step.trace(*problem.args)
        lowered = traced.lower()
        t1 = time.perf_counter()
        progress("compiling")
        # With XLA's dump on: the memory timeline reads it (None on a persistent-cache hit).
        compiled, dump = compile_dumped(lowered)
        t2 = time.perf_counter()
    except Exception as err:  # XlaRuntimeError and friends
        raise _xla_error("compiling", err) from err

    result = {"schema": 1, "config": config.as_dict(), "environment": environment(),
              "compile": {"lower_s": t1 - t0, "compile_s": t2 - t1}}
    cost = cost_of(compiled)
    text = compiled.as_text()
    flops = step_flops(cost["flops"], text)
    try:
        if timing:
            with timing_slot(progress):
                progress("timing")
                samples = time_executable(compiled, problem.args, warmup=config.warmup,
                                          repeats=config.repeats, min_warmup_s=MIN_WARMUP_S)
            result["step_time_s"] = {**step_time_summary(samples, config.warmup),
                                     "min_warmup_s": MIN_WARMUP_S}
        else:
            result["step_time_s"] = None
        progress("checking")
        out = compiled(*problem.args)
    except Exception as err:
        raise _xla_error("running", err) from err
    loss, grads = (None, out) if config.objective == "grad" else (float(out[0]), out[1])
    median = result["step_time_s"]["median"] if timing else None
    result["flops"] = flops
    result["flops_xla"] = cost["flops"]  # XLA's own count: a scan's loop body counted once
    result["achieved_flops_per_s"] = flops / median if flops and median else None
    # The roofs are calibrated (measured once per machine, cached): only a timed run needs them.
    # Bytes accessed, like flops, count a loop body once: scaled by the same factor.
    scale = flops / cost["flops"] if flops and cost["flops"] else 1.0
    bytes_accessed = cost["bytes_accessed"] * scale if cost["bytes_accessed"] else None
    result["roofline"] = (roofline_report(flops, bytes_accessed, median) if timing
                          else None)
    # Against an independent plain-jax.numpy implementation of the model, and structurally: the
    # step's jaxpr has remat equations exactly when the policy asks for remat.
    if problem.mesh is None:
        check = check_gradients(problem, grads, loss, traced.jaxpr)
    else:
        check, grad_norm = _check_sharded(problem, grads, loss, traced.jaxpr)
    result["loss"] = loss  # None for objective grad: the step returns no loss
    result["memory"] = memory_report(compiled)
    # What holds the peak (timeline.py): from the dump above, or an uncached copy after a cache hit.
    t3 = time.perf_counter()
    result["memory_timeline"] = memory_timeline(lowered, compiled=compiled, dump=dump, depth=config.depth,
                                                 names=names_of(config.model), paths=problem.paths)
    result["compile"]["timeline_s"] = time.perf_counter() - t3

    progress("dissecting")
    try:
        base = baseline_program(config)
    except Exception as err:
        raise _xla_error("compiling the no_remat baseline", err) from err
    dis: Dissection = dissect(problem, text, step_jaxpr=traced.jaxpr, flops=flops, baseline=base,
                              backend=jax.default_backend())
    result["hlo"] = dis.compiled
    result["baseline"] = {"policy": "no_remat", "flops": base["flops"],
                          "peak_bytes": (base["memory"] or {}).get("peak_bytes")}
    result["gradient_check"] = check
    if problem.mesh is not None:
        from . import sharding
        result["sharding"] = {**sharding.report(problem, text, result["memory"], base["text"]),
                              "grad_norm": grad_norm}
    result["residuals"] = dis.residuals
    result["dots"] = dis.dots
    result["totals"] = dis.totals
    result["notes"] = dis.notes
    result["texts"] = dis.texts
    return result

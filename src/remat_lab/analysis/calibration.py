"""Measuring the roofs now: best-of timed jitted matmuls and an in-place copy, under the timing lock."""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings

import jax
import jax.numpy as jnp

from remat_lab.program.timing import TIMING_LOCK

# Square float32 matmul sizes and copy sizes per backend, and the seconds each part may take.
MATMUL_SIZES = {"cpu": (1024, 1536, 2048), "default": (4096, 8192)}
COPY_BYTES = {"cpu": 256 * 2**20, "default": 1024 * 2**20}
MATMUL_BUDGET_S = 1.4
COPY_BUDGET_S = 0.6
TIMING_LOCK_WAIT_S = 30.0


# ---------------------------------------------------------------- measuring


def _best_seconds(fn, args, budget_s: float, *, min_calls: int = 3, max_calls: int = 200,
                  donate: bool = False) -> tuple[float, int]:
    """Fastest of several calls of ``fn(*args)`` (each ended by ``block_until_ready``), and how many.

    One untimed warm-up call first. With ``donate`` the output is the next call's input.
    """
    clock = time.perf_counter
    out = jax.block_until_ready(fn(*args))
    if donate:
        args = (out,)
    best, calls, start = math.inf, 0, clock()
    while calls < min_calls or (clock() - start < budget_s and calls < max_calls):
        t0 = clock()
        out = jax.block_until_ready(fn(*args))
        best = min(best, clock() - t0)
        calls += 1
        if donate:
            args = (out,)
    return best, calls


def _measure_matmul(sizes, budget_s: float) -> dict:
    """Best float32 FLOP/s (2 n^3 per call) of jitted square matmuls, sizes in increasing order.

    The budget is shared: a size whose warm-up and two timed calls would not fit in what is left
    (projected from the best rate so far) is skipped, so a loaded machine cannot stretch it.
    """
    rates, calls, skipped = {}, {}, []
    deadline = time.perf_counter() + budget_s
    for i, n in enumerate(sorted(sizes)):
        left = deadline - time.perf_counter()
        if rates and (left <= 0 or 3 * 2.0 * n**3 / max(rates.values()) > left):
            skipped.append(n)
            continue
        a = jnp.full((n, n), 1.0 / n, jnp.float32)
        b = jnp.full((n, n), 0.5, jnp.float32)
        fn = jax.jit(jnp.matmul).lower(a, b).compile()
        share = (deadline - time.perf_counter()) / (len(sizes) - i)
        best, calls[n] = _best_seconds(fn, (a, b), share, min_calls=2)
        rates[n] = 2.0 * n**3 / best
        del a, b, fn
    return {"sizes": list(sizes), "skipped_sizes": skipped,
            "flops_per_s_by_size": {str(n): r for n, r in rates.items()},
            "calls_by_size": {str(n): c for n, c in calls.items()},
            "peak_flops_per_s": max(rates.values())}


def _measure_copy(nbytes: int, budget_s: float) -> dict:
    """Best bytes/s of a jitted ``x + 1`` over ``nbytes`` of float32, counted as read + written.

    The input buffer is donated, so the output reuses it: fresh output pages would measure page
    faults, not memory. Counting read + written matches XLA's "bytes accessed".
    """
    n = nbytes // 4
    x = jnp.zeros((n,), jnp.float32)
    with warnings.catch_warnings():  # a backend without donation warns; the copy still counts
        warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        fn = jax.jit(lambda v: v + 1.0, donate_argnums=0).lower(x).compile()
        best, calls = _best_seconds(fn, (x,), budget_s, min_calls=2, donate=True)
    return {"bytes": 4 * n, "op": "x + 1.0 on float32, input donated (in place)",
            "counted": "bytes read + bytes written", "calls": calls,
            "bandwidth_bytes_per_s": 2.0 * 4 * n / best}


def measure(backend: str) -> dict:
    """Both roofs, measured now: {"peak_flops_per_s", "bandwidth_bytes_per_s", "details"}."""
    key = backend if backend in MATMUL_SIZES else "default"
    t0 = time.perf_counter()
    matmul = _measure_matmul(MATMUL_SIZES[key], MATMUL_BUDGET_S)
    mem = _measure_copy(COPY_BYTES.get(backend, COPY_BYTES["default"]), COPY_BUDGET_S)
    return {"peak_flops_per_s": matmul["peak_flops_per_s"],
            "bandwidth_bytes_per_s": mem["bandwidth_bytes_per_s"],
            "details": {"matmul": matmul, "copy": mem, "seconds": time.perf_counter() - t0,
                        "loadavg": _loadavg()}}


def _loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (a loaded machine calibrates low)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def timing_slot():
    """Hold the engine's timing lock while measuring, so no step is timed alongside (and vice
    versa). Waits at most ``TIMING_LOCK_WAIT_S``; yields whether the lock was held."""
    got = TIMING_LOCK.acquire(timeout=TIMING_LOCK_WAIT_S)
    try:
        yield got
    finally:
        if got:
            TIMING_LOCK.release()


def peak_note(identity: dict) -> str:
    backend, precision = identity["backend"], identity["matmul_precision"]
    note = (f"calibrated: best jitted float32 matmul rate on this {identity['device_kind']} "
            f"(matmul precision {precision})")
    if backend == "cpu":
        note += (f", {identity['usable_cores']} usable of {identity['physical_cores']} physical "
                 f"cores ({identity['cpu_model']})")
    elif backend == "gpu" and precision in ("default", "fastest", "high", "tensorfloat32",
                                            "bfloat16", "bfloat16_3x"):
        note += ("; JAX's default float32 matmul precision runs on TF32 tensor cores on Ampere "
                 "and newer GPUs, so this is a TF32 rate (set jax_default_matmul_precision="
                 "'highest' for true float32)")
    elif backend == "tpu" and precision in ("default", "fastest", "bfloat16"):
        note += "; on TPU the default float32 matmul uses bfloat16 passes, so this is that rate"
    return note


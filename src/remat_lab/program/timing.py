"""Timing a compiled executable: the bare timed loop, its summary, and the process-wide timing lock.

The lock lives here, with the only thing it protects: two timings at once in one process would share
the cores and corrupt each other's numbers, so every timed loop (a run, a comparison, the advisor,
the roofline's calibration) takes ``TIMING_LOCK`` or ``timing_slot`` first.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

import jax
import numpy as np

# One timing at a time in this process: concurrent timings would share the cores and corrupt
# each other's numbers.
TIMING_LOCK = threading.Lock()

Progress = Callable[[str], None]


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


MIN_WARMUP_S = 0.02  # warm up for at least this long as well as for ``warmup`` calls


def time_executable(compiled, args, *, warmup: int, repeats: int,
                    min_warmup_s: float = 0.0) -> np.ndarray:
    """Seconds per call of ``compiled(*args)``, each ended by ``block_until_ready`` on all outputs.

    Warm-up: ``warmup`` calls, then more until ``min_warmup_s`` seconds have passed (at most 1000
    calls): a microsecond step needs more than a few calls before its time settles.
    """
    return time_keeping_output(compiled, args, warmup=warmup, repeats=repeats,
                               min_warmup_s=min_warmup_s, keep=False)[0]


def time_keeping_output(compiled, args, *, warmup: int, repeats: int, min_warmup_s: float = 0.0,
                        keep: bool = True) -> tuple[np.ndarray, object]:
    """``(seconds per call, the last call's output)``, as ``time_executable``: a caller that needs
    the step's output (the gradient check) reads the last timed call's instead of calling again.
    One output is alive at a time (each is released before the next call); with ``repeats=0``
    the output is the last warm-up call's, or ``None`` when there was none."""
    clock = time.perf_counter
    start, done, out = clock(), 0, None
    while done < warmup or (clock() - start < min_warmup_s and done < 1000):
        out = None
        out = jax.block_until_ready(compiled(*args))
        done += 1
    samples = np.empty(repeats)
    for i in range(repeats):
        out = None
        t0 = clock()
        out = jax.block_until_ready(compiled(*args))
        samples[i] = clock() - t0
    return samples, (out if keep else None)


def step_time_summary(samples: np.ndarray, warmup: int) -> dict:
    p25, med, p75 = np.percentile(samples, [25, 50, 75])
    return {"median": float(med), "p25": float(p25), "p75": float(p75),
            "min": float(samples.min()), "max": float(samples.max()),
            "repeats": int(samples.size), "warmup": warmup, "samples": samples.tolist()}

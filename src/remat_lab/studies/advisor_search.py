"""The advisor's batch search: compile-only probes (cached by configuration) and the largest batch that fits.

XLA's compiled memory analysis is known before anything is allocated, so the search needs compiles,
not runs: each probe lowers and compiles the step on abstract inputs (``jax.ShapeDtypeStruct``) and
reads ``memory.peak_bytes``. Per policy: from a first guess (the previous policy's answer), predictions
from a line through the measured peaks, doubling and bisection, down to the exact batch that fits and
the next one that does not.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from remat_lab.analysis import hlo
from remat_lab.analysis.costs import memory_report, program_flops
from remat_lab.config import LIMITS, ConfigError, RunConfig, human_bytes
from remat_lab.program.backend import xla_error
from remat_lab.program.step import abstract_problem, jit_step

MAX_BATCH = LIMITS["batch"][1]
PROBE_CACHE_ENTRIES = 1024  # a probe is a few numbers: ~1 KB each

Progress = Callable[[str], None]


class _ProbeCache:
    """Probe results by configuration (a policy's program at one batch), least recently used out."""

    def __init__(self, entries: int):
        self.entries, self._data, self._lock = entries, OrderedDict(), threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        return None

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.entries:
                self._data.popitem(last=False)

    def drop(self, key) -> None:
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


_PROBES = _ProbeCache(PROBE_CACHE_ENTRIES)


def _probe_key(config: RunConfig) -> RunConfig:
    return config.replace(repeats=1, warmup=0, seed=0)  # none of these changes the program


def compile_abstract(config: RunConfig):
    """The jitted step of ``config`` lowered and compiled on abstract inputs (nothing allocated)."""
    problem = abstract_problem(config)
    try:
        return jit_step(problem).trace(*problem.args).lower().compile()
    except Exception as err:  # XlaRuntimeError and friends
        raise xla_error("compiling", err) from err


def probe(config: RunConfig) -> dict:
    """One compile-only probe: ``{"batch", "peak_bytes", "flops", "fingerprint", "cached", "s"}``.

    ``peak_bytes`` is XLA's compiled peak (``memory.peak_bytes``); ``flops`` the step's flops with
    loop bodies scaled by their trip counts. Results are cached in this process by configuration.
    """
    key = _probe_key(config)
    found = _PROBES.get(key)
    if found is not None:
        return {**found, "cached": True}
    t0 = time.perf_counter()
    compiled = compile_abstract(config)
    text = compiled.as_text()
    memory = memory_report(compiled) or {}
    if memory.get("peak_bytes") is None:
        raise ConfigError("this backend gives no compiled memory analysis, so the advisor cannot "
                          "size batches on it.")
    flops, bytes_accessed, _ = program_flops(compiled, text)
    out = {"batch": config.batch, "peak_bytes": int(memory["peak_bytes"]), "flops": flops,
           "bytes_accessed": bytes_accessed,
           "fingerprint": hlo.fingerprint(text), "s": time.perf_counter() - t0}
    _PROBES.put(key, out)
    return {**out, "cached": False}


def clear_cache() -> None:
    _PROBES.clear()


def _interpolate(lo: int, p_lo: int, hi: int, p_hi: int, budget: int) -> int:
    """The batch where the line through (lo, p_lo) and (hi, p_hi) reaches ``budget``, rounded down."""
    if p_hi <= p_lo:
        return (lo + hi) // 2
    return lo + int((budget - p_lo) * (hi - lo) // (p_hi - p_lo))


def largest_batch(config: RunConfig, budget: int, *, guess: int | None = None,
                  max_batch: int = MAX_BATCH, progress: Progress | None = None,
                  measure: Callable[[RunConfig], dict] | None = None) -> dict:
    """The largest batch of ``config`` (its policy) whose compiled peak is at most ``budget``.

    The compiled peak grows about linearly with the batch, so the search predicts from a line
    through what it has measured and checks the prediction and the batch after it; bisection
    takes over once a prediction does not narrow the bracket by half. It starts at ``guess`` (the
    previous policy's answer) and its next batch, or at batches 1 and 64. At most about
    2·log2(max_batch) + 3 compiles, usually 3 to 6. Returns ``{"max_batch", "peak_bytes",
    "next_batch", "next_peak_bytes", "probes": [{"batch", "peak_bytes", "fits"}], "compiles",
    "reason"}``: ``max_batch`` 0 when batch 1 does not fit, ``next_batch`` None when even
    ``max_batch`` (the lab's limit) fits.
    """
    say = progress or (lambda message: None)
    measure = measure or probe  # ``probe`` (a compile); tests pass synthetic curves
    probes: dict[int, dict] = {}

    def peak(b: int) -> int:
        if b not in probes:
            say(f"{config.policy}: compiling batch {b}")
            probes[b] = measure(config.replace(batch=b))
        return probes[b]["peak_bytes"]

    def fits(b: int) -> bool:
        return peak(b) <= budget

    def take(b: int, predicted: bool) -> None:
        """``b`` fits: the new ``lo``; after a prediction, the batch after it says whether it is the
        answer (the prediction is usually the boundary or one short of it)."""
        nonlocal lo, hi
        lo = b
        if predicted and lo < max_batch and (hi is None or hi - lo > 1):
            if fits(lo + 1):
                lo += 1
            else:
                hi = lo + 1

    # 1. A bracket: lo fits (0: nothing does yet), hi does not (None: not found yet).
    first = min(max(guess or 1, 1), max_batch)
    lo, hi = (first, None) if fits(first) else (0, first)
    if lo and guess and lo < max_batch:  # is the guess already the answer?
        if not fits(lo + 1):
            hi = lo + 1
        else:
            lo = lo + 1
    far = min(max_batch, 64) if not guess else None
    predicted = False  # upward: one prediction from a line, then doubling
    while hi is None and lo < max_batch:
        b, use = lo * 2, False
        if far and far > lo:
            b, far = far, None
        elif not predicted:
            small = min(probes)
            if lo - small >= 8 and peak(lo) > peak(small):
                pred = _interpolate(small, peak(small), lo, peak(lo), budget)
                if pred > lo:
                    b, use, predicted = pred, True, True
        b = min(b, max_batch)
        if fits(b):
            take(b, use)
        else:
            hi = b
    if hi is not None and lo == 0:  # downward: the first probe did not fit
        while hi > 1 and lo == 0:
            b = hi // 2
            if fits(b):
                lo = b
            else:
                hi = b
    # 2. Narrow the bracket: predict from the line through its ends (and check the batch after a
    # prediction that fits); once a prediction does not halve the bracket, bisect.
    predict = True
    while hi is not None and hi - lo > 1:
        width = hi - lo
        use = predict and lo > 0
        b = _interpolate(lo, peak(lo), hi, peak(hi), budget) if use else (lo + hi) // 2
        b = min(max(b, lo + 1), hi - 1)
        if fits(b):
            take(b, use)
        else:
            hi = b
        predict = predict and hi - lo <= width // 2  # one that does not halve it: bisect from now on
    rows = [{"batch": k, "peak_bytes": v["peak_bytes"], "fits": v["peak_bytes"] <= budget}
            for k, v in sorted(probes.items())]
    if lo == 0:
        reason = (f"does not fit even batch 1: its compiled peak is "
                  f"{human_bytes(probes[1]['peak_bytes'])}, over the budget of {human_bytes(budget)}")
    elif hi is None:
        reason = f"fits the largest batch the lab searches ({max_batch})"
    else:
        reason = (f"batch {lo} peaks at {human_bytes(probes[lo]['peak_bytes'])}; batch {hi} "
                  f"would need {human_bytes(probes[hi]['peak_bytes'])}")
    return {
        "max_batch": lo, "peak_bytes": probes[lo]["peak_bytes"] if lo else None,
        "next_batch": hi, "next_peak_bytes": probes[hi]["peak_bytes"] if hi else None,
        "probes": rows, "compiles": sum(not v["cached"] for v in probes.values()),
        "reason": reason,
    }


def probe_seconds(config: RunConfig, repeats: int = 5) -> list[float]:
    """Seconds of ``repeats`` uncached compile-only probes of ``config`` (the probe cache cleared
    before each; XLA's persistent cache, when on, still applies): for the benchmark."""
    out = []
    for _ in range(repeats):
        _PROBES.drop(_probe_key(config))
        t = time.perf_counter()
        probe(config)
        out.append(time.perf_counter() - t)
    return out


"""The advisor's sizing of every policy (up to two searches at once, each exact to one) and its model flops.

A probe is a lowering (Python, one at a time under ``advisor_search``'s lock) and XLA's compile
(its own threads, the GIL released), so a second search lowers while the first compiles. The first
policy is searched alone; the rest start in the order given, each from the answer of the policy
that finished last (its ``guess``) and that policy's batch-independent bytes
(``batch_search.intercept``), so one probe and a prediction usually land on the boundary. A
policy whose program at batch one is the same text as an earlier policy's waits for that one and
starts at its answer: its probes are then that policy's compiles. Each search still ends on a batch
that fits and the next that does not, both compiled, so the answers do not depend on the threads
(``tests/test_advisor.py`` checks them against plain searches).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from remat_lab.analysis.costs import memory_report, program_flops
from remat_lab.analysis.xla_remat import rematerialized
from remat_lab.analysis.xla_remat import report as xla_remat_report
from remat_lab.config import LOCAL, RunConfig, get_target
from remat_lab.program.backend import ExecutionError, out_of_memory
from remat_lab.studies.advisor.batch_search import intercept, largest_batch
from remat_lab.studies.advisor.search import (
    MAX_BATCH,
    Progress,
    batch_unit,
    compile_abstract,
    probe,
    probed_flops,
    program_key,
)
from remat_lab.studies.probe_cache import ProbeCache
from remat_lab.studies.progress import Tracker

# Searches at once: a second search lowers (Python) while the first compiles (XLA). On this idle
# 2-core machine, 17 policies of the bench's transformer, read-only compiles: 56.0 and 59.3 s with
# two, 66.3 and 69.4 s with one, interleaved (under a load of ~6 two were slower: 219 vs 194 s).
WORKERS = 2 if (os.cpu_count() or 1) >= 2 else 1


def size_policies(configs: dict[str, RunConfig], budget: int, *, max_batch: int = MAX_BATCH,
                  progress: Progress | None = None, workers: int = WORKERS,
                  measure: Callable[[RunConfig], dict] | None = None,
                  key: Callable[[RunConfig], object] | None = None) -> dict[str, dict]:
    """``{policy: largest_batch(...)}`` for every configuration of ``configs`` (one per policy),
    searched in ``workers`` threads (1: one after another, in order). ``measure`` and ``key``
    (what says two policies lower alike: ``program_key``) are for tests with synthetic curves.
    A ``Tracker`` as ``progress`` (``advisor_timing.tracker``) also counts each policy as its search finishes,
    with its row (the live partial table), and starts the model flops' phase when all are sized."""
    say = progress or (lambda message: None)
    key = key or (lambda cfg: program_key(cfg.replace(batch=batch_unit(cfg))))
    names = list(configs)
    started: dict[object, Future] = {}  # program at batch one -> the first policy's result
    lock = threading.Lock()
    last: list[dict] = []  # results as they finish

    def search(i: int, p: str) -> dict:
        cfg = configs[p]
        same = key(cfg) if len(names) > 1 else None
        with lock:
            mine = Future()
            earlier = started.setdefault(same, mine) if same is not None else None
        if earlier is not None and earlier is not mine:  # lowers as an earlier policy: its answer
            guess, base = earlier.result()["max_batch"] or None, None
        else:
            with lock:
                prior = last[-1] if last else None
            guess = prior["max_batch"] or None if prior else None
            base = intercept(prior) if prior and guess else None
        try:
            found = largest_batch(cfg, budget, guess=guess, max_batch=max_batch, measure=measure,
                                  base_bytes=base,
                                  progress=lambda m: say(f"{i}/{len(names)} {m}"))
        except BaseException as err:
            mine.set_exception(err)
            raise
        mine.set_result(found)
        with lock:
            last.append(found)
        if isinstance(say, Tracker):
            say.finished(_progress_row(p, found), f"{i}/{len(names)} {p}: sized")
        return found

    if workers <= 1:
        out = {p: search(i, p) for i, p in enumerate(names, 1)}
    else:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="advise") as pool:
            # The first alone: the rest start from its answer and intercept, two at a time.
            first = pool.submit(search, 1, names[0])
            first.result()
            futures = {names[0]: first, **{p: pool.submit(search, i, p)
                                           for i, p in enumerate(names[1:], 2)}}
            try:
                out = {p: f.result() for p, f in futures.items()}
            except BaseException:
                for f in futures.values():
                    f.cancel()
                raise
    return out


def _progress_row(policy: str, found: dict) -> dict:
    """A sized policy's row of the live progress: ``largest_batch``'s answer without its probes."""
    return {"policy": policy, **{k: found.get(k) for k in (
        "max_batch", "per_device_batch", "peak_bytes", "next_batch", "next_peak_bytes", "compiles",
        "limited_by")}}



_UNLIMITED = ProbeCache(256)  # the flops of probes XLA's own rematerialization rewrote, as written


def xla_free(config: RunConfig) -> dict:
    """``probe(config)`` with XLA's own rematerialization accounted: ``{"flops", "xla_remat"}``
    where ``flops`` are the program's as the policy wrote it. When XLA's pass rewrote the probe's
    program, the program is compiled again with the pass's limit lifted (cached) and
    ``xla_remat`` (``analysis/xla_remat.report``) says what the pass added."""
    found = probe(config)
    remat = found.get("xla_remat") or {"applied": False}
    if not remat["applied"]:
        return {"flops": found["flops"], "xla_remat": xla_remat_report(0, found["flops"], None)}
    cached = _UNLIMITED.get(config)
    if cached is None:
        try:
            compiled = compile_abstract(config, unlimited=True)
        except ExecutionError as err:  # libtpu refuses the program as written: over its HBM
            if not out_of_memory(err):
                raise
            cached = {"flops": None, "left": 1, "peak_bytes": None}  # peak unknown: refused
        else:
            text = compiled.as_text()
            cached = {"flops": program_flops(compiled, text)[0], "left": len(rematerialized(text)),
                      "peak_bytes": (memory_report(compiled) or {}).get("peak_bytes")}
        _UNLIMITED.put(config, cached)
    device = None if config.target == LOCAL else get_target(config.target).memory_bytes
    out = xla_remat_report(remat["instructions"], found["flops"], found["peak_bytes"], cached,
                           device_bytes=device)
    return {"flops": cached["flops"] if not cached["left"] else None, "xla_remat": out}


# No_remat's flops between two of its compiled counts are read on the line through them when its
# counts lie on one line within this share (XLA's counts grow by the same flops per example within
# about 1e-7 from batch 2 up, transformer width 512 depth 8; batch 1's differ by 4e-4: left out).
FLOPS_RTOL = 1e-5


def model_flops_at(config: RunConfig, batches: set[int], done: Callable[[int], None] | None = None
                   ) -> tuple[dict[int, float | None], int]:
    """``({batch: flops}, interpolated)``: ``config``'s (no_remat's) flops at each batch, and how
    many of them were read on a line rather than compiled.

    Flops are always a program's that XLA's own rematerialization pass did not rewrite
    (``xla_free``). A batch already probed is read from its probe (cached). The
    others: with the smallest and the largest asked compiled (batch 1 on its own), each lies
    between two compiled counts (an end XLA's pass rewrote counts by its compile with the limit
    lifted); when the compiled counts from batch 2 up lie on one line within ``FLOPS_RTOL`` of
    each, it is read on the segment between its neighbours, else compiled, and so is a batch with
    no count on one side (an end whose lifted compile still recomputed: ``flops`` None)
    (``tests/test_advisor.py`` compares both with compiles of their own;
    ``tests/test_xla_remat.py`` a batch past the probes with the largest end rewritten).
    ``done(batch)`` is called as each batch's count is known (its progress)."""
    def flops(b: int) -> float | None:  # as the model wrote it: XLA's own recomputation left out
        found = xla_free(config.replace(batch=b))["flops"]
        if done is not None:
            done(b)
        return found

    probed = probed_flops(config)
    out = {b: flops(b) for b in batches if b == 1 or b in probed}
    rest = sorted(b for b in batches if b not in out)
    if not rest:
        return out, 0
    for b in dict.fromkeys((rest[0], rest[-1])):  # the ends compiled: everything else lies between counts
        out[b] = flops(b)
    # Every count as the model wrote it: the probes XLA's pass left alone, and the ends (where the
    # pass rewrote one, its compile with the limit lifted, which ``probed_flops`` does not hold).
    known = {b: f for b, f in probed_flops(config).items() if b > 1}
    known.update({b: f for b, f in out.items() if b > 1 and f is not None})
    pts = sorted(known.items())
    ok = len(pts) >= 3 and all(f is not None and f > 0 for _, f in pts)
    if ok:
        (b1, f1), (b2, f2) = pts[0], pts[-1]
        ok = all(abs(f1 + (f2 - f1) * (b - b1) / (b2 - b1) - f) <= FLOPS_RTOL * f for b, f in pts[1:-1])
    line = 0
    for b in rest[1:-1]:
        below = [p for p in pts if p[0] <= b]
        above = [p for p in pts if p[0] >= b]
        if not ok or not below or not above:  # no line, or no count on one side: compiled
            out[b] = flops(b)
            continue
        (lo, flo), (hi, fhi) = below[-1], above[0]
        out[b] = flo if hi == lo else float(round(flo + (fhi - flo) * (b - lo) / (hi - lo)))
        line += hi != lo
        if done is not None:
            done(b)
    return out, line

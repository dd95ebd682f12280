"""The advisor's sizing of every policy: searches in up to two threads, each exact to one.

A probe is a lowering (Python, one at a time under ``advisor_search``'s lock) and XLA's compile
(its own threads, the GIL released), so a second search lowers while the first compiles. The first
policy is searched alone; the rest start in the order given, each from the answer of the policy
that finished last (its ``guess``) and that policy's batch-independent bytes
(``advisor_search.intercept``), so one probe and a prediction usually land on the boundary. A
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
from fractions import Fraction

from remat_lab.config import RunConfig
from remat_lab.studies.advisor_search import (
    MAX_BATCH,
    Progress,
    batch_unit,
    intercept,
    largest_batch,
    probe,
    program_key,
)

# Searches at once. XLA CPU already compiles on several threads: on 2 cores a second search
# measured no faster (194 s one, 219 s two, 16 policies, load ~6), so two only from 4 cores.
WORKERS = 2 if (os.cpu_count() or 1) >= 4 else 1


def size_policies(configs: dict[str, RunConfig], budget: int, *, max_batch: int = MAX_BATCH,
                  progress: Progress | None = None, workers: int = WORKERS,
                  measure: Callable[[RunConfig], dict] | None = None,
                  key: Callable[[RunConfig], object] | None = None,
                  then: Callable[[str, dict], object] | None = None) -> dict[str, dict]:
    """``{policy: largest_batch(...)}`` for every configuration of ``configs`` (one per policy),
    searched in ``workers`` threads (1: one after another, in order). ``then(policy, found)``: more
    work for a sized policy, queued behind the searches not yet started. ``measure`` and ``key``
    (what says two policies lower alike: ``program_key``) are for tests with synthetic curves."""
    say = progress or (lambda message: None)
    key = key or (lambda cfg: program_key(cfg.replace(batch=batch_unit(cfg))))
    names = list(configs)
    started: dict[object, Future] = {}  # program at batch one -> the first policy's result
    lock = threading.Lock()
    last: list[dict] = []  # results as they finish
    pools: list[ThreadPoolExecutor] = []  # the pool, once there is one
    after: list[Future] = []  # the ``then`` calls queued

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
            if then is not None and pools:
                after.append(pools[0].submit(then, p, found))
        if then is not None and not pools:
            then(p, found)
        return found

    if workers <= 1:
        return {p: search(i, p) for i, p in enumerate(names, 1)}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="advise") as pool:
        pools.append(pool)
        # The first alone: the rest start from its answer and intercept, two at a time.
        first = pool.submit(search, 1, names[0])
        first.result()
        futures = {names[0]: first, **{p: pool.submit(search, i, p)
                                       for i, p in enumerate(names[1:], 2)}}
        try:
            out = {p: f.result() for p, f in futures.items()}
            for f in list(after):  # complete: every search has queued its own
                f.result()
            return out
        except BaseException:
            for f in [*futures.values(), *after]:
                f.cancel()
            raise



def flops_on_the_line(config: RunConfig, batch: int, measured: list[int]) -> float | None:
    """``config``'s flops at ``batch`` from its probes at the ``measured`` batches (cached, no
    compile) when three or more lie exactly on one line, whole numbers all (the step's flops grow
    by the same count per example: matmuls, elementwise work and the loss all scale with it); else
    None, and the caller compiles that batch."""
    counts = {b: probe(config.replace(batch=b))["flops"] for b in sorted(set(measured))}
    if len(counts) < 3 or any(f is None or not float(f).is_integer() for f in counts.values()):
        return None
    (b1, f1), (b2, f2) = min(counts.items()), max(counts.items())
    slope = Fraction(int(f2) - int(f1), b2 - b1)
    if any(int(f1) + slope * (b - b1) != int(f) for b, f in counts.items()):
        return None
    at = int(f1) + slope * (batch - b1)
    return float(at) if at.denominator == 1 and at > 0 else None

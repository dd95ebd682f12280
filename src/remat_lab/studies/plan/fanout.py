"""The planner's compiles fanned out over worker processes (spawned: JAX is not fork-safe)."""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from remat_lab.config import RunConfig

# Memory allowed a worker: an allowance, not a measurement of the largest (measured here: a worker
# compiling Llama 2 7B for 16 H100s 1.3 GB; the planning process of Llama 3.1 70B on 256 v6e 3.0 GB).
WORKER_BYTES = 6 << 30


def default_workers(memory_bytes: int | None = None) -> int:
    """Worker processes: one per core, at most one per ``WORKER_BYTES`` of this machine's memory."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if memory_bytes is None:
        try:
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            memory_bytes = WORKER_BYTES
    return max(1, min(cores, memory_bytes // WORKER_BYTES))


def start_worker(cache: bool, parent: int | None = None) -> None:
    """A worker's start: it ends itself once ``parent`` (the planner's process) is gone, whatever
    ended it (a signal, the app's Stop killing its job's process, a closed tab), and the persistent
    compile cache is turned on when ``cache``."""
    if parent is not None:
        threading.Thread(target=_orphaned, args=(parent,), daemon=True, name="plan-watchdog").start()
    if cache:
        from remat_lab.program.backend import enable_compilation_cache

        enable_compilation_cache()


def _orphaned(parent: int, every_s: float = 0.5) -> None:
    """Exit this process once its parent is no longer ``parent`` (reparented: the planner died)."""
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(1)


def compile_one(fields: dict) -> dict:
    """One candidate compiled for its target (the Advisor's compile-only probe, nothing allocated):
    its peak, whether the compiler refused it, and its predicted step (``analysis/predict.py``)."""
    from remat_lab.analysis.estimate import estimate_step
    from remat_lab.analysis.predict import predict_step
    from remat_lab.config import get_target
    from remat_lab.studies.advisor.search import probe

    config = RunConfig(**fields)
    found = probe(config)
    refused = str(found.get("fingerprint", "")).startswith("over the device")
    out = {"peak_bytes": found["peak_bytes"], "temp_bytes": (found.get("memory") or {}).get("temp_bytes"),
           "refused": refused, "flops": found.get("flops"), "predicted_s": None, "bound_s": None,
           "limited_by": None, "xla_remat": (found.get("xla_remat") or {}).get("applied", False),
           "compile_s": found.get("s")}
    if refused or found.get("flops") is None:
        return out
    target = get_target(config.target, config.network)
    est = estimate_step(found["flops"], found.get("bytes_accessed"), target, config.dtype,
                        found.get("traffic"))
    pred = predict_step(target, est, kernels=found.get("kernels"),
                        events=found.get("schedule"), overlap=config.collective_overlap)
    out.update(predicted_s=pred.get("predicted_s"), bound_s=est.get("estimate_s"),
               limited_by=pred.get("limited_by") or est.get("bound"))
    return out


class Fanout:
    """Compiles run ``workers`` at a time in spawned processes (``workers`` 0: in this process, as
    the tests' small programs do); ``run`` yields each answer as it lands."""

    def __init__(self, workers: int, cache: bool = True) -> None:
        self.workers, self._pool = workers, None
        if workers > 0:
            main = sys.modules.get("__main__")
            # spawn re-imports the parent's __main__ (under Streamlit, the page): give it an empty one
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=start_worker, initargs=(cache, os.getpid()))
            finally:
                sys.modules["__main__"] = main
        elif cache:
            start_worker(cache)

    def run(self, jobs: Iterable[tuple[object, RunConfig]]) -> Iterator[tuple[object, dict | Exception]]:
        """``(key, config)`` jobs compiled; yields ``(key, figures)`` (or the exception) as each ends
        (the caller's heartbeat runs beside it: ``ledger.collect``)."""
        jobs = list(jobs)
        if self._pool is None:
            for key, config in jobs:
                yield key, _guarded(compile_one, config.as_dict())
            return
        pending: dict[Future, object] = {self._pool.submit(compile_one, c.as_dict()): k for k, c in jobs}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                key = pending.pop(f)
                err = f.exception()
                yield key, err if err is not None else f.result()

    def close(self) -> None:
        """Stop at once: queued compiles cancelled, running ones' workers terminated (a compile
        runs to its end otherwise, minutes at pod scale)."""
        if self._pool is not None:
            procs = list((getattr(self._pool, "_processes", None) or {}).values())
            self._pool.shutdown(wait=False, cancel_futures=True)
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            for proc in procs:
                proc.join(timeout=5)
            self._pool = None


def _guarded(fn: Callable[[dict], dict], fields: dict) -> dict | Exception:
    try:
        return fn(fields)
    except Exception as err:  # the caller files it as that candidate's failure
        return err

"""Inside a worker process: one job by its kind (``execute``) and the loop that serves the queue (``serve``).

``serve`` is the target of every worker process (``spawn``: it must stay importable by name). It
turns on the persistent compilation cache, warms up with a tiny untimed run (``WARM``), says
``ready``, then answers ``(job_id, kind, payload)`` requests with stages and a value or an error.
A stage is a line, or a ``studies.progress.Step`` (a line with counts and the finished rows so far),
sent as it is: the pool hands it to the page's progress unchanged.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from remat_lab.config import ConfigError, MemoryBudgetError, RunConfig, limits
from remat_lab.program import failures, targets
from remat_lab.program.backend import ExecutionError
from remat_lab.serve import quotas
from remat_lab.store.history import public_mode

WARM = RunConfig(width=8, batch=1, repeats=1, warmup=0)


def execute(kind: str, payload: dict, progress: Callable[[str], None]) -> Any:
    """One job, in this process (a worker, or the caller for a pool of size 0)."""
    from remat_lab.program import backend
    from remat_lab.studies import compare, experiment

    if kind == "environment":
        return backend.environment()
    if kind == "device_limit":
        return backend.device_memory_limit()
    cfg = RunConfig(**payload["config"])
    if cfg.model_module and public_mode():  # a visitor's code never runs on a public server
        raise ConfigError("your own block (model_module) runs your Python code, so it runs only on a "
                          "private instance of the app, never on this public server.")
    if kind == "run":
        result = experiment.run_experiment(cfg, progress=progress)
        result.pop("texts", None)  # the timed result is kept small; Inspect asks for "programs"
        return result
    if kind == "programs":
        return experiment.run_experiment(cfg, progress=progress, timing=False)
    if kind == "untimed":  # a Sweep configuration: its cell times it with the others (sweep_time)
        result = experiment.run_experiment(cfg, progress=progress, timing=False)
        result.pop("texts", None)
        return result
    if kind == "mesh_table":  # Compare's per-device table on a mesh: every policy compiled, not run
        from remat_lab.studies import mesh_table

        return mesh_table.compare_on_mesh(cfg, list(payload["policies"]))
    if kind == "compare":
        return compare.compare_policies(cfg, list(payload["policies"]), progress=progress)
    if kind == "sweep_time":  # a Sweep cell's steps timed together, interleaved (studies/sweep.py)
        from remat_lab.studies import sweep

        docs = [{"flops": f} for f in payload["flops"]]
        sweep.time_interleaved([RunConfig(**c) for c in payload["configs"]], docs, progress=progress)
        return docs
    if kind in ("advise", "advise_sizes"):  # the timed advice, and the compile-only one
        from remat_lab.studies import advisor

        bound = {"max_batch": int(payload["max_batch"])} if payload.get("max_batch") else {}
        if payload.get("time_budget_s"):
            bound["time_budget_s"] = float(payload["time_budget_s"])
        return advisor.advise(cfg, int(payload["budget"]), policies=list(payload["policies"]),
                              timing=kind == "advise", progress=progress,
                              should_stop=stopper(kind, payload.get("stop_file")), **bound)
    if kind == "synthesize":  # the policy synthesizer: compile-only, Stop and deadline between compiles
        from remat_lab.studies.synthesize import synthesize

        return synthesize(cfg, int(payload["budget"]), goal=str(payload["goal"]),
                          batch=int(payload["batch"]) if payload.get("batch") else None,
                          policies=list(payload["policies"]) if payload.get("policies") else None,
                          max_batch=int(payload.get("max_batch") or 65536), progress=progress,
                          should_stop=stopper(kind, payload.get("stop_file")))
    if kind == "plan":  # the planner: compiles in this worker, one at a time (the server's pool bounds them)
        from remat_lab.studies.plan import plan_across

        tokens = payload.get("global_batch_tokens")
        also = [(str(t), int(n), float(p) if p else None) for t, n, p in payload.get("also") or []]
        return plan_across(cfg, also, price=float(payload["price"]) if payload.get("price") else None,
                           budget_tokens=float(payload["budget_tokens"]) if payload.get("budget_tokens")
                           else None, global_batch_tokens=int(tokens) if tokens else None,
                           slices=int(payload["slices"]) if payload.get("slices") else None,
                           tensor=tuple(int(t) for t in payload["tensor"]), plans=tuple(payload["plans"]),
                           offload=bool(payload["offload"]), top=int(payload["top"]), workers=0,
                           knobs_from_published=("attention_block", "stack", "loss_chunks"),
                           progress=progress)
    raise ValueError(f"unknown job kind {kind!r}")


def stopper(kind: str, stop_file: str | None) -> Callable[[], str | None] | None:
    """The advice's ``should_stop`` (checked between timing rounds): ``"stopped"`` once the page's
    Stop made its flag file, ``"deadline"`` once this kind's deadline (``quotas``; the pool kills the
    worker at it) is near, so that the finished rounds come back as an answer. None: neither."""
    limit = quotas.deadline_for(quotas.deadlines(), kind)
    ends = time.monotonic() + limit - max(5.0, 0.1 * limit) if limit else None
    if not stop_file and ends is None:
        return None

    def should_stop() -> str | None:
        if stop_file and os.path.exists(stop_file):
            return "stopped"
        return "deadline" if ends is not None and time.monotonic() > ends else None
    return should_stop


def error_reply(err: BaseException) -> tuple[str, str]:
    """``(kind, sentence)`` of a job's error: ``budget``, ``config``, a ``program.failures`` class's
    name (an error not worded before is the lab's bug), or ``execution``."""
    if isinstance(err, ConfigError):
        return ("budget" if isinstance(err, MemoryBudgetError) else "config"), str(err)
    if not isinstance(err, ExecutionError):
        err = failures.lab_bug("running this job", err)
    return (type(err).__name__ if hasattr(failures, type(err).__name__) else "execution"), str(err)


def serve(requests, replies, env: dict) -> None:
    """The worker's loop: ``(job_id, kind, payload)`` in, ``(job_id, what, value, rss)`` out."""
    os.environ.update(env)
    from remat_lab.program import backend, distributed

    try:  # $REMAT_LAB_HOST_DEVICES: emulated CPU devices, set before JAX starts its backend
        distributed.apply_env()
    except Exception:  # noqa: BLE001 - the server shows the same error from its own check
        pass
    targets.start_backend_quietly()  # the CUDA plugin's "no driver" lines stay out of the server log
    try:
        backend.enable_compilation_cache()
    except ConfigError:  # an unwritable cache folder: compile without it (the CLI says why)
        pass
    try:
        execute("programs", {"config": WARM.as_dict()}, lambda s: None)  # imports, backend, tracing
    except Exception:  # a warm-up failure shows in the first real job
        pass
    replies.put((None, "ready", os.getpid(), limits.rss_bytes()))
    while (msg := requests.get()) is not None:
        job_id, kind, payload = msg
        try:
            value = execute(kind, payload,
                            lambda stage, job=job_id: replies.put((job, "stage", stage, None)))
        except Exception as err:
            replies.put((job_id, "error", error_reply(err), limits.rss_bytes()))
        else:
            replies.put((job_id, "done", value, limits.rss_bytes()))

"""The server's memory budget in the app: the device's limit (asked of the worker), the over-budget flag."""

from __future__ import annotations

import streamlit as st

from remat_lab.config import LOCAL, ConfigError, RunConfig, estimate_bytes, human_bytes, resolve_budget
from remat_lab.model.models import SEQ_MODELS
from remat_lab.program.backend import ExecutionError
from remat_lab.serve import worker


@st.cache_resource(show_spinner=False)
def _worker_device_limit() -> int | None:
    return worker.shared_pool().call("device_limit", {})


def device_limit() -> int | None:
    """The device's memory limit, as the worker process sees it (None on CPU, or while no worker
    could be started: asked again on the next run, a failure is not cached)."""
    try:
        return _worker_device_limit()
    except ExecutionError:
        return None


def budget_or_none() -> int | None:
    try:
        return resolve_budget(None, device_limit())
    except ConfigError:  # a malformed budget setting: run_config reports it when a run is asked for
        return None


def over_budget(cfg: RunConfig) -> tuple[int, int] | None:
    """``(estimate, budget)`` in bytes when ``cfg`` is too large for this server, else None. On a
    named target nothing is allocated: never too large (compile-only, ``targets.compile_only_bytes``).
    On an attached GPU or TPU never flagged before the compile: its memory analysis answers (a
    compile costs seconds; the run refuses a program over the device's memory)."""
    if cfg.target != LOCAL or device_limit() is not None:  # an accelerator: the compile answers
        return None
    need, budget = estimate_bytes(cfg), budget_or_none()
    return (need, budget) if budget is not None and need > budget else None


def budget_message(need: int, budget: int, model: str = "seq_mixer") -> str:
    """The over-budget flag: the estimate, the budget and the sidebar settings that lower it."""
    knobs = "width, batch, seq or depth" if model in SEQ_MODELS else "width, batch or depth"
    return (f"**This configuration cannot run here.** Estimated {human_bytes(need)}, over the "
            f"memory budget of {human_bytes(budget)} on this server: lower {knobs}.")


def memory_caption(cfg: RunConfig) -> str:
    """The sidebar's sentence on memory: nothing allocated on a named target or compile-only; on an
    attached accelerator the compile's memory analysis decides; else the estimate and the budget."""
    allowed = f" (this server allows {human_bytes(b)})" if (b := budget_or_none()) else ""
    need = human_bytes(estimate_bytes(cfg.replace(compile_only=False)))
    if cfg.target != LOCAL:
        return f"Compiled for the {cfg.target} without it: nothing is allocated here. "
    if device_limit() is not None:
        return (f"On this accelerator the compile's memory analysis decides whether it fits the "
                f"{human_bytes(b or 0)} the device holds. ")
    if cfg.compile_only:
        return f"Compile only: nothing is allocated; running it would need about {need}{allowed}. "
    return f"Estimated memory need: {need}{allowed}. "

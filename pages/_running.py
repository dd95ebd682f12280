"""Running configurations from the pages: the cached engine calls, their progress box and errors."""

from __future__ import annotations

import re
import threading
import time

import streamlit as st

from pages._sidebar import _device_limit, describe, over_budget
from remat_lab import experiment
from remat_lab.config import (
    ConfigError,
    MemoryBudgetError,
    RunConfig,
    check_budget,
    estimate_bytes,
    resolve_budget,
)
from remat_lab.experiment import STAGES, ExecutionError
from remat_lab.models import SEQ_MODELS

STAGE_TEXT = {
    "waiting": "Waiting: another session is timing a run (one timing at a time)",
    "building": "Building the model",
    "lowering": "Lowering the step",
    "compiling": "Compiling with XLA",
    "timing": "Timing the compiled step",
    "checking": "Checking gradients against no_remat",
    "dissecting": "Dissecting jaxprs and compiled HLO",
}
assert set(STAGE_TEXT) == set(STAGES)
QUICK_FLOPS = 3e10  # auto-run below this many flops of timed work (a few seconds on 2 cores)

_PROGRESS = threading.local()  # the progress callback of the run in progress


def _progress(stage: str) -> None:
    (getattr(_PROGRESS, "callback", None) or (lambda s: None))(stage)


# A result without program texts is up to ~200 KB (depth-16 loop: tables and the memory timeline):
# 128 entries bound this cache at ~25 MiB.
@st.cache_data(show_spinner=False, max_entries=128)
def _cached_run(items: tuple) -> dict:
    """The engine's timed result for a configuration, without the program texts."""
    result = experiment.run_experiment(RunConfig(**dict(items)), progress=_progress)
    result.pop("texts", None)
    return result


@st.cache_data(show_spinner=False, max_entries=16)
def _cached_programs(items: tuple) -> dict:
    """The untimed result with the jaxpr and HLO texts (large: few are kept)."""
    return experiment.run_experiment(RunConfig(**dict(items)), progress=_progress, timing=False)


def run_config(cfg: RunConfig, status, prefix: str = "", keep_texts: bool = False) -> dict:
    """One cached run, naming each stage in ``status``; raises ConfigError / ExecutionError.

    ``keep_texts=True`` (the Inspect page) returns the jaxpr and HLO texts and skips the timing:
    reading programs should not wait for, or take, the timing lock.
    """
    def progress(stage: str) -> None:
        status.update(label=f"{prefix}{STAGE_TEXT.get(stage, stage)}…", state="running")

    # The budget is checked before the cache too: lowering it refuses cached configurations as well.
    check_budget(cfg, resolve_budget(None, _device_limit()))
    _PROGRESS.callback = progress
    try:
        items = tuple(sorted(cfg.as_dict().items()))
        return _cached_programs(items) if keep_texts else _cached_run(items)
    finally:
        _PROGRESS.callback = None


def is_quick(cfg: RunConfig) -> bool:
    """Whether ``cfg`` should run as soon as a control changes (a few seconds at most)."""
    rows = max(cfg.batch, 1) * (cfg.seq if cfg.model in SEQ_MODELS else 1)
    fwd = 4 * rows * cfg.width ** 2 * cfg.depth
    if cfg.model == "transformer":  # 16 w^2 of projections per row, scores and context
        fwd = (32 * rows * cfg.width ** 2 + 4 * cfg.batch * cfg.seq ** 2 * cfg.width) * cfg.depth
    if cfg.model == "seq_mixer":
        fwd += 4 * max(cfg.batch, 1) * cfg.seq ** 2 * cfg.width * cfg.depth
    return 3 * fwd * (cfg.repeats + cfg.warmup) < QUICK_FLOPS and estimate_bytes(cfg) < (1 << 30)


def run_one(cfg: RunConfig, keep_texts: bool = True, button_key: str = "run_now") -> dict | None:
    """The current configuration's result with a progress box; None (after st.error) on failure.

    Quick configurations run at once; slower ones wait for a click (and then stay remembered).
    """
    if over_budget(cfg):  # flagged in the sidebar (see _sidebar._render_controls): nothing to offer here
        st.info("Nothing was run: the configuration in the sidebar is too large for this server.",
                icon=":material/arrow_back:")
        return None
    ran = st.session_state.setdefault("_ran", set())
    key = (cfg, keep_texts)
    if not is_quick(cfg) and key not in ran:
        st.info("This configuration may take a while to compile and time, so it does not run "
                "automatically.")
        if not st.button("Run this configuration", key=button_key, type="primary"):
            return None
    t0 = time.perf_counter()
    what = describe(cfg) if not keep_texts else describe(cfg).rsplit(",", 1)[0] + ", programs only"
    with st.status(f"Running {what}…", expanded=False) as status:
        try:
            result = run_config(cfg, status, keep_texts=keep_texts)
        except (ConfigError, ExecutionError) as err:
            status.update(label="Run failed", state="error")
            error = err
        else:
            error = None
            took = time.perf_counter() - t0
            status.update(label=f"Done: {what} ({took:.1f} s"
                                f"{', from cache' if took < 0.2 else ''})", state="complete")
            st.write(" → ".join(s for s in STAGES if s != "waiting" and not (keep_texts and s == "timing")))
    if error is not None:
        show_error(error)
        return None
    ran.add(key)
    return result


def show_error(err: Exception) -> None:
    """ConfigError / ExecutionError as a red box with what to change."""
    if isinstance(err, ConfigError):
        text = str(err)
        if isinstance(err, MemoryBudgetError):  # the engine's advice names a CLI flag: not for the web
            text = re.sub(r" \(or raise the budget with [^)]*\)", "", text)
        st.error(f"**This configuration cannot run.** {text}\n\nChange the settings in the sidebar "
                 "(for example a smaller width, batch, seq or depth); the app keeps serving.")
    elif isinstance(err, ExecutionError):
        st.error(f"**XLA failed.** {err}\n\nChange the settings in the sidebar and the app will "
                 "run again.")
    else:
        st.error(f"Unexpected error: {err}")

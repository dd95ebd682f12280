"""Streamlit code shared by the router (app.py) and every page.

Sidebar controls (kept across pages), the URL mirror of the configuration, the cached run wrapper
with its progress box, the environment line and the error display. Pages stay thin.
"""

from __future__ import annotations

import re
import threading
import time
from contextlib import contextmanager

import streamlit as st

from remat_lab import experiment
from remat_lab.config import (
    CHOICES,
    DTYPES,
    LIMITS,
    NAME_FIELDS,
    OBJECTIVES,
    ConfigError,
    MemoryBudgetError,
    RunConfig,
    check_budget,
    coerce_config,
    estimate_bytes,
    human_bytes,
    resolve_budget,
)
from remat_lab.experiment import STAGES, ExecutionError
from remat_lab.models import SEQ_MODELS, names_of
from remat_lab.policies import DEFAULT_POLICY, GROUPS, POLICIES

CONTROL_KEYS = ("model", "width", "batch", "seq", "heads", "depth", "stack", "dtype", "policy",
                "objective", "repeats")
NAME_CHOICES = ("save", "offload", "recompute")  # the custom editor, one control per checkpoint name
# The app opens where policies visibly differ on a CPU: a scanned 8-block mlp (width 256, batch
# 128). Measured (XLA CPU): peak 10.4 MiB (nothing_saveable) / 11.7 (no_remat) / 12.2
# (dots_with_no_batch_dims_saveable), one step about 8 ms; the engine's own default stays the
# seed's one-block case.
DEFAULT = RunConfig(width=256, batch=128, depth=8)
POW2_WIDTHS = [2 ** i for i in range(3, 13)]  # 8 .. 4096
POW2_BATCHES = [2 ** i for i in range(0, 13)]  # 1 .. 4096
POW2_SEQS = [2 ** i for i in range(0, 11)]  # 1 .. 1024
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

_RUN = threading.local()  # the router's config for this script run; the progress callback


def policy_label(pid: str) -> str:
    return POLICIES[pid].label if pid in POLICIES else pid


def grouped_policy_label(pid: str) -> str:
    """The policy picker's label: its group (JAX policies / MaxText recipes / custom), then the id."""
    return f"{GROUPS[POLICIES[pid].group]} › {pid}" if pid in POLICIES else pid


def _custom_names(ss) -> dict:
    """``save_names``/``offload_names`` from the custom editor's controls (only for policy custom)."""
    if ss["policy"] != "custom":
        return {}
    choice = {n: ss.get(f"custom_{n}") or "recompute" for n in names_of(ss["model"])}
    return {"save_names": tuple(n for n, c in choice.items() if c == "save"),
            "offload_names": tuple(n for n, c in choice.items() if c == "offload")}


def describe(cfg: RunConfig) -> str:
    shape = "x".join(map(str, cfg.input_shape))
    return (f"{cfg.model} {cfg.dtype} x:({shape}) depth {cfg.depth}, {cfg.policy}, "
            f"{cfg.objective}, {cfg.repeats} repeats")


# ---------------------------------------------------------------- URL <-> controls


def _read_url_once() -> list[str]:
    """On a session's first run, copy valid URL values into the controls; warn about bad ones."""
    if st.session_state.get("_url_loaded"):
        return []
    st.session_state["_url_loaded"] = True
    warnings, values = [], {}
    for key in CONTROL_KEYS:
        if key not in st.query_params:
            continue
        raw = st.query_params[key]
        try:  # validate one parameter at a time so the warning names it; never executed
            values[key] = getattr(coerce_config({key: raw} if key != "batch" else
                                                {key: raw, "model": "mlp"}), key)
        except ConfigError as err:
            allowed = (", ".join(CHOICES[key]) if key in CHOICES
                       else "a whole number from {} to {}".format(*LIMITS[key]))
            warnings.append(f"URL parameter `{key}` = `{str(raw)[:40]}` is not valid ({err}) "
                            f"Allowed: {allowed}. Using the default, `{getattr(DEFAULT, key)}`.")
    if values.get("batch") == 0 and values.get("model") == "seq_mixer":
        warnings.append("URL parameter `batch` = `0` (a single vector) is only for the mlp model. "
                        f"Using the default, `{DEFAULT.batch}`.")
        values.pop("batch")
    for key in NAME_FIELDS:  # custom's names: checked against the URL's model
        if key not in st.query_params:
            continue
        raw = st.query_params[key]
        model = values.get("model", DEFAULT.model)
        try:
            names = getattr(coerce_config({"model": model, "policy": "custom", key: raw}), key)
        except ConfigError as err:
            warnings.append(f"URL parameter `{key}` = `{str(raw)[:40]}` is not valid ({err}) "
                            "Using none: those tensors are recomputed.")
            continue
        values.update({f"custom_{n}": "save" if key == "save_names" else "offload" for n in names})
    for key, value in values.items():
        st.session_state[key] = value
    if "width" in values:
        st.session_state["width_exact"] = values["width"]
    return warnings


def _write_url(cfg: RunConfig) -> None:
    wanted = {k: str(getattr(cfg, k)) for k in CONTROL_KEYS if k != "heads" or cfg.model == "transformer"}
    wanted.update({k: ",".join(getattr(cfg, k)) for k in NAME_FIELDS if getattr(cfg, k)})
    if {k: st.query_params.get(k) for k in st.query_params} != wanted:
        st.query_params.from_dict(wanted)


def _width_from_slider() -> None:
    st.session_state["width_exact"] = st.session_state["width"]


def _width_from_entry() -> None:
    st.session_state["width"] = int(st.session_state["width_exact"])


def _render_controls() -> RunConfig:
    warnings = _read_url_once()
    ss = st.session_state
    for key in CONTROL_KEYS:
        ss.setdefault(key, getattr(DEFAULT, key))
    ss.setdefault("width_exact", ss["width"])
    sb = st.sidebar
    sb.title("Remat Lab")
    sb.caption("What a JAX checkpoint policy does to a Flax NNX model.")
    flag = sb.empty()  # the over-budget flag goes here, above the controls, once they are read
    sb.radio("Model", CHOICES["model"], key="model", horizontal=True,
             help="mlp: relu(l2(relu(l1(x)))); seq_mixer adds token mixing whose dots pair batch axes; "
                  "transformer: a pre-norm decoder block (causal attention, gated MLP) with "
                  "MaxText's checkpoint names.")
    sb.select_slider("Width D (features)", options=sorted(set(POW2_WIDTHS) | {ss["width"]}),
                     key="width", on_change=_width_from_slider)
    sb.number_input("…or type any width", min_value=LIMITS["width"][0], max_value=LIMITS["width"][1],
                    step=1, key="width_exact", on_change=_width_from_entry)
    if ss["model"] != "mlp" and ss["batch"] == 0:
        ss["batch"] = 1
    batches = ([0] if ss["model"] == "mlp" else []) + POW2_BATCHES
    sb.select_slider("Batch B", options=sorted(set(batches) | {ss["batch"]}), key="batch",
                     format_func=lambda b: "single vector" if b == 0 else str(b),
                     help="single vector = x: (D,), the seed's case (mlp only).")
    sb.select_slider("Sequence length N (seq_mixer, transformer)",
                     options=sorted(set(POW2_SEQS) | {ss["seq"]}), key="seq",
                     disabled=ss["model"] not in SEQ_MODELS)
    if ss["model"] == "transformer":
        heads = [h for h in range(1, LIMITS["heads"][1] + 1) if int(ss["width"]) % h == 0]
        if ss["heads"] not in heads:  # the width changed: the nearest head count that divides it
            ss["heads"] = max(h for h in heads if h <= ss["heads"]) if ss["heads"] > 1 else 1
        sb.select_slider("Attention heads", options=heads, key="heads",
                         help="Heads of width / heads features each; only divisors of the width.")
    sb.slider("Depth (remat'd blocks)", *LIMITS["depth"], key="depth")
    sb.radio("Stack", CHOICES["stack"], key="stack", horizontal=True, disabled=ss["depth"] == 1,
             help="How depth > 1 blocks run: scan over layers stacked on a leading axis (nnx.scan, "
                  "how production code is written), or an unrolled Python loop, where XLA CPU "
                  "merges most recomputation back into the forward pass (see the Guide).")
    sb.radio("dtype", DTYPES, key="dtype", horizontal=True)
    sb.selectbox("Checkpoint policy", list(POLICIES), key="policy", format_func=grouped_policy_label,
                 help=POLICIES[ss["policy"]].description if ss["policy"] in POLICIES else None)
    if ss["policy"] == "custom":
        sb.caption(f"Per checkpoint name of {ss['model']}: save on the device, offload to pinned "
                   "host memory, or recompute.")
        for name in names_of(ss["model"]):
            ss.setdefault(f"custom_{name}", "recompute")
            sb.segmented_control(f"`{name}`", NAME_CHOICES, key=f"custom_{name}")
    sb.radio("Objective", OBJECTIVES, key="objective", horizontal=True)
    sb.number_input("Timed repeats", min_value=LIMITS["repeats"][0], max_value=LIMITS["repeats"][1],
                    step=1, key="repeats")
    try:
        cfg = RunConfig(**{k: (int(ss[k]) if k in LIMITS else ss[k]) for k in CONTROL_KEYS},
                        **_custom_names(ss))
    except ConfigError as err:  # should not happen: every control offers valid values only
        st.warning(f"{err} Using the defaults.")
        cfg = DEFAULT
    for text in warnings:
        st.warning(text)
    _write_url(cfg)
    over = over_budget(cfg)
    if over:
        flag.error(budget_message(*over, cfg.model), icon=":material/memory:")
    else:
        budget = _budget_or_none()
        allowed = f" (this server allows {human_bytes(budget)})" if budget else ""
        sb.caption(f"Estimated memory need: {human_bytes(estimate_bytes(cfg))}{allowed}. "
                   "The link in the address bar restores these settings.")
    return cfg


# ---------------------------------------------------------------- memory budget


@st.cache_resource(show_spinner=False)
def _device_limit() -> int | None:
    return experiment.device_memory_limit()


def _budget_or_none() -> int | None:
    try:
        return resolve_budget(None, _device_limit())
    except ConfigError:  # a malformed budget setting: run_config reports it when a run is asked for
        return None


def over_budget(cfg: RunConfig) -> tuple[int, int] | None:
    """``(estimate, budget)`` in bytes when ``cfg`` is too large for this server, else None."""
    need, budget = estimate_bytes(cfg), _budget_or_none()
    return (need, budget) if budget is not None and need > budget else None


def budget_message(need: int, budget: int, model: str = "seq_mixer") -> str:
    """The over-budget flag: the estimate, the budget and the sidebar settings that lower it."""
    knobs = "width, batch, seq or depth" if model in SEQ_MODELS else "width, batch or depth"
    return (f"**This configuration cannot run here.** Estimated {human_bytes(need)}, over the "
            f"memory budget of {human_bytes(budget)} on this server: lower {knobs}.")


def _leave_legacy_page_mode() -> None:
    """Hand a page run by Streamlit's legacy ``pages/`` discovery back to the router.

    A server's first request that names a page (``/sweep``, a shared link) is served in the old
    multipage mode because ``pages/`` exists: the page script runs without ``app.py`` and the
    sidebar lists every file in ``pages/``. That mode ends only when ``st.navigation`` is called,
    so end it and rerun: the rerun executes ``app.py``, which routes to the same URL path.
    """
    from streamlit.runtime.pages_manager import PagesManager  # the flag lives nowhere public

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        st.rerun()


def controls() -> RunConfig:
    """The sidebar controls' configuration; rendered once per script run (router or page)."""
    cfg = getattr(_RUN, "config", None)
    if cfg is not None:
        return cfg
    _leave_legacy_page_mode()
    return _render_controls()


@contextmanager
def routed(cfg: RunConfig):
    """Used by app.py around ``pg.run()`` so pages reuse the router's controls."""
    _RUN.config = cfg
    try:
        yield
    finally:
        _RUN.config = None


# ---------------------------------------------------------------- running


def _progress(stage: str) -> None:
    (getattr(_RUN, "progress", None) or (lambda s: None))(stage)


@st.cache_data(show_spinner=False, max_entries=512)
def _cached_run(items: tuple) -> dict:
    """The engine's timed result for a configuration, without the program texts (small)."""
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
    _RUN.progress = progress
    try:
        items = tuple(sorted(cfg.as_dict().items()))
        return _cached_programs(items) if keep_texts else _cached_run(items)
    finally:
        _RUN.progress = None


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
    if over_budget(cfg):  # flagged in the sidebar (see _render_controls): nothing to offer here
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


# ---------------------------------------------------------------- page furniture


@st.cache_resource(show_spinner=False)
def _environment() -> dict:
    return experiment.environment()


def page_start(title: str, intro: str | None = None) -> RunConfig:
    """Controls, header and environment line; the configuration to use."""
    cfg = controls()
    st.header(title)
    if intro:
        st.caption(intro)
    env_line()
    return cfg


def env_line() -> None:
    e = _environment()
    st.caption(f"Environment: backend **{e['backend']}** · device {e['device_kind']} × "
               f"{e['device_count']} · {e['cpu_count']} CPU cores · jax {e['jax']} · jaxlib "
               f"{e['jaxlib']} · flax {e['flax']} · streamlit {st.__version__}")


__all__ = ["controls", "routed", "run_one", "run_config", "show_error", "page_start", "env_line",
           "describe", "policy_label", "is_quick", "STAGE_TEXT",
           "DEFAULT_POLICY", "over_budget", "budget_message"]

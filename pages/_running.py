"""Running configurations from the pages: the cached engine calls, their progress box and errors."""

from __future__ import annotations

import time

import streamlit as st

from pages import _record, _visitor
from pages._sidebar import _device_limit, describe, over_budget
from remat_lab.config import (
    ConfigError,
    RunConfig,
    check_budget,
    estimate_bytes,
    estimate_process_bytes,
    resolve_budget,
)
from remat_lab.model.models import SEQ_MODELS
from remat_lab.program import targets
from remat_lab.program.backend import ExecutionError
from remat_lab.serve import quotas, safe_text, worker
from remat_lab.store.bytecache import ByteCache
from remat_lab.studies.experiment import STAGES

STAGE_TEXT = {
    "waiting": ("Waiting for a worker: this instance's other jobs are running" if quotas.private()
                else "Waiting for the worker: other visitors' jobs are served in turn, one at a time"),
    "building": "Building the model",
    "lowering": "Lowering the step",
    "compiling": "Compiling with XLA",
    "timing": "Timing the compiled step",
    "checking": "Checking gradients against no_remat",
    "dissecting": "Dissecting jaxprs and compiled HLO",
}
assert set(STAGE_TEXT) == set(STAGES)
QUICK_FLOPS = 3e10  # auto-run below this many flops of timed work (a few seconds on 2 cores)

# Results live in byte-bounded caches on the server (bytecache.py); the JAX work runs in the worker
# pool (worker.py). A timed result without program texts is up to ~200 KB (depth-16 loop: tables and
# the memory timeline); a programs result carries the jaxpr and HLO texts (up to a few MiB).
RUN_CACHE_BYTES = 32 << 20
PROGRAM_CACHE_BYTES = 16 << 20
UNTIMED_CACHE_BYTES = 16 << 20  # the Sweep's configurations, untimed (their cells time them)


@st.cache_resource(show_spinner=False)
def _caches() -> dict[str, ByteCache]:
    """The server's result caches, one per job kind, shared by all sessions (read-only results)."""
    return {"run": ByteCache(RUN_CACHE_BYTES, "results"),
            "programs": ByteCache(PROGRAM_CACHE_BYTES, "programs"),
            "untimed": ByteCache(UNTIMED_CACHE_BYTES, "untimed results")}


def pool() -> worker.Pool:
    """The server's worker pool (started, and warmed, by the first session)."""
    return worker.shared_pool()


def _session_alive():
    """A callable telling whether this script run's browser session is still connected."""
    try:
        from streamlit.runtime import Runtime
        from streamlit.runtime.scriptrunner import get_script_run_ctx
    except ImportError:  # pragma: no cover - a Streamlit without these
        return None
    ctx = get_script_run_ctx()
    if ctx is None or not Runtime.exists():  # AppTest and bare mode: nobody can leave
        return None
    runtime, session = Runtime.instance(), ctx.session_id
    return lambda: runtime.is_active_session(session)


def _session_id():
    """This browser session and its visitor (``_visitor.lane``): the worker queue's lane is the
    visitor's (its jobs are served in turn with other visitors', a few at a time, all its tabs
    together), and the session's newer request replaces its still-queued one. None outside a run."""
    return _visitor.lane()


def cached_call(kind: str, cache: ByteCache, key: tuple, payload: dict, progress=None,
                need: int = 0, clean=None) -> dict:
    """``kind`` from ``cache``, else from the worker pool; a finished result is cached even when
    the session that asked for it has left (a run nobody waits for is stopped). A failure is
    raised and never cached."""
    found = cache.get(key)
    if found is not None:
        return found

    def keep(value):
        cache.put(key, clean(value) if clean else value)

    alive, tick = _session_alive(), getattr(progress, "tick", None)
    if tick is not None:  # the pool asks ``alive`` ~4 times a second while it waits: the clock ticks
        gone = alive
        alive = lambda: (tick(), gone is None or gone())[1]  # noqa: E731
    value = pool().call(kind, payload, key=key, need=need, progress=progress,
                        alive=alive, on_done=keep, session=_session_id())
    found = cache.get(key)  # None when larger than the whole cache: shown, not kept
    return found if found is not None else (clean(value) if clean else value)


class _CachedKind:
    """``f(items)``: the cached result of one job kind for a configuration's sorted items;
    ``f.clear()`` empties its cache (the calls the st.cache_data functions here used to have)."""

    def __init__(self, kind: str, clean=None) -> None:
        self.kind, self.clean = kind, clean

    def __call__(self, items: tuple, progress=None) -> dict:
        cfg = RunConfig(**dict(items))
        return cached_call(self.kind, _caches()[self.kind], items, {"config": cfg.as_dict()},
                           progress, need=(estimate_process_bytes(cfg, _device_limit() is not None)
                                           if cfg.target == "local"
                                           else targets.compile_only_bytes(cfg.target)), clean=self.clean)

    def clear(self) -> None:
        _caches()[self.kind].clear()


_cached_run = _CachedKind("run")  # timed results, without program texts
_cached_programs = _CachedKind("programs", clean=safe_text.strip_paths_in)  # texts, paths cut
_cached_untimed = _CachedKind("untimed")  # compiled, checked and dissected, not timed (the Sweep)


def run_config(cfg: RunConfig, status, prefix: str = "", keep_texts: bool = False,
               timed: bool = True, say=None) -> dict:
    """One cached run, naming each stage in ``status``; raises ConfigError / ExecutionError.

    ``keep_texts=True`` (the Inspect page) returns the jaxpr and HLO texts and skips the timing:
    reading programs should not wait for, or take, the timing lock. ``timed=False`` (the Sweep,
    whose cells time their policies together afterwards) skips the timing, without the texts.
    ``say`` (a page's ``_progress.Live``): the stages go to it instead, and its clock ticks.
    """
    def progress(stage: str) -> None:
        text = f"{prefix}{STAGE_TEXT.get(stage, stage)}"
        if say is not None:
            say(text)
        else:
            status.update(label=f"{text}…", state="running")

    progress.tick = getattr(say, "tick", None)

    # The budget is checked before the cache too: lowering it refuses cached configurations as well.
    limit = _device_limit()
    if limit is None:  # on an accelerator the compile's memory analysis answers (run_experiment)
        check_budget(cfg, resolve_budget(None, limit))
    items = tuple(sorted(cfg.as_dict().items()))
    return (_cached_programs if keep_texts else _cached_run if timed else _cached_untimed)(items, progress)


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
        compile_only = cfg.compile_only or cfg.target != "local"
        st.info("This configuration may take a while to compile" + ("" if compile_only else " and time")
                + ", so it does not start automatically.")
        label = "Compile this configuration" if compile_only else "Run this configuration"
        if not st.button(label, key=button_key, type="primary"):
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
    if not keep_texts:  # a finished timed run goes to the run history (History page)
        _record.record(result)
    return result


def show_error(err: Exception) -> None:
    """ConfigError / ExecutionError as a red box with what to change (user values escaped, paths cut;
    on a public server no flag or environment variable the engine's advice names)."""
    text = safe_text.escape_markdown(safe_text.strip_paths(safe_text.for_visitor(str(err))))
    if isinstance(err, ConfigError):
        st.error(f"**This configuration cannot run.** {text}\n\nChange the settings in the sidebar "
                 "(for example a smaller width, batch, seq or depth); the app keeps serving.")
    elif isinstance(err, worker.TimeLimit):
        st.error(f"**Stopped.** {text}\n\nThe app keeps serving; a new worker is starting.")
    elif isinstance(err, worker.Busy):  # the per-visitor cap: a sentence, not a failure
        st.warning(text, icon=":material/hourglass_top:")
    elif isinstance(err, worker.Superseded):
        st.info("This request was replaced by a newer one from this page (one queued job per visitor).")
    elif isinstance(err, worker.WorkerLost):
        st.error(f"**The run was lost.** {text}\n\nThe app keeps serving; the next run starts a "
                 "new worker.")
    elif isinstance(err, ExecutionError):
        st.error(f"**XLA failed.** {text}\n\nChange the settings in the sidebar and the app will "
                 "run again.")
    else:
        st.error(f"Unexpected error: {text}")

"""Advisor: per policy, the largest batch whose compiled peak fits a memory budget, and the fastest."""

import json
import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _page_state, _running, _shared, _sidebar, _views  # noqa: E402
from remat_lab.config import LOCAL, ConfigError, RunConfig, human_bytes, parse_bytes, resolve_budget
from remat_lab.model.policies import POLICIES  # noqa: E402
from remat_lab.present import (
    reproduce,
    tables,  # noqa: E402
)
from remat_lab.program.backend import ExecutionError  # noqa: E402
from remat_lab.serve import quotas
from remat_lab.store import history
from remat_lab.store.bytecache import ByteCache
from remat_lab.studies import advisor


# An advice is a few KB (probes and rates per policy): 4 MiB keep hundreds.
@st.cache_resource(show_spinner=False)
def _advice_cache() -> ByteCache:
    return ByteCache(4 << 20, "advice")


def _advise(model: RunConfig, budget: int, policies: list[str], timing: bool, say,
            max_batch: int | None) -> dict:
    """The advice, from the cache or the worker pool. Timing runs each policy at its largest batch,
    one at a time, within this server's budget: the need is twice that budget (device program and
    host work) or the user's budget if smaller; sizing only compiles."""
    allowed = min(budget, resolve_budget(None, _sidebar._device_limit()))
    need = 2 * allowed + (48 << 20) if timing else 64 << 20
    key = (tuple(sorted(model.as_dict().items())), budget, tuple(policies), timing, max_batch)
    return _running.cached_call("advise" if timing else "advise_sizes", _advice_cache(), key,
                                {"config": model.as_dict(), "budget": budget, "policies": policies,
                                 "max_batch": max_batch}, say, need=need)


def _default_budget(target: str) -> tuple[int, str]:
    """Not cached here: the device limit is (``_sidebar._device_limit``), and a limit missing while
    the worker starts must not become the default for the server's lifetime. On a named target:
    the memory JAX may use there."""
    if target != LOCAL:
        return advisor.advice_budget(None, target=target)
    return advisor.advice_budget(None, _sidebar._device_limit(), ask_device=False)


def _size_text(n: int) -> str:
    """A budget as the user would type it: ``64M``, ``1.5G``."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return str(n)


cfg = _shared.page_start(
    "Advisor", "The largest batch each policy fits in a memory budget, and which policy trains the "
               "most examples per second there. The model comes from the sidebar (its batch and "
               "policy are what the advisor searches, so they are ignored here).")
default_bytes, default_source = _default_budget(cfg.target)
public = history.public_mode()
ss = st.session_state
default = [p for p, entry in POLICIES.items()
           if entry.group == "jax" or (entry.group == "maxtext" and cfg.model == "transformer")]
if public:  # a shared server: a bounded advice per click (serve/quotas.py)
    default = default[:quotas.PUBLIC_ADVISOR_MAX_POLICIES]
on_target = cfg.target != LOCAL
url = _page_state.loaded("advisor", ("budget", "policies", "timed"))
_page_state.show(
    _page_state.restore(url, "budget", _page_state.size, "advisor_budget",
                        "a size such as 512M, 16G or 80G, or a number of bytes", _size_text(default_bytes))
    + _page_state.restore(url, "policies", _page_state.names(
        POLICIES, quotas.PUBLIC_ADVISOR_MAX_POLICIES if public else len(POLICIES)), "advisor_policies")
    + _page_state.restore(url, "timed", _page_state.flag, "advisor_timing", "1 or 0 (true or false)",
                          "on" if not on_target else "off"))
ss.setdefault("advisor_budget", _size_text(default_bytes))
ss.setdefault("advisor_policies", default)
ss.setdefault("advisor_timing", not on_target)
left, right = st.columns([1, 2])
budget_text = left.text_input("Device memory budget", max_chars=64, key="advisor_budget",
                              help="The memory one device has for this step: e.g. 512M, 16G, 80G.")
left.caption(f"Default {human_bytes(default_bytes)}: {default_source}.")
chosen = right.multiselect("Policies", list(POLICIES), key="advisor_policies",
                           format_func=_sidebar.policy_label,
                           max_selections=quotas.PUBLIC_ADVISOR_MAX_POLICIES if public else None)
timing = right.toggle("Time each policy at its largest batch (examples/s, MFU, HFU)",
                      key="advisor_timing", disabled=on_target,
                      help="Off: sizes only. The search compiles and never allocates; timing runs "
                           "the step at each policy's largest batch, on this server. On a named "
                           "target nothing runs: examples/s are roofline estimates.")
_page_state.write({"budget": budget_text.strip()[:64], "policies": ",".join(chosen),
                   "timed": None if on_target else ("1" if timing else "0")})
timing = timing and not on_target
try:
    budget = parse_bytes(budget_text)
except ConfigError as err:
    st.error("**Budget not understood.** Write a size such as 512M, 16G or 80G, or a number of bytes.")
    st.text(str(err))  # plain text: the message quotes what was typed
    st.stop()
if public and budget > quotas.PUBLIC_ADVISOR_MAX_BUDGET:
    st.error(f"**Budget too large for this shared server.** Write at most "
             f"{human_bytes(quotas.PUBLIC_ADVISOR_MAX_BUDGET)} (more than any one accelerator has).")
    st.stop()
if not chosen:
    st.info("Pick at least one policy.")
    st.stop()
if cfg.mesh and not on_target:
    st.info("The advisor sizes the one-device program: the sidebar's mesh is left out here.")
    cfg = cfg.replace(mesh="")
model = cfg.replace(batch=1, policy="no_remat", save_names=(), offload_names=())
if "custom" in chosen:
    model = cfg.replace(batch=1)
key = (model, budget, tuple(chosen), timing)
max_batch = quotas.PUBLIC_ADVISOR_MAX_BATCH if public else None
if public:
    limits = quotas.deadlines()
    stops = [quotas.deadline_for(limits, k) for k in ("advise", "advise_sizes")]
    stop = ("" if None in stops else
            f"; it stops after {stops[0]:.0f} s (sizes only: {stops[1]:.0f} s)")
    st.caption(f"This server is shared: an advice takes at most {quotas.PUBLIC_ADVISOR_MAX_POLICIES} "
               f"policies, a budget up to {human_bytes(quotas.PUBLIC_ADVISOR_MAX_BUDGET)} and batches "
               f"up to {quotas.PUBLIC_ADVISOR_MAX_BATCH}{stop}. The command line has no limits.")
clicked = st.button("Find the largest batches", key="advisor_run", type="primary")
if not (clicked or st.session_state.get("_advisor_done") == key):
    st.info("Each policy's batch is found by compiling only (nothing is allocated): a few seconds "
            "per policy. With timing on, every policy then runs at its largest batch.")
    st.stop()

with st.status(f"Advising on {len(chosen)} policies…", expanded=False) as status:
    say = lambda message: status.update(label=f"{message}…", state="running")  # noqa: E731
    try:
        doc = _advise(model, budget, list(chosen), timing, say, max_batch)
    except (ConfigError, ExecutionError) as err:
        status.update(label="The advisor failed", state="error")
        doc, error = None, err
    else:
        error = None
        status.update(label=f"Done: {len(doc['rows'])} policies sized in {doc['search_s']:.1f} s of "
                            "compiling" + (", then timed" if doc["timed"] else ""), state="complete")
if error is not None:
    _running.show_error(error)
    st.stop()
st.session_state["_advisor_done"] = key

# ---------------------------------------------------------------- the answer
_views.advice_view(doc, key="advisor")
st.markdown("The same advice from the command line:")
exact = _size_text(budget) if parse_bytes(_size_text(budget)) == budget else str(budget)
st.code(reproduce.advise_command(model, exact, chosen, timing, max_batch), language="bash")
a, b = st.columns(2)
a.download_button("Download CSV", tables.advice_frame(doc).to_csv(index=False), "remat_lab_advice.csv",
                  "text/csv", key="advisor_csv")
b.download_button("Download JSON", json.dumps(doc, indent=1), "remat_lab_advice.json",
                  "application/json", key="advisor_json")

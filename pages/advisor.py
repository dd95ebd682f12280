"""Advisor: per policy, the largest batch whose compiled peak fits a memory budget, and the fastest."""

import json
import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _advisor_run, _page_state, _progress, _running, _shared, _sidebar, _views  # noqa: E402
from remat_lab.config import (  # noqa: E402
    LOCAL,
    ConfigError,
    RunConfig,
    batch_rows,
    budget_text,
    human_bytes,
    parse_bytes,
    parse_mesh,
)
from remat_lab.config.budget import COMPILE_WORKSPACE  # noqa: E402
from remat_lab.model.policies import POLICIES  # noqa: E402
from remat_lab.present import (  # noqa: E402
    advisor_tables,
    charts,
    reproduce,
    tables,
)
from remat_lab.program.backend import ExecutionError  # noqa: E402
from remat_lab.serve import quotas, worker
from remat_lab.store import history
from remat_lab.store.bytecache import ByteCache
from remat_lab.studies import advisor


# An advice is a few KB (probes and rates per policy): 4 MiB keep hundreds.
@st.cache_resource(show_spinner=False)
def _advice_cache() -> ByteCache:
    return ByteCache(4 << 20, "advice")


def _job_key(model: RunConfig, budget: int, policies: list[str], timing: bool,
             max_batch: int | None, time_budget: int) -> tuple:
    return (tuple(sorted(model.as_dict().items())), budget, tuple(policies), timing, max_batch,
            time_budget if timing else None)


def _advise(model: RunConfig, budget: int, policies: list[str], timing: bool, say,
            max_batch: int | None, time_budget: int) -> dict:
    """The advice, from the cache or the worker pool (with a Stop: ``_advisor_run``). The job asks
    the pool for the compiles' workspace only: the engine times a policy only where its compiled
    peak plus the process overhead fits what the worker may allocate at that moment (in a
    container: its limit less what is in use), and says so in each row it leaves untimed."""
    key = _job_key(model, budget, policies, timing, max_batch, time_budget)
    return _advisor_run.run("advise" if timing else "advise_sizes", _advice_cache(), key,
                            {"config": model.as_dict(), "budget": budget, "policies": policies,
                             "max_batch": max_batch, "time_budget_s": time_budget}, say,
                            need=COMPILE_WORKSPACE)


def _default_budget(target: str) -> tuple[int, str]:
    """Not cached here: the device limit is (``_sidebar._device_limit``), and a limit missing while
    the worker starts must not become the default for the server's lifetime. On a named target:
    the memory JAX may use there."""
    if target != LOCAL:
        return advisor.advice_budget(None, target=target)
    return advisor.advice_budget(None, _sidebar._device_limit(), ask_device=False)


cfg = _shared.page_start(
    "Advisor", "The largest batch each policy fits in a memory budget, and which policy trains the "
               "most examples per second there. The model comes from the sidebar (its batch and "
               "policy are what the advisor searches, so they are ignored here).")
default_bytes, default_source = _default_budget(cfg.target)
public = history.public_mode()
ss = st.session_state
default = [p for p, entry in POLICIES.items()  # MaxText's recipes where the block names its tensors
           if entry.group == "jax" or (entry.group == "maxtext" and cfg.model in ("transformer", "llm"))]
if public:  # a shared server: a bounded advice per click (serve/quotas.py)
    default = default[:quotas.PUBLIC_ADVISOR_MAX_POLICIES]
on_target = cfg.target != LOCAL
url = _page_state.loaded("advisor", ("budget", "policies", "timed"))
_page_state.show(
    _page_state.restore(url, "budget", _page_state.size, "advisor_budget",
                        "a size such as 512M, 16G or 80G, or a number of bytes", budget_text(default_bytes))
    + _page_state.restore(url, "policies", _page_state.names(
        POLICIES, quotas.PUBLIC_ADVISOR_MAX_POLICIES if public else len(POLICIES)), "advisor_policies")
    + _page_state.restore(url, "timed", _page_state.flag, "advisor_timing", "1 or 0 (true or false)",
                          "on" if not on_target else "off"))
for k, v in ss.get("_advisor_kept", {}).items():  # back from another page: Streamlit forgot the widgets
    if k not in ss:
        ss[k] = v
ss.setdefault("advisor_budget", budget_text(default_bytes))
ss.setdefault("advisor_time_budget", 30)
ss.setdefault("advisor_policies", default)
ss.setdefault("advisor_timing", not on_target)
left, right = st.columns([1, 2])
typed_budget = left.text_input("Device memory budget", max_chars=64, key="advisor_budget",
                              help="The memory one device has for this step: e.g. 512M, 16G, 80G.")
left.caption(f"Default {human_bytes(default_bytes)}: {default_source}.")
chosen = right.multiselect("Policies", list(POLICIES), key="advisor_policies",
                           format_func=_sidebar.policy_label,
                           max_selections=quotas.PUBLIC_ADVISOR_MAX_POLICIES if public else None)
timing = right.toggle("Time each policy at its largest batch (examples/s, MFU, HFU)",
                      key="advisor_timing", disabled=on_target,
                      help="Off: sizes only. The search compiles and never allocates; timing runs "
                           "the step at each policy's largest batch, on this server. On a named "
                           "target nothing runs: examples/s are predictions, with the "
                           "roofline bound beside them.")
time_budget = right.select_slider("Time budget for timing (s)", [10, 20, 30, 60, 90, 120],
                                  key="advisor_time_budget", disabled=not timing or on_target,
                                  help="Rounds stop earlier once the best policy's interval of "
                                       "examples/s separates from the runner-up's; at least 3 rounds.")
right.caption("A policy is timed only where its compiled peak at its largest batch plus the "
              "process overhead (64 MiB, and the other timed policies' parameters and inputs) fits "
              "what this server may allocate when timing starts; the others are sized only and "
              "their note gives the numbers. In a small container (1 GiB) that is often none: the "
              "answer is then the sizes, labelled so.")
_page_state.write({"budget": typed_budget.strip()[:64], "policies": ",".join(chosen),
                   "timed": None if on_target else ("1" if timing else "0")})
ss["_advisor_kept"] = {"advisor_budget": typed_budget, "advisor_policies": list(chosen),
                       "advisor_timing": timing, "advisor_time_budget": time_budget}
timing = timing and not on_target
try:
    budget = parse_bytes(typed_budget)
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
sizes = parse_mesh(cfg.mesh)  # the search starts at one example per device and microbatch
start = batch_rows(sizes) * cfg.microbatches
model = cfg.replace(batch=start, policy="no_remat", save_names=(), offload_names=())
if "custom" in chosen:
    model = cfg.replace(batch=start)
key = (model, budget, tuple(chosen), timing, time_budget)
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
running = st.session_state.get("_advisor_running") == key
_advisor_run.release(("advise" if timing else "advise_sizes",
                      _job_key(model, budget, list(chosen), timing, max_batch, time_budget))
                     if clicked or running else None)
if not (clicked or running or st.session_state.get("_advisor_done") == key):
    st.info("Each policy's batch is found by compiling only (nothing is allocated): a few seconds "
            "per policy. With timing on, every policy then runs at its largest batch.")
    st.stop()

stored = st.session_state.get("_advisor_doc")
if stored is not None and stored[0] == key and not (clicked or running):
    doc = stored[1]  # this session's last answer (a stopped one is not in the server's cache)
else:
    if timing:
        st.button("Stop timing (keep the finished rounds)", key="advisor_stop",
                  on_click=_advisor_run.request_stop,
                  args=(_job_key(model, budget, list(chosen), timing, max_batch, time_budget),))
    st.session_state["_advisor_running"] = key
    # Live: elapsed, policies sized of planned, time left, and each policy's row as it is sized.
    status, live = _progress.running(f"Advising on {len(chosen)} policies…", _progress.ADVICE,
                                     words=lambda m: _running.STAGE_TEXT.get(m, m),
                                     title="Policies sized so far")
    with status:
        try:
            doc = _advise(model, budget, list(chosen), timing, live, max_batch, time_budget)
        except (ConfigError, ExecutionError) as err:
            status.update(label="The advisor stopped" if live.rows or isinstance(err, worker.TimeLimit)
                          else "The advisor failed", state="error")
            doc, error = None, err
        else:
            error = None
            status.update(label=f"Done: {len(doc['rows'])} policies sized in {doc['search_s']:.1f} s "
                                "of compiling" + (", then timed" if doc["timed"] else ""),
                          state="complete")
    st.session_state.pop("_advisor_running", None)
    if error is not None:
        _progress.stopped_with_rows(live, error, len(chosen))
        st.stop()
    live.clear()
    st.session_state["_advisor_done"] = key
    st.session_state["_advisor_doc"] = (key, doc)

# ---------------------------------------------------------------- the decision first (advice_view)
if doc.get("stopped_because") == "deadline":  # timing ended early: the rounds finished are the answer
    st.warning(_progress.deadline_note("advise", public, doc.get("rounds") or 0))
elif timing and not doc["timed"] and doc.get("stopped_because") != "stopped":
    t = doc.get("timing") or {}
    st.info(f"Sizes only: no policy was timed ({_views.md(str(doc.get('stopped_because')))}); this "
            f"server could allocate {human_bytes(t.get('allowance_bytes') or 0)} for timing "
            f"({_views.md(str(t.get('allowance_source')))}). Each row's note gives the numbers.")

# ---------------------------------------------------------------- the answer
_views.advice_view(doc, key="advisor")
kinds = advisor_tables.advice_by_kind_frame(doc)
if not kinds.empty:
    st.plotly_chart(charts.make_memory_by_kind_figure(kinds), width="stretch", key="advisor_kinds")
    st.caption("What fills each device's memory at each policy's largest batch (per device).")
st.markdown("The same advice from the command line:")
exact = budget_text(budget) if parse_bytes(budget_text(budget)) == budget else str(budget)
command = reproduce.advise_command(model, exact, chosen, timing, max_batch)
st.code(command.replace(" --json", f" --time-budget {time_budget} --json") if timing else command,
        language="bash", wrap_lines=True)
a, b = st.columns(2)
a.download_button("Download CSV", tables.advice_frame(doc).to_csv(index=False), "remat_lab_advice.csv",
                  "text/csv", key="advisor_csv")
b.download_button("Download JSON", json.dumps(doc, indent=1), "remat_lab_advice.json",
                  "application/json", key="advisor_json")

"""Synthesize: the per-name save / offload / recompute plan that fits a budget, recomputing least."""

import json
import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from pages import _advisor_run, _page_state, _progress, _shared, _sidebar, _synth_live, _views  # noqa: E402
from remat_lab.config import (  # noqa: E402
    LOCAL,
    ConfigError,
    batch_rows,
    budget_text,
    human_bytes,
    human_flops,
    parse_bytes,
    parse_mesh,
)
from remat_lab.config.budget import COMPILE_WORKSPACE  # noqa: E402
from remat_lab.model.policies import POLICIES  # noqa: E402
from remat_lab.present import charts  # noqa: E402
from remat_lab.present.synth_charts import synthesis_frame  # noqa: E402
from remat_lab.program.backend import ExecutionError  # noqa: E402
from remat_lab.serve import quotas  # noqa: E402
from remat_lab.store import history  # noqa: E402
from remat_lab.store.bytecache import ByteCache  # noqa: E402
from remat_lab.studies import advisor  # noqa: E402
from remat_lab.studies.synthesize import GOALS, named_policies  # noqa: E402

GOAL_LABELS = {"max-batch": "The largest batch (then the fewest recomputed flops)",
               "min-recompute": "The fewest recomputed flops at a batch"}


@st.cache_resource(show_spinner=False)
def _synthesis_cache() -> ByteCache:
    return ByteCache(4 << 20, "synthesis")


def _goal(raw: str) -> str:
    if raw not in GOALS:
        raise ConfigError(f"goal must be one of {', '.join(GOALS)}")
    return raw


def _batch(raw: str) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit() and 0 < int(text) <= 65536):
        raise ConfigError("batch must be a whole number from 1 to 65536")
    return int(text)


cfg = _shared.page_start(
    "Synthesize", "The plan, name by name: save on the device, offload to host memory or recompute, "
                  "and how many layers to remat, that fits a memory budget with the least "
                  "recomputation. Every answer is a compiled program's; the named policies are "
                  "compiled by the same search and returned when no plan beats them.")
on_target = cfg.target != LOCAL
default_bytes, default_source = (advisor.advice_budget(None, target=cfg.target) if on_target else
                                 advisor.advice_budget(None, _sidebar._device_limit(), ask_device=False))
public = history.public_mode()
url = _page_state.loaded("synthesize", ("budget", "goal", "batch", "policies"))
_page_state.show(
    _page_state.restore(url, "budget", _page_state.size, "synth_budget",
                        "a size such as 512M, 16G or 80G, or a number of bytes", budget_text(default_bytes))
    + _page_state.restore(url, "goal", _goal, "synth_goal", " or ".join(GOALS), "max-batch")
    + _page_state.restore(url, "batch", _batch, "synth_batch", "a whole number from 1 to 65536", "8")
    + _page_state.restore(url, "policies", _page_state.names(p for p in POLICIES if p != "custom"),
                          "synth_named", default="every named policy of the model"))
ss = st.session_state
for k, v in ss.get("_synth_kept", {}).items():  # back from another page: Streamlit forgot the widgets
    if k not in ss:
        ss[k] = v
ss.setdefault("synth_budget", budget_text(default_bytes))
ss.setdefault("synth_goal", "max-batch")
ss.setdefault("synth_batch", 8)
left, right = st.columns([1, 2])
typed_budget = left.text_input("Device memory budget", max_chars=64, key="synth_budget",
                              help="The memory one device has for this step: e.g. 512M, 16G, 80G.")
left.caption(f"Default {human_bytes(default_bytes)}: {default_source}.")
goal = right.radio("Goal", GOALS, key="synth_goal", format_func=GOAL_LABELS.get, horizontal=True)
batch = right.number_input("Batch (global)", 1, 65536, key="synth_batch", disabled=goal != "min-recompute",
                           help="min-recompute: the batch the plan must fit, a multiple of data x "
                                "fsdp x microbatches.")
_page_state.write({"budget": typed_budget.strip()[:64], "goal": goal,
                   "batch": str(batch) if goal == "min-recompute" else None})
try:
    budget = parse_bytes(typed_budget)
except ConfigError as err:
    st.error("**Budget not understood.** Write a size such as 512M, 16G or 80G, or a number of bytes.")
    st.text(str(err))
    st.stop()
if public and budget > quotas.PUBLIC_ADVISOR_MAX_BUDGET:
    st.error(f"**Budget too large for this shared server.** Write at most "
             f"{human_bytes(quotas.PUBLIC_ADVISOR_MAX_BUDGET)}.")
    st.stop()
if cfg.mesh and not on_target:
    st.info("The synthesizer sizes the one-device program locally: the sidebar's mesh is left out here.")
    cfg = cfg.replace(mesh="")
sizes = parse_mesh(cfg.mesh)
unit = batch_rows(sizes) * cfg.microbatches
model = cfg.replace(batch=unit, policy="no_remat", save_names=(), offload_names=(), remat_layers=0)
offered = named_policies(model)
ss["synth_named"] = [p for p in ss.get("synth_named", offered) if p in offered] or offered
limit = quotas.PUBLIC_ADVISOR_MAX_POLICIES if public else None  # the same per-click bounds as the Advisor
if limit:
    ss["synth_named"] = ss["synth_named"][:limit]
named = st.multiselect("Named policies to beat", offered, key="synth_named", max_selections=limit,
                       format_func=_sidebar.policy_label,
                       help="Compiled by the same search; the answer is never worse than the best of "
                            "them. Fewer policies: fewer compiles.")
_page_state.write({"policies": ",".join(named) if named != offered else None})
ss["_synth_kept"] = {"synth_budget": typed_budget, "synth_goal": goal, "synth_batch": batch,
                     "synth_named": list(named)}
if not named:
    st.info("Choose at least one named policy to compare the plan with.")
    st.stop()
if public:
    st.caption(f"This server is shared: a synthesis compares {len(named)} named policies, a budget up "
               f"to {human_bytes(quotas.PUBLIC_ADVISOR_MAX_BUDGET)} and batches up to "
               f"{quotas.PUBLIC_ADVISOR_MAX_BATCH}. The command line has no limits.")
goal_batch = int(batch) if goal == "min-recompute" else None
key = (tuple(sorted(model.as_dict().items())), budget, goal, goal_batch, tuple(named))
clicked = st.button("Synthesize the plan", key="synth_run", type="primary")
running = ss.get("_synth_running") == key
_advisor_run.release(("synthesize", key) if clicked or running else None)
if not (clicked or running or ss.get("_synth_done") == key):
    st.info("The synthesizer compiles probes of each checkpoint name, solves a cost model exactly, "
            "then compiles the best plans and the named policies: tens of compiles, nothing runs.")
    st.stop()

stored = ss.get("_synth_doc")
if stored is not None and stored[0] == key and not (clicked or running):
    doc = stored[1]
else:
    stop = st.empty()  # the Stop goes when the job ends
    stop.button("Stop (answer with what is compiled)", key="synth_stop", on_click=_advisor_run.request_stop,
                args=(key,))
    ss["_synth_running"] = key
    # Live: elapsed, the plan's compiles of at most its limit, time left, each compile as it ends.
    status, live = _progress.running("Synthesizing…", _synth_live.COLUMNS, title="Compiled so far")
    with status:
        try:
            doc = _advisor_run.run("synthesize", _synthesis_cache(), key,
                                   {"config": model.as_dict(), "budget": budget, "goal": goal,
                                    "batch": goal_batch, "policies": named,
                                    "max_batch": quotas.PUBLIC_ADVISOR_MAX_BATCH if public else None},
                                   _synth_live.Lines(live), need=COMPILE_WORKSPACE)
        except (ConfigError, ExecutionError) as err:
            status.update(label="The synthesizer failed", state="error")
            doc, error = None, err
        else:
            error = None
            status.update(label=(("Stopped before an answer" if doc.get("answer") is None else "Stopped")
                                 if doc.get("stopped_because") else "Done")
                          + f": {doc['compiles']} compiles for the plan, {doc['named_compiles']} for the "
                            f"named policies, {doc['wall_s']:.1f} s", state="complete")
    stop.empty()
    ss.pop("_synth_running", None)
    if error is not None:
        _progress.stopped_with_rows(live, error, len(live.rows), "compiles")
        st.stop()
    live.clear()
    ss["_synth_done"] = key
    ss["_synth_doc"] = (key, doc)

# ---------------------------------------------------------------- the answer
md = _views.md
if doc.get("answer") is None:
    if doc.get("stopped_because"):  # no answer yet, not "nothing fits": what was compiled, below
        st.warning(md(f"**Stopped before an answer** ({doc['stopped_because']}): {doc['compiles']} "
                      f"compiles for the plan and {doc['named_compiles']} for the named policies were "
                      "done; what they compiled is below. Click Synthesize for an answer."))
        st.dataframe(synthesis_frame(doc), hide_index=True, key="synth_table")
    else:
        st.warning("**Nothing fits.** " + md("; ".join(doc["notes"])))
    st.stop()
who = "the synthesized plan" if doc["answer"] == "plan" else f"the named policy {doc['answer']}"
sentence = (f"Answer: {who}: batch {doc['max_batch']} ({doc['per_device_batch']} per device), compiled "
            f"peak {human_bytes(doc['peak_bytes'])} per device")
if doc.get("recomputed_flops") is not None:
    sentence += f", recomputing {human_flops(doc['recomputed_flops'])} per step (vs no_remat)"
st.success(md(sentence + "."))
best = doc.get("best_named")
if best:
    share = best.get("recompute_saved_share")
    st.markdown(md(f"Best named policy: {best['policy']} at batch {best['max_batch']}"
                   + (f"; the plan recomputes {share:.1%} less" if share is not None else "") + "."))
plan = doc.get("plan")
if plan:
    choice = {n: "save" for n in plan["save"]} | {n: "offload" for n in plan["offload"]}
    st.dataframe(pd.DataFrame({"checkpoint name": doc["names"],
                               "choice": [choice.get(n, "recompute") for n in doc["names"]]}),
                 hide_index=True, key="synth_plan")
    st.caption(md(f"{plan['remat_layers']} of {doc['config']['depth']} layers remat'd (the rest saved "
                  f"whole). Offload: {doc['offload']['why']}."))
    a, b = st.columns(2)
    a.markdown("The policy, ready to paste:")
    a.code(doc["code"], language="python", wrap_lines=True)
    b.markdown("MaxText (`remat_policy: custom`):")
    b.code(doc["maxtext_yaml"], language="yaml", wrap_lines=True)
    st.markdown("Reproduce the plan with `run`:")
    st.code(doc["run_command"], language="bash", wrap_lines=True)
elif doc.get("run_command"):  # the answer is a named policy: its own code, not a solver candidate
    a, b = st.columns(2)
    a.markdown(md(f"{doc['answer']}, ready to paste:"))
    a.code(doc["code"], language="python", wrap_lines=True)
    if doc.get("maxtext_yaml"):
        b.markdown("MaxText:")
        b.code(doc["maxtext_yaml"], language="yaml", wrap_lines=True)
    st.markdown("Reproduce the answer with `run`:")
    st.code(doc["run_command"], language="bash", wrap_lines=True)
frame = synthesis_frame(doc)
st.plotly_chart(charts.make_synthesis_figure(frame, doc["budget_bytes"] / (1 << 20)), width="stretch",
                key="synth_chart")
st.dataframe(frame, hide_index=True, key="synth_table")
forced = doc.get("xla_forced_compiles") or 0
st.caption(md(f"{doc['compiles']} compiles for the plan (3k + 12 = {doc['compile_limit']} for its "
              f"{len(doc['names'])} names"
              + (f"; {forced} of them forced by XLA's own pass, outside it" if forced else "")
              + f"), {doc['named_compiles']} for the named policies; "
              f"{doc['wall_s']:.1f} s."
              + (f" Stopped: {doc['stopped_because']}." if doc.get("stopped_because") else "")))
for n in doc["notes"]:
    st.caption(md(n))
with st.expander("Method"):
    for k, v in doc["method"].items():
        st.markdown(md(f"**{k}**: {v}"))
st.markdown("The same synthesis from the command line:")
st.code(doc["command"], language="bash", wrap_lines=True)
st.download_button("Download JSON", json.dumps(doc, indent=1), "remat_lab_synthesis.json",
                   "application/json", key="synth_json")

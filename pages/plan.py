"""Plan the run: mesh, remat plan, per-device batch, accumulation and offload, searched and compiled."""

import json
import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _advisor_run, _plan_form, _plan_views, _progress, _running, _shared, _views  # noqa: E402
from remat_lab.config import ConfigError, RunConfig  # noqa: E402
from remat_lab.config.budget import COMPILE_WORKSPACE, parameters_text  # noqa: E402
from remat_lab.program.backend import ExecutionError  # noqa: E402
from remat_lab.store.bytecache import ByteCache  # noqa: E402
from remat_lab.studies.progress import Step  # noqa: E402

RUNNING, STOP, ROWS, DOC = "_plan_running", "_plan_stop", "_plan_rows", "_plan_doc"  # session state


@st.cache_resource(show_spinner=False)
def _plan_cache() -> ByteCache:
    return ByteCache(4 << 20, "plans")


def _stop(key: tuple) -> None:
    """The Stop's callback: the page stops waiting and lets go of the job, so the pool kills its
    worker at once (its compile workers end with it); the compiles finished so far stay shown."""
    st.session_state[STOP] = key
    st.session_state.pop(RUNNING, None)
    _advisor_run.release()


class _Kept:
    """The live progress, its rows kept in the session as they come (what a Stop keeps)."""

    def __init__(self, live, key: tuple) -> None:
        self.live, self.key, self.tick = live, key, live.tick

    def __call__(self, message: str) -> None:
        self.live(message)
        if isinstance(message, Step):
            st.session_state[ROWS] = (self.key, message.rows)


_shared.page_start("Plan the run", "Give a model, the chips and a global batch: the planner searches "
                                   "meshes (FSDP, tensor, expert; data or FSDP across slices or hosts), "
                                   "remat plans, the per-device batch and accumulation steps, and "
                                   "whether AdamW's state lives in host memory. An estimate by hand "
                                   "comes at once (labelled one); then a few compiles per mesh fit a "
                                   "model of memory and step time, the best plans are compiled at full "
                                   "size, and every figure below is a compile's. The sidebar's settings "
                                   "are not used here.")
ss = st.session_state
q = _plan_form.form()
if not (q["tensor"] and q["plans"]):
    st.info("Choose at least one tensor-parallel size and one remat plan.")
    st.stop()
try:
    per_chip = float(ss["plan_price"]) if ss["plan_price"] else None
    budget = _plan_form.budget(ss["plan_budget"]) if ss["plan_budget"] else None
    also = _plan_form.also(ss["plan_also"])
except ValueError as err:
    st.error(f"**A cost field is not valid:** {_views.md(str(err))}")
    st.stop()
fields = dict(seq=q["seq"], step="train", compile_only=True, target=q["target"], target_devices=q["devices"],
              mesh=f"fsdp={q['devices']}", batch=q["devices"], attention="flash", network=q["network"])
try:
    if q["preset"] == _plan_form.FILE:
        if q["model_file"] is None:
            st.info("Upload a Hugging Face config.json or a MaxText model YAML to plan its model.")
            st.stop()
        name, read = q["model_file"]
        notes = read.notes(True)
        st.caption(_views.md(f"From {name} ({read.source}); the link does not carry a file's model."
                             + (" Not modelled: " + "; ".join(notes) + "." if notes else "")))
        cfg = read.config(**fields)
    else:
        cfg = RunConfig.from_preset(q["preset"], **fields)
except ConfigError as err:
    st.error(f"**This question cannot be planned.** {_views.md(str(err))}")
    st.stop()
st.caption(f"{parameters_text(cfg)}, counted from its shape.")
model = (f"--model-config {q['model_file'][0]}" if q["model_file"] else f"--preset {q['preset']}")
command = (f"python -m remat_lab plan {model} --seq {q['seq']} --target {q['target']} "
           f"--target-devices {q['devices']}" + (f" --slices {q['slices']}" if q["slices"] else "")
           + (f" --network {q['network']}" if q["network"] else "")
           + (f" --global-batch-tokens {q['tokens']}" if q["tokens"] else "")
           + f" --tensor {','.join(map(str, q['tensor']))} --plans '{';'.join(q['plans'])}'"
           + ("" if q["offload"] else " --no-optimizer-offload")
           + "".join(f" --also {t}:{n}" for t, n, _ in also)
           + (f" --token-budget {ss['plan_budget']}" if budget else "") + " --json")
key = (tuple(sorted(cfg.as_dict().items())), q["tokens"], q["slices"], tuple(q["tensor"]), tuple(q["plans"]),
       q["offload"], tuple((t, n) for t, n, _ in also))
clicked = st.button("Plan the run", key="plan_run", type="primary")
if clicked:
    ss.pop(STOP, None)
# a plan of this question running: this session's (back from another page) or another tab's
running = not clicked and ss.get(STOP) != key and (
    ss.get(RUNNING) == key or _running.pool().running("plan", key))
_advisor_run.release(("plan", key) if clicked or running else None)
done = ss.get(DOC, (None,))[0] == key
if ss.get(STOP) == key and not clicked:
    kept = ss.get(ROWS, (None, ()))
    rows = kept[1] if kept[0] == key else ()
    st.warning(f"**Stopped.** The {len(rows)} rows finished before the Stop are below (the estimate by hand "
               "first, then each compile); the plan was not finished. Plan the run again to start over.")
    if rows:
        st.dataframe(_progress.rows_frame(rows, _plan_views.COLUMNS), hide_index=True, width="stretch")
    st.code(command, language="bash", wrap_lines=True)
    st.stop()
if not (clicked or running or done):
    st.info("A plan compiles each mesh and remat plan once or twice, then the best candidates at full "
            "size: at 256 chips each compile takes a minute or more on this server.")
    st.code(command, language="bash", wrap_lines=True)
    st.stop()
if clicked or running:
    ss[RUNNING] = key
    halt = st.empty()
    halt.button("Stop (keep what is compiled)", key="plan_stop", on_click=_stop, args=(key,))
    status, live = _progress.running("Planning…" if clicked else "Planning (found running again)…",
                                     _plan_views.COLUMNS, title="Compiled so far")
    with status:
        try:
            doc = _advisor_run.run("plan", _plan_cache(), key, {
                "config": cfg.as_dict(), "global_batch_tokens": q["tokens"] or None,
                "slices": q["slices"] or None, "tensor": q["tensor"], "plans": q["plans"],
                "offload": q["offload"], "top": 3, "also": [[t, n, None] for t, n, _ in also]},
                _Kept(live, key), need=COMPILE_WORKSPACE)
        except (ConfigError, ExecutionError) as err:
            ss.pop(RUNNING, None)
            status.update(label="The planner failed", state="error")
            halt.empty()
            _progress.stopped_with_rows(live, err, len(live.rows), "compiles")
            st.stop()
        status.update(label=f"Done: {doc['candidates_compiled']} compiles, {doc['wall_s']:.0f} s",
                      state="complete")
    halt.empty()
    live.clear()
    ss.pop(RUNNING, None)
    ss[DOC] = (key, doc)
doc = ss[DOC][1]
_plan_views.answer(doc, per_chip, budget, also)
st.markdown("The same plan from the command line:")
st.code(command, language="bash", wrap_lines=True)
st.download_button("Download JSON", json.dumps(doc, indent=1), "remat_lab_plan.json", "application/json",
                   key="plan_json")

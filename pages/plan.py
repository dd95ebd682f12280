"""Plan the run: mesh, remat plan, per-device batch, accumulation and offload, searched and compiled."""

import json
import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from pages import _advisor_run, _progress, _shared, _views  # noqa: E402
from remat_lab.config import PRESETS, TARGET_NAMES, ConfigError, RunConfig, get_target, human_bytes  # noqa: E402
from remat_lab.config.budget import COMPILE_WORKSPACE, parameters_text  # noqa: E402
from remat_lab.program.backend import ExecutionError  # noqa: E402
from remat_lab.store.bytecache import ByteCache  # noqa: E402
from remat_lab.studies.plan.space import DEFAULT_PLANS, plan_label  # noqa: E402

PLANS = (*DEFAULT_PLANS, "synthesized", "minimal", "save_dot_except_mlp", "qkv_proj_offloaded",
         "offload:decoder_layer_input,query_proj,key_proj,value_proj,out_proj")
COLUMNS = [("what", "compiled", _progress._text), ("peak_bytes", "peak", _progress._bytes),
           ("predicted_s", "predicted step", _progress._seconds), ("error", "note", _progress._text)]


@st.cache_resource(show_spinner=False)
def _plan_cache() -> ByteCache:
    return ByteCache(4 << 20, "plans")


def _table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{
        "mesh": r["mesh"], "remat plan": r["plan_text"], "per-device batch": r["per_device_batch"],
        "accumulation steps": r["microbatches"], "optimizer on host": r["optimizer_offload"],
        "compiled peak": human_bytes(r["peak_bytes"]),
        "model's peak": human_bytes(r["predicted_peak_bytes"]) if r.get("predicted_peak_bytes") else "-",
        "predicted step (s)": r["predicted_s"] or r["bound_s"],
        "tokens/s/device": round(r["predicted_tokens_per_s_per_device"] or 0),
        "MFU (causal)": f"{r['predicted_mfu']:.1%}" if r.get("predicted_mfu") else "-",
        "MFU (full square)": f"{r['predicted_mfu_full_attention']:.1%}"
        if r.get("predicted_mfu_full_attention") else "-",
        "limited by": r.get("limited_by") or "-"} for r in rows])


_shared.page_start("Plan the run", "Give a model, the chips and a global batch: the planner searches "
                                   "meshes (FSDP, tensor, expert; data or FSDP across slices or hosts), "
                                   "remat plans, the per-device batch and accumulation steps, and "
                                   "whether AdamW's state lives in host memory. An estimate by hand "
                                   "comes at once (labelled one); then a few compiles per mesh fit a "
                                   "model of memory and step time, the best plans are compiled at full "
                                   "size, and every figure below is a compile's. The sidebar's settings "
                                   "are not used here.")
ss = st.session_state
a, b, c = st.columns(3)
preset = a.selectbox("Model", list(PRESETS), key="plan_preset",
                     index=list(PRESETS).index("llama3.1-8b") if "llama3.1-8b" in PRESETS else 0)
seq = a.number_input("Sequence length", 128, 131072, 8192, step=1024, key="plan_seq")
target = b.selectbox("Accelerator", [t for t in TARGET_NAMES if t != "local"], key="plan_target",
                     index=[t for t in TARGET_NAMES if t != "local"].index("tpu-v6e"))
devices = b.number_input("Devices", 1, 4096, 256, key="plan_devices")
slices = b.number_input("Slices or hosts (0: one TPU slice; GPUs 8 to a host)", 0, 64, 0, key="plan_slices")
networks = list(get_target(target).networks)  # a GPU's hosts' network, where it has a choice
network = b.selectbox("Hosts' network", networks, key="plan_network",
                      help="What each GPU sends a second to other hosts (the machine's NICs): "
                           "collectives across hosts are priced at it.") if networks else ""
network = "" if network == get_target(target).network else network
tokens = c.number_input("Global batch, tokens (0: as large as fits)", 0, 1 << 40, 4 * 256 * 8192,
                        step=8192, key="plan_tokens")
tensor = c.multiselect("Tensor-parallel sizes", [1, 2, 4, 8], default=[1, 4], key="plan_tensor")
offload = c.checkbox("Consider the optimizer's state on the host", True, key="plan_offload")
plans = st.multiselect("Remat plans", PLANS, default=list(DEFAULT_PLANS), key="plan_plans",
                       format_func=plan_label)
if not (tensor and plans):
    st.info("Choose at least one tensor-parallel size and one remat plan.")
    st.stop()
try:
    cfg = RunConfig.from_preset(preset, seq=int(seq), step="train", compile_only=True, target=target,
                                target_devices=int(devices), mesh=f"fsdp={int(devices)}",
                                batch=int(devices), attention="flash", network=network)
except ConfigError as err:
    st.error(f"**This question cannot be planned.** {_views.md(str(err))}")
    st.stop()
a.caption(f"{parameters_text(cfg)}, counted from its shape.")
command = (f"python -m remat_lab plan --preset {preset} --seq {int(seq)} --target {target} "
           f"--target-devices {int(devices)}" + (f" --slices {int(slices)}" if slices else "")
           + (f" --network {network}" if network else "")
           + (f" --global-batch-tokens {int(tokens)}" if tokens else "")
           + f" --tensor {','.join(map(str, tensor))} --plans '{';'.join(plans)}'"
           + ("" if offload else " --no-optimizer-offload") + " --json")
key = (tuple(sorted(cfg.as_dict().items())), int(tokens), int(slices), tuple(tensor), tuple(plans), offload)
clicked = st.button("Plan the run", key="plan_run", type="primary")
if not (clicked or ss.get("_plan_doc", (None,))[0] == key):
    st.info("A plan compiles each mesh and remat plan once or twice, then the best candidates at full "
            "size: at 256 chips each compile takes a minute or more on this server.")
    st.code(command, language="bash", wrap_lines=True)
    st.stop()
if clicked:
    status, live = _progress.running("Planning…", COLUMNS, title="Compiled so far")
    with status:
        try:
            doc = _advisor_run.run("plan", _plan_cache(), key, {
                "config": cfg.as_dict(), "global_batch_tokens": int(tokens) or None,
                "slices": int(slices) or None, "tensor": list(tensor), "plans": list(plans),
                "offload": offload, "top": 3}, live, need=COMPILE_WORKSPACE)
        except (ConfigError, ExecutionError) as err:
            status.update(label="The planner failed", state="error")
            st.error(_views.md(str(err)))
            st.stop()
        status.update(label=f"Done: {doc['candidates_compiled']} compiles, {doc['wall_s']:.0f} s",
                      state="complete")
    live.clear()
    ss["_plan_doc"] = (key, doc)
doc = ss["_plan_doc"][1]

md = _views.md
if not doc["plans"]:
    st.warning("**No plan compiled fits** the chips' memory. Try a smaller global batch, more devices, "
               "or the optimizer's state on the host.")
else:
    best = doc["plans"][0]
    st.success(md(f"Best: {best['mesh']} · {best['plan_text']} · per-device batch "
                  f"{best['per_device_batch']:g} × {best['microbatches']} accumulation step(s)"
                  + (" · optimizer state on the host" if best["optimizer_offload"] else "")
                  + f": compiled peak {human_bytes(best['peak_bytes'])} of {human_bytes(doc['hbm_bytes'])}, "
                  f"predicted {best['predicted_tokens_per_s_per_device']:,.0f} tokens/s per device."))
    st.dataframe(_table(doc["plans"]), hide_index=True, width="stretch", key="plan_table")
pub = doc.get("published_row")
if pub:
    st.markdown(md(f"**The published configuration** ({pub['name']}, `{pub['source']}`), compiled the "
                   "same way:"))
    st.dataframe(_table([pub]), hide_index=True, width="stretch", key="plan_published")
    if doc["beats_published"] is not None:
        st.caption("The top plan's predicted tokens/s per device is "
                   + ("at least the published configuration's." if doc["beats_published"] else
                      "below the published configuration's: the search did not find it."))
err, ref = doc["memory_model_error"], doc.get("refinement_error") or {}
st.caption(md(f"{doc['candidates_predicted']} candidates predicted, {doc['candidates_compiled']} "
              f"compiled in {doc['wall_s']:.0f} s. The memory model's error on "
              f"{err['compiled_candidates']} compiles it did not fit on: "
              + (f"at most {err['max']:.1%} (mean {err['mean']:.1%})." if err["max"] is not None
                 else "none was compiled.")
              + (f" Before each family was measured on its own it was off by up to {ref['max']:.1%} "
                 f"on the {ref['compiled_candidates']} compiles that measured them."
                 if ref.get("max") is not None else "") + " Step times are predictions (nothing runs here)."))
if doc["plans"]:
    left, right = st.columns(2)
    left.markdown("MaxText's knobs for the best plan:")
    left.code(best["maxtext_yaml"], language="yaml", wrap_lines=True)
    right.markdown("The lab's compile of it:")
    right.code(best["run_command"], language="bash", wrap_lines=True)
hand = doc.get("instant_error") or {}
if hand.get("max") is not None:
    st.caption(f"The estimate by hand shown while the first compiles ran (the configuration alone, "
               f"nothing compiled) was off by up to {hand['max']:.1%} (median {hand['median']:.1%}) on "
               f"the {hand['compiled_candidates']} compiled candidates.")
with st.expander(f"Every candidate the model predicted ({len(doc['estimates'])})"):
    st.dataframe(pd.DataFrame(doc["estimates"]), hide_index=True, width="stretch")
with st.expander("Method"):
    st.markdown(md(doc["method"]))
    for note in doc["left_out"]:
        st.caption(md(f"Left out: {note}"))
st.markdown("The same plan from the command line:")
st.code(command, language="bash", wrap_lines=True)
st.download_button("Download JSON", json.dumps(doc, indent=1), "remat_lab_plan.json", "application/json",
                   key="plan_json")

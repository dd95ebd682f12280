"""Published runs: MaxText's tuned training runs, compiled for their chips and held against the record."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import pandas as pd  # noqa: E402
import streamlit as st  # noqa: E402

from pages import _page_state, _running, _shared  # noqa: E402
from remat_lab.config import ConfigError, human_bytes, mfu_text  # noqa: E402
from remat_lab.config import published as pub  # noqa: E402
from remat_lab.present.reproduce import cli_command  # noqa: E402
from remat_lab.program.backend import ExecutionError, out_of_memory  # noqa: E402
from remat_lab.serve import safe_text  # noqa: E402
from remat_lab.studies import published as study  # noqa: E402

_shared.page_start("Published runs", "MaxText's tuned training configurations (its tables, "
                                     "tpu-recipes' runs of them, and gpu-recipes' logged runs), with "
                                     "the throughput measured on real chips. Pick one: the lab "
                                     "compiles the same configuration "
                                     "for the same chips (without them) and sets its memory, flops "
                                     "and predicted step beside the record. The sidebar's settings "
                                     "are not used here.")
ss = st.session_state
st.dataframe(pd.DataFrame([{"run": r["name"], "chips": f"{r['devices']} × {r['target']}"
                            + (f" ({r['network']})" if r.get("network") else ""),
                            "published": pub.figure_text(r.get("measured")),
                            "configuration": pub.source_url(r["source"])} for r in pub.RUNS.values()]),
             hide_index=True, width="stretch", height=35 * (len(pub.RUNS) + 1) + 3,
             column_config={"configuration": st.column_config.LinkColumn(
                 "configuration", display_text=r"/blob/[0-9a-f]{40}/(?:benchmarks/)?(.*)$")})
names = list(pub.RUNS)
url = _page_state.loaded("published", ["run"])
if url.get("run") in pub.RUNS:
    ss["published_run"] = url["run"]
elif url.get("run"):
    st.warning(f"The link names no published run ({safe_text.escape_markdown(url['run'][:60])}); "
               f"choose one of the list.", icon=":material/link:")
name = st.selectbox("Run", names, key="published_run", format_func=lambda n: pub.RUNS[n]["title"])
_page_state.write({"run": name})
run = pub.RUNS[name]
figure_source = f" (`{pub.source_link(run['measured']['source'])}`)" if run.get("measured") else ""
st.caption(f"Configuration: `{pub.source_link(run['source'])}` · published figure: "
           f"{pub.figure_text(run.get('measured'))}{figure_source}")
if run.get("note"):
    st.info(run["note"], icon=":material/info:")
if defaults := pub.defaults_text(run):
    st.caption(f"MaxText's defaults then: {safe_text.escape_markdown(defaults)}")
if overlap := pub.overlap_text(run):
    st.caption(f"Collectives: {safe_text.escape_markdown(overlap)}.")
try:
    config, differences = study.config_for(name)
except ConfigError as err:
    st.warning(f"**The lab cannot compile this run yet.** {safe_text.escape_markdown(str(err))}",
               icon=":material/block:")
    st.stop()
st.markdown("**The lab's configuration** (the same numbers from the command line):")
st.code(f"python -m remat_lab published --check {name} --json\n"
        f"{cli_command(config).replace(' --json', '')}", language="bash", wrap_lines=True)
for d in differences:
    st.warning(f"Differs from MaxText's program: {safe_text.escape_markdown(d)}", icon=":material/compare:")

done = ss.setdefault("_published_docs", {})
if name not in done:
    st.info(f"Compiling {run['devices']} × {run['target']} takes minutes on this server (2 cores: "
            "about 1–6 minutes at 256 chips); the answer is kept for this session.")
    if not st.button(f"Compile for {run['devices']} × {run['target']}", key="published_check",
                     type="primary"):
        st.stop()
    with st.status(f"Compiling {name}…", expanded=False) as status:
        try:
            doc = study.judge(name, _running.run_config(config, status))
        except ExecutionError as err:
            doc = study.judge(name, None, refused=err) if out_of_memory(err) else None
            if doc is None:
                status.update(label="Compiling failed", state="error")
                _running.show_error(err)
                st.stop()
        except ConfigError as err:
            status.update(label="Compiling failed", state="error")
            _running.show_error(err)
            st.stop()
        status.update(label=f"Done: {name}", state="complete")
    done[name] = doc
doc = done[name]

a, b, c = st.columns(3)
peak = doc["peak_bytes"] if doc["peak_bytes"] is not None else doc["temp_bytes"]
a.metric("Fits one chip" if doc["fits"] else "Does not fit one chip",
         human_bytes(peak) if peak is not None else "-",
         f"of {human_bytes(doc['hbm_bytes'])} HBM" + (" (libtpu refused it)" if doc["refused"] else ""),
         delta_color="off")
ratio = doc.get("program_over_source_flops")
b.metric("Compiled flops a chip a step", f"{doc['program_flops']:.3g}" if doc["program_flops"] else "-",
         f"{ratio:.2f}× MaxText's model flops ({doc['source_model_flops']:.3g})" if ratio
         else f"MaxText's model flops {doc['source_model_flops']:.3g}", delta_color="off")
if doc["measured_step_s"]:
    est, pred = doc.get("bound_s", doc["estimate_s"]), doc.get("predicted_s")
    c.metric("Step time: measured", f"{doc['measured_step_s']:.3f} s",
             (f"predicted {pred:.3f} s ({doc['predicted_over_measured']:.2f}×)" if pred
              else "no prediction") + (f"; bound {est:.3f} s ({est / doc['measured_step_s']:.2f}×)"
                                       if est else ""), delta_color="off")
else:
    c.metric("Step time: measured", "none published", delta_color="off")
if d := pub.mfu_definition(run):  # from the catalogue (a stored check may predate a field)
    counted = f"({d['full_square']:.2%} full square, {d['causal']:.2%} causal, as MaxText counts now)"
    st.caption(f"The published MFU ({d['published']:.2%}) and tokens/s agree when attention is counted as "
               f"{'the full square' if d['matches'] == 'full_square' else 'causal'} {counted}."
               if d.get("agree", True) else
               f"The published MFU ({d['published']:.2%}) and tokens/s disagree: the tokens/s give "
               f"{d['full_square']:.2%} with attention counted as the full square, {d['causal']:.2%} "
               f"causal (as MaxText counts now). The measured step is the tokens/s's; by the MFU it "
               f"would be {d['step_s_from_mfu']:.2f} s.")
if mfu := mfu_text(doc.get("timing") or study.mfu_timing(doc)):  # a stored check may predate it
    st.caption(f"MFU: {mfu}.")
if doc["refused"] and doc.get("predicted_s"):
    st.caption("Libtpu refuses this program for HBM today; the prediction is read from the program it "
               "writes when told to finish anyway (xla_tpu_no_crash_on_oom): the kernels and "
               "collectives the run ran where its own, older compiler fit it in the chip.")
terms = doc.get("estimate_terms") or {}
if terms.get("collectives_dcn_s"):
    st.caption(f"The estimate's collectives: {terms['collectives_ici_s'] or 0:.3f} s within slices or "
               f"hosts, {terms['collectives_dcn_s']:.3f} s across them (the data-centre network or "
               f"the hosts' network, {terms['dcn_bytes_per_s'] / 1e9:g} GB/s a device); bound by "
               f"{terms['bound']}.")
if net := pub.network_text(doc):  # which machine's network, and why that one
    st.caption(f"The hosts' network: {safe_text.escape_markdown(net)}.")
exposed = (doc.get("prediction") or {}).get("exposed_collectives_s")
if exposed is not None:
    st.caption(f"The prediction runs the collectives as the program's schedule lets them: "
               f"{(doc['prediction'].get('scheduled_collectives_s') or 0):.3f} s of them, "
               f"{exposed:.3f} s not hidden behind kernels (added to the kernels' "
               f"{doc['prediction']['kernels_s']:.3f} s).")
st.caption("Per-device peak: XLA's compiled memory analysis of the lab's training step for one chip "
           "of the target; on TPU libtpu refuses a program over the chip's HBM. The estimate is a "
           "roofline from the target's spec figures, not a measurement.")
for note in doc["notes"][:3]:
    st.caption(safe_text.escape_markdown(note))
with st.expander("The whole answer (JSON)"):
    st.json(doc, expanded=False)

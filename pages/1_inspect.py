"""Inspect: the jaxprs and the compiled HLO of the current configuration, dots easy to find."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _running, _shared  # noqa: E402
from remat_lab.present import tables  # noqa: E402

cfg = _shared.page_start("Inspect", "The programs behind the numbers. Recomputed values sit under "
                                    "the name scope rematted_computation.")
result = _running.run_one(cfg, keep_texts=True, button_key="inspect_run")  # untimed
if result is None:
    st.stop()

TEXTS = [  # key, tab title, default filter, caption
    ("step_jaxpr", "Step jaxpr", "dot_general",
     "Forward and backward together: dots under rematted_computation are recomputed."),
    ("vjp_jaxpr", "Forward + residuals (vjp) jaxpr", "dot_general",
     "The forward pass as autodiff linearises it: what it outputs besides the loss are the residuals."),
    ("forward_jaxpr", "Forward jaxpr", "dot_general|remat",
     "The model as traced, with the remat wrapper and its policy."),
    ("compiled_hlo", "Compiled HLO", " dot(|rematted_computation",
     "What XLA actually runs after optimisation (fusion, CSE). op_name metadata names the scopes "
     "but is no witness: XLA drops it on rewritten products and CSE survivors keep either name."),
]
texts = result["texts"]
stem = (f"remat_lab_{cfg.model}_w{cfg.width}_b{cfg.batch}_d{cfg.depth}_{cfg.policy}")
for tab, (key, title, pattern, caption) in zip(st.tabs([t[1] for t in TEXTS]), TEXTS):
    with tab:
        text = texts.get(key, "")
        st.caption(caption)
        pat = st.text_input("Show lines containing (plain text; | separates alternatives)", pattern,
                            key=f"inspect_filter_{key}")
        hits = tables.matching_lines(text, pat)
        remat = [ln for ln in hits if "rematted_computation" in ln]
        st.markdown(f"**{len(hits)} matching lines**, of which **{len(remat)} recomputed** "
                    f"(`rematted_computation`) · {len(text.splitlines())} lines in all")
        if remat:
            st.markdown("Recomputed lines")
            st.code("\n".join(remat), language=None, wrap_lines=False)
        st.markdown("All matching lines")
        st.code("\n".join(hits) or "(no match)", language=None)
        st.download_button(f"Download {title}", text, f"{stem}_{key}.txt", "text/plain",
                           key=f"inspect_download_{key}")
        with st.expander(f"Full {title} ({len(text):,} characters)"):
            st.code(text, language=None, line_numbers=True)

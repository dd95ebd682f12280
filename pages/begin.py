"""Start: what you train, on what, with which recipe; then the page that answers, all of it in the link."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _shared, _url  # noqa: E402
from pages._begin_link import start_params  # noqa: E402
from remat_lab.config import PRESETS, TARGETS, ConfigError  # noqa: E402
from remat_lab.config.targets import MAX_TARGET_DEVICES  # noqa: E402

ANSWERS = {  # button -> (page, the question it answers)
    "advisor": ("pages/advisor.py", "Which policy, and how large a batch per device?"),
    "explore": ("pages/explore.py", "What fills the memory at one example per device?"),
    "compare": ("pages/compare.py", "How do the policies compare there?"),
}

_shared.page_start("What do you train, and on what?",
                   "Choose a published model and the accelerators you will rent; the Advisor then "
                   "compiles every checkpoint policy for them (nothing runs: no GPU or TPU is needed "
                   "here) and finds the largest batch per device that fits. For a small model of "
                   "your own, or your own block, use the sidebar and Explore.")
def _preset_seq(preset: str) -> int:
    return int(PRESETS[preset].get("seq", 2048))


left, right = st.columns(2)
with left:
    # Another model brings its own sequence length (gpt2-small's 1024, not llama's 8192).
    preset = st.selectbox("Model (a published shape)", list(PRESETS), key="start_preset",
                          on_change=lambda: st.session_state.update(
                              start_seq=_preset_seq(st.session_state["start_preset"])))
    seq = st.number_input("Sequence length", 2, 32768, _preset_seq(preset), step=512, key="start_seq")
with right:
    names = ["local", *TARGETS]
    target = st.selectbox("Accelerator", names, index=names.index("h100"), key="start_target",
                          format_func=lambda t: "this machine" if t == "local" else t)
    devices = st.number_input("Devices (FSDP over all of them)", 1, MAX_TARGET_DEVICES,
                              8 if target != "local" else 1, key="start_devices",
                              disabled=target == "local")
recipe = st.toggle("The usual training recipe: the AdamW step, float32 master weights and moments, "
                   "bfloat16 compute, flash-style attention, the vocabulary loss in chunks",
                   value=True, key="start_recipe")
try:
    params = start_params(preset, int(seq), target, int(devices) if target != "local" else 1, recipe)
except ConfigError as err:
    st.error(f"That combination cannot be built: {err}")
    st.stop()
for name, (path, question) in ANSWERS.items():
    if st.button(question, key=f"start_{name}", type="primary" if name == "advisor" else "secondary"):
        _url.read_again()  # the sidebar reads the new link, as on a fresh visit
        st.switch_page(path, query_params=params)

"""Start: what you train, on what, with which recipe; then the page that answers, all of it in the link."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _page_state, _shared, _url  # noqa: E402
from pages._begin_link import start_params  # noqa: E402
from remat_lab.config import PRESETS, TARGETS, ConfigError, RunConfig, parameters_text  # noqa: E402
from remat_lab.config.targets import MAX_TARGET_DEVICES  # noqa: E402

FIELDS = ("start_preset", "start_seq", "start_target", "start_devices", "start_recipe")
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


def _one_of(options):
    """A parser of one name among ``options`` (the link's value of a select box)."""
    pick = _page_state.names(options, 1)
    return lambda raw: pick(raw)[0]


# The page's own fields in its link (the sidebar's keep theirs): restored on a first visit, written back.
ss = st.session_state
url = _page_state.loaded("begin", FIELDS)
_page_state.show(
    _page_state.restore(url, "start_preset", _one_of(PRESETS), "start_preset", "a preset's name",
                        "the first preset")
    + _page_state.restore(url, "start_seq", lambda r: _page_state.numbers(2, 32768)(r)[0], "start_seq",
                          "a whole number from 2 to 32768", "the model's own")
    + _page_state.restore(url, "start_target", _one_of(["local", *TARGETS]), "start_target",
                          "local or a target's name", "h100")
    + _page_state.restore(url, "start_devices", lambda r: _page_state.numbers(1, MAX_TARGET_DEVICES)(r)[0],
                          "start_devices", f"a whole number from 1 to {MAX_TARGET_DEVICES}", "8")
    + _page_state.restore(url, "start_recipe", _page_state.flag, "start_recipe", "1 or 0", "on"))
for k, v in ss.get("_start_kept", {}).items():  # back from another page: Streamlit forgot the widgets
    if k not in ss:
        ss[k] = v
ss.setdefault("start_preset", next(iter(PRESETS)))
ss.setdefault("start_seq", _preset_seq(ss["start_preset"]))  # a link's bad value too: the model's own
ss.setdefault("start_target", "h100")
ss.setdefault("start_devices", 8)
ss.setdefault("start_recipe", True)
left, right = st.columns(2)
with left:
    # Another model brings its own sequence length (gpt2-small's 1024, not llama's 8192).
    preset = st.selectbox("Model (a published shape)", list(PRESETS), key="start_preset",
                          on_change=lambda: st.session_state.update(
                              start_seq=_preset_seq(st.session_state["start_preset"])))
    seq = st.number_input("Sequence length", 2, 32768, step=512, key="start_seq")
    st.caption(f"{preset}: {parameters_text(RunConfig.from_preset(preset))}, counted from its shape.")
with right:
    names = ["local", *TARGETS]
    target = st.selectbox("Accelerator", names, key="start_target",
                          format_func=lambda t: "this machine" if t == "local" else t)
    devices = st.number_input("Devices (FSDP over all of them)", 1, MAX_TARGET_DEVICES,
                              key="start_devices", disabled=target == "local")
recipe = st.toggle("The usual training recipe: the AdamW step, float32 master weights and moments, "
                   "bfloat16 compute, flash-style attention, the vocabulary loss in chunks",
                   key="start_recipe")
ss["_start_kept"] = {k: ss[k] for k in FIELDS}
_page_state.write({"start_preset": preset, "start_seq": str(int(seq)), "start_target": target,
                   "start_devices": str(int(devices)), "start_recipe": "1" if recipe else "0"})
try:
    params = start_params(preset, int(seq), target, int(devices) if target != "local" else 1, recipe)
except ConfigError as err:
    st.error(f"That combination cannot be built: {err}")
    st.stop()
for name, (path, question) in ANSWERS.items():
    if st.button(question, key=f"start_{name}", type="primary" if name == "advisor" else "secondary"):
        _url.read_again()  # the sidebar reads the new link, as on a fresh visit
        st.switch_page(path, query_params=params)

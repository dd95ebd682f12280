"""The Plan page's question: its fields in the link, kept across pages, its model a preset or a config file.

Every field is a URL parameter named as its widget's key (``/plan?plan_preset=llama3.2-1b&plan_devices=8``).
On the page's first run in a session each is read from the link and checked on its own (a bad one is
named in a warning and its field keeps the default); every run writes them back, and keeps them in
``_plan_kept`` so that leaving the page and coming back finds the same question (Streamlit forgets a
widget's state once a page without it runs). A model read from a config file is the session's, not the
link's: the link says so.
"""

from __future__ import annotations

import streamlit as st

from pages import _page_state
from remat_lab.config import PRESETS, TARGET_NAMES, ConfigError, get_target
from remat_lab.config.model_config import MAX_BYTES, parse_model_config
from remat_lab.config.targets import MAX_TARGET_DEVICES
from remat_lab.studies.plan.space import DEFAULT_PLANS, plan_label

PLANS = (*DEFAULT_PLANS, "synthesized", "minimal", "save_dot_except_mlp", "qkv_proj_offloaded",
         "offload:decoder_layer_input,query_proj,key_proj,value_proj,out_proj")
TARGETS = [t for t in TARGET_NAMES if t != "local"]
FILE = "(a config file)"  # the model picker's entry for an uploaded config.json or MaxText YAML
KEPT, MODEL = "_plan_kept", "_plan_model_file"  # session state: the fields; (name, ModelConfig)
DEFAULTS = {"plan_preset": "llama3.1-8b" if "llama3.1-8b" in PRESETS else next(iter(PRESETS)),
            "plan_seq": 8192, "plan_target": "tpu-v6e", "plan_devices": 256, "plan_slices": 0,
            "plan_network": "", "plan_tokens": 4 * 256 * 8192, "plan_tensor": [1, 4], "plan_offload": True,
            "plan_plans": list(DEFAULT_PLANS), "plan_price": "", "plan_budget": "1T", "plan_also": ""}


def _one(options):
    pick = _page_state.names(options, 1)
    return lambda raw: pick(raw)[0]


def _whole(lo: int, hi: int):
    return lambda raw: _page_state.numbers(lo, hi)(raw)[0]


def _plans(raw: str) -> list[str]:
    items = [p.strip() for p in str(raw).split(";") if p.strip()]
    bad = [p for p in items if p not in PLANS]
    if not items or bad:
        raise ValueError(f"unknown plan {bad[0][:40]!r}." if bad else "no plan given.")
    return list(dict.fromkeys(items))


def price(raw: str) -> str:
    """A price per chip-hour as typed: empty (the accelerator's default) or a positive number."""
    text = str(raw).strip()[:16]
    if text and not (text.replace(".", "", 1).isdigit() and 0 < float(text) < 1e6):
        raise ValueError("not a positive number of dollars.")
    return text


def budget(raw: str) -> float:
    """Tokens: 1e12, 1T, 500B, 2.5M."""
    text = str(raw).strip().upper()[:24]
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(text[-1:], 1.0)
    try:
        value = float(text[:-1] if scale != 1.0 else text) * scale
    except ValueError:
        raise ValueError("not a number of tokens (1T, 500B, 1e12).") from None
    if not 1 <= value <= 1e18:
        raise ValueError("not between 1 and 1e18 tokens.")
    return value


def also(raw: str) -> list[tuple[str, int, float | None]]:
    """Other accelerators: ``tpu-v5p:64,h100:64:6.5`` (TARGET:DEVICES[:USD per chip-hour])."""
    out = []
    for item in [s.strip() for s in str(raw).split(",") if s.strip()][:4]:
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[0] not in TARGETS or not parts[1].isdigit() \
                or not 1 <= int(parts[1]) <= MAX_TARGET_DEVICES:
            raise ValueError(f"{item[:40]!r} is not TARGET:DEVICES[:USD].")
        usd = float(price(parts[2])) if len(parts) == 3 and parts[2] else None
        out.append((parts[0], int(parts[1]), usd))
    return out


def _tensor(raw: str) -> list[int]:
    sizes = _page_state.numbers(1, 8)(raw)
    if any(t not in (1, 2, 4, 8) for t in sizes):
        raise ValueError("a size other than 1, 2, 4 or 8.")
    return sizes


def _budget_text(raw: str) -> str:
    budget(raw)
    return str(raw).strip()[:24]


def _also_text(raw: str) -> str:
    also(raw)
    return str(raw).strip()[:160]


PARSE = {"plan_preset": (_one([*PRESETS]), "a preset's name"),
         "plan_seq": (_whole(128, 131072), "a whole number from 128 to 131072"),
         "plan_target": (_one(TARGETS), "a target's name"),
         "plan_devices": (_whole(1, MAX_TARGET_DEVICES), f"a whole number from 1 to {MAX_TARGET_DEVICES}"),
         "plan_slices": (_whole(0, 64), "a whole number from 0 to 64"),
         "plan_network": (str, "a network of the accelerator"),
         "plan_tokens": (_whole(0, 1 << 40), "a whole number of tokens, 0 for as large as fits"),
         "plan_tensor": (_tensor, "1, 2, 4 or 8, separated by commas"),
         "plan_offload": (_page_state.flag, "1 or 0"), "plan_plans": (_plans, "plans separated by ';'"),
         "plan_price": (price, "a positive number of dollars, or empty for the default"),
         "plan_budget": (_budget_text, "1T, 500B or 1e12"),
         "plan_also": (_also_text, "TARGET:DEVICES[:USD], separated by commas")}


def restore() -> None:
    """The link's fields on the first run (a bad one warned of), else the kept ones; then defaults."""
    ss = st.session_state
    url = _page_state.loaded("plan", PARSE)
    _page_state.show([w for key, (parse, allowed) in PARSE.items()
                      for w in _page_state.restore(url, key, parse, key, allowed, "the page's default")])
    if url.get("plan_network") and url["plan_network"] not in (
            get_target(ss.get("plan_target", DEFAULTS["plan_target"])).networks or {}):
        _page_state.show(["URL parameter `plan_network` names no network of this accelerator; "
                          "using its default."])
        ss.pop("plan_network", None)
    for k, v in ss.get(KEPT, {}).items():
        if k not in ss and k not in url:
            ss[k] = v
    for k, v in DEFAULTS.items():
        ss.setdefault(k, v)


def keep_and_write() -> None:
    """The fields kept for the next visit and written to the address bar."""
    ss = st.session_state
    ss[KEPT] = {k: ss[k] for k in DEFAULTS if k in ss}
    text = {k: ss.get(k) for k in DEFAULTS}
    _page_state.write({**{k: str(int(v)) for k, v in text.items() if k in (
        "plan_seq", "plan_devices", "plan_slices", "plan_tokens")},
        "plan_preset": text["plan_preset"], "plan_target": text["plan_target"],
        "plan_network": text["plan_network"] or None, "plan_tensor": ",".join(map(str, text["plan_tensor"])),
        "plan_offload": "1" if text["plan_offload"] else "0", "plan_plans": ";".join(text["plan_plans"]),
        "plan_price": text["plan_price"] or None, "plan_budget": text["plan_budget"] or None,
        "plan_also": text["plan_also"] or None})


def model_file(where) -> None:
    """An uploaded config.json or MaxText YAML, read by the engine (data only); kept in the session."""
    f = where.file_uploader("Hugging Face config.json or MaxText model YAML", type=["json", "yml", "yaml"],
                            key="plan_model_upload", max_upload_size=1)
    if f is None:
        return
    data = f.getvalue()
    try:
        if len(data) > MAX_BYTES:
            raise ConfigError(f"{f.name} is {len(data):,} bytes; a model config is at most {MAX_BYTES:,}.")
        st.session_state[MODEL] = (f.name, parse_model_config(data.decode("utf-8", "replace"), f.name))
    except ConfigError as err:
        st.session_state.pop(MODEL, None)
        where.error(str(err))


def form() -> dict:
    """The question's widgets; its values (``model_file``: the file's (name, ModelConfig) or None)."""
    ss = st.session_state
    restore()
    a, b, c = st.columns(3)
    options = [*PRESETS, FILE]
    preset = a.selectbox("Model", options, key="plan_preset")
    if preset == FILE:
        model_file(a)
    seq = a.number_input("Sequence length", 128, 131072, step=1024, key="plan_seq")
    target = b.selectbox("Accelerator", TARGETS, key="plan_target")
    devices = b.number_input("Devices", 1, MAX_TARGET_DEVICES, key="plan_devices")
    slices = b.number_input("Slices or hosts (0: one TPU slice; GPUs 8 to a host)", 0, 64, key="plan_slices")
    networks = list(get_target(target).networks)
    if networks and ss.get("plan_network") not in networks:
        ss["plan_network"] = get_target(target).network
    network = b.selectbox("Hosts' network", networks, key="plan_network",
                          help="What each GPU sends a second to other hosts (the machine's NICs): "
                               "collectives across hosts are priced at it.") if networks else ""
    if not networks:
        ss["plan_network"] = ""
    tokens = c.number_input("Global batch, tokens (0: as large as fits)", 0, 1 << 40, step=8192,
                            key="plan_tokens")
    tensor = c.multiselect("Tensor-parallel sizes", [1, 2, 4, 8], key="plan_tensor")
    offload = c.checkbox("Consider the optimizer's state on the host", key="plan_offload")
    plans = st.multiselect("Remat plans", PLANS, key="plan_plans", format_func=plan_label)
    d, e, f = st.columns(3)
    d.text_input("Price per chip-hour, USD (empty: the accelerator's default)", key="plan_price",
                 help="Edit it for your region, commitment or discount; the default's source is below.")
    e.text_input("Token budget (1T, 500B, 1e12)", key="plan_budget")
    f.text_input("Also plan on (TARGET:DEVICES[:USD per chip-hour], comma-separated)", key="plan_also",
                 placeholder="tpu-v5p:64, h100:64")
    keep_and_write()
    return {"preset": preset, "seq": int(seq), "target": target, "devices": int(devices),
            "slices": int(slices),
            "network": "" if network == get_target(target).network else network, "tokens": int(tokens),
            "tensor": list(tensor), "offload": bool(offload), "plans": list(plans),
            "model_file": ss.get(MODEL) if preset == FILE else None}

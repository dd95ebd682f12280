"""The device mesh in the app: emulated devices at start, sidebar controls, Explore and Compare sections.

Shown only when the process has more than one device (a multi-GPU host, or the app started with
``REMAT_LAB_HOST_DEVICES=N`` to emulate N CPU devices). The engine is ``remat_lab.sharding``.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from pages import _mesh_link
from remat_lab.config import (
    MESH_AXES,
    ConfigError,
    RunConfig,
    format_mesh,
    get_target,
    human_bytes,
    mesh_devices,
)
from remat_lab.present import reproduce
from remat_lab.program import mesh as sharding
from remat_lab.program.backend import ExecutionError
from remat_lab.program.distributed import HOST_DEVICES_ENV, apply_env
from remat_lab.serve import safe_text, worker


@st.cache_resource(show_spinner=False)
def _started() -> str | None:
    """Apply ``$REMAT_LAB_HOST_DEVICES`` once per server process, before JAX starts; the error
    sentence when it cannot be applied."""
    try:
        apply_env()
    except ConfigError as err:
        return str(err)
    return None


def start_devices() -> None:
    """Call from app.py before anything touches a device."""
    error = _started()
    if error:
        st.error(f"{HOST_DEVICES_ENV}: {error}")


@st.cache_resource(show_spinner=False)
def _worker_environment() -> dict:
    """The worker's backend and devices: the server starts no JAX backend of its own (a GPU's or a
    TPU's would load the accelerator's plugin into the server; tests/test_lean_server.py)."""
    return worker.shared_pool().call("environment", {})


def device_count() -> int:
    """The devices of the worker, where the runs happen (1 when it cannot say)."""
    try:
        return _worker_environment()["device_count"]
    except ExecutionError:
        return 1


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


TARGET_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # each axis's choices on a named target (compile-only)
DCN_SIZES = (1, 2, 4, 8, 16)  # each cross-slice (dcn_*) axis's choices on a named target


def apply(cfg: RunConfig, target: str = "local") -> RunConfig:
    """The sidebar's mesh controls: ``cfg`` on the chosen mesh, or ``cfg`` unchanged (one device)
    with a warning when the mesh does not fit it. Locally only with more than one device; on a
    named target always, over as many of its compile-only devices as the mesh uses."""
    on_target = target != "local"
    n = device_count()
    ss, sb = st.session_state, st.sidebar
    choices = list(TARGET_SIZES) if on_target else _divisors(n)
    _mesh_link.read(on_target, n, choices, DCN_SIZES)
    if n < 2 and not on_target:
        return cfg
    for axis in MESH_AXES:  # a value the other backend allowed: back to 1
        if ss.get(f"mesh_{axis}", 1) not in choices:
            ss[f"mesh_{axis}"] = 1
    axes = MESH_AXES if cfg.experts else tuple(a for a in MESH_AXES if a != "expert")
    if not cfg.experts:
        ss["mesh_expert"] = ss["mesh_dcn_expert"] = 1  # the expert axis splits experts: only with them
    sb.subheader("Device mesh")
    sb.caption(("Devices of the target: as many as the mesh uses (compiled, nothing runs). "
                if on_target else f"{n} devices. ")
               + "`data` and `fsdp` split the batch, `fsdp` also the parameters, `tensor` the width"
               + (", `expert` the experts (and the batch outside them)" if cfg.experts else "")
               + " (see the Guide). All 1: one device.")
    cols = sb.columns(len(axes))
    for col, axis in zip(cols, axes):
        col.selectbox(axis, choices, key=f"mesh_{axis}")
    sizes = {a: int(ss[f"mesh_{a}"]) for a in MESH_AXES}
    dcn, network = {}, ""
    if on_target:
        with sb.expander("Across slices or hosts (dcn)", expanded=any(
                ss.get(f"mesh_dcn_{a}", 1) > 1 for a in MESH_AXES)):
            st.caption("MaxText's `dcn_*` axes: each axis above is repeated over this many TPU "
                       "slices or GPU hosts (the slower axis outermost); collectives that cross "
                       "them are priced at the data-centre network, not ICI / NVLink.")
            for col, axis in zip(st.columns(len(axes)), axes):
                col.selectbox(f"dcn_{axis}", DCN_SIZES, key=f"mesh_dcn_{axis}")
            network = _network(target)
        dcn = {a: int(ss.get(f"mesh_dcn_{a}", 1)) for a in MESH_AXES}
    used = mesh_devices(format_mesh(sizes))
    if not on_target and n % used:
        sb.warning(f"The mesh uses {used} devices, which does not divide the {n} present: "
                   "running on one device.")
        return cfg
    try:
        mesh = format_mesh({a: sizes[a] * dcn.get(a, 1) for a in MESH_AXES}, dcn)
        if on_target:  # a dcn axis needs the named target (the attached devices are one slice)
            return cfg.replace(mesh=mesh, target=target, target_devices=mesh_devices(mesh), network=network)
        return cfg.replace(mesh=mesh)
    except ConfigError as err:
        sb.warning(f"{safe_text.escape_markdown(err)} Running on one device.")
        return cfg


def _network(target: str) -> str:
    """The host network selector (a GPU target with several: h100 on A3 Mega, A3 High, a DGX);
    "" for the target's default, so equal choices make equal configurations."""
    t = get_target(target)
    if not t.networks:
        return ""
    ss, names = st.session_state, list(t.networks)
    _mesh_link.read_network(names)
    if ss.get("mesh_network") not in names:
        ss["mesh_network"] = t.network
    st.selectbox("Host network", names, key="mesh_network",
                 format_func=lambda n: f"{n} ({t.on_network(n).dcn_bytes_per_s / 1e9:g} GB/s a GPU)"
                 + (" · default" if n == t.network else ""),
                 help="What each GPU sends a second to other hosts: the machine decides it (an A3 "
                      "High has half an A3 Mega's). Collectives across hosts are priced at it.")
    return "" if ss["mesh_network"] == t.network else ss["mesh_network"]


def url_params(cfg: RunConfig) -> dict[str, str]:
    """The mesh's URL parameters (none on one device; the host network where not the default),
    noted as the selectors' own."""
    _mesh_link.written(cfg.mesh)
    return {**({"mesh": cfg.mesh} if cfg.mesh else {}), **({"network": cfg.network} if cfg.network else {})}


def _collectives_frame(sh: dict) -> pd.DataFrame:
    rows = []
    for kind, phases in sh["collectives"].items():
        if not any(c["count"] for c in phases.values()):
            continue
        row = {"collective": kind}
        for phase, c in phases.items():
            row[f"{phase} (count)"] = c["count"]
            row[f"{phase} (bytes)"] = human_bytes(c["bytes"])
        if any(c.get("dcn_count") for c in phases.values()):
            row["across slices or hosts (bytes)"] = human_bytes(sum(c.get("dcn_bytes", 0)
                                                                    for c in phases.values()))
        row["vs no_remat (count)"] = None if sh["vs_no_remat"] is None else sh["vs_no_remat"][kind]
        rows.append(row)
    return pd.DataFrame(rows)


def explore_section(cfg: RunConfig, result: dict) -> None:
    """Explore: per-device memory and the collectives by phase, when the run used a mesh."""
    sh = result.get("sharding")
    if not sh:
        return
    mem = sh["per_device"] or {}
    st.subheader("On the device mesh")
    mesh = sh.get("mesh_text") or ", ".join(f"{a}={s}" for a, s in sh["mesh"].items())
    a, b, c = st.columns(3)
    a.metric("Peak per device", human_bytes(mem.get("peak_bytes", 0)),
             help="memory_analysis() of the partitioned program: it describes one device's program")
    a.caption(f"temp {human_bytes(mem.get('temp_bytes', 0))} · mesh {mesh} · {sh['devices']} devices, "
              f"{sh['processes']} process(es)")
    b.metric("Parameters per device", human_bytes(sh["param_bytes_per_device"]))
    b.caption(f"of {human_bytes(sh['param_bytes_total'])} in all")
    norm = sh.get("grad_norm")  # none when compiled for a target: nothing ran
    c.metric("Gradient norm", "not run" if norm is None else f"{norm:.6g}")
    frame = _collectives_frame(sh)
    if frame.empty:
        st.caption("The compiled program has no collectives.")
    else:
        st.dataframe(frame, hide_index=True, width="stretch")
    st.caption("Collectives in the compiled per-device program, times the runs of their loop (a scanned "
               "body runs depth times), by phase from op_name (recomputed: under the remat; CSE may "
               "merge a recomputation back into the forward). vs no_remat: the same count minus "
               "the no_remat compile on the same mesh, whatever the names say. On emulated CPU "
               "devices there is no interconnect: step times are not a cluster's; memory per device is.")
    st.code(reproduce.cli_command(cfg), language="bash", wrap_lines=True)


def _cpu() -> bool:
    try:
        return _worker_environment()["backend"] == "cpu"
    except ExecutionError:
        return True


@st.cache_data(show_spinner="Compiling every policy on the mesh…", max_entries=16)
def _mesh_rows(items: tuple, policies: tuple) -> list[dict]:
    """In the worker (a compile for a named target needs its plugin, which the server never loads)."""
    from pages import _visitor

    return worker.shared_pool().call("mesh_table", {"config": RunConfig(**dict(items)).as_dict(),
                                                    "policies": list(policies)},
                                     key=(items, policies), session=_visitor.lane())


def compare_section(cfg: RunConfig, policies: list[str]) -> None:
    """Compare: per policy, the per-device peak and the collectives recomputation brings back."""
    if not cfg.mesh:
        return
    st.subheader(f"On the device mesh ({cfg.mesh})")
    try:
        rows = _mesh_rows(tuple(sorted(cfg.as_dict().items())), tuple(policies))
    except ConfigError as err:
        st.error(str(err))
        return
    frame = pd.DataFrame([{
        "policy": r["policy"], "peak per device": human_bytes(r["peak_bytes"] or 0),
        "temp per device": human_bytes(r["temp_bytes"] or 0),
        "all-gathers recomputed": r["all-gather_recomputed"],
        "all-gathers vs no_remat": r["all-gather_vs_no_remat"],
        "all-reduces recomputed": r["all-reduce_recomputed"],
        "all-reduces vs no_remat": r["all-reduce_vs_no_remat"],
        "reduce-scatters vs no_remat": r["reduce-scatter_vs_no_remat"]} for r in rows])
    st.dataframe(frame, hide_index=True, width="stretch")
    st.caption("Compiled on the mesh, not timed. Under fsdp a policy that does not keep the gathered "
               "parameters gathers them again in the backward pass (all-gathers vs no_remat > 0); "
               "under tensor a recomputed row-parallel product brings its all-reduce back.")


def guide_text() -> str:
    """The sharding rules, for the Guide."""
    return sharding.RULES_TEXT

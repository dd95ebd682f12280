"""One run's charts and tables, shared by Explore and the views of saved runs: every one legible in a
1024 px window (charts stacked there, side by side on a wide page; tables narrow enough not to
scroll sideways, an llm's dozens of rows grouped by layer and checkpoint name)."""

from __future__ import annotations

import streamlit as st

from pages._layout import chart_row
from remat_lab.present import charts, dot_tables, tables

CHECK, NUM, TEXT = st.column_config.CheckboxColumn, st.column_config.NumberColumn, st.column_config.TextColumn
COMPILED_HELP = ("Recomputed in the compiled program: yes / no from the policy's compile against the "
                 "no_remat compile of the same configuration; not attributable when products of this "
                 "size cannot be told apart")
EVERY_LAYER = "every layer the row stands for (a scanned row: all of the stack's)"
WHERE_KEPT = "device or host memory; jaxpr → compiled where the two differ"
GROUP_COMPILED_HELP = ("How many of them the compiled program recomputes (against the no_remat "
                       "compile); unknown: products of their size cannot be told apart (not attributable)")
DOT_VIEWS = ["each dot", "shapes", "by layer and name"]
RESIDUAL_VIEWS = ["each value", "sources", "by layer and name"]
PEAK_VIEWS = ["each buffer", "sources", "by phase", "by layer and name"]
VALUE_HELP = "dtype and shape, as XLA writes them: f32[8,64] is 8 x 64 float32"


def run_charts(result: dict, key: str, no_time: str | None = None) -> None:
    """Step time, compiled memory and residuals by layer: three charts in a row that wraps.
    ``no_time``: what to say in the step time's place when nothing was timed."""
    time_cell, memory_cell, residual_cell = chart_row(f"{key}_charts", 3)
    samples = tables.samples_frame(result)
    if no_time and samples.empty:
        time_cell.info(no_time)
    else:
        time_cell.plotly_chart(charts.make_step_time_figure(samples), width="stretch", key=f"{key}_time")
    memory_cell.plotly_chart(charts.make_memory_figure(tables.memory_frame([result])), width="stretch",
                             key=f"{key}_memory")
    residual_cell.plotly_chart(charts.make_residuals_figure(tables.residual_layer_kind_frame(result)),
                               width="stretch", key=f"{key}_residuals")


def _view(label: str, options: list[str], rows: int, key: str) -> str:
    """The table's view: each row, or grouped first when there are more than ``GROUP_ABOVE``."""
    grouped = options[-1] if rows > dot_tables.GROUP_ABOVE else options[0]
    return st.segmented_control(label, options, default=grouped, key=key) or grouped


def dots_table(result: dict, key: str) -> None:
    """The per-dot table in one of three narrow views: the decisions, the operands' shapes, or the
    dots grouped by layer and checkpoint name."""
    view = _view("View", DOT_VIEWS, len(result.get("dots") or []), f"{key}_dot_view")
    if view == "shapes":
        st.dataframe(dot_tables.dot_shapes_frame(result), hide_index=True, width="stretch", key=f"{key}_dots",
                     column_config={"index": NUM("dot", width=45), "layer": TEXT("layer", width=80),
                                    **{c: TEXT(c, width=105) for c in ("lhs", "rhs", "out")},
                                    "batch_dims": CHECK("batch dims", width=55),
                                    "flops": NUM("flops", width=50, format="compact", help=EVERY_LAYER)})
    elif view == "by layer and name":
        st.dataframe(dot_tables.dot_groups_frame(result), hide_index=True, width="stretch", key=f"{key}_dots",
                     column_order=["layer", "name", "dots", "policy", "jaxpr", "compiled", "output"],
                     column_config={
                         "layer": TEXT("layer", width=75),
                         "name": TEXT("name", width=90, help="the checkpoint_name tag of the dots' output"),
                         "dots": NUM("dots", width=50, help="forward dots, all blocks"),
                         "policy": TEXT("policy", width=75, help="what the checkpoint policy says"),
                         "jaxpr": TEXT("jaxpr", width=85, help="what the backward jaxpr does with them"),
                         "compiled": TEXT("compiled", width=90, help=GROUP_COMPILED_HELP),
                         "output": TEXT("output", width=75, help="their outputs' bytes, every block")})
    else:
        st.dataframe(dot_tables.dot_decisions_frame(result), hide_index=True, width="stretch",
                     key=f"{key}_dots", column_config={  # widths: about 550 px, a 1024 px window's page
                         "index": NUM("dot", width=45), "layer": TEXT("layer", width=95),
                         "policy_verdict": TEXT("policy", width=80,
                                                help="what the checkpoint policy says about it"),
                         "saved": CHECK("saved", width=55, help="kept for the backward pass (the jaxpr)"),
                         "recomputed": CHECK("recomputed", width=90, help="recomputed in the backward jaxpr"),
                         "offloaded": CHECK("offloaded"),
                         "offloaded_in_compiled": CHECK("offloaded (compiled)"),
                         "recomputed_in_compiled": TEXT("compiled", width=110, help=COMPILED_HELP),
                         "out_bytes": None,
                         "output": TEXT("output", width=75, help="its output, every layer it stands for")})


def _shown(df, columns: list[str], optional: dict[str, object]) -> list[str]:
    """``columns`` of ``df`` without the ``optional`` ones holding nothing but their default (an
    empty name, "device" memory): a column that says nothing takes no room."""
    return [c for c in columns if c not in optional or (df[c] != optional[c]).any()]


def residuals_table(result: dict, key: str) -> None:
    """The residual table: each kept value, where the program makes each, or grouped by layer and
    checkpoint name."""
    view = _view("View", RESIDUAL_VIEWS, len(result.get("residuals") or []), f"{key}_res_view")
    if view == "by layer and name":
        st.dataframe(dot_tables.residual_groups_frame(result), hide_index=True, width="stretch",
                     key=f"{key}_res", column_config={
                         "values": NUM("values", help="rows of the table: kept values"),
                         "blocks": NUM("blocks", help="blocks (layers of the stack) they stand for"),
                         "kinds": TEXT("kinds", width=110), "memory": TEXT("memory", help=WHERE_KEPT),
                         "bytes": None})
        return
    rows = dot_tables.residual_rows_frame(result)
    shown = (["index", "layer", "value", "size", "source"] if view == "sources" else
             _shown(rows, ["index", "layer", "name", "kind", "value", "size", "memory"],
                    {"name": "", "memory": "device"}))
    st.dataframe(rows, hide_index=True, width="stretch", key=f"{key}_res", column_order=shown,
                 column_config={"index": NUM("#", width=45), "memory": TEXT("memory", help=WHERE_KEPT),
                                "layer": TEXT("layer", width=90), "value": TEXT("value", help=VALUE_HELP),
                                "size": TEXT("size", width=75),
                                "source": TEXT("source", width=200, help="the operation that makes it, "
                                                                         "and where in the code")})


def at_peak_table(result: dict, key: str) -> None:
    """The buffers live at the timeline's peak: each, their sources, by phase, or by layer and name."""
    at_peak = tables.at_peak_frame(result)
    at_peak["value"] = [dot_tables.value_text(d, s) for d, s in zip(at_peak["dtype"], at_peak["shape"])]
    group = st.segmented_control("Buffers at the peak", PEAK_VIEWS, default=PEAK_VIEWS[0],
                                 key=f"{key}_peak_group") or PEAK_VIEWS[0]
    if group in ("by phase", "by layer and name"):
        grouped = tables.at_peak_groups(at_peak, ["phase"] if group == "by phase" else ["layer", "name"])
        st.dataframe(grouped, hide_index=True, width="stretch", key=f"{key}_at_peak",
                     column_config={"bytes": None})
        return
    shown = (["size", "layer", "instruction", "op_name"] if group == "sources" else
             _shown(at_peak, ["size", "phase", "layer", "name", "value", "kind"], {"name": ""}))
    st.dataframe(at_peak, hide_index=True, width="stretch", key=f"{key}_at_peak", column_order=shown,
                 column_config={"value": TEXT("value", help=VALUE_HELP), "size": TEXT("size", width=75),
                                "layer": TEXT("layer", width=110),
                                "instruction": TEXT("instruction", width=150,
                                                    help="the HLO instruction (see Inspect)"),
                                "op_name": TEXT("op_name", width=175, help="JAX's name of the operation")})

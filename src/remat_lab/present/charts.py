"""Plotly figures for the app: DataFrame in, ``go.Figure`` out.

No Streamlit and no JAX here. Every builder accepts an empty frame (it returns a figure with a
"no data" note). ``POLICY_COLORS`` gives every policy one colour used on every chart.

The builders live by subject: ``run_charts`` (one run, a comparison, the roofline),
``timeline_charts`` (memory over the program), ``study_charts`` (sweeps, the heatmap, the advisor);
``palette`` holds the colours and the common frame. This module names them all.
"""

from remat_lab.present.figure_text import plain_inputs
from remat_lab.present.kind_charts import make_memory_by_kind_figure
from remat_lab.present.palette import (
    KIND_COLORS,
    MEMORY_COLORS,
    MIB,
    PAGE_LAYOUT,
    PHASE_COLORS,
    POLICY_COLORS,
    policy_color,
)
from remat_lab.present.run_charts import (
    make_memory_figure,
    make_pareto_figure,
    make_residuals_figure,
    make_roofline_figure,
    make_step_time_figure,
    make_time_bars_figure,
)
from remat_lab.present.study_charts import (
    make_advice_peak_figure,
    make_advice_throughput_figure,
    make_relative_heatmap_figure,
    make_sweep_figure,
)
from remat_lab.present.synth_charts import make_synthesis_figure
from remat_lab.present.target_charts import make_targets_peak_figure
from remat_lab.present.timeline_charts import make_timeline_figure, make_timeline_overlay_figure

# One escaping path: every builder named here gets its text inputs made plain (figure_text).
for _name in [n for n in dir() if n.startswith("make_")]:
    globals()[_name] = plain_inputs(globals()[_name])

__all__ = [
    "KIND_COLORS", "MEMORY_COLORS", "MIB", "PAGE_LAYOUT", "PHASE_COLORS", "POLICY_COLORS", "policy_color",
    "make_advice_peak_figure", "make_advice_throughput_figure", "make_memory_figure",
    "make_pareto_figure", "make_relative_heatmap_figure", "make_residuals_figure",
    "make_roofline_figure", "make_step_time_figure", "make_sweep_figure", "make_time_bars_figure",
    "make_timeline_figure", "make_timeline_overlay_figure", "make_memory_by_kind_figure",
    "make_targets_peak_figure", "make_synthesis_figure",
]

"""The charts' shared look: one colour per policy (and per memory part, residual kind, phase) and the frame.

No Streamlit and no JAX here. ``POLICY_COLORS`` gives every policy one colour used on every chart;
``figure`` is every chart's empty frame in the page layout, ``empty`` its "no data" note.
"""

from __future__ import annotations

import plotly.graph_objects as go

POLICY_COLORS = {
    "no_remat": "#4C566A",
    "nnx_remat_default": "#E69F00",
    "nothing_saveable": "#D55E00",
    "everything_saveable": "#56B4E9",
    "dots_saveable": "#009E73",
    "dots_with_no_batch_dims_saveable": "#0072B2",
    "offload_dot_with_no_batch_dims": "#CC79A7",
    # MaxText's recipes and custom: Plotly's Dark24 and Alphabet hues, distinct from the above.
    "full": "#2E91E5",
    "minimal": "#1CA71C",
    "minimal_with_context": "#FB0D0D",
    "save_dot_with_context_except_mlp": "#DA16FF",
    "save_dot_except_mlpwi": "#222A2A",
    "save_dot_except_mlp": "#B68100",
    "save_qkv_proj": "#750D86",
    "save_out_proj": "#EB663B",
    "qkv_proj_offloaded": "#511CFB",
    "minimal_offloaded": "#00A08B",
    "custom": "#FC0080",
}
MEMORY_COLORS = {"argument": "#0072B2", "output": "#56B4E9", "temp": "#E69F00",
                 "alias": "#999999", "generated_code": "#009E73"}
KIND_COLORS = {"argument": "#8FA9C7", "dot_general": "#0072B2", "layer input": "#E69F00",
               "literal": "#BBBBBB"}
_FALLBACK = ["#F0E442", "#7F3C8D", "#11A579", "#3969AC", "#F2B701", "#E73F74"]
# Residual kinds without a colour of their own take these, one each in order of first use.
_KIND_FALLBACK = ["#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#7F3C8D", "#11A579", "#F2B701", "#E73F74"]
PAGE_LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50),
                   legend=dict(orientation="v", yanchor="top", y=1, x=1.02, font=dict(size=11)),
                   title=dict(font=dict(size=15)), height=400)
# One grey only: "other" (no source in the program's metadata); the parameters are blue-violet.
PHASE_COLORS = {"parameter": "#7F7FD5", "output": "#56B4E9", "forward": "#0072B2",
                "recomputed": "#D55E00", "backward": "#009E73", "other": "#BBBBBB"}
MIB = float(1 << 20)


def policy_color(policy: str) -> str:
    """The colour of ``policy`` (a stable fallback for unknown ids)."""
    return POLICY_COLORS.get(policy) or _FALLBACK[sum(map(ord, str(policy))) % len(_FALLBACK)]


def kind_colors(kinds) -> dict[str, str]:
    """A colour for each residual kind in ``kinds``: its own where it has one, else a distinct one
    from a fallback list (two kinds never share a grey)."""
    out, spare = {}, [c for c in _KIND_FALLBACK if c not in KIND_COLORS.values()]
    for kind in kinds:
        if kind in out:
            continue
        out[kind] = KIND_COLORS.get(kind) or (spare.pop(0) if spare else _FALLBACK[len(out) % len(_FALLBACK)])
    return out


def figure(title: str, x_title: str, y_title: str) -> go.Figure:
    """An empty figure in the page layout, titled, its axes named."""
    fig = go.Figure()
    fig.update_layout(**PAGE_LAYOUT)
    fig.update_layout(title_text=title)
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title)
    return fig


def empty(fig: go.Figure) -> go.Figure:
    """``fig`` with a "no data yet" note (every builder returns this for an empty frame)."""
    fig.add_annotation(text="no data yet", showarrow=False, xref="paper", yref="paper",
                       x=0.5, y=0.5, font=dict(size=16, color="#888"))
    return fig

"""Result dicts (``run_experiment`` documents) -> pandas DataFrames for the app's tables and charts.

pandas only: no Streamlit, no JAX. Every builder accepts partial or empty input and returns a frame
with its documented columns (possibly with no rows).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from remat_lab.present.dot_tables import GROUP_ABOVE, block_of

MIB = float(1 << 20)
MEMORY_PARTS = ("argument", "output", "temp", "alias", "generated_code")

DOT_COLUMNS = ["index", "layer", "layers", "lhs_shape", "rhs_shape", "out_shape", "has_batch_dims",
               "policy_verdict", "saved", "offloaded", "offloaded_in_compiled", "recomputed",
               "recomputed_in_compiled", "flops", "out_bytes", "note"]
RESIDUAL_COLUMNS = ["index", "shape", "dtype", "bytes", "layers", "role", "memory_kind",
                    "memory_kind_in_compiled", "kind", "layer", "source"]
SUMMARY_COLUMNS = ["policy", "model", "width", "batch", "seq", "depth", "dtype", "objective",
                   "median_ms", "p25_ms", "p75_ms", "ci_low_ms", "ci_high_ms",
                   "peak_mib", "temp_mib", "residual_mib",
                   "peak_bytes", "temp_bytes", "residual_bytes",
                   "compiled_recomputed_products", "compiled_recomputed_gflop",
                   "dots_saved", "dots_recomputed", "recompute_flops", "recompute_gflop",
                   "grad_ok", "compile_s"]


def _shape(value) -> str:
    return "(" + ", ".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")" \
        if isinstance(value, (list, tuple)) else str(value)


def dots_frame(result: dict | None) -> pd.DataFrame:
    """One row per forward dot_general: shapes as text, verdict and booleans, the note."""
    rows = (result or {}).get("dots") or []
    df = pd.DataFrame(rows, columns=DOT_COLUMNS)
    for col in ("lhs_shape", "rhs_shape", "out_shape"):
        df[col] = df[col].map(_shape)
    return df


def residuals_frame(result: dict | None) -> pd.DataFrame:
    """One row per residual the backward pass keeps (arguments included)."""
    rows = (result or {}).get("residuals") or []
    df = pd.DataFrame(rows, columns=RESIDUAL_COLUMNS)
    df["shape"] = df["shape"].map(_shape)
    return df


def residual_layer_kind_frame(result: dict | None, limit: int = GROUP_ABOVE) -> pd.DataFrame:
    """Residual bytes summed by (layer, kind): columns layer, kind, bytes, mib. Over ``limit``
    layers (an llm's blocks in a loop), by layer without its block prefix (``3.q_proj`` -> ``q_proj``)."""
    df = residuals_frame(result)
    if df.empty:
        return pd.DataFrame(columns=["layer", "kind", "bytes", "mib"])
    if df["layer"].nunique() > limit:
        df = df.assign(layer=[block_of(v)[0] for v in df["layer"]])
    out = df.groupby(["layer", "kind"], sort=False, as_index=False)["bytes"].sum()
    out["mib"] = out["bytes"] / MIB
    return out


def samples_frame(result: dict | None) -> pd.DataFrame:
    """The timed runs of one result: columns policy, run, ms."""
    st = (result or {}).get("step_time_s") or {}
    samples = st.get("samples") or []
    policy = ((result or {}).get("config") or {}).get("policy", "")
    return pd.DataFrame({"policy": [policy] * len(samples), "run": list(range(1, len(samples) + 1)),
                         "ms": [s * 1e3 for s in samples]}, columns=["policy", "run", "ms"])


def memory_frame(results: list[dict]) -> pd.DataFrame:
    """One row per result: policy, each memory part in MiB, peak_mib and the raw bytes."""
    rows = []
    for r in results:
        mem = r.get("memory")
        if not mem:
            continue
        row = {"policy": r["config"]["policy"]}
        for part in MEMORY_PARTS:
            row[part] = mem.get(f"{part}_bytes", 0) / MIB
        row["peak_mib"] = mem["peak_bytes"] / MIB
        row["peak_bytes"] = mem["peak_bytes"]
        rows.append(row)
    return pd.DataFrame(rows, columns=["policy", *MEMORY_PARTS, "peak_mib", "peak_bytes"])


def summary_row(result: dict) -> dict:
    """The numbers of one result that the comparison and the sweep tables show."""
    c = result["config"]
    st = result.get("step_time_s") or {}
    mem = result.get("memory") or {}
    tot = result.get("totals") or {}
    hlo = result.get("hlo") or {}
    ms = lambda key: st[key] * 1e3 if st.get(key) is not None else None  # noqa: E731
    giga = lambda value: value / 1e9 if value is not None else None  # noqa: E731
    return {
        "policy": c["policy"], "model": c["model"], "width": c["width"], "batch": c["batch"],
        "seq": c["seq"], "depth": c["depth"], "dtype": c["dtype"], "objective": c["objective"],
        "median_ms": ms("median"), "p25_ms": ms("p25"), "p75_ms": ms("p75"),
        # The 95 % interval of the median (sweeps timed interleaved); None in older files.
        "ci_low_ms": ms("ci_low"), "ci_high_ms": ms("ci_high"),
        "peak_mib": mem["peak_bytes"] / MIB if mem else None,
        "temp_mib": mem["temp_bytes"] / MIB if mem else None,
        "residual_mib": tot.get("residual_bytes", 0) / MIB,
        "peak_bytes": mem.get("peak_bytes"), "temp_bytes": mem.get("temp_bytes"),
        "residual_bytes": tot.get("residual_bytes"),
        # What the compiled program really recomputes: its products and flops beyond the no_remat
        # compile of the same configuration (None until the engine compares the two).
        "compiled_recomputed_products": hlo.get("excess_dots_vs_no_remat"),
        "compiled_recomputed_gflop": giga(hlo.get("excess_flops_vs_no_remat")),
        # What the backward jaxpr recomputes, before XLA's optimisations.
        "dots_saved": tot.get("dots_saved"), "dots_recomputed": tot.get("dots_recomputed"),
        "recompute_flops": tot.get("recompute_flops"),
        "recompute_gflop": giga(tot.get("recompute_flops")),
        "grad_ok": (result.get("gradient_check") or {}).get("ok"),
        "compile_s": (result.get("compile") or {}).get("compile_s"),
    }


def summary_frame(results: list[dict]) -> pd.DataFrame:
    """One row per result (see ``summary_row``)."""
    return pd.DataFrame([summary_row(r) for r in results], columns=SUMMARY_COLUMNS)


SPREADS = {"median_ms": ("p25_ms", "p75_ms")}  # metric -> the columns of its timing spread
INTERVALS = {"median_ms": ("ci_low_ms", "ci_high_ms")}  # metric -> its 95 % interval, where timed so


def relative_frame(df: pd.DataFrame, metric: str, baseline: str = "no_remat",
                   spread: tuple[str, str] | None = None) -> pd.DataFrame:
    """``metric`` of each row divided by the baseline policy's at the same width and batch.

    Columns: policy, width, batch, config ("w256 b64"), ratio, within_noise. ``within_noise`` says
    whether the difference to the baseline is no larger than the measurement noise: for a timed
    metric, the row's 95 % interval of the median overlaps the baseline's (``INTERVALS``, where both
    rows have one: sweeps timed interleaved), else their ``spread`` (p25 and p75 columns, by default
    from ``SPREADS``: files from before the intervals) overlap; for a deterministic one (memory) the
    values are equal. Empty without baseline rows.
    """
    cols = ["policy", "width", "batch", "config", "ratio", "within_noise"]
    if df.empty or metric not in df or "policy" not in df:
        return pd.DataFrame(columns=cols)
    if spread is None and all(c in df for c in SPREADS.get(metric, ("", ""))):
        spread = SPREADS[metric]
    lo, hi = spread if spread else (metric, metric)
    ci_lo, ci_hi = INTERVALS.get(metric, (lo, hi)) if spread else (lo, hi)
    if ci_lo not in df or ci_hi not in df:
        ci_lo, ci_hi = lo, hi
    base = df[df["policy"] == baseline].groupby(["width", "batch"])[
        list(dict.fromkeys([metric, lo, hi, ci_lo, ci_hi]))].mean()
    if base.empty:
        return pd.DataFrame(columns=cols)
    out = df[["policy", "width", "batch"]].copy()
    keys = list(zip(out["width"], out["batch"]))
    ratios, noise = [], []
    for value, low, high, c_low, c_high, key in zip(df[metric], df[lo], df[hi], df[ci_lo], df[ci_hi],
                                                    keys):
        ref = base.loc[key] if key in base.index else None
        ok = ref is not None and ref[metric] and pd.notna(value)
        ratios.append(value / ref[metric] if ok else None)
        if not ok:
            noise.append(None)
        elif pd.notna([c_low, c_high, ref[ci_lo], ref[ci_hi]]).all():  # the 95 % intervals overlap
            noise.append(bool(c_low <= ref[ci_hi] and ref[ci_lo] <= c_high))
        elif spread:  # the two p25-p75 ranges overlap (a row without an interval)
            noise.append(bool(low <= ref[hi] and ref[lo] <= high))
        else:
            noise.append(bool(value == ref[metric]))
    out["ratio"], out["within_noise"] = ratios, noise
    out = out.dropna(subset=["ratio"])
    out["ratio"] = out["ratio"].astype(float)
    out["config"] = [f"w{w} b{b}" for w, b in zip(out["width"], out["batch"])]
    out = out.groupby(["policy", "width", "batch", "config"], as_index=False, sort=False).agg(
        ratio=("ratio", "mean"), within_noise=("within_noise", "all"))
    return out[cols].sort_values(["width", "batch"], kind="stable").reset_index(drop=True)


def export_frame(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` for a CSV download: columns in MiB end in ``_MiB`` (binary units, never "MB")."""
    return df.rename(columns={c: c[: -len("_mib")] + "_MiB" for c in df.columns
                              if str(c).endswith("_mib")})


def pareto_mask(df: pd.DataFrame, x: str, y: str) -> pd.Series:
    """True for rows no other row beats on both ``x`` and ``y`` (lower is better)."""
    if df.empty:
        return pd.Series([], dtype=bool)
    xs, ys = df[x].to_numpy(), df[y].to_numpy()
    keep = []
    for i in range(len(df)):
        dominated = any((xs[j] <= xs[i] and ys[j] <= ys[i]) and (xs[j] < xs[i] or ys[j] < ys[i])
                        for j in range(len(df)))
        keep.append(not dominated)
    return pd.Series(keep, index=df.index)


def matching_lines(text: str, pattern: str, limit: int = 400) -> list[str]:
    """The lines of ``text`` that contain any of the ``|``-separated plain substrings of ``pattern``.

    Deliberately not a regular expression: a filter typed in a public app must not be able to
    make the server backtrack for minutes.
    """
    needles = [p for p in (pattern or "").split("|") if p]
    if not text or not needles:
        return []
    hits = [ln for ln in text.splitlines() if any(n in ln for n in needles)]
    return hits[:limit]


# ---------------------------------------------------------------- memory over the program
# ``result["memory_timeline"]``: live bytes over XLA's schedule (see ``remat_lab.timeline``).

PHASES = ("parameter", "output", "forward", "recomputed", "backward", "other")
MAX_POINTS = 2000  # per trace: a depth-16 timeline must stay a small figure
AT_PEAK_COLUMNS = ["bytes", "size", "phase", "layer", "name", "shape", "dtype", "kind", "instruction",
                   "op_name"]


def _timeline(result: dict | None) -> dict:
    """The result's timeline, or {} when the backend gave none (None, or ``{"source": None, ...}``)."""
    tl = (result or {}).get("memory_timeline") or {}
    return tl if tl.get("points") or tl.get("by_phase") else {}


def _size(n: float) -> str:
    """``config.human_bytes`` (imported on use: ``config`` imports the models, this module is pandas only)."""
    from remat_lab.config import human_bytes

    return human_bytes(n)


def _thin(index: pd.Index, keep: int, limit: int = MAX_POINTS) -> pd.Index:
    """At most ``limit`` evenly spread labels of ``index``, ``keep`` (the peak) among them."""
    if len(index) <= limit:
        return index
    picks = set(index[np.linspace(0, len(index) - 1, limit - 1).round().astype(int)])
    return index[index.isin(picks | {keep})]


def timeline_frame(result: dict | None) -> pd.DataFrame:
    """Live bytes by phase over the schedule, long format: columns index, phase, bytes.

    One row per (instruction index, phase) from ``memory_timeline.by_phase``, phases in the order
    of ``PHASES`` (unknown ones after; a phase that is zero throughout is left out). Every phase
    gets a value at every index of any phase (a value holds until that phase's next point), so
    the phases stack; at most ``MAX_POINTS`` indices, the largest total kept. Empty without a
    timeline.
    """
    cols = ["index", "phase", "bytes"]
    by_phase = _timeline(result).get("by_phase") or {}
    series = {p: pd.Series({int(i): float(b) for i, b in pts}) for p, pts in by_phase.items()
              if any(b for _, b in pts)}  # a phase that never holds a byte would only add a legend entry
    if not series:
        return pd.DataFrame(columns=cols)
    order = [p for p in PHASES if p in series] + [p for p in series if p not in PHASES]
    wide = pd.DataFrame(series)[order].sort_index().ffill().fillna(0.0)
    wide = wide.loc[_thin(wide.index, wide.sum(axis=1).idxmax())]
    wide.index.name = "index"
    out = wide.reset_index().melt(id_vars="index", var_name="phase", value_name="bytes")
    return out[cols].reset_index(drop=True)


def at_peak_frame(result: dict | None) -> pd.DataFrame:
    """The buffers live at the timeline's peak, largest first (see ``AT_PEAK_COLUMNS``).

    ``bytes`` stays exact; ``size`` is the same in binary units (KiB, MiB) for display.
    """
    rows = _timeline(result).get("at_peak") or []
    df = pd.DataFrame(rows, columns=[c for c in AT_PEAK_COLUMNS if c != "size"])
    df["shape"] = df["shape"].map(_shape)
    text = ["phase", "layer", "name", "dtype", "kind", "instruction", "op_name"]
    df[text] = df[text].astype(object).where(df[text].notna(), "")  # no "None" cells in the table
    df = df.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)
    df.insert(1, "size", df["bytes"].map(_size))
    return df[AT_PEAK_COLUMNS]


def at_peak_groups(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """``at_peak_frame`` rows summed by ``by`` (e.g. phase and layer): ``by``, buffers, bytes, size."""
    if df.empty:
        return pd.DataFrame(columns=[*by, "buffers", "bytes", "size"])
    out = df.fillna({c: "" for c in by}).groupby(by, as_index=False, sort=False).agg(
        buffers=("bytes", "size"), bytes=("bytes", "sum"))
    out = out.sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)
    out["size"] = out["bytes"].map(_size)
    return out


def _where(buffer: pd.Series) -> str:
    """A buffer's layer and name (distinct, "other" left out), else its producing instruction."""
    names = [str(v) for v in (buffer["layer"], buffer["name"]) if isinstance(v, str) and v and v != "other"]
    return " ".join(dict.fromkeys(names)) or str(buffer["instruction"])


def _policy(result: dict) -> str:
    return str((result.get("config") or {}).get("policy", ""))


def timeline_overlay_frame(results: list[dict]) -> pd.DataFrame:
    """Total live bytes over the program for several results: columns policy, label, fraction, live_bytes.

    ``fraction`` is index / instructions (0 to 1), so programs of different lengths line up.
    Results with identical timelines (policies that compile alike) give one entry, the first's,
    its ``label`` naming the others ("a (= b, c)"). Results without a timeline are left out.
    """
    same: dict[str, list[tuple[str, dict]]] = {}
    for r in results:
        tl = _timeline(r)
        if tl.get("points"):
            same.setdefault(repr(tl["points"]), []).append((_policy(r), tl))
    frames = []
    for group in same.values():
        (policy, tl), others = group[0], [p for p, _ in group[1:]]
        pts = tl["points"]
        n = tl.get("instructions") or max(int(i) for i, _ in pts) or 1
        frames.append(pd.DataFrame({
            "policy": policy, "label": policy + (f" (= {', '.join(others)})" if others else ""),
            "fraction": [i / n for i, _ in pts], "live_bytes": [float(b) for _, b in pts]}))
    cols = ["policy", "label", "fraction", "live_bytes"]
    return pd.concat(frames, ignore_index=True)[cols] if frames else pd.DataFrame(columns=cols)


def peak_holdings_frame(results: list[dict], top: int = 3) -> pd.DataFrame:
    """What each result holds at its timeline's peak: one row per policy.

    Columns: policy, peak_live_bytes, peak_at (fraction of the program), one ``<phase>_bytes``
    column per phase (bytes live at the peak in that phase), and ``largest`` (the ``top`` largest
    buffers as "layer name (phase) size").
    """
    cols = ["policy", "peak_live_bytes", "peak_at", *(f"{p}_bytes" for p in PHASES), "largest"]
    rows = []
    for r in results:
        tl = _timeline(r)
        if not tl:
            continue
        at = at_peak_frame(r)
        row = {"policy": _policy(r), "peak_live_bytes": tl.get("peak_live_bytes"),
               "peak_at": (tl["peak_index"] / tl["instructions"]
                           if tl.get("instructions") and tl.get("peak_index") is not None else None)}
        sums = at.groupby("phase")["bytes"].sum() if not at.empty else pd.Series(dtype=float)
        row.update({f"{p}_bytes": float(sums.get(p, 0.0)) for p in PHASES})
        row["largest"] = "; ".join(f"{_size(b['bytes'])} {b['phase']} ({_where(b)})"
                                   for _, b in at.head(top).iterrows())
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


# ---------------------------------------------------------------- the advisor: in advisor_tables

from remat_lab.present.advisor_tables import (  # noqa: E402,F401 - re-exported: tables names them
    ADVICE_COLUMNS,
    PROBE_COLUMNS,
    advice_frame,
    advice_probes_frame,
)

# ---------------------------------------------------------------- across targets (across_targets)

TARGET_COLUMNS = ["target", "policy", "peak_bytes", "peak_mib", "temp_mib", "fits", "predicted_ms",
                  "estimate_ms",
                  "excess_dots_vs_no_remat", "platform", "device_kind", "memory_bytes"]


def across_targets_frame(doc: dict | None) -> pd.DataFrame:
    """One row per (target, policy) of an across-targets document, in its order; sizes in MiB too."""
    mib = lambda v: None if v is None else v / MIB  # noqa: E731
    rows = [{**{c: r.get(c) for c in TARGET_COLUMNS}, "peak_mib": mib(r.get("peak_bytes")),
             "temp_mib": mib(r.get("temp_bytes")),
             "estimate_ms": None if r.get("estimate_s") is None else r["estimate_s"] * 1e3,
             "predicted_ms": None if r.get("predicted_s") is None else r["predicted_s"] * 1e3}
            for r in (doc or {}).get("rows", [])]
    return pd.DataFrame(rows, columns=TARGET_COLUMNS)


def memory_by_kind_frame(results: list[dict]) -> pd.DataFrame:
    """Columns run (the policy), kind, bytes: each result's ``memory.by_kind`` (its method left out)."""
    rows = [{"run": (r.get("config") or {}).get("policy", ""), "kind": k, "bytes": v}
            for r in results for k, v in ((r.get("memory") or {}).get("by_kind") or {}).items()
            if k != "method" and isinstance(v, int | float) and not isinstance(v, bool)]
    return pd.DataFrame(rows, columns=["run", "kind", "bytes"])


def other_parts_frame(result: dict) -> pd.DataFrame:
    """Columns part, bytes, share (of other): ``memory.by_kind_other``, what other holds at the peak."""
    mem = result.get("memory") or {}
    parts, other = mem.get("by_kind_other") or {}, (mem.get("by_kind") or {}).get("other") or 0
    return pd.DataFrame([{"part": k, "bytes": v, "share": v / other if other else None}
                         for k, v in parts.items()], columns=["part", "bytes", "share"])

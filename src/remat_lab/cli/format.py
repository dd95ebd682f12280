"""Text for terminals shared by the subcommands: plain tables, times, the per-dot/residual/peak tables."""

from __future__ import annotations

from remat_lab.config import human_bytes


def fmt_time(s: float | None) -> str:
    """Seconds as milliseconds (``'-'`` for none)."""
    return "-" if s is None else f"{s * 1e3:.3f} ms"


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain text table of ``rows`` (for terminals)."""
    if not rows:
        return "(none)"
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))
    return "\n".join([line(columns), line(["-" * w for w in widths]), *map(line, cells)])


DOT_COLUMNS = ["index", "layer", "layers", "lhs_shape", "rhs_shape", "out_shape", "has_batch_dims",
               "policy_verdict", "saved", "offloaded", "recomputed", "recomputed_in_compiled",
               "offloaded_in_compiled"]
RESIDUAL_COLUMNS = ["index", "shape", "dtype", "bytes", "layers", "memory_kind", "kind", "layer", "source"]


def format_tables(result: dict) -> str:
    """The per-dot and residual tables, the totals and the buffers live at the peak."""
    out = ["Per-dot table (forward pass):", format_table(result["dots"], DOT_COLUMNS)]
    notes = [f"  dot {d['index']} ({d['layer']}): {d['note']}" for d in result["dots"] if d["note"]]
    if notes:
        out += ["", "Dot notes:", *notes]
    out += ["", "Residuals (saved for the backward pass):",
            format_table(result["residuals"], RESIDUAL_COLUMNS)]
    t, h = result["totals"], result["hlo"]
    rec_c = t["dots_recomputed_in_compiled"]
    out += ["", (f"Residual bytes: {human_bytes(t['residual_bytes'])}: activations "
                 f"{human_bytes(t['activation_residual_bytes'])}, parameters "
                 f"{human_bytes(t['parameter_residual_bytes'])}, input "
                 f"{human_bytes(t['input_residual_bytes'])}, zero-cost constants "
                 f"{human_bytes(t['zero_cost_residual_bytes'])} "
                 f"(host in the jaxpr {human_bytes(t['residual_host_bytes'])}, in the compiled program "
                 f"{human_bytes(t['residual_host_bytes_in_compiled'])})"),
            (f"Dots saved {t['dots_saved']}, offloaded {t['dots_offloaded']} "
             f"({t['dots_offloaded_in_compiled']} in the compiled program), recomputed "
             f"{t['dots_recomputed']} in the jaxpr, "
             + ("not compared with no_remat" if rec_c is None else
                f"{rec_c} in the compiled program"))]
    excess = h.get("excess_dots_vs_no_remat")
    line = f"Compiled matrix products: {h['dot_count']}"
    if excess is not None:
        line += f" ({excess:+d} vs no_remat"
        if h.get("excess_flops_vs_no_remat") is not None:
            line += f", {h['excess_flops_vs_no_remat'] / 1e6:+.3g} MFLOP"
        line += ")"
    if h.get("identical_to") and h["identical_to"] != (result.get("config") or {}).get("policy"):
        line += f"; the same compiled program as {h['identical_to']}"
    out.append(line)
    out += [f"Note: {n}" for n in result["notes"]]
    out += ["", *format_peak(result.get("memory_timeline"))]
    return "\n".join(out)


PEAK_COLUMNS = ["bytes", "shape", "dtype", "kind", "phase", "layer", "name", "instruction"]


def format_peak(timeline: dict | None, top: int = 10) -> list[str]:
    """The largest buffers live at the peak of the memory timeline, as lines of text."""
    if not timeline or timeline.get("source") is None:
        reason = (timeline or {}).get("reason", "not built")
        return [f"Memory over the program: none ({reason})."]
    rows = [{**b, "bytes": human_bytes(b["bytes"]), "shape": "x".join(map(str, b["shape"] or [])) or "()"}
            for b in timeline["at_peak"][:top]]
    head = (f"Buffers live at the peak (instruction {timeline['peak_index']} of {timeline['instructions']}, "
            f"{human_bytes(timeline['peak_live_bytes'])} live; largest {len(rows)} of "
            f"{len(timeline['at_peak'])}):")
    return [head, format_table(rows, PEAK_COLUMNS), f"Note: {timeline['note']}"]

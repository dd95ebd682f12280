"""The bench's report: each figure against its target, as a table, and the document made JSON-safe."""

from __future__ import annotations

import math

import numpy as np

TARGETS = {  # key -> (comparison, bound, meaning)
    "fidelity_ratio_default": ("<=", 1.03, "engine median / bare loop median, default size"),
    "fidelity_ratio_small": ("<=", None, "engine median / bare loop median, width 64 batch 8"),
    "overhead_ratio": ("<=", 1.2, "engine per call / bare compiled call, width 64 batch 8"),
    "warm_latency_s": ("<=", 0.3, "repeat request through the app's cached path"),
    "cold_latency_s": ("", None, "first request: build, lower, compile, time, check, dissect"),
    "dissect_overhead_ratio": ("<=", 1.25, "(lower+compile+time+check+dissect+cache) / "
                               "(lower+compile+time), default size"),
    "sweep_s_per_config": ("", None, "seconds per configuration, empty compile cache"),
    "cache_speedup": (">=", 3.0, "first sweep / second sweep (persistent compile cache)"),
    "achieved_flops_fraction": ("", None, "achieved FLOP/s / calibrated peak FLOP/s, default size"),
    "timeline_overhead_ratio": ("<=", 0.15, "compile time the memory timeline adds (dump + parse) / "
                                "step compile, default size"),
    "timeline_overhead_ratio_cache_hit": ("", None, "memory timeline after a persistent-cache hit "
                                          "(an uncached copy) / step compile, default size"),
    "advise_s": ("<=", 30.0, "advice for 7 policies at the app's default model, 64 MiB, timed"),
    "advise_no_time_s": ("<=", 10.0, "the same advice, compile-only (--no-time)"),
    "advise_transformer_s": ("<=", 180.0, "advice for every policy on a transformer (width 512, seq "
                             "256, 8 heads, depth 8), 2 GiB, timed; target: compile-only time + "
                             "time budget + one step of each program timed (180 s without them)"),
    "advise_transformer_no_time_s": ("<=", 60.0, "the same advice, compile-only (--no-time)"),
    "synthesize_transformer_s": ("<=", 120.0, "synthesize, goal max-batch, the same transformer in "
                                 "2 GiB (every named policy sized too); idle 2-core machine"),
    "synthesize_llama3_8b_s": ("<=", 600.0, "synthesize llama3-8b, seq 8192, train, 8 x H100, "
                               "fsdp=8, max-batch; idle 2-core machine"),
    "probe_s": ("<=", 0.5, "one compile-only probe (abstract inputs), app's default model, median"),
}


def verdict(key: str, value, doc: dict | None = None) -> tuple[str, str]:
    op, bound, _ = TARGETS[key]
    if key == "advise_transformer_s" and doc:  # its bound is measured with it (bench_advise.timing_bound)
        timed = doc.get("details", {}).get("advise_transformer", {}).get("timed") or {}
        bound = timed.get("bound_s", bound)
    if bound is None or value is None:
        return "-", "report"
    ok = value <= bound if op == "<=" else value >= bound
    return f"{op} {bound:g}", "PASS" if ok else "MISS"


def _fmt(key: str, value) -> str:
    if value is None:
        return "n/a"
    if key.endswith("_s") or key == "sweep_s_per_config":
        return f"{value:.3f} s"
    if key == "achieved_flops_fraction":
        return f"{value:.1%}"
    return f"{value:.3f}"


def format_report(doc: dict) -> str:
    m, d = doc["machine"], doc["details"]
    rows = [("figure", "value", "target", "verdict", "meaning")]
    for key, (_, _, meaning) in TARGETS.items():
        target, ok = verdict(key, doc[key], doc)
        rows.append((key, _fmt(key, doc[key]), target, ok, meaning))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"Remat Lab bench{' (quick)' if doc['quick'] else ''} on {m['cpu_model']}, "
             f"{m['cores']} cores, {m['backend']} ({m['device_kind']}), jax {m['jax']}; "
             f"load average {m['loadavg_start']} -> {m['loadavg_end']}", ""]
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
        if i == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 7)
    fd, fs, ov, lat, sw = (d["fidelity_default"], d["fidelity_small"], d["overhead"],
                           d["latency"], d["sweep"])
    us = lambda s: f"{s * 1e6:.1f} us"  # noqa: E731
    lines += [
        "",
        f"fidelity: default engine {us(fd['engine_median_s'])} vs bare {us(fd['bare_median_s'])}; "
        f"small engine {us(fs['engine_median_s'])} vs bare {us(fs['bare_median_s'])} "
        f"({fd['rounds']} interleaved rounds)",
        "per call (width 64, batch 8): " + ", ".join(f"{k} {us(v)}"
                                                     for k, v in ov["per_call_s"].items()),
        f"latency via {lat['path']}: cold {lat['cold_s']:.3f} s = "
        + ", ".join(f"{k} {v:.3f}" for k, v in lat["cold"]["stages_s"].items())
        + f"; warm {lat['warm_s'] * 1e3:.1f} ms; policy change {lat['policy_change']['total_s']:.3f}"
        f" s (overhead ratio {lat['policy_change']['overhead_ratio']:.2f})",
        f"sweep {len(sw['widths'])}x{len(sw['batches'])}x{sw['policies']} = "
        f"{sw['first']['configs']} configs (repeats {sw['repeats']}): first "
        f"{sw['first']['total_s']:.1f} s (compile share {sw['first']['compile_share']:.0%}), "
        f"second {sw['second']['total_s']:.1f} s (compile share "
        f"{sw['second']['compile_share']:.0%})",
        _roofline_line(doc["roofline"]),
        f"memory timeline (default size): plain compile {d['timeline']['compile_s']:.3f} s; with "
        f"XLA's dump and the timeline {d['timeline']['compile_dumped_and_timeline_s']:.3f} s; after a "
        f"cache hit (uncached copy) {d['timeline']['uncached_copy_and_timeline_s']:.3f} s",
        f"advisor (7 policies, default model, 64 MiB): {d['advise']['no_time']['compiles']} "
        f"compiles; largest batches {d['advise']['timed']['max_batch']}; recommended "
        f"{d['advise']['timed']['recommended']}",
        *_transformer_line(d.get("advise_transformer")),
    ]
    return "\n".join(lines)


def _transformer_line(adv: dict | None) -> list[str]:
    """The Advisor on the transformer: policies, both times, how many were timed, the pick."""
    if not adv:
        return []
    head = (f"advisor on the transformer ({len(adv['policies'])} policies, "
            f"{adv['budget_bytes'] / 2**30:g} GiB): compile-only {adv['no_time']['s']:.1f} s")
    if "timed" not in adv:  # --quick
        return [f"{head}; not timed (--quick leaves the timed advice out)"]
    t = adv["timed"]
    terms = (f"; its target {t['bound_s']:.1f} s = compile-only {t['compile_only_s']:.1f} + time budget "
             f"{t['time_budget_s']:.1f} + one step each {t['one_step_each_s']:.2f}; the timed phase took "
             f"{t['timing_s']:.1f} s" if "bound_s" in t else "")
    return [f"{head}, timed {t['s']:.1f} s ({t['timed']} policies timed); "
            f"recommended {t['recommended']}{terms}"]


def _roofline_line(roof: dict) -> str:
    """The roofline in one line: peak (and its source), bandwidth, achieved, intensity, bound."""
    text = f"peak ({roof['peak_source'] or 'unknown'}): "
    if roof["peak_flops_per_s"]:
        text += f"{roof['peak_flops_per_s'] / 1e9:.0f} GFLOP/s"
    if roof["bandwidth_bytes_per_s"]:
        text += f", bandwidth {roof['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s"
    if roof["achieved_flops_per_s"]:
        text += f"; achieved {roof['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s"
    if roof["arithmetic_intensity"]:
        text += f" at {roof['arithmetic_intensity']:.1f} FLOP/byte ({roof['bound']}-bound)"
    if roof["stale_calibration"]:
        text += "; above the calibrated peak (stale calibration, fraction capped at 1)"
    return text + (f" [{roof['peak_note']}]" if roof.get("peak_note") else "")


def jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    return obj

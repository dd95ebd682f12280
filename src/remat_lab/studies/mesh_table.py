"""Every policy on one device mesh, compiled and not run: per-device memory and collectives by phase."""

from __future__ import annotations

from remat_lab.analysis.collectives import KINDS, PHASES, collectives, totals
from remat_lab.analysis.costs import memory_report
from remat_lab.config import RunConfig
from remat_lab.program.analysis_compile import compile_for_analysis
from remat_lab.program.step import build_problem, jit_step
from remat_lab.program.tracing import trace_and_lower
from remat_lab.studies.experiment import baseline_program


def compare_on_mesh(config: RunConfig, policies: list[str]) -> list[dict]:
    """Per policy on ``config``'s mesh, compiled, not run: the per-device peak and temp, and the
    collectives in each phase and against ``no_remat`` (the Compare page's mesh table)."""
    base = totals(collectives(baseline_program(config)["text"]))
    rows = []
    for policy in policies:
        problem = build_problem(config.replace(policy=policy))
        compiled = compile_for_analysis(trace_and_lower(jit_step(problem), *problem.args)[1])
        counts = collectives(compiled.as_text())
        mine, mem = totals(counts), memory_report(compiled) or {}
        rows.append({"policy": policy, "peak_bytes": mem.get("peak_bytes"),
                     "temp_bytes": mem.get("temp_bytes"),
                     **{f"{k}_{p}": counts[k][p]["count"] for k in KINDS for p in PHASES},
                     **{f"{k}_vs_no_remat": mine[k] - base[k] for k in KINDS}})
    return rows

"""The compare subcommand: every (or the chosen) policy timed interleaved and ranked only beyond noise."""

from __future__ import annotations

import argparse
import json

from remat_lab.cli.common import (
    Failure,
    add_config_args,
    config_from,
    engine_errors,
    policies_arg,
    record,
    rounds_arg,
)
from remat_lab.cli.format import fmt_time, format_table
from remat_lab.cli.progress import stderr_progress
from remat_lab.config import human_bytes
from remat_lab.model.models import SEQ_MODELS
from remat_lab.model.policies import POLICIES


def add_parsers(sub) -> None:
    """``compare`` under the subcommands ``sub``."""
    cmp = sub.add_parser("compare", help="every (or the chosen) policy, timed interleaved, ranked "
                                         "only beyond noise")
    add_config_args(cmp)
    cmp.add_argument("--policies", type=policies_arg, default=list(POLICIES),
                     help="comma-separated policy ids (default: all); --policy is ignored")
    cmp.add_argument("--rounds", type=rounds_arg, default=None,
                     help="interleaved timing rounds (1..1000; default: --repeats)")


def main(args: argparse.Namespace) -> int:
    """Compare the policies on the configuration ``args`` describe; print the ranking."""
    from remat_lab.program.backend import enable_compilation_cache
    from remat_lab.studies.compare import compare_policies

    if getattr(args, "code", False):  # the snippet is one policy's: ask run or explain for it
        raise Failure("--code prints one policy's code: use it with run or explain.")
    with engine_errors():
        config = config_from(args)
        if not args.no_cache:
            enable_compilation_cache()
        with stderr_progress() as say:  # a bar on a terminal, else one line per step
            result = compare_policies(config, args.policies, rounds=args.rounds,
                                      budget=args.memory_budget, progress=say)
    record(result, "compare")
    print(json.dumps(result, indent=2) if args.json else format_compare(result))
    return 0


COMPARE_COLUMNS = ["policy", "median", "95% interval", "peak", "same program as", "fastest", "pareto",
                   "excess dots", "excess flops", "jaxpr recomputed", "grad"]


def format_compare(result: dict) -> str:
    """``compare``'s result as text: one row per policy, then the verdicts."""
    c, m = result["config"], result["method"]
    rows = [{"policy": r["policy"], "median": fmt_time(r["median_s"]),
             "95% interval": f"{fmt_time(r['ci_low_s'])} .. {fmt_time(r['ci_high_s'])}",
             "peak": "-" if r["peak_bytes"] is None else human_bytes(r["peak_bytes"]),
             "same program as": r["same_program_as"] or "-",
             "fastest": "yes" if r["fastest"] else "", "pareto": "yes" if r["pareto"] else "",
             "excess dots": "-" if r["excess_dots_vs_no_remat"] is None else r["excess_dots_vs_no_remat"],
             "excess flops": ("-" if r["excess_flops_vs_no_remat"] is None
                              else f"{r['excess_flops_vs_no_remat']:.4g}"),
             "jaxpr recomputed": "-" if r["dots_recomputed"] is None else r["dots_recomputed"],
             "grad": {True: "ok", False: "MISMATCH"}.get(r["grad_ok"], "-")}
            for r in result["rows"]]
    head = (f"{c['model']} width={c['width']} batch={c['batch']} depth={c['depth']} {c['dtype']} "
            f"objective={c['objective']}" + (f" seq={c['seq']}" if c["model"] in SEQ_MODELS else ""))
    lines = [head, f"timing: {m['rounds']} interleaved rounds x {m['calls_per_round']} calls per "
                   f"policy, order {m['order']}; interval: {m['interval']}", "",
             format_table(rows, COMPARE_COLUMNS), "",
             "excess dots/flops: in the compiled program, vs no_remat; jaxpr recomputed: dots the "
             "policy recomputes before XLA optimises", "", result["fastest_reason"],
             result.get("pareto_reason")
             or "Pareto front (time interval and peak memory): " + (", ".join(result["pareto"]) or "-")]
    lines += [f"failed: {f['policy']}: {f['error']}" for f in result.get("failed", [])]
    return "\n".join(lines)

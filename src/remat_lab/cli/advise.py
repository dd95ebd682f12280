"""The advise subcommand: per policy the largest batch that fits a memory budget, and the fastest."""

from __future__ import annotations

import argparse
import json
import sys

from remat_lab.cli.common import (
    add_llm_args,
    add_model_args,
    config_from,
    engine_errors,
    int_arg,
    policies_arg,
)
from remat_lab.cli.format import fmt_time, format_table
from remat_lab.config import LIMITS, TARGET_NAMES, human_bytes
from remat_lab.model.models import SEQ_MODELS


def add_parsers(sub) -> None:
    """``advise`` under the subcommands ``sub``."""
    adv = sub.add_parser("advise", help="per policy, the largest batch whose compiled peak fits a "
                                        "memory budget, and the fastest policy at its largest batch")
    add_model_args(adv)
    add_llm_args(adv)
    adv.add_argument("--target", choices=TARGET_NAMES, default="local", metavar="TARGET",
                     help="size for this accelerator without it (see `targets`); no timing there")
    adv.add_argument("--target-devices", type=int_arg("target_devices"), default=1, metavar="N",
                     help="devices of the target (with a --mesh over all of them)")
    adv.add_argument("--mesh", default="", metavar="data=D,fsdp=F,tensor=T",
                     help="on a target: the mesh over its devices (the batch searched is the global one)")
    adv.add_argument("--budget", default=None, metavar="SIZE",
                     help="device memory to fit, e.g. 256M or 16G (default: the device's memory "
                          "limit, or the run budget on CPU: half the machine's or container's "
                          "memory, or $REMAT_LAB_MEMORY_BUDGET)")
    adv.add_argument("--policies", type=policies_arg, default=None,
                     help="comma-separated policy ids (default: JAX's named policies)")
    adv.add_argument("--no-time", action="store_true",
                     help="size batches only (compiles, nothing runs); no step times or MFU")
    adv.add_argument("--max-batch", type=int_arg("batch"), default=LIMITS["batch"][1],
                     help=f"search batches up to this (1..{LIMITS['batch'][1]})")
    adv.add_argument("--memory-budget", default=None,
                     help="what this machine may allocate for the timed runs (as for run); a "
                          "policy whose largest batch is estimated above it is sized, not timed")
    adv.add_argument("--json", action="store_true", help="print one JSON document")
    adv.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")


def main(args: argparse.Namespace) -> int:
    """Advise on the model ``args`` describe; print the table and the recommendation."""
    from remat_lab.program.backend import enable_compilation_cache
    from remat_lab.studies.advisor import advise

    with engine_errors():
        args.batch, args.warmup = 1, 0  # the advisor searches the batch; nothing warms up
        args.policy = "custom" if args.save_names or args.offload_names else "no_remat"
        config = config_from(args)
        if not args.no_cache:
            enable_compilation_cache()
        doc = advise(config, args.budget, policies=args.policies, timing=not args.no_time,
                     max_batch=args.max_batch, server_budget=args.memory_budget,
                     progress=(lambda m: print(m, file=sys.stderr, flush=True))
                     if sys.stderr.isatty() and not args.json else None)
    print(json.dumps(doc, indent=2) if args.json else format_advice(doc))
    return 0


ADVISE_COLUMNS = ["policy", "max batch", "peak", "next batch (over by)", "probes", "step time",
                  "examples/s", "MFU", "HFU", "note"]


def _over(peak: int, doc: dict) -> str:
    """How far a peak is over the budget: ``'+24.0 KiB'``."""
    return "+" + human_bytes(peak - doc["budget_bytes"])


def format_advice(doc: dict) -> str:
    """``advise``'s document as text: one row per policy, then the recommendation."""
    c = doc["config"]
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"
    rows = [{"policy": r["policy"], "max batch": r["max_batch"],
             "peak": "-" if r["peak_bytes"] is None else human_bytes(r["peak_bytes"]),
             "next batch (over by)": ("-" if r["next_batch"] is None else
                                      f"{r['next_batch']} ({_over(r['next_peak_bytes'], doc)})"),
             "probes": len(r["probes"]),
             "step time": (fmt_time(r["step_time_s"]) if r["step_time_s"] is not None
                           else f"~{fmt_time(r['estimate_s'])} (est.)" if r.get("estimate_s") else "-"),
             "examples/s": (f"{r['examples_per_s']:,.0f}" if r["examples_per_s"] is not None
                            else f"~{r['examples_per_s_estimate']:,.0f} (est.)"
                            if r.get("examples_per_s_estimate") else "-"),
             "MFU": pct(r["mfu"]), "HFU": pct(r["hfu"]),
             "note": (f"same program as {r['same_program_as']}" if r.get("same_program_as")
                      else r["not_timed"] or ("" if r["max_batch"] else r["reason"]))}
            for r in doc["rows"]]
    head = (f"{c['model']} width={c['width']} depth={c['depth']} stack={c['stack']} {c['dtype']} "
            f"objective={c['objective']}" + (f" seq={c['seq']}" if c["model"] in SEQ_MODELS else "")
            + f"; budget {human_bytes(doc['budget_bytes'])} ({doc['budget_source']})")
    if doc.get("target"):
        head += f"\ncompiled for {doc['target']['name']} ({doc['target']['device_kind']}), not run"
    lines = [head, f"searched in {doc['search_s']:.1f} s by compiling only (XLA's compiled peak on "
                   "abstract inputs); " + ("timed at each policy's largest batch, interleaved"
                                           if doc["timed"] else "not timed"), "",
             format_table(rows, ADVISE_COLUMNS), ""]
    if doc["timed"] and doc.get("peak_flops_per_s"):
        lines.append(f"MFU / HFU: model (no_remat) / hardware flops per second over the peak of "
                     f"{doc['peak_flops_per_s'] / 1e9:.0f} GFLOP/s ({doc['peak_source']})")
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    lines.append(("Recommended: " if doc["recommended"] else "") + doc["reason"] + ".")
    return "\n".join(lines)

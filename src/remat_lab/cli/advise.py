"""The advise subcommand: per policy the largest batch that fits a memory budget, and the fastest."""

from __future__ import annotations

import argparse
import json
import sys
import time

from remat_lab.cli.common import (
    add_llm_args,
    add_model_args,
    add_target_args,
    config_from,
    engine_errors,
    int_arg,
    policies_arg,
)
from remat_lab.cli.format import format_table
from remat_lab.cli.progress import stderr_progress
from remat_lab.config import LIMITS, batch_rows, human_bytes, mesh_devices, parse_mesh
from remat_lab.model.models import SEQ_MODELS
from remat_lab.studies.advisor.decision import STOPPED, precision_sentence, sig

TIME_BUDGET_S = 60.0  # the CLI's default --time-budget
MAX_TIME_BUDGET_S = 24 * 3600.0


def _seconds(text: str) -> float:
    """``--time-budget``: a number of seconds from 1 to a day."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 1 <= value <= MAX_TIME_BUDGET_S:
        raise argparse.ArgumentTypeError(f"--time-budget must be a number of seconds from 1 to "
                                         f"{MAX_TIME_BUDGET_S:.0f}; got {text[:40]!r}")
    return value


def add_parsers(sub) -> None:
    """``advise`` under the subcommands ``sub``."""
    adv = sub.add_parser("advise", help="per policy, the largest batch whose compiled peak fits a "
                                        "memory budget, and the fastest policy at its largest batch")
    add_model_args(adv)
    add_llm_args(adv)
    add_target_args(adv, "size for this accelerator without it (see `targets`); no timing there",
                    "the mesh over the target's (or the local) devices: the batch is searched per device")
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
    adv.add_argument("--time-budget", type=_seconds, default=TIME_BUDGET_S, metavar="SECONDS",
                     help=f"seconds for timing (compiles for timing included; default "
                          f"{TIME_BUDGET_S:.0f}): rounds stop earlier once the best policy's "
                          "interval separates from the runner-up's")
    adv.add_argument("--json", action="store_true", help="print one JSON document")
    adv.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")


def main(args: argparse.Namespace) -> int:
    """Advise on the model ``args`` describe; print the table and the recommendation."""
    from remat_lab.program.backend import enable_compilation_cache
    from remat_lab.studies.advisor import advise

    with engine_errors():
        # The advisor searches the batch (one example per device and microbatch to start).
        sizes = parse_mesh(args.mesh)
        args.batch = batch_rows(sizes) * args.microbatches
        args.warmup = 0  # nothing warms up
        args.policy = "custom" if args.save_names or args.offload_names else "no_remat"
        config = config_from(args)
        if not args.no_cache:
            enable_compilation_cache()
        # Progress on stderr (stdout stays the answer): a bar on a terminal, else one plain line
        # per step with the time since the start, the policies sized of planned and the time left.
        with stderr_progress() as say:
            doc = advise(config, args.budget, policies=args.policies, timing=not args.no_time,
                         max_batch=args.max_batch, server_budget=args.memory_budget,
                         time_budget_s=args.time_budget, progress=say)
    print(json.dumps(doc, indent=2) if args.json else format_advice(doc))
    return 0


def progress_lines():
    """Each step as one plain line on stderr, with the time since it started, on a terminal, a
    file or a pipe alike (``cli/progress.stderr_progress`` also draws a bar on a terminal)."""
    t0 = time.perf_counter()
    return lambda message: print(f"[{time.perf_counter() - t0:7.1f} s] {message}", file=sys.stderr,
                                 flush=True)


def format_advice(doc: dict) -> str:
    """``advise``'s document as text: the decision first, then one row per policy and the notes."""
    c = doc["config"]
    head = (f"{c['model']} width={c['width']} depth={c['depth']} stack={c['stack']} {c['dtype']} "
            f"objective={c['objective']}" + (f" seq={c['seq']}" if c["model"] in SEQ_MODELS else "")
            + f"; budget {human_bytes(doc['budget_bytes'])} ({doc['budget_source']})")
    if c.get("mesh"):  # the batch is searched per device: each row says it per device and globally
        head += f"; mesh {c['mesh']}, batches per device ({mesh_devices(c['mesh'])} devices) and global"
    if doc.get("precision"):
        head += f"\n{precision_sentence(doc['precision'])}"
    if doc.get("target"):
        head += f"\ncompiled for {doc['target']['name']} ({doc['target']['device_kind']}), not run"
    timing = "not timed"
    if doc["timed"]:
        timing = (f"timed at each policy's largest batch, interleaved: {doc.get('rounds')} rounds, "
                  f"stopped because {STOPPED.get(doc.get('stopped_because'), doc.get('stopped_because'))}"
                  f" (time budget {doc.get('time_budget_s'):.0f} s)")
    from remat_lab.present.advisor_tables import advice_display_frame, decision_lines  # pandas: on use

    table = advice_display_frame(doc).fillna("")
    rows = table.to_dict("records")
    searched = (f"searched in {doc['search_s']:.1f} s by compiling only (XLA's compiled peak on "
                f"abstract inputs); {timing}")
    if (doc.get("static") or {}).get("fits") is False:  # the parameters alone are over the budget
        searched = "answered from the configuration alone: nothing compiled, nothing searched"
    lines = [*decision_lines(doc), "", head, searched, "", format_table(rows, list(table.columns)), ""]
    if doc["timed"] and doc.get("peak_flops_per_s"):
        lines.append(f"MFU / HFU: model (the llm: MaxText's count, attention causal; other models: "
                     f"no_remat's program) / hardware flops per second over the "
                     f"{sig(doc['peak_flops_per_s'] / 1e9)} GFLOP/s peak: {doc['peak_source']}")
    said = set((doc.get("decision") or {}).get("cannot_show") or [])  # each sentence once
    lines += [f"note: {n}" for n in doc.get("notes", []) if n not in said]
    lines.append(("Recommended: " if doc["recommended"] else "") + doc["reason"] + ".")
    return "\n".join(lines)

"""The synthesize subcommand: the per-name save / offload / recompute plan that fits a budget, compiled."""

from __future__ import annotations

import argparse
import json

from remat_lab.cli.advise import progress_lines
from remat_lab.cli.common import (
    add_llm_args,
    add_model_args,
    add_target_args,
    config_from,
    engine_errors,
    int_arg,
    policies_arg,
)
from remat_lab.config import LIMITS, batch_rows, human_bytes, human_flops, parse_mesh

GOALS = ("max-batch", "min-recompute")


def add_parsers(sub) -> None:
    """``synthesize`` under the subcommands ``sub``."""
    syn = sub.add_parser("synthesize", help="the per-name save / offload / recompute plan (and remat'd "
                                            "layer count) that fits a budget with the least "
                                            "recomputation, every answer compiled")
    add_model_args(syn)
    add_llm_args(syn)
    add_target_args(syn, "compile for this accelerator without it (see `targets`)",
                    "the mesh over the target's devices: batches are per device")
    syn.add_argument("--budget", default=None, metavar="SIZE",
                     help="device memory to fit, e.g. 256M or 16G (default: as advise's)")
    syn.add_argument("--goal", choices=GOALS, default="max-batch",
                     help="max-batch: the largest batch, then the fewest recomputed flops; "
                          "min-recompute: the fewest recomputed flops at --batch")
    syn.add_argument("--batch", type=int_arg("batch"), default=None,
                     help="--goal min-recompute: the global batch (a multiple of data x fsdp x "
                          "microbatches)")
    syn.add_argument("--policies", type=policies_arg, default=None,
                     help="the named policies to beat (default: JAX's, and MaxText's recipes for "
                          "the transformer and the llm)")
    syn.add_argument("--max-batch", type=int_arg("batch"), default=LIMITS["batch"][1],
                     help=f"search batches up to this (1..{LIMITS['batch'][1]})")
    syn.add_argument("--json", action="store_true", help="print one JSON document")
    syn.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")


def main(args: argparse.Namespace) -> int:
    """Synthesize the plan for the model ``args`` describe; print it (or the JSON)."""
    from remat_lab.program.backend import enable_compilation_cache
    from remat_lab.studies.synthesize import synthesize

    with engine_errors():
        goal_batch = args.batch
        sizes = parse_mesh(args.mesh)
        args.batch = goal_batch or batch_rows(sizes) * args.microbatches
        args.warmup = 0
        args.policy = "no_remat"
        if args.save_names or args.offload_names:
            from remat_lab.config import ConfigError

            raise ConfigError("synthesize chooses the names itself: leave out --save-names and "
                              "--offload-names.")
        config = config_from(args)
        if not args.no_cache:
            enable_compilation_cache()
        doc = synthesize(config, args.budget, goal=args.goal, batch=goal_batch,
                         max_batch=args.max_batch, policies=args.policies, progress=progress_lines())
    print(json.dumps(doc, indent=2) if args.json else format_synthesis(doc))
    return 0


def _flops(value) -> str:
    return "-" if value is None else human_flops(value)  # 3.441 MFLOP, not 0.003441 GFLOP


def format_synthesis(doc: dict) -> str:
    """The synthesis as text: the answer, the plan as code, every candidate compiled, the method."""
    plan = doc.get("plan")
    lines = [f"goal {doc['goal']}; budget {human_bytes(doc['budget_bytes'])} per device "
             f"({doc['budget_source']})"]
    if doc.get("answer") is None:
        lines.append("Nothing fits: " + "; ".join(doc["notes"][1:] or ["no plan fits batch 1"]) + ".")
    else:
        who = "the synthesized plan" if doc["answer"] == "plan" else f"named policy {doc['answer']}"
        vs = ("(vs no_remat)" if doc['recomputed_flops'] is not None else
              "(no_remat has no flop count at this batch: over the HBM"
              + ("; see the best named below)" if (doc.get("best_named") or {}).get("at_named_batch")
                 else ")"))
        lines.append(f"Answer: {who}: batch {doc['max_batch']} ({doc['per_device_batch']} per device), "
                     f"compiled peak {human_bytes(doc['peak_bytes'])}, recomputes "
                     f"{_flops(doc['recomputed_flops'])} {vs}; {_flops(doc.get('flops'))} per step")
    best = doc.get("best_named")
    if best:
        share = best.get("recompute_saved_share")
        lines.append(f"Best named: {best['policy']} at batch {best['max_batch']}, recomputes "
                     f"{_flops(best['recomputed_flops'])}"
                     + (f"; the plan recomputes {share:.1%} less" if share is not None else ""))
        at = best.get("at_named_batch")
        if at:
            base = ("recomputed flops vs no_remat" if at["baseline"] == "no_remat" else
                    "each program's own flops: no_remat has no flop count there")
            lines.append(f"At {best['policy']}'s batch {at['max_batch']}: the best plan compiled there "
                         f"has {_flops(at['fewer_flops'])} fewer flops per step ({base})")
    if plan:
        lines += ["", f"Plan: save {plan['save'] or '-'}; offload {plan['offload'] or '-'}; recompute "
                      f"{plan['recompute'] or '-'}; {plan['remat_layers']} layers remat'd",
                  f"flags: {doc['custom']}", "", doc["code"], "", "MaxText:", doc["maxtext_yaml"]]
    elif doc.get("run_command"):  # the answer is a named policy: its own texts
        lines += ["", f"Named policy {doc['answer']}: flags {doc['custom']}", "", doc["code"]]
        if doc.get("maxtext_yaml"):
            lines += ["", "MaxText:", doc["maxtext_yaml"]]
    lines += ["", "candidates compiled (predicted vs compiled peak at the batch):"]
    for c in doc["candidates"]:
        p = c["plan"]
        lines.append(f"  {c.get('source', 'solve')}: save={','.join(p['save']) or '-'} "
                     f"offload={','.join(p['offload']) or '-'} "
                     f"layers={p['remat_layers']}: batch {c['max_batch']}, peak "
                     f"{human_bytes(c['peak_bytes'])} (model {human_bytes(c['predicted_peak_bytes'])},"
                     f" error {c['error_share']:+.1%}), recomputes {_flops(c['recomputed_flops'])}")
    forced = doc.get("xla_forced_compiles") or 0
    lines.append(f"{doc['compiles']} compiles" + (f" ({forced} forced by XLA's own pass)" if forced else "")
                 + f" (limit 3k+12 = {doc['compile_limit']}"
                 + ("" if doc.get("within_limit", True) else ", passed") + "), "
                 f"{doc['named_compiles']} for the named policies; {doc['wall_s']:.1f} s")
    lines += [f"note: {n}" for n in doc["notes"]]
    return "\n".join(lines)

"""``published``: MaxText's published runs; ``--check NAME`` compiles one and holds it to the record."""

from __future__ import annotations

import argparse
import json

from remat_lab.cli.common import engine_errors
from remat_lab.cli.format import format_table
from remat_lab.config import human_bytes, mfu_text
from remat_lab.config import published as pub


def add_parsers(sub) -> None:
    p = sub.add_parser("published", help="MaxText's published training runs; --check NAME compiles one")
    p.add_argument("--check", metavar="NAME", default=None,
                   help="compile this run as the lab for its chips and compare (minutes at 256 chips)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def _listing(as_json: bool) -> int:
    runs = [{"name": r["name"], "title": r["title"], "target": r["target"], "devices": r["devices"],
             "network": r.get("network"), "source": pub.source_link(r["source"]),
             "measured": r.get("measured"),
             "measured_source": pub.source_link(r["measured"]["source"]) if r.get("measured") else None}
            for r in pub.RUNS.values()]
    if as_json:
        print(json.dumps({"about": pub.CATALOGUE["about"], "runs": runs}, indent=1))
        return 0
    print(format_table([{"name": r["name"], "chips": f"{r['devices']} x {r['target']}"
                         + (f" ({r['network']})" if r["network"] else ""),
                         "published": pub.figure_text(r["measured"])} for r in runs],
                       ["name", "chips", "published"]))
    print("\nSources: MaxText's benchmark configurations and tables, tpu-recipes' and gpu-recipes' logs "
          "(`published --json`); (a3-high): the hosts' network the run was measured on. "
          "`published --check NAME` compiles one for its chips.")
    return 0


def _gib(n: float | None) -> str:
    return human_bytes(n) if n is not None else "-"


def _ratio_text(a: float, b: float) -> str:
    return f"{a / b:.2f}x the measured" if a and b else "-"


def format_check(doc: dict) -> str:
    """A check as text: the table's rows, then the differences from MaxText's program."""
    fits = ("fits" if doc["fits"] else "does not fit") + (" (libtpu refused the compile)"
                                                          if doc["refused"] else "")
    lines = [f"{doc['title']}", f"  configuration: {doc['source']}",
             f"  lab:           {doc['run_command']}",
             f"  memory:        {fits}: per-device peak {_gib(doc['peak_bytes'])}, temporaries "
             f"{_gib(doc['temp_bytes'])}, HBM {_gib(doc['hbm_bytes'])}",
             f"  model flops:   MaxText {doc['source_model_flops']:.4g} a device a step; the lab's "
             f"compiled program {doc['program_flops'] or 0:.4g}" +
             (f" ({doc['program_over_source_flops']:.2f}x)" if doc.get("program_over_source_flops") else "")]
    if net := pub.network_text(doc):  # collectives across GPU hosts
        lines.append(f"  network:       {net}")
    if doc["measured_step_s"]:
        pred, bound = doc.get("predicted_s"), doc.get("bound_s", doc["estimate_s"])
        lines.append(f"  step time:     measured {doc['measured_step_s']:.3f} s (from "
                     f"{doc['measured_step_from']}); the lab's prediction "
                     + (f"{pred:.3f} s ({doc['predicted_over_measured']:.2f}x the measured"
                        + ("; from the program libtpu finishes past HBM" if doc.get("refused") else "")
                        + ")" if pred else "- (none for this target)")
                     + "; its roofline bound "
                     + (f"{bound:.3f} s ({_ratio_text(bound, doc['measured_step_s'])})" if bound else "-"))
    else:
        lines.append("  step time:     no figure published")
    if mfu := mfu_text(doc.get("timing") or {}):
        lines.append(f"  MFU:           {mfu}")
    for d in doc["differences"]:
        lines.append(f"  difference:    {d}")
    if defaults := pub.defaults_text(pub.run_named(doc["name"])):
        lines.append(f"  defaults:      {defaults}")
    if overlap := pub.overlap_text(pub.run_named(doc["name"])):
        lines.append(f"  collectives:   {overlap}")
    if doc.get("note"):
        lines.append(f"  note:          {doc['note']}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    if args.check is None:
        return _listing(args.json)
    from remat_lab.present.reproduce import cli_command
    from remat_lab.program.backend import enable_compilation_cache
    from remat_lab.studies import published as study

    with engine_errors():
        config, _ = study.config_for(args.check)
        enable_compilation_cache()
        doc = study.check(args.check)
    doc["run_command"] = cli_command(config).replace("--json", "").strip()
    print(json.dumps(doc, indent=1) if args.json else format_check(doc))
    return 0

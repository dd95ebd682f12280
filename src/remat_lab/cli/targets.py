"""``targets``: the accelerators a configuration can be compiled for, with their spec figures."""

from __future__ import annotations

import argparse
import json

from remat_lab.cli.format import format_table
from remat_lab.config import TARGETS, human_bytes


def add_parsers(sub) -> None:
    p = sub.add_parser("targets", help="accelerators to compile for without the hardware (--target)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def _network(target, name: str) -> str:
    """``a3-high 12.5`` (GB/s a device), starred where it is the target's default."""
    dcn = target.on_network(name).dcn_bytes_per_s / 1e9
    return f"{name}{'*' if name == target.network else ''} {dcn:g}"


def main(args: argparse.Namespace) -> int:
    rows = [t.as_dict() for t in TARGETS.values()]
    if args.json:
        print(json.dumps({"local": "the attached backend, run and timed", "targets": rows}, indent=1))
        return 0
    table = [{"target": t["name"], "platform": t["platform"], "memory": human_bytes(t["memory_bytes"]),
              "bf16 TFLOP/s": f"{t['peak_flops'].get('bfloat16', 0) / 1e12:.0f}",
              "f32 TFLOP/s": f"{t['peak_flops'].get('float32', 0) / 1e12:.0f}",
              "bandwidth": f"{t['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s",
              "across hosts": f"{t['dcn_bytes_per_s'] / 1e9:g} GB/s",
              "networks (--network)": ", ".join(_network(TARGETS[t["name"]], n) for n in t["networks"])
              or "-"} for t in rows]
    print(format_table(table, list(table[0])))
    print("\nlocal: the attached backend (run and timed). Named targets are compiled for, not run: "
          "memory, programs, a step-time prediction and its roofline bound. 'across hosts': what a "
          "device sends a second to other hosts or slices (the default network, marked *).")
    return 0

"""Every save / offload / recompute plan of a user block's names, each plan's largest batch compiled.

The synthesizer's answer is checked against this brute force: 3^k plans (every layer remat'd), each
searched by the lab's exact batch search (compile-only, the target's compiled peak per device).

    PYTHONPATH=src python benchmarks/synth_brute_force.py \
        --model-module tests/fixtures/swiglu_block.py:make_block --input-shape 1,64,256 --depth 4 \
        --target h100 --budget 128M --names gate,up,act \
        --out benchmarks/synth_brute_force/swiglu-h100-128M.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shlex
import sys
import time
from datetime import UTC, datetime

import jax
import jaxlib

from remat_lab.cli import _config_from, build_parser
from remat_lab.config import parse_bytes
from remat_lab.studies.advisor.batch_search import largest_batch
from remat_lab.studies.synthesize.costs import plan_config
from remat_lab.studies.synthesize.solve import Plan


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-module", required=True)
    ap.add_argument("--input-shape", required=True)
    ap.add_argument("--depth", type=int, required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--budget", required=True)
    ap.add_argument("--names", required=True, help="the block's checkpoint names, comma-separated")
    ap.add_argument("--guess", type=int, default=32, help="the batch search's first guess")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    cfg = _config_from(build_parser().parse_args(
        ["run", "--model-module", args.model_module, "--input-shape", args.input_shape,
         "--depth", str(args.depth), "--target", args.target, "--compile-only"]))
    budget = parse_bytes(args.budget)
    names = tuple(args.names.split(","))
    rows = []
    for picks in itertools.product(("save", "offload", "recompute"), repeat=len(names)):
        plan = Plan(tuple(n for n, p in zip(names, picks) if p == "save"),
                    tuple(n for n, p in zip(names, picks) if p == "offload"), args.depth)
        found = largest_batch(plan_config(cfg.replace(policy="no_remat", batch=1), plan, 1), budget,
                              guess=args.guess)
        rows.append({"plan": dict(zip(names, picks)), "max_batch": found["max_batch"],
                     "peak_bytes": found["peak_bytes"], "next_peak_bytes": found["next_peak_bytes"],
                     "compiles": found["compiles"]})
        print(json.dumps(rows[-1]), flush=True)
    top = max(r["max_batch"] for r in rows)
    doc = {"measured_on": {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                           "machine": f"{os.cpu_count()}-core {platform.machine()} CPU",
                           "jax": jax.__version__,
                           "jaxlib": jaxlib.__version__, "python": platform.python_version(),
                           "command": "PYTHONPATH=src python benchmarks/synth_brute_force.py "
                                      + shlex.join(argv),
                           "wall_s": round(time.perf_counter() - t0)},
           "budget_bytes": budget, "names": list(names), "max_batch": top,
           "best": [r for r in rows if r["max_batch"] == top], "plans": rows}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"best: {top} per device, {len(doc['best'])} plan(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

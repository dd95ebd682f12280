"""Measure the worker's peak RSS growth per configuration against ``config.estimate_process_bytes``.

Run by hand (not in CI): ``PYTHONPATH=src python tests/load/memory_model.py [--quick]``. Each
configuration runs in a fresh worker process (warmed up like the app's), so its growth is the
growth a fresh worker sees: peak RSS (VmHWM) after the run minus RSS before it. Prints one JSON
line per configuration and a summary (largest measured / estimate ratio).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys

GRID = [
    dict(width=256, batch=128, depth=8),  # the app's default
    dict(width=64, batch=8),
    dict(width=1024, batch=64),
    dict(width=2048, batch=16),
    dict(width=2048, batch=256, depth=2),
    dict(width=4096, batch=1, dtype="bfloat16"),  # the link
    dict(width=4096, batch=1),
    dict(model="seq_mixer", width=256, batch=16, seq=256),
    dict(model="transformer", width=512, batch=8, seq=128, heads=8, depth=2),
    dict(model="transformer", width=1024, batch=4, seq=256, heads=8),
    dict(width=1024, batch=512, depth=4, stack="loop", policy="nothing_saveable"),
    dict(model="transformer", width=256, batch=4, seq=64, depth=16, stack="loop"),  # a long program
    dict(model="seq_mixer", width=512, batch=8, seq=128, depth=16, stack="loop", dtype="bfloat16"),
]


def _measure(cfg_dict: dict, out) -> None:
    from remat_lab.config import RunConfig, limits
    from remat_lab.serve.worker import WARM, execute
    from remat_lab.studies import experiment

    experiment.enable_compilation_cache()
    execute("programs", {"config": WARM.as_dict()}, lambda s: None)
    before = limits.rss_bytes()
    cfg = RunConfig(**{"repeats": 3, "warmup": 1, **cfg_dict})
    execute("run", {"config": cfg.as_dict()}, lambda s: None)
    out.put({"before": before, "peak": limits.peak_rss_bytes(), "after": limits.rss_bytes()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first four configurations only")
    args = parser.parse_args(argv)
    from remat_lab.config import RunConfig, estimate_bytes, estimate_process_bytes

    ctx = mp.get_context("spawn")
    worst = 0.0
    for raw in GRID[:4] if args.quick else GRID:
        cfg = RunConfig(**raw)
        q = ctx.Queue()
        p = ctx.Process(target=_measure, args=(raw, q))
        p.start()
        got = q.get()
        p.join()
        growth = got["peak"] - got["before"]
        est = estimate_process_bytes(cfg)
        worst = max(worst, growth / est)
        print(json.dumps({**raw, "device_estimate_mib": round(estimate_bytes(cfg) / 2**20, 1),
                          "estimate_mib": round(est / 2**20, 1), "growth_mib": round(growth / 2**20, 1),
                          "baseline_mib": round(got["before"] / 2**20, 1),
                          "measured_over_estimate": round(growth / est, 2)}), flush=True)
    print(f"largest measured/estimate: {worst:.2f} (must stay <= 1)")
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())

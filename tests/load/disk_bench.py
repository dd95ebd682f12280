"""Disk after many configurations: compile cache, timeline dumps and history held to their bounds (by hand).

    PYTHONPATH=src python tests/load/disk_bench.py [--n 1000] [--cache-max 8M --dumps-max 1M
        --history-max 2M] [--json out.json]

In-process, the path the app's worker takes for one configuration (``run_experiment``: compile with
XLA's dump, no_remat witness, gradient check, one timed repeat) and the history write the app makes
after it, for ``--n`` distinct small configurations (mlp, widths 8-152, batches 1-10, depths 1-2,
five policies) in fresh folders (``REMAT_LAB_CACHE_DIR``, ``REMAT_LAB_HOME``). The bounds are set
well below what ``--n`` configurations write, so least-recently-used eviction really runs; the
bytes per configuration are measured before the first eviction (the first ``--per-config-over``
configurations) and say how far the defaults (256M, 64M, 32M) reach. After every ``--every``
configurations: each store's bytes against its bound, and XLA dump folders left in the temp
folder. Not in CI: it measures, it does not test (``tests/test_disk.py`` tests the bounds).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

MIB = 1 << 20
POLICIES = ("no_remat", "nothing_saveable", "dots_saveable", "everything_saveable",
            "dots_with_no_batch_dims_saveable")
WIDTHS = (8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 152, 160)


def configs(n: int) -> list[dict]:
    """``n`` distinct small mlp configurations (width, batch, depth, policy), the widths varying fastest."""
    out = []
    for batch in range(1, 11):
        for depth in (1, 2):
            for policy in POLICIES:
                for width in WIDTHS:
                    out.append({"width": width, "batch": batch, "depth": depth, "policy": policy})
    if n > len(out):
        raise SystemExit(f"at most {len(out)} configurations")
    return out[:n]


def _bytes(folder: Path, pattern: str) -> tuple[int, int]:
    files = [p for p in folder.glob(pattern) if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def measure(cache: Path, home: Path) -> dict:
    """Bytes and files of each store now, and the temp folder's XLA dump folders."""
    from remat_lab.store import history

    cache_b, cache_n = _bytes(cache, "*-cache")
    dumps_b, dumps_n = _bytes(cache / "timeline_dumps", "*")
    db = history.db_path()
    with history.connect() as con:
        used, rows = history.used_bytes(con), con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    files = sum(p.stat().st_size for p in home.glob("history.sqlite3*"))
    temp = [p for p in Path(tempfile.gettempdir()).glob(f"remat_lab_timeline_{os.getpid()}_*")]
    return {"cache_bytes": cache_b, "cache_entries": cache_n, "dumps_bytes": dumps_b,
            "dumps_files": dumps_n, "history_used_bytes": used, "history_file_bytes": files,
            "history_rows": rows, "history_file": db.name, "temp_dump_folders": len(temp)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--cache-max", default="8M")
    ap.add_argument("--dumps-max", default="1M")
    ap.add_argument("--history-max", default="2M")
    ap.add_argument("--per-config-over", type=int, default=50)
    ap.add_argument("--dir", default=None, help="the folders' parent (default: a new temp folder)")
    ap.add_argument("--compile-only", action="store_true",
                    help="compile and analyse only (no gradient check, nothing run): faster")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="remat_lab_disk_"))
    cache, home = base / "cache", base / "home"
    os.environ.update({"REMAT_LAB_CACHE_DIR": str(cache), "REMAT_LAB_HOME": str(home),
                       "REMAT_LAB_CACHE_MAX_BYTES": args.cache_max,
                       "REMAT_LAB_DUMPS_MAX_BYTES": args.dumps_max,
                       "REMAT_LAB_HISTORY_MAX_BYTES": args.history_max})

    from remat_lab.config import RunConfig, parse_bytes
    from remat_lab.program import backend
    from remat_lab.store import history
    from remat_lab.studies.experiment import run_experiment

    bounds = {"cache_bytes": parse_bytes(args.cache_max), "dumps_bytes": parse_bytes(args.dumps_max),
              "history_used_bytes": parse_bytes(args.history_max)}
    backend.enable_compilation_cache(str(cache))
    rows, failed, t0, worst = [], 0, time.perf_counter(), dict.fromkeys(bounds, 0)
    for i, c in enumerate(configs(args.n), 1):
        cfg = RunConfig(width=c["width"], batch=c["batch"], depth=c["depth"], policy=c["policy"],
                        repeats=1, warmup=0, compile_only=args.compile_only)
        try:
            doc = run_experiment(cfg)
        except Exception as err:  # noqa: BLE001 - a benchmark counts failures, it does not stop
            failed += 1
            print(json.dumps({"config": c, "failed": f"{type(err).__name__}: {str(err)[:120]}"}))
            continue
        problem = history.try_record(doc, kind="run", source="app", session_id="disk-bench")
        if problem:
            print(json.dumps({"config": c, "history": problem[:120]}))
        now = measure(cache, home)
        worst = {k: max(worst[k], now[k]) for k in worst}
        if i == args.per_config_over or i % args.every == 0 or i == args.n:
            row = {"configurations": i, "seconds": round(time.perf_counter() - t0, 1),
                   "load_avg_1m": round(os.getloadavg()[0], 2), "failed": failed, **now,
                   "max_so_far": dict(worst),
                   "within_bounds": all(worst[k] <= bounds[k] for k in bounds)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:  # kept as it goes: a run stopped early still leaves its rows
                Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    first = next(r for r in rows if r["configurations"] == args.per_config_over)
    n = first["configurations"]
    summary = {
        "configurations": args.n, "compile_only": args.compile_only, "failed": failed, "bounds": bounds,
        "max_bytes_seen": worst, "within_bounds": all(worst[k] <= bounds[k] for k in bounds),
        "bytes_per_configuration": {
            "cache": round(first["cache_bytes"] / n), "dumps": round(first["dumps_bytes"] / n),
            "history": round(first["history_used_bytes"] / n), "measured_over": n},
        "history_used_le_file": rows[-1]["history_used_bytes"] <= rows[-1]["history_file_bytes"],
        "temp_dump_folders_left": rows[-1]["temp_dump_folders"],
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps({"summary": summary}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0 if summary["within_bounds"] and not failed else 1


if __name__ == "__main__":
    sys.exit(main())

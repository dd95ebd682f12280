"""Issue 64's planner benchmark: wall time, longest silence, compiles by phase, the machine and its load.

    python benchmarks/plan_search.py 70b      # Llama 3.1 70B on 256 v6e, MaxText's published global batch
    python benchmarks/plan_search.py fits     # "as large as fits": Llama 3.1 8B at depth 2 on 8 v6e

Each runs ``python -m remat_lab plan ... --json --no-cache`` in a fresh process (empty caches: the
persistent compile cache off, nothing compiled before in it), reads its progress lines on stderr as
they come (the longest gap between two is the CLI's longest silence), and stores the answer's
figures with the machine (cores, memory, load averages before and after) in
``benchmarks/plan_search/NAME.json`` (its progress lines in ``NAME.log`` as they come); ``LIMIT_S``:
SIGTERM past it, the answer then unfinished. The load of other users of the machine is what it was:
``LOAD_NOTE`` says so.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUESTIONS = {
    "70b": ["--preset", "llama3.1-70b", "--seq", "8192", "--target", "tpu-v6e", "--target-devices", "256",
            "--global-batch-tokens", "10485760"],
    # issue 64 gives no flags for it: the Plan page's default model at depth 2, as large as fits
    "fits": ["--preset", "llama3.1-8b", "--depth", "2", "--seq", "8192", "--target", "tpu-v6e",
             "--target-devices", "8"],
}


def machine() -> dict:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {"cores": len(os.sched_getaffinity(0)), "memory_bytes": mem, "cpu": platform.processor(),
            "python": platform.python_version(), "load_average": os.getloadavg()}


def run(name: str, note: str, limit_s: float | None = None) -> dict:
    cmd = [sys.executable, "-m", "remat_lab", "plan", *QUESTIONS[name], "--json", "--no-cache"]
    before = machine()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stamps, lines = [t0], []
    (HERE / "plan_search").mkdir(exist_ok=True)
    log = (HERE / "plan_search" / f"{name}.log").open("w")

    def read() -> None:
        for line in proc.stderr:
            stamps.append(time.monotonic())
            lines.append(line.rstrip())
            log.write(f"[{stamps[-1] - t0:8.1f} s] {line}")
            log.flush()

    def stop() -> None:  # past the limit: SIGTERM, as a user would (the planner ends its workers)
        if proc.poll() is None:
            proc.terminate()

    timer = threading.Timer(limit_s, stop) if limit_s else None
    if timer:
        timer.start()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out = proc.stdout.read()
    proc.wait()
    reader.join()
    if timer:
        timer.cancel()
    wall = time.monotonic() - t0
    stamps.append(time.monotonic())
    doc = json.loads(out) if proc.returncode == 0 else {}
    top = (doc.get("plans") or [None])[0]
    result = {
        "question": "python -m remat_lab plan " + " ".join(QUESTIONS[name]) + " --json --no-cache",
        "returncode": proc.returncode, "wall_s": wall, "limit_s": limit_s,
        "finished": proc.returncode == 0,
        "longest_silence_s": max(b - a for a, b in zip(stamps, stamps[1:])),
        "progress_lines": len(lines), "compiles_by_phase": doc.get("compiles_by_phase"),
        "candidates_compiled": doc.get("candidates_compiled"),
        "top_plan": top and {k: top.get(k) for k in ("mesh", "plan_text", "per_device_batch", "microbatches",
                                                     "optimizer_offload", "peak_bytes", "predicted_s",
                                                     "predicted_tokens_per_s_per_device", "same_as")},
        "published": doc.get("published_row") and {
            k: doc["published_row"].get(k) for k in ("name", "peak_bytes", "predicted_s",
                                                     "predicted_tokens_per_s_per_device")},
        "against_published": doc.get("against_published"),
        "memory_model_error": doc.get("memory_model_error"), "instant_error": doc.get("instant_error"),
        "machine_before": before, "machine_after": machine(), "load_note": note,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "stderr_tail": lines[-12:],
    }
    (HERE / "plan_search" / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    which = sys.argv[1:] or list(QUESTIONS)
    note = os.environ.get("LOAD_NOTE", "")
    limit = float(os.environ["LIMIT_S"]) if os.environ.get("LIMIT_S") else None
    for name in which:
        print(json.dumps(run(name, note, limit), indent=1))

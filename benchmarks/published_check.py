"""Store published runs' checks: `published --check NAME --json` with the machine it ran on first.

    PYTHONPATH=src python benchmarks/published_check.py NAME [NAME ...]

writes benchmarks/published_checks/NAME.json.

Each check runs in its own process (as a user runs it), timed; its document is stored with
``measured_on`` (date, this machine, the versions of jax, jaxlib and libtpu, the command, its
wall time) ahead of the check's own fields. docs/published.md's tables are generated from these
(python benchmarks/doc_tables.py).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).parent / "published_checks"


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def store(name: str) -> dict:
    command = f"PYTHONPATH=src python -m remat_lab published --check {name} --json"
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "remat_lab", "published", "--check", name, "--json"],
                          capture_output=True, text=True, check=False)
    wall = round(time.perf_counter() - t0)
    if done.returncode:
        raise SystemExit(f"{name}: the check exited {done.returncode}: {done.stderr.strip()[-500:]}")
    doc = json.loads(done.stdout)
    cores = os.cpu_count()
    measured_on = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                   "machine": f"{cores}-core CPU ({platform.machine()})",
                   **{k: _version(k) for k in ("jax", "jaxlib", "libtpu")},
                   "python": platform.python_version(), "command": command, "wall_s": wall}
    out = {"measured_on": measured_on, **doc}
    OUT.mkdir(exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def main(names: list[str]) -> int:
    if not names:
        print(__doc__)
        return 2
    for name in names:
        doc = store(name)
        print(json.dumps({"name": name, "wall_s": doc["measured_on"]["wall_s"],
                          "predicted_over_measured": doc.get("predicted_over_measured"),
                          "bound_over_measured": doc.get("bound_over_measured")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

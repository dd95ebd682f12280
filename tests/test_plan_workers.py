"""The planner's compile workers die with it: SIGTERM to ``plan`` leaves no child process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")
SRC = str(Path(__file__).resolve().parents[1] / "src")
TINY = ["--model", "llm", "--width", "64", "--heads", "4", "--depth", "1", "--seq", "64", "--vocab", "256",
        "--mlp-dim", "128", "--dtype", "bfloat16", "--target", "tpu-v6e", "--target-devices", "8",
        "--tensor", "1", "--plans", "full", "--no-optimizer-offload", "--no-cache"]


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.mark.parametrize("how", ["term", "kill"])
def test_ending_plan_leaves_no_worker(how):
    """SIGTERM ends the compile workers from the planner's own exit; SIGKILL (nothing runs in the
    planner) leaves them to their watchdog, which sees their parent gone within a second of its
    start (a worker killed before its imports end starts it after them)."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "remat_lab", "plan", *TINY, "--workers", "2"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    parent = psutil.Process(proc.pid)
    ends = time.monotonic() + 240
    workers: list[psutil.Process] = []
    while time.monotonic() < ends and proc.poll() is None:
        workers = [c for c in _children(parent) if "multiprocessing" in " ".join(c.cmdline())]
        if len(workers) >= 2:
            break
        time.sleep(0.2)
    assert workers, f"no compile worker started: {proc.stderr.read().decode()[-2000:] if proc.poll() else ''}"
    everyone = _children(parent)
    proc.send_signal(signal.SIGTERM if how == "term" else signal.SIGKILL)
    proc.wait(timeout=60)
    gone, alive = psutil.wait_procs(everyone, timeout=20 if how == "term" else 120)
    assert not alive, [p.cmdline() for p in alive]
    if how == "term":
        assert proc.returncode != 0

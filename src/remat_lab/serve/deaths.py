"""Why a worker process died, in a visitor's words: the out-of-memory killer, a signal from outside, its exit.

A SIGKILL is what the out-of-memory killer sends, but also what an operator's ``kill -9`` or a
supervisor sends. The kernel counts its own kills: ``oom_kill`` in the memory cgroup's
``memory.events`` (v2) or ``memory.oom_control`` (v1), for this process's cgroup and each one above
it (a limit may sit on an ancestor); without a cgroup that counts, ``oom_kill`` in ``/proc/vmstat``
for the whole machine. ``oom_kills`` sums them; the pool reads it when a job starts and again when
its worker dies: a count that rose means out of memory, one that did not means someone else killed
the worker, and no count at all (none of these files) says both are possible. No text names a flag
or a variable.
"""

from __future__ import annotations

import signal
from pathlib import Path

from remat_lab.config import human_bytes, limits

# Signals a process sends itself when its native code fails (XLA's CHECK aborts, a segfault).
_CRASHES = {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}


def _count(path: Path) -> int | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _cgroup_dirs(root: Path) -> list[tuple[Path, str]]:
    """``(directory, counter file)`` for this process's memory cgroup and its ancestors."""
    paths, fs, out = limits.cgroup_paths(root), root / "sys/fs/cgroup", []
    mounts = [("v1", fs / "memory", "memory.oom_control")] + [
        ("v2", m, "memory.events") for m in (fs, fs / "unified")]
    for kind, mount, name in mounts:
        if kind not in paths or not (mount / name).parent.is_dir():
            continue
        d = mount / paths[kind].strip("/")
        while True:
            if (d / name).exists():
                out.append((d, name))
            if d == mount or mount not in d.parents:
                break
            d = d.parent
    return out


def oom_kills(root: str | Path = "/") -> int | None:
    """The kernel's out-of-memory kills counted for this process's cgroups and the machine; None
    when nothing counts them here."""
    root = Path(root)
    known = [c for c in (_count(d / name) for d, name in _cgroup_dirs(root)) if c is not None]
    if not known:  # no memory cgroup counts kills here: the machine's count (any process's OOM)
        known = [c for c in [_count(root / "proc/vmstat")] if c is not None]
    return sum(known) if known else None


def message(code: int | None, limit: int, oom_before: int | None, oom_after: int | None) -> str:
    """The sentence for a worker that died with exit ``code`` (negative: the signal) while running a
    job; ``oom_before`` / ``oom_after``: ``oom_kills()`` when the job started and after the death."""
    again = "a new one is starting."
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        counted = oom_before is not None and oom_after is not None
        if code == -signal.SIGKILL and counted and oom_after > oom_before:
            return (f"This configuration ran out of memory in the worker (limit {human_bytes(limit)}): "
                    f"the kernel's out-of-memory killer stopped the worker process; {again} Lower "
                    "width, batch, seq or depth.")
        if code == -signal.SIGKILL and not counted:
            return (f"The worker process was killed (SIGKILL) while running this configuration: it "
                    f"may have run out of memory (limit {human_bytes(limit)}), or something outside "
                    f"the app stopped it (this server cannot tell which); {again} Try it again, or a "
                    "smaller configuration.")
        if -code in _CRASHES:
            return (f"The worker process crashed ({name}) in native code, XLA's or JAX's, while "
                    f"running this configuration; {again} This is a bug in XLA or the lab, not a "
                    "lack of memory: a smaller configuration is no cure; run it again, and report "
                    "it if it crashes again.")
        return (f"The worker process was stopped from outside the app ({name}, not by the "
                f"out-of-memory killer) while running this configuration; {again} Your configuration "
                "was not the cause: run it again.")
    return (f"The worker process exited while running this configuration (exit code {code}), "
            f"which the lab's worker never does on its own: a bug in the lab; {again} Run it "
            "again, and report it if it happens again.")

"""The memory this process may use: the cgroup limit (v1 or v2, nested paths) and resident set sizes.

Read from files only (no JAX): ``/proc/self/cgroup`` names this process's cgroup in each hierarchy;
the limit is the smallest one on the path from that cgroup up to the hierarchy's root (a parent's
limit applies to its children). ``root`` lets the tests point every path at a fixture tree.
"""

from __future__ import annotations

import os
from pathlib import Path

UNLIMITED = 1 << 60  # cgroup v1 writes "no limit" as 2**63 rounded down to a page


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _value(text: str | None) -> int | None:
    """A limit file's number; None for ``max``, a missing file or v1's "unlimited"."""
    if text is None or not text.isdigit():
        return None
    value = int(text)
    return value if value < UNLIMITED else None


def cgroup_paths(root: str | Path = "/") -> dict[str, str]:
    """``{"v1": path, "v2": path}`` of this process's memory cgroup, from ``/proc/self/cgroup``."""
    text = _read(Path(root) / "proc/self/cgroup") or ""
    paths = {}
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            paths["v2"] = path
        elif "memory" in controllers.split(","):
            paths["v1"] = path
    return paths


def _mounts(root: Path) -> list[tuple[str, Path, str, str]]:
    """``(kind, mount directory, limit file, usage file)`` for each memory hierarchy mounted."""
    fs = root / "sys/fs/cgroup"
    found = []
    if (fs / "memory").is_dir():
        found.append(("v1", fs / "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"))
    for v2 in (fs, fs / "unified"):
        if (v2 / "cgroup.controllers").exists() and "memory" in (_read(v2 / "cgroup.controllers") or ""):
            found.append(("v2", v2, "memory.max", "memory.current"))
    return found


def _chain(mount: Path, path: str) -> list[Path]:
    """The cgroup's directory and its ancestors up to the mount. Inside a container the path in
    ``/proc/self/cgroup`` may be the host's while the mount is the container's own cgroup: then
    only the mount's root is there to read."""
    own = mount / path.strip("/")
    if not own.is_dir():
        return [mount]
    chain = [own]
    while chain[-1] != mount:
        chain.append(chain[-1].parent)
    return chain


def cgroup_memory(root: str | Path = "/") -> dict:
    """``{"limit": bytes or None, "usage": bytes or None, "kind": "v1"/"v2"/None, "path": str}``.

    The limit is the smallest set on the way from this process's cgroup to the root, in any
    hierarchy that has the memory controller; None when nothing limits it.
    """
    root = Path(root)
    paths = cgroup_paths(root)
    best = {"limit": None, "usage": None, "kind": None, "path": None}
    for kind, mount, limit_file, usage_file in _mounts(root):
        if kind not in paths:
            continue
        chain = _chain(mount, paths[kind])
        for d in chain:
            limit = _value(_read(d / limit_file))
            if limit is not None and (best["limit"] is None or limit < best["limit"]):
                best.update(limit=limit, kind=kind, path=str(d.relative_to(mount)),
                            usage=_value(_read(d / usage_file)))
        if best["usage"] is None:
            best["usage"] = _value(_read(chain[0] / usage_file))
    return best


def system_memory_bytes() -> int:
    """Physical memory of the machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_limit(root: str | Path = "/") -> int:
    """What this process may use: the cgroup limit when one is set, else physical memory."""
    limit = cgroup_memory(root)["limit"]
    return min(limit, system_memory_bytes()) if limit else system_memory_bytes()


def rss_bytes(pid: int | str = "self", root: str | Path = "/") -> int | None:
    """Resident set size of process ``pid`` (``VmRSS``), None if it is gone."""
    text = _read(Path(root) / f"proc/{pid}/status") or ""
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def peak_rss_bytes(pid: int | str = "self", root: str | Path = "/") -> int | None:
    """The highest resident set size of process ``pid`` so far (``VmHWM``)."""
    text = _read(Path(root) / f"proc/{pid}/status") or ""
    for line in text.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None

"""The device's peak FLOP/s, for a roofline fraction: spec sheets for known GPUs, an estimate on CPU."""

from __future__ import annotations

import contextlib
import functools
import os
import platform
from pathlib import Path

import jax


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict:
    """Model name, feature flags and clock from /proc/cpuinfo (what is there)."""
    info = {"model": platform.processor() or platform.machine(), "flags": set(), "mhz": None}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and value:
            info["model"] = value
        elif key == "flags" and not info["flags"]:
            info["flags"] = set(value.split())
        elif key == "cpu MHz" and info["mhz"] is None:
            with contextlib.suppress(ValueError):
                info["mhz"] = float(value)
    return info


def cpu_count() -> int:
    """Cores this process may use (the affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def peak_flops() -> tuple[float | None, str]:
    """The default device's peak float32 FLOP/s and how it was obtained.

    CPU: cores x clock x FLOPs per cycle per core, with two FMA units at the widest vector width
    the flags advertise (avx512f: 64, avx2+fma: 32, avx: 16, else 8). An upper estimate: some
    cores split 512-bit FMAs in two, and clocks vary with load.
    """
    if jax.default_backend() != "cpu":
        kind = jax.devices()[0].device_kind
        table = {"H200": 67e12, "H100": 67e12, "A100": 19.5e12, "V100": 15.7e12, "L4": 30.3e12,
                 "A10": 31.2e12, "T4": 8.1e12}
        for name, peak in table.items():
            if name.lower() in kind.lower():
                return peak, f"{kind}: float32 (non tensor-core) spec-sheet peak"
        return None, f"{kind}: peak unknown"
    cpu = cpu_info()
    flags = cpu["flags"]
    if "avx512f" in flags:
        per_cycle, isa = 64, "avx512f"
    elif "avx2" in flags and "fma" in flags:
        per_cycle, isa = 32, "avx2+fma"
    elif "avx" in flags:
        per_cycle, isa = 16, "avx"
    else:
        per_cycle, isa = 8, "sse"
    if not cpu["mhz"]:
        return None, "estimate impossible: no clock in /proc/cpuinfo"
    cores = cpu_count()
    peak = cores * cpu["mhz"] * 1e6 * per_cycle
    return peak, (f"estimate: {cores} cores x {cpu['mhz']:.0f} MHz x {per_cycle} float32 "
                  f"FLOP/cycle ({isa}, 2 FMA units)")

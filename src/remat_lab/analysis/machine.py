"""The machine: CPU, cores, device, jax and matmul precision (a calibration's identity), its spec sheet."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
from pathlib import Path

import jax

# name in device_kind -> (float32 FLOP/s, TF32 tensor-core FLOP/s or None, memory bytes/s); dense
# (no sparsity) spec-sheet numbers of the SXM/largest-memory variant.
GPU_SPECS = {
    "H200": (67e12, 494.7e12, 4.8e12), "H100": (67e12, 494.7e12, 3.35e12),
    "A100": (19.5e12, 156e12, 2.039e12), "V100": (15.7e12, None, 0.9e12),
    "L4": (30.3e12, 60e12, 0.3e12), "A10": (31.2e12, 62.5e12, 0.6e12),
    "T4": (8.1e12, None, 0.32e12),
}


# ---------------------------------------------------------------- the machine


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


def physical_from_cpuinfo(text: str) -> int | None:
    """Distinct (physical id, core id) pairs of /proc/cpuinfo's processor blocks; None if absent."""
    pairs, seen_core_ids = set(), False
    for block in text.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        if "processor" not in fields:
            continue
        if "core id" not in fields:
            return None
        seen_core_ids = True
        pairs.add((fields.get("physical id", "0"), fields["core id"]))
    return len(pairs) if seen_core_ids else None


def physical_from_sysfs(root: Path) -> int | None:
    """Distinct thread-sibling sets under /sys/devices/system/cpu; None if unreadable."""
    groups = set()
    for topo in root.glob("cpu[0-9]*/topology"):
        for name in ("core_cpus_list", "thread_siblings_list"):
            try:
                groups.add((topo / name).read_text().strip())
                break
            except OSError:
                continue
    return len(groups) or None


@functools.lru_cache(maxsize=1)
def physical_core_count() -> int:
    """Physical cores of the machine (hyper-threads counted once); the logical count if unknown.

    From /proc/cpuinfo's distinct (physical id, core id) pairs, else /sys's thread-sibling sets.
    Never more than the logical count, never less than 1.
    """
    logical = os.cpu_count() or 1
    count = None
    with contextlib.suppress(OSError):
        count = physical_from_cpuinfo(Path("/proc/cpuinfo").read_text())
    if not count:
        count = physical_from_sysfs(Path("/sys/devices/system/cpu"))
    return max(1, min(count or logical, logical))


def matmul_precision() -> str:
    """JAX's default matmul precision setting (``jax_default_matmul_precision``), "default" if unset."""
    return str(jax.config.jax_default_matmul_precision or "default")


def machine_identity() -> dict:
    """What a calibration is valid for: device, CPU, cores this process may use, jax, precision."""
    cpu = cpu_info()
    device = jax.devices()[0]
    return {"backend": jax.default_backend(), "device_kind": device.device_kind,
            "cpu_model": cpu["model"], "physical_cores": physical_core_count(),
            "usable_cores": cpu_count(), "jax": jax.__version__,
            "matmul_precision": matmul_precision()}


def identity_key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- spec-sheet fallback


def _cpu_estimate() -> tuple[float | None, str]:
    """Cores x clock x FLOP/cycle (two FMA units at the widest advertised vector width)."""
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
        return None, "spec: no estimate (no clock in /proc/cpuinfo)"
    cores = cpu_count()
    return cores * cpu["mhz"] * 1e6 * per_cycle, (
        f"spec: estimate {cores} cores x {cpu['mhz']:.0f} MHz x {per_cycle} float32 FLOP/cycle "
        f"({isa}, 2 FMA units); a rough figure that a real matmul can exceed")


def spec_roofs(identity: dict | None = None) -> dict:
    """Spec-sheet roofs (GPUs in ``GPU_SPECS``; a clock-based estimate on CPU), as ``calibrate``
    returns them but with ``peak_source`` "spec". Numbers are None where nothing is known."""
    identity = identity or machine_identity()
    kind = identity["device_kind"]
    peak = bandwidth = None
    if identity["backend"] == "cpu":
        peak, note = _cpu_estimate()
    else:
        note = f"spec: {kind} unknown"
        for name, (fp32, tf32, bw) in GPU_SPECS.items():
            if name.lower() in kind.lower():
                tf32_mode = bool(tf32) and identity["matmul_precision"] not in ("highest", "float32")
                peak, bandwidth = (tf32 if tf32_mode else fp32), bw
                what = ("TF32 tensor-core (JAX's default float32 matmul precision)" if tf32_mode
                        else "float32")
                note = f"spec: {kind} {what} spec-sheet peak, dense"
                break
    return {"peak_flops_per_s": peak, "bandwidth_bytes_per_s": bandwidth, "peak_source": "spec",
            "peak_note": note, "machine": identity, "measured_at": None, "details": {}}


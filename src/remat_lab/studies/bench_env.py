"""The bench's surroundings: the machine and its roofs, and resetting the compile caches between runs."""

from __future__ import annotations

import os
import platform

import jax

from remat_lab.analysis.machine import cpu_count, cpu_info, physical_core_count
from remat_lab.analysis.roofline import calibrate
from remat_lab.program import step
from remat_lab.program.backend import enable_compilation_cache, environment
from remat_lab.studies import experiment

# ---------------------------------------------------------------- machine and peak


def machine() -> dict:
    """This process's machine and its roofs (``roofline.calibrate``: cached, else measured now)."""
    cpu = cpu_info()
    roofs = calibrate()
    env = environment()
    return {**env, "cpu_model": cpu["model"], "cores": cpu_count(),
            "physical_cores": physical_core_count(), "cpu_mhz": cpu["mhz"],
            "vector_flags": sorted(cpu["flags"] & {"avx512f", "avx2", "fma", "avx"}),
            "python": platform.python_version(), "peak_flops": roofs["peak_flops_per_s"],
            "peak_source": roofs["peak_source"], "peak_note": roofs["peak_note"],
            "bandwidth_bytes_per_s": roofs["bandwidth_bytes_per_s"],
            "calibrated_at": roofs["measured_at"], "loadavg_start": loadavg()}


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------- caches


def clear_caches() -> None:
    """Forget every in-process compile and trace (JAX's and the engine's), as a new session."""
    jax.clear_caches()
    experiment.baseline_program.cache_clear()
    for name in ("_parameters", "_input"):
        fn = getattr(step, name, None)
        if fn is not None and hasattr(fn, "cache_clear"):
            fn.cache_clear()


def use_cache_dir(path: str) -> str:
    """Point JAX's persistent compilation cache at ``path`` (re-initialised if already in use)."""
    from jax._src import compilation_cache  # pinned jax; needed to switch directories

    path = enable_compilation_cache(path)
    compilation_cache.reset_cache()
    return path

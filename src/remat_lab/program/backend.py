"""The local backend: its environment, memory limit, the persistent compile cache and XLA's errors."""

from __future__ import annotations

import os

import flax
import jax
import jaxlib

from remat_lab.config import ConfigError


class ExecutionError(RuntimeError):
    """XLA failed to compile or run a configuration; the message says what to change."""


def enable_compilation_cache(path: str | None = None) -> str:
    """Turn on JAX's persistent compilation cache (default ``~/.cache/remat_lab/jax``)."""
    path = path or os.environ.get("REMAT_LAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "remat_lab", "jax")
    try:
        os.makedirs(path, exist_ok=True)
        writable = os.access(path, os.W_OK | os.X_OK)
    except OSError as err:
        writable, reason = False, err.strerror or type(err).__name__
    else:
        reason = "not writable"
    if not writable:
        raise ConfigError(f"the compilation cache folder {path[-80:]} cannot be used ({reason}); set "
                          "REMAT_LAB_CACHE_DIR to a writable folder (or run without the cache, "
                          "--no-cache).")
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


def environment() -> dict:
    """Backend, devices and versions of this process."""
    devices = jax.devices()
    return {
        "backend": jax.default_backend(), "device_kind": devices[0].device_kind,
        "device_count": len(devices), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
        "flax": flax.__version__, "cpu_count": os.cpu_count(),
    }


def device_memory_limit() -> int | None:
    """Bytes the default device may use, when the backend says (GPU/TPU); None on CPU."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("bytes_limit")


def xla_error(stage: str, err: Exception) -> ExecutionError:
    text = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
    hint = ("the device ran out of memory: lower width, batch, seq or depth"
            if "RESOURCE_EXHAUSTED" in str(err) or "out of memory" in str(err).lower()
            else "try a smaller or different configuration")
    return ExecutionError(f"XLA failed while {stage}: {text}. {hint.capitalize()}.")

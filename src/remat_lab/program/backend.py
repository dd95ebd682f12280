"""The local backend: its environment, memory limit, the persistent compile cache and XLA's errors."""

from __future__ import annotations

import glob
import logging
import os
import re
import sys
import threading

import flax
import jax
import jaxlib

from remat_lab.config import LOCAL, ConfigError, RunConfig, get_target, parse_bytes
from remat_lab.program import failures
from remat_lab.program.failures import ExecutionError, out_of_memory

__all__ = ["ExecutionError", "out_of_memory"]  # the failures' base and test, where callers import them

CACHE_MAX_ENV = "REMAT_LAB_CACHE_MAX_BYTES"
CACHE_MAX_BYTES = 256 << 20  # JAX's compiled executables: 43-340 KB per configuration on XLA CPU
_CACHE_FILES = ("*-cache",)  # JAX's entries (its "-atime" stamps, when JAX evicts itself, stay)
_PRUNE_LOCK = threading.Lock()
_CACHE = {"dir": None, "listening": False}
# Whether this thread's compile wrote a cache entry not yet held to the bound: per thread, because
# the witness compiles run beside the main one (studies/witness_compiles) and one thread's "done"
# must not clear another's pending write (a shared flag let a write land after the other thread's
# trim and stay over the bound until some later compile).
_WROTE = threading.local()


def byte_limit(env: str, default: int) -> int | None:
    """``$env`` as a size (``256M``, ``1G``, bytes); ``0``/``off`` = no bound (None); unset or
    unreadable = ``default``."""
    text = os.environ.get(env, "").strip().lower()
    if text in ("0", "off", "none", "unlimited"):
        return None
    try:
        return parse_bytes(text) if text else default
    except ConfigError:
        print(f"remat_lab: warning: {env}={text[:40]!r} is not a size; using {default} bytes.",
              file=sys.stderr)
        return default


def prune(folder: str, max_bytes: int | None, patterns: tuple[str, ...] = ("*",),
          keep: float = 1.0) -> int:
    """Delete ``folder``'s files matching ``patterns``, least recently used first (the later of
    access and modification time), until they total at most ``keep * max_bytes``; bytes deleted.

    Files another process deletes meanwhile are skipped; nothing happens without a bound.
    """
    if not max_bytes or not folder:
        return 0
    files = []
    for pattern in patterns:
        for path in glob.glob(os.path.join(glob.escape(folder), pattern)):
            try:
                st = os.stat(path)
            except OSError:
                continue
            files.append((max(st.st_atime, st.st_mtime), path, st.st_size))
    total, target, freed = sum(f[2] for f in files), int(max_bytes * keep), 0
    with _PRUNE_LOCK:
        for _, path, size in sorted(files):
            if total <= target:
                break
            try:
                os.remove(path)  # only files the caller's patterns name, in its cache folder
            except FileNotFoundError:
                pass
            except OSError:
                continue
            total, freed = total - size, freed + size
    return freed


def prune_compilation_cache(folder: str | None = None) -> int:
    """Hold the compile cache folder to ``$REMAT_LAB_CACHE_MAX_BYTES``; bytes deleted."""
    folder = folder or _CACHE["dir"] or jax.config.jax_compilation_cache_dir
    return prune(folder, byte_limit(CACHE_MAX_ENV, CACHE_MAX_BYTES), _CACHE_FILES)


def _on_cache_event(event: str, **_kwargs) -> None:
    """JAX's monitoring events, in the compiling thread: before a new entry is written
    (``cache_misses``) make room for it (down to 15/16 of the bound) and mark the write pending."""
    try:
        if event == "/jax/compilation_cache/cache_misses":
            _WROTE.pending = True
            prune(_CACHE["dir"], byte_limit(CACHE_MAX_ENV, CACHE_MAX_BYTES), _CACHE_FILES, keep=15 / 16)
    except Exception:  # noqa: BLE001 - a listener must never break a compile
        pass


def _skip_compile_only_programs() -> None:
    """Keep programs compiled for a target that is not attached out of the cache: JAX would write
    them but can never read them back ("PjRtCompiler must be constructed with a Client"), so each
    such compile paid for a useless entry, and each repeat read it, warned and compiled again."""
    from jax._src import compilation_cache  # pinned jax: the runtimes the cache leaves alone

    unsupported = getattr(compilation_cache, "_UNSUPPORTED_RUNTIMES", None)
    if isinstance(unsupported, set) and "compile_only_runtime" not in unsupported:
        unsupported.add("compile_only_runtime")
        # ... and JAX says so at WARNING on every such compile: not a thing for the user's terminal.
        logging.getLogger(compilation_cache.__name__).addFilter(
            lambda record: "Unsupported runtime: compile_only_runtime" not in record.getMessage())


def _on_compile_done(event: str, _duration: float, **_kwargs) -> None:
    """JAX's duration event at the end of each compile, after its cache write and in the same
    thread: a write that went over the bound (a new entry larger than the room made for it, or
    written after another thread's trim) is trimmed before the compile returns."""
    try:
        if event == "/jax/core/compile/backend_compile_duration" and getattr(_WROTE, "pending", False):
            _WROTE.pending = False
            prune_compilation_cache()
    except Exception:  # noqa: BLE001 - a listener must never break a compile
        pass


def enable_compilation_cache(path: str | None = None) -> str:
    """Turn on JAX's persistent compilation cache (default ``~/.cache/remat_lab/jax``), held to
    ``$REMAT_LAB_CACHE_MAX_BYTES`` (default 256 MiB, least recently used entries out)."""
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
    _skip_compile_only_programs()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _CACHE["dir"] = path
    if not _CACHE["listening"]:
        _CACHE["listening"] = True
        jax.monitoring.register_event_listener(_on_cache_event)
        jax.monitoring.register_event_duration_secs_listener(_on_compile_done)
    prune_compilation_cache(path)  # start-up: a smaller bound than last time takes effect now
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


_NEEDED = re.compile(r"required for [^(]*\(([\d.]+)([KMGT])\)|Used ([\d.]+)([KMGT]) of")


def needed_bytes(err: BaseException) -> int | None:
    """The device bytes an out-of-memory compile error says the program needs (libtpu: "... HLO
    temporaries (32.00G) exceeds ..." or "Used 21.27M of ... hbm"), or None."""
    m = _NEEDED.search(str(err))
    if not m:
        return None
    return int(float(m.group(1) or m.group(3)) * 1024 ** " KMGT".index(m.group(2) or m.group(4)))


def refused_memory(err: Exception) -> str:
    """Which memory libtpu's refusal names: ``"host"`` (pinned host memory, as optimizer offload
    fills it) or ``"hbm"`` (the device's)."""
    line = str(err).strip().splitlines()[0].lower() if str(err).strip() else ""
    return "host" if re.search(r"\bhost\b", line) and "hbm" not in line else "hbm"


def _preset_hint(config: RunConfig) -> str:
    """Out of memory with a published shape (a preset): what holds it, never a smaller model. The
    static bytes per device against the device's memory (a target's usable share, else the local
    device's limit; ``footprint.fit``): over it, the fewest devices and what else holds them."""
    from remat_lab.program import footprint  # builds on step: imported when needed

    budget = (get_target(config.target, config.network).usable_bytes() if config.target != LOCAL
              else device_memory_limit())
    if not budget:
        return f"{config.preset} is a published shape: {footprint.MORE}"
    found = footprint.fit(config, budget)
    if not found["fits"]:
        return f"{config.preset} {footprint.no_fit_sentence(found)}"
    return f"{config.preset}: {footprint.crowded_sentence(found, config.batch)}"


def xla_error(stage: str, err: Exception, config: RunConfig | None = None) -> Exception:
    """``err``, raised while ``stage``, named for what it is (``failures``): the device out of memory
    (with a preset's ``config``, said in devices and memory by ``_preset_hint``, else as a smaller
    model), this machine's memory, XLA's own error quoted with its code, or the lab's bug. An error
    already worded (the configuration's, the user's block's, one named here before) stays as it is."""
    if isinstance(err, ConfigError | ExecutionError):
        return type(err)(str(err))
    cls = failures.kind(err)
    if cls is failures.LabBug:
        return failures.lab_bug(stage, err)
    if cls is failures.HostOutOfMemory:
        local = config is None or config.target == LOCAL
        return failures.host_oom(stage, err, device_is_host=local and jax.default_backend() == "cpu")
    if cls is failures.CompilerError:
        return failures.compiler_error(stage, err)
    hint = "the device ran out of memory: lower width, batch, seq or depth"
    if config is not None and config.preset:
        hint = f"the device ran out of memory: {_preset_hint(config)}"
    return failures.DeviceOutOfMemory(f"XLA failed while {stage}: {failures.xla_words(err)}. "
                                      f"{hint[0].upper() + hint[1:]}.")

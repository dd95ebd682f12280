"""The device's roofs (calibrated matmul peak FLOP/s and copy bandwidth) and a step's place under them."""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import hashlib
import json
import math
import os
import platform
import threading
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp

from remat_lab.program.timing import TIMING_LOCK

CALIBRATION_FILE = "calibration.json"
FILE_FORMAT = 1
MAX_FILE_ENTRIES = 8  # machines remembered in one file (a home directory shared between hosts)
# Square float32 matmul sizes and copy sizes per backend, and the seconds each part may take.
MATMUL_SIZES = {"cpu": (1024, 1536, 2048), "default": (4096, 8192)}
COPY_BYTES = {"cpu": 256 * 2**20, "default": 1024 * 2**20}
MATMUL_BUDGET_S = 1.4
COPY_BUDGET_S = 0.6
MAX_STALE_RECALIBRATIONS = 1  # per process: a step above the peak triggers at most this many
TIMING_LOCK_WAIT_S = 30.0

# name in device_kind -> (float32 FLOP/s, TF32 tensor-core FLOP/s or None, memory bytes/s); dense
# (no sparsity) spec-sheet numbers of the SXM/largest-memory variant.
GPU_SPECS = {
    "H200": (67e12, 494.7e12, 4.8e12), "H100": (67e12, 494.7e12, 3.35e12),
    "A100": (19.5e12, 156e12, 2.039e12), "V100": (15.7e12, None, 0.9e12),
    "L4": (30.3e12, 60e12, 0.3e12), "A10": (31.2e12, 62.5e12, 0.6e12),
    "T4": (8.1e12, None, 0.32e12),
}

_LOCK = threading.Lock()
_MEMO: dict[str, dict] = {}  # identity key -> calibration, this process
_STATE = {"stale_recalibrations": 0}


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


def _physical_from_cpuinfo(text: str) -> int | None:
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


def _physical_from_sysfs(root: Path) -> int | None:
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
        count = _physical_from_cpuinfo(Path("/proc/cpuinfo").read_text())
    if not count:
        count = _physical_from_sysfs(Path("/sys/devices/system/cpu"))
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


def _identity_key(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def cache_dir() -> Path:
    """The remat_lab cache directory, as ``program.backend.enable_compilation_cache`` computes it."""
    return Path(os.environ.get("REMAT_LAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "remat_lab", "jax"))


def calibration_path() -> Path:
    return cache_dir() / CALIBRATION_FILE


# ---------------------------------------------------------------- measuring


def _best_seconds(fn, args, budget_s: float, *, min_calls: int = 3, max_calls: int = 200,
                  donate: bool = False) -> tuple[float, int]:
    """Fastest of several calls of ``fn(*args)`` (each ended by ``block_until_ready``), and how many.

    One untimed warm-up call first. With ``donate`` the output is the next call's input.
    """
    clock = time.perf_counter
    out = jax.block_until_ready(fn(*args))
    if donate:
        args = (out,)
    best, calls, start = math.inf, 0, clock()
    while calls < min_calls or (clock() - start < budget_s and calls < max_calls):
        t0 = clock()
        out = jax.block_until_ready(fn(*args))
        best = min(best, clock() - t0)
        calls += 1
        if donate:
            args = (out,)
    return best, calls


def _measure_matmul(sizes, budget_s: float) -> dict:
    """Best float32 FLOP/s (2 n^3 per call) of jitted square matmuls, sizes in increasing order.

    The budget is shared: a size whose warm-up and two timed calls would not fit in what is left
    (projected from the best rate so far) is skipped, so a loaded machine cannot stretch it.
    """
    rates, calls, skipped = {}, {}, []
    deadline = time.perf_counter() + budget_s
    for i, n in enumerate(sorted(sizes)):
        left = deadline - time.perf_counter()
        if rates and (left <= 0 or 3 * 2.0 * n**3 / max(rates.values()) > left):
            skipped.append(n)
            continue
        a = jnp.full((n, n), 1.0 / n, jnp.float32)
        b = jnp.full((n, n), 0.5, jnp.float32)
        fn = jax.jit(jnp.matmul).lower(a, b).compile()
        share = (deadline - time.perf_counter()) / (len(sizes) - i)
        best, calls[n] = _best_seconds(fn, (a, b), share, min_calls=2)
        rates[n] = 2.0 * n**3 / best
        del a, b, fn
    return {"sizes": list(sizes), "skipped_sizes": skipped,
            "flops_per_s_by_size": {str(n): r for n, r in rates.items()},
            "calls_by_size": {str(n): c for n, c in calls.items()},
            "peak_flops_per_s": max(rates.values())}


def _measure_copy(nbytes: int, budget_s: float) -> dict:
    """Best bytes/s of a jitted ``x + 1`` over ``nbytes`` of float32, counted as read + written.

    The input buffer is donated, so the output reuses it: fresh output pages would measure page
    faults, not memory. Counting read + written matches XLA's "bytes accessed".
    """
    n = nbytes // 4
    x = jnp.zeros((n,), jnp.float32)
    with warnings.catch_warnings():  # a backend without donation warns; the copy still counts
        warnings.filterwarnings("ignore", message=".*[Dd]onat.*")
        fn = jax.jit(lambda v: v + 1.0, donate_argnums=0).lower(x).compile()
        best, calls = _best_seconds(fn, (x,), budget_s, min_calls=2, donate=True)
    return {"bytes": 4 * n, "op": "x + 1.0 on float32, input donated (in place)",
            "counted": "bytes read + bytes written", "calls": calls,
            "bandwidth_bytes_per_s": 2.0 * 4 * n / best}


def _measure(backend: str) -> dict:
    """Both roofs, measured now: {"peak_flops_per_s", "bandwidth_bytes_per_s", "details"}."""
    key = backend if backend in MATMUL_SIZES else "default"
    t0 = time.perf_counter()
    matmul = _measure_matmul(MATMUL_SIZES[key], MATMUL_BUDGET_S)
    mem = _measure_copy(COPY_BYTES.get(backend, COPY_BYTES["default"]), COPY_BUDGET_S)
    return {"peak_flops_per_s": matmul["peak_flops_per_s"],
            "bandwidth_bytes_per_s": mem["bandwidth_bytes_per_s"],
            "details": {"matmul": matmul, "copy": mem, "seconds": time.perf_counter() - t0,
                        "loadavg": _loadavg()}}


def _loadavg() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (a loaded machine calibrates low)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


@contextlib.contextmanager
def _timing_slot():
    """Hold the engine's timing lock while measuring, so no step is timed alongside (and vice
    versa). Waits at most ``TIMING_LOCK_WAIT_S``; yields whether the lock was held."""
    got = TIMING_LOCK.acquire(timeout=TIMING_LOCK_WAIT_S)
    try:
        yield got
    finally:
        if got:
            TIMING_LOCK.release()


def _peak_note(identity: dict) -> str:
    backend, precision = identity["backend"], identity["matmul_precision"]
    note = (f"calibrated: best jitted float32 matmul rate on this {identity['device_kind']} "
            f"(matmul precision {precision})")
    if backend == "cpu":
        note += (f", {identity['usable_cores']} usable of {identity['physical_cores']} physical "
                 f"cores ({identity['cpu_model']})")
    elif backend == "gpu" and precision in ("default", "fastest", "high", "tensorfloat32",
                                            "bfloat16", "bfloat16_3x"):
        note += ("; JAX's default float32 matmul precision runs on TF32 tensor cores on Ampere "
                 "and newer GPUs, so this is a TF32 rate (set jax_default_matmul_precision="
                 "'highest' for true float32)")
    elif backend == "tpu" and precision in ("default", "fastest", "bfloat16"):
        note += "; on TPU the default float32 matmul uses bfloat16 passes, so this is that rate"
    return note


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


# ---------------------------------------------------------------- calibration and its cache


def _valid_rate(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _read_file(path: Path) -> dict:
    """The file's {key: calibration} map; empty when missing, unreadable or malformed."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != FILE_FORMAT:
        return {}
    entries = doc.get("calibrations")
    return entries if isinstance(entries, dict) else {}


def _from_file(path: Path, key: str, identity: dict) -> dict | None:
    entry = _read_file(path).get(key)
    if (isinstance(entry, dict) and entry.get("machine") == identity
            and entry.get("peak_source") == "calibrated"
            and _valid_rate(entry.get("peak_flops_per_s"))
            and _valid_rate(entry.get("bandwidth_bytes_per_s"))):
        return entry
    return None


def _write_file(path: Path, key: str, entry: dict) -> str | None:
    """Add ``entry`` to the file (atomically, keeping the newest entries); an error text or None."""
    try:
        entries = _read_file(path)
        entries[key] = entry
        newest = sorted(entries.items(), key=lambda kv: str(kv[1].get("measured_at")
                                                            if isinstance(kv[1], dict) else ""))
        doc = {"format": FILE_FORMAT, "calibrations": dict(newest[-MAX_FILE_ENTRIES:])}
        os.makedirs(path.parent, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError as err:
        return f"{type(err).__name__}: {err}"
    return None


def clear_cache() -> None:
    """Forget this process's calibrations (the file stays)."""
    with _LOCK:
        _MEMO.clear()
        _STATE["stale_recalibrations"] = 0


def calibrate(force: bool = False) -> dict:
    """This machine's roofs, measured once per machine and cached in memory and on disk.

    Returns ``{"peak_flops_per_s", "bandwidth_bytes_per_s", "peak_source": "calibrated",
    "peak_note", "machine", "measured_at", "details"}``. The peak is the best rate of jitted
    float32 square matmuls (``MATMUL_SIZES``), the bandwidth that of an in-place ``x + 1`` over
    ``COPY_BYTES`` (read + written), each the fastest of several calls. About 2-3 s on a 2-core
    CPU, holding the engine's timing lock (do not call it while holding ``TIMING_LOCK``).

    Cached by ``machine_identity()`` in this process and in ``calibration.json`` in the cache
    directory (``$REMAT_LAB_CACHE_DIR``, default ``~/.cache/remat_lab/jax``); an entry for another
    identity is ignored. ``force`` measures again and replaces both. If measuring fails, the
    spec-sheet roofs (``peak_source`` "spec", numbers possibly None) are returned, not cached.
    ``details["cache"]`` says where this answer came from: "measured", "file" or "memory".
    """
    return _calibrate(force)


def _calibrate(force: bool, previous: dict | None = None) -> dict:
    """``calibrate``; with ``previous`` (a calibration found too low) measure again and keep, for
    each roof, the higher of the new and the previous figure (both are best-of measurements)."""
    identity = machine_identity()
    key = _identity_key(identity)
    path = calibration_path()
    with _LOCK:
        if not force:
            if key in _MEMO:
                return _answer(_MEMO[key], "memory")
            entry = _from_file(path, key, identity)
            if entry is not None:
                _MEMO[key] = entry
                return _answer(entry, "file")
        try:
            with _timing_slot() as held:
                measured = _measure(identity["backend"])
        except Exception as err:  # noqa: BLE001 - fall back to the spec sheet, and say why
            spec = spec_roofs(identity)
            spec["details"] = {"calibration_error": f"{type(err).__name__}: {str(err)[:200]}"}
            return spec
        if not (_valid_rate(measured["peak_flops_per_s"])
                and _valid_rate(measured["bandwidth_bytes_per_s"])):
            spec = spec_roofs(identity)
            spec["details"] = {"calibration_error": "non-positive or non-finite measurement",
                               "measured": measured}
            return spec
        details = {**measured.get("details", {}), "timing_lock_held": held}
        peak, bandwidth = float(measured["peak_flops_per_s"]), float(measured["bandwidth_bytes_per_s"])
        if previous and previous.get("peak_source") == "calibrated" and previous.get(
                "machine") == identity:
            details["measured_now"] = {"peak_flops_per_s": peak, "bandwidth_bytes_per_s": bandwidth}
            details["previous"] = {k: previous.get(k) for k in (
                "peak_flops_per_s", "bandwidth_bytes_per_s", "measured_at")}
            peak = max(peak, _positive(previous.get("peak_flops_per_s")) or 0.0)
            bandwidth = max(bandwidth, _positive(previous.get("bandwidth_bytes_per_s")) or 0.0)
        entry = {"peak_flops_per_s": peak, "bandwidth_bytes_per_s": bandwidth,
                 "peak_source": "calibrated", "peak_note": _peak_note(identity),
                 "machine": identity,
                 "measured_at": datetime.datetime.now(datetime.UTC).isoformat(
                     timespec="seconds"),
                 "details": details}
        error = _write_file(path, key, entry)
        entry["details"]["cache_file"] = None if error else str(path)
        if error:
            entry["details"]["cache_file_error"] = error
        _MEMO[key] = entry
        return _answer(entry, "measured")


def recalibrate() -> dict:
    """Measure again and keep, per roof, the higher of the stored and the new figure (a busy
    machine only ever makes a best-of measurement read low): ``python -m remat_lab calibrate``."""
    return _calibrate(True, previous=calibrate())


def _answer(entry: dict, source: str) -> dict:
    out = copy.deepcopy(entry)
    out.setdefault("details", {})["cache"] = source
    return out


def peak_flops() -> tuple[float | None, str]:
    """(peak float32 FLOP/s, how it was obtained): ``calibrate()``'s peak and its note.

    The note starts with the source, "calibrated:" or "spec:". Kept for older callers; new code
    uses ``roofline_report``.
    """
    roofs = calibrate()
    return roofs["peak_flops_per_s"], roofs["peak_note"]


# ---------------------------------------------------------------- one step under the roofs


def _positive(x) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def xla_cost(compiled) -> dict:
    """XLA's cost analysis of a compiled program: ``{"flops", "bytes_accessed"}`` (None if absent).

    XLA counts a while loop's body once, whatever its trip count: scale both by the trip count
    (or use an unrolled program) before passing them to ``roofline_report``.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        cost = None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    cost = cost or {}
    return {"flops": _positive(cost.get("flops")), "bytes_accessed": _positive(cost.get("bytes accessed"))}


def _place(roofs: dict, flops, bytes_accessed, median_s) -> dict:
    peak = _positive(roofs.get("peak_flops_per_s"))
    bandwidth = _positive(roofs.get("bandwidth_bytes_per_s"))
    flops, nbytes, median_s = _positive(flops), _positive(bytes_accessed), _positive(median_s)
    achieved = flops / median_s if flops and median_s else None
    intensity = flops / nbytes if flops and nbytes else None
    memory_roof = intensity * bandwidth if intensity and bandwidth else None
    attainable = (min(peak, memory_roof) if peak and memory_roof else peak if peak and bandwidth
                  is None else None)
    bound = None
    if peak and memory_roof:
        bound = "memory" if memory_roof < peak else "compute"
    return {
        "peak_flops_per_s": peak, "peak_source": roofs.get("peak_source"),
        "peak_note": roofs.get("peak_note"), "bandwidth_bytes_per_s": bandwidth,
        "ridge_intensity": peak / bandwidth if peak and bandwidth else None,
        "flops": flops, "bytes_accessed": nbytes, "median_s": median_s,
        "arithmetic_intensity": intensity, "achieved_flops_per_s": achieved,
        "attainable_flops_per_s": attainable, "bound": bound,
        "achieved_fraction": achieved / peak if achieved and peak else None,
        "fraction_of_attainable": achieved / attainable if achieved and attainable else None,
        "calibrated_at": roofs.get("measured_at"),
    }


def roofline_report(flops: float | None, bytes_accessed: float | None,
                    median_s: float | None) -> dict:
    """Where one step sits under this machine's roofs: the engine's ``result["roofline"]``.

    Wiring in ``run_experiment``, after timing and outside ``timing_slot`` (it may calibrate)::

        cost = roofline.xla_cost(compiled)  # XLA's "flops" and "bytes accessed"
        result["roofline"] = roofline_report(cost["flops"], cost["bytes_accessed"], median)

    ``flops`` and ``bytes_accessed`` come from XLA's cost analysis, which counts a while-loop
    body once: the caller passes numbers already scaled by trip counts. ``median_s`` is the
    median step time. Keys (None where an input is missing, never an error):

    - ``peak_flops_per_s``, ``peak_source`` ("calibrated" or "spec"), ``peak_note``,
      ``bandwidth_bytes_per_s``, ``ridge_intensity`` (peak / bandwidth), ``calibrated_at``;
    - ``flops``, ``bytes_accessed``, ``median_s`` (the inputs, as used);
    - ``arithmetic_intensity`` = flops / bytes accessed (FLOP/byte);
    - ``achieved_flops_per_s`` = flops / median_s;
    - ``attainable_flops_per_s`` = min(peak, intensity x bandwidth);
    - ``bound``: "compute" or "memory" (which roof is lower at this intensity);
    - ``achieved_fraction`` = achieved / peak, ``fraction_of_attainable`` = achieved / attainable;
    - ``stale_calibration`` (bool), ``above_memory_roof`` (bool), ``notes`` (list of str).

    No fraction is ever above 1. A step faster than the calibrated peak means the calibration is
    stale (measured under load, or the machine changed): it is measured again once per process,
    keeping the higher of the old and new figures, and the report recomputed; if the step is
    still faster, the fraction is capped at 1.0 and ``stale_calibration`` is true. A step above
    the memory roof (its working set stays in cache, so XLA's bytes accessed overstate memory
    traffic) has ``fraction_of_attainable`` capped at 1.0 and ``above_memory_roof`` true.
    """
    notes: list[str] = []
    try:
        roofs = calibrate()
    except Exception as err:  # noqa: BLE001 - a report without roofs rather than no result
        roofs = {"peak_source": None, "peak_note": f"no roofs: {type(err).__name__}: {err}"}
    report = _place(roofs, flops, bytes_accessed, median_s)
    stale = bool(report["achieved_fraction"] and report["achieved_fraction"] > 1.0)
    if stale and report["peak_source"] == "calibrated":
        with _LOCK:
            again = _STATE["stale_recalibrations"] < MAX_STALE_RECALIBRATIONS
            _STATE["stale_recalibrations"] += again
        if again:
            before = report["peak_flops_per_s"]
            with contextlib.suppress(Exception):
                roofs = _calibrate(True, previous=roofs)
                report = _place(roofs, flops, bytes_accessed, median_s)
            notes.append(f"step ran above the calibrated peak {before / 1e9:.1f} GFLOP/s: "
                         f"recalibrated ({(report['peak_flops_per_s'] or 0) / 1e9:.1f} GFLOP/s)")
        stale = bool(report["achieved_fraction"] and report["achieved_fraction"] > 1.0)
    if stale:
        notes.append(f"achieved {report['achieved_flops_per_s'] / 1e9:.1f} GFLOP/s is above the "
                     f"{report['peak_source']} peak {report['peak_flops_per_s'] / 1e9:.1f} "
                     "GFLOP/s: the peak is stale or too low; fraction capped at 1.0")
        report["achieved_fraction"] = 1.0
    above_memory = bool(report["fraction_of_attainable"] and report["fraction_of_attainable"] > 1.0)
    if above_memory:
        if report["bound"] == "memory":
            notes.append("above the memory roof: the working set stays in cache, so XLA's bytes "
                         "accessed overstate memory traffic; fraction of attainable capped at 1.0")
        report["fraction_of_attainable"] = 1.0
    report["stale_calibration"] = stale
    report["above_memory_roof"] = above_memory and report["bound"] == "memory"
    report["notes"] = notes
    return report

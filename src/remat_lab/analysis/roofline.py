"""The device's roofs (calibrated matmul peak FLOP/s and copy bandwidth) and a step's place under them."""

# The roofs are measured by ``calibration`` on the machine that ``machine`` describes and cached here
# per machine, in this process and in ``calibration.json`` (the one file this module writes);
# ``intensity`` does the arithmetic of a step's place under them. Their names are re-exported below,
# so ``roofline.cpu_info``, ``roofline.xla_cost`` and the rest keep working. ``_calibrate`` calls
# ``_measure`` through this module's namespace: replacing ``roofline._measure`` replaces what runs.

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import math
import os
import threading
from pathlib import Path

from remat_lab.analysis.calibration import measure as _measure
from remat_lab.analysis.calibration import peak_note as _peak_note
from remat_lab.analysis.calibration import timing_slot as _timing_slot
from remat_lab.analysis.intensity import place as _place
from remat_lab.analysis.intensity import positive as _positive
from remat_lab.analysis.intensity import xla_cost
from remat_lab.analysis.machine import (
    cpu_count,
    cpu_info,
    machine_identity,
    matmul_precision,
    physical_core_count,
    spec_roofs,
)
from remat_lab.analysis.machine import identity_key as _identity_key
from remat_lab.analysis.machine import physical_from_cpuinfo as _physical_from_cpuinfo
from remat_lab.analysis.machine import physical_from_sysfs as _physical_from_sysfs
from remat_lab.config.targets import TARGETS

__all__ = [
    # the cached roofs and the report (this module)
    "CALIBRATION_FILE", "FILE_FORMAT", "cache_dir", "calibrate", "calibration_path", "clear_cache",
    "CALIBRATED_PEAK", "peak_flops", "recalibrate", "roofline_report", "stated_peak",
    # re-exported from machine, calibration and intensity (callers and tests reach them here)
    "_identity_key", "_measure", "_peak_note", "_physical_from_cpuinfo", "_physical_from_sysfs",
    "cpu_count", "cpu_info", "machine_identity", "matmul_precision", "physical_core_count",
    "spec_roofs", "xla_cost",
]

CALIBRATION_FILE = "calibration.json"
FILE_FORMAT = 1
MAX_FILE_ENTRIES = 8  # machines remembered in one file (a home directory shared between hosts)
MAX_STALE_RECALIBRATIONS = 1  # per process: a step above the peak triggers at most this many

_LOCK = threading.Lock()
_MEMO: dict[str, dict] = {}  # identity key -> calibration, this process
_STATE = {"stale_recalibrations": 0}


def cache_dir() -> Path:
    """The remat_lab cache directory, as ``program.backend.enable_compilation_cache`` computes it."""
    return Path(os.environ.get("REMAT_LAB_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "remat_lab", "jax"))


def calibration_path() -> Path:
    return cache_dir() / CALIBRATION_FILE


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
    identity is ignored. ``force`` measures again and stores, per roof, the higher of the new and
    the stored figure (a measurement under load never lowers the peak). If measuring fails, the
    spec-sheet roofs (``peak_source`` "spec", numbers possibly None) are returned, not cached.
    ``details["cache"]`` says where this answer came from: "measured", "file" or "memory".
    """
    return _calibrate(force)


def _calibrate(force: bool, previous: dict | None = None) -> dict:
    """``calibrate``; measuring again (``force``, or ``previous``: a calibration found too low)
    keeps, for each roof, the higher of the new and the stored figure: both are best-of
    measurements, and one taken under load only ever reads low."""
    identity = machine_identity()
    key = _identity_key(identity)
    path = calibration_path()
    with _LOCK:
        if not force and key in _MEMO:
            return _answer(_MEMO[key], "memory")
        stored = _MEMO.get(key) or _from_file(path, key, identity)
        if not force and stored is not None:
            _MEMO[key] = stored
            return _answer(stored, "file")
        previous = previous or stored  # measuring again never lowers the stored roofs (best-of)
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


CALIBRATED_PEAK = "calibrated best matmul rate, not a vendor peak"


def stated_peak(dtype: str = "float32", identity: dict | None = None) -> dict:
    """The peak FLOP/s that MFU and HFU are stated against, and what it is.

    ``{"peak_flops_per_s", "peak_kind", "peak_source"}``. On a device named in
    ``config/targets.json`` (its ``device_kind``): the vendor's dense figure for ``dtype``
    (``peak_kind`` "vendor"; float32 on a GPU at JAX's default matmul precision is its TF32 figure).
    Elsewhere (every CPU): this machine's calibrated best matmul rate (``peak_kind`` "calibrated",
    the source saying it is not a vendor peak); None when neither is known.
    """
    identity = identity or machine_identity()
    kind = str(identity.get("device_kind", "")).lower()
    for t in TARGETS.values():
        if identity.get("backend") != "cpu" and t.device_kind.lower() == kind:
            key = dtype
            if (dtype == "float32" and t.platform == "cuda" and "tf32" in t.peak_flops
                    and identity.get("matmul_precision") not in ("highest", "float32")):
                key = "tf32"
            if key in t.peak_flops:
                return {"peak_flops_per_s": t.peak_flops[key], "peak_kind": "vendor",
                        "peak_source": f"vendor: {t.device_kind} dense {key} peak ({t.source})"}
    try:
        roofs = calibrate()
    except Exception as err:  # noqa: BLE001 - rates without fractions rather than no answer
        return {"peak_flops_per_s": None, "peak_kind": None,
                "peak_source": f"no peak: {type(err).__name__}: {str(err)[:120]}"}
    if roofs.get("peak_source") != "calibrated":
        return {"peak_flops_per_s": roofs.get("peak_flops_per_s"), "peak_kind": "spec",
                "peak_source": str(roofs.get("peak_note"))}
    return {"peak_flops_per_s": roofs["peak_flops_per_s"], "peak_kind": "calibrated",
            "peak_source": f"{CALIBRATED_PEAK} ({roofs.get('peak_note')}; measured "
                           f"{roofs.get('measured_at')})"}


# ---------------------------------------------------------------- one step under the roofs


def _for_dtype(roofs: dict, dtype: str) -> dict:
    """The roofs with the peak of the program's compute ``dtype``: the calibration's matmul is
    float32's; on a catalogued accelerator a bfloat16 program is placed under the vendor's dense
    bfloat16 peak (``stated_peak``), its bandwidth the calibration's. Else unchanged."""
    if dtype == "float32" or roofs.get("peak_source") != "calibrated":
        return roofs
    stated = stated_peak(dtype)
    if stated["peak_kind"] != "vendor":  # a CPU, or an accelerator the lab does not catalogue
        return roofs
    return {**roofs, "peak_flops_per_s": stated["peak_flops_per_s"], "peak_source": "vendor",
            "peak_note": f"{stated['peak_source']}: the program computes in {dtype}; the calibrated "
                         f"float32 matmul rate is {roofs['peak_flops_per_s'] / 1e12:.1f} TFLOP/s"}


def roofline_report(flops: float | None, bytes_accessed: float | None,
                    median_s: float | None, dtype: str = "float32") -> dict:
    """Where one step sits under this machine's roofs: the engine's ``result["roofline"]``.

    Wiring in ``run_experiment``, after timing and outside ``timing_slot`` (it may calibrate)::

        cost = roofline.xla_cost(compiled)  # XLA's "flops" and "bytes accessed"
        result["roofline"] = roofline_report(cost["flops"], cost["bytes_accessed"], median)

    ``flops`` and ``bytes_accessed`` come from XLA's cost analysis, which counts a while-loop
    body once: the caller passes numbers already scaled by trip counts. ``median_s`` is the
    median step time. Keys (None where an input is missing, never an error):

    - ``peak_flops_per_s``, ``peak_source`` ("calibrated", "spec", or "vendor": a catalogued
      accelerator's dense peak of the program's compute ``dtype`` when it is not float32), ``peak_note``,
      ``bandwidth_bytes_per_s``, ``ridge_intensity`` (peak / bandwidth), ``calibrated_at``;
    - ``flops``, ``bytes_accessed``, ``median_s`` (the inputs, as used);
    - ``arithmetic_intensity`` = flops / bytes accessed (FLOP/byte);
    - ``achieved_flops_per_s`` = flops / median_s;
    - ``attainable_flops_per_s`` = min(peak, intensity x bandwidth);
    - ``bound``: "compute" or "memory" (which roof is lower at this intensity);
    - ``achieved_fraction`` = achieved / peak, ``fraction_of_attainable`` = achieved / attainable;
    - ``stale_calibration`` (bool), ``above_memory_roof`` (bool), ``notes`` (list of str).

    A step faster than the calibrated peak means the calibration is stale (measured under load,
    or the machine changed): it is measured again once per process, keeping the higher of the old
    and new figures, and the report recomputed; if the step is still faster, the fraction stays
    above 1 (never capped: it measures the peak's error), ``stale_calibration`` is true and a
    note names it a calibration error. A step above
    the memory roof (its working set stays in cache, so XLA's bytes accessed overstate memory
    traffic) has ``fraction_of_attainable`` capped at 1.0 and ``above_memory_roof`` true.
    """
    notes: list[str] = []
    try:
        roofs = calibrate()
    except Exception as err:  # noqa: BLE001 - a report without roofs rather than no result
        roofs = {"peak_source": None, "peak_note": f"no roofs: {type(err).__name__}: {err}"}
    report = _place(_for_dtype(roofs, dtype), flops, bytes_accessed, median_s)
    stale = bool(report["achieved_fraction"] and report["achieved_fraction"] > 1.0)
    if stale and report["peak_source"] == "calibrated":
        with _LOCK:
            again = _STATE["stale_recalibrations"] < MAX_STALE_RECALIBRATIONS
            _STATE["stale_recalibrations"] += again
        if again:
            before = report["peak_flops_per_s"]
            with contextlib.suppress(Exception):
                roofs = _calibrate(True, previous=roofs)
                report = _place(_for_dtype(roofs, dtype), flops, bytes_accessed, median_s)
            notes.append(f"step ran above the calibrated peak {before / 1e9:.1f} GFLOP/s: "
                         f"recalibrated ({(report['peak_flops_per_s'] or 0) / 1e9:.1f} GFLOP/s)")
        stale = bool(report["achieved_fraction"] and report["achieved_fraction"] > 1.0)
    if stale:  # reported as it is: a fraction over 1 is the peak's error, not the step's
        notes.append(f"calibration error: achieved {report['achieved_flops_per_s'] / 1e9:.1f} "
                     f"GFLOP/s is above the {report['peak_source']} peak "
                     f"{report['peak_flops_per_s'] / 1e9:.1f} GFLOP/s, so the peak is too low "
                     f"(fraction {report['achieved_fraction']:.2f}, not capped); run "
                     "`python -m remat_lab calibrate` on an idle machine")
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

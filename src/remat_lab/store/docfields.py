"""Physical ranges of a results document's numbers, and the compact copy of it that the views draw.

A document whose types are right may still hold numbers no machine measures: negative or absurd
bytes, times, counts. ``check`` refuses them per document with the field named and the value echoed
in at most ``ECHO`` characters. ``compact`` keeps only the fields the Open results views read (no
program texts, no per-policy timelines); a run keeps its per-dot, residual and timeline detail only
when asked (the first runs of a file, which a one-run view draws).
"""

from __future__ import annotations

import sys

from remat_lab.config import LIMITS

ECHO = 20  # characters of an uploaded value echoed in a message
MAX_BYTES_VALUE = 1 << 50  # 1 PiB: no device holds more
MAX_SECONDS = 7 * 86400.0  # a week: a step, a compile or a search beyond it is not a measurement
MAX_FLOPS = 1e24
MAX_COUNT = 10**9  # dots, probes, rounds
MAX_DEVICES = 1 << 20
MAX_ROWS = 1000  # rows of one comparison or advice
MAX_LIST = 10_000  # entries of one list: samples, dots, residuals, probes


class Invalid(ValueError):
    """A document that does not have the documented shape; the message names the field."""


def echo(value: object, limit: int = ECHO) -> str:
    """``value`` for a message, at most ``limit`` characters (a 4,000-digit number is cut)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** (limit + 1):
        try:
            return f"a {'negative ' if value < 0 else ''}{len(str(abs(value))):,}-digit number"
        except ValueError:  # over Python's limit on printing ints
            return "a number of thousands of digits"
    try:
        text = repr(value) if not isinstance(value, str) else repr(value[:limit + 1])
    except ValueError:  # an int too long to print
        return "a very long number"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _range(value, where: str, hi: float, lo: float = 0.0, unit: str = "") -> None:
    """``value`` (None: absent) must be a finite number from ``lo`` to ``hi``."""
    if value is None or not _number(value):
        return
    if value != value or value in (float("inf"), float("-inf")):
        raise Invalid(f"{where} is not a finite number")
    if value < lo:
        raise Invalid(f"{where} is negative ({echo(value)})" if lo == 0 else
                      f"{where} must be at least {lo:g}; got {echo(value)}")
    if value > hi:
        raise Invalid(f"{where} is {echo(value)}: over {hi:g}{unit}, not a measurement")


def _bytes(value, where: str) -> None:
    _range(value, where, MAX_BYTES_VALUE, unit=" bytes (1 PiB)")


def _seconds(value, where: str) -> None:
    _range(value, where, MAX_SECONDS, unit=" s (a week)")


def _length(items, where: str, most: int = MAX_LIST) -> None:
    if isinstance(items, list) and len(items) > most:
        raise Invalid(f"{where} has {len(items):,} entries; at most {most:,} are read")


def _environment(env) -> None:
    if isinstance(env, dict):
        _range(env.get("device_count"), "environment.device_count", MAX_DEVICES, lo=1)


def check_run(doc: dict) -> None:
    """A run document's bytes, times and counts are ones a machine can measure."""
    _environment(doc.get("environment"))
    for key, value in (doc.get("memory") or {}).items():
        if key.endswith("_bytes"):
            _bytes(value, f"memory.{key}")
    tot = doc.get("totals") or {}
    for key in ("residual_bytes", "activation_residual_bytes", "parameter_residual_bytes"):
        _bytes(tot.get(key), f"totals.{key}")
    for key in ("dots_saved", "dots_recomputed"):
        _range(tot.get(key), f"totals.{key}", MAX_COUNT)
    _range(tot.get("recompute_flops"), "totals.recompute_flops", MAX_FLOPS)
    hlo = doc.get("hlo") or {}
    _range(hlo.get("dot_count"), "hlo.dot_count", MAX_COUNT)
    _range(hlo.get("excess_dots_vs_no_remat"), "hlo.excess_dots_vs_no_remat", MAX_COUNT, lo=-MAX_COUNT)
    _range(hlo.get("excess_flops_vs_no_remat"), "hlo.excess_flops_vs_no_remat", MAX_FLOPS, lo=-MAX_FLOPS)
    step = doc.get("step_time_s") or {}
    for key in ("median", "p25", "p75", "min", "max", "ci_low", "ci_high"):
        _seconds(step.get(key), f"step_time_s.{key}")
    for key in ("repeats", "warmup"):
        lo, hi = LIMITS[key]
        _range(step.get(key), f"step_time_s.{key}", hi, lo=lo)
    _length(step.get("samples"), "step_time_s.samples")
    for i, s in enumerate(step.get("samples") or []):
        _seconds(s, f"step_time_s.samples[{i}]")
    _seconds((doc.get("compile") or {}).get("compile_s"), "compile.compile_s")
    _range(doc.get("flops"), "flops", MAX_FLOPS)
    for key in ("dots", "residuals", "notes"):
        _length(doc.get(key), key)


def check_compare(doc: dict) -> None:
    """A comparison's times and bytes are ones a machine can measure."""
    _environment(doc.get("environment"))
    _length(doc["rows"], "rows", MAX_ROWS)
    for i, row in enumerate(doc["rows"]):
        for key in ("median_s", "ci_low_s", "ci_high_s"):
            _seconds(row.get(key), f"rows[{i}].{key}")
        for key, value in row.items():
            if key.endswith("_bytes"):
                _bytes(value, f"rows[{i}].{key}")
        _length(row["samples_s"], f"rows[{i}].samples_s")
        for j, s in enumerate(row["samples_s"]):
            _seconds(s, f"rows[{i}].samples_s[{j}]")
    for key in ("rounds", "calls_per_round"):
        _range(doc["method"].get(key), f"method.{key}", MAX_COUNT)


def check_advice(doc: dict) -> None:
    """An advice's budget, batches, times and rates are ones a machine can measure."""
    _environment(doc.get("environment"))
    _bytes(doc["budget_bytes"], "budget_bytes")
    _seconds(doc["search_s"], "search_s")
    _range(doc.get("peak_flops_per_s"), "peak_flops_per_s", MAX_FLOPS)
    _length(doc["rows"], "rows", MAX_ROWS)
    batch = LIMITS["batch"][1]
    for i, row in enumerate(doc["rows"]):
        at = f"rows[{i}]."
        _range(row["max_batch"], at + "max_batch", batch)
        _range(row.get("next_batch"), at + "next_batch", batch + 1)
        _bytes(row.get("peak_bytes"), at + "peak_bytes")
        _bytes(row.get("next_peak_bytes"), at + "next_peak_bytes")
        _seconds(row.get("step_time_s"), at + "step_time_s")
        for key in ("examples_per_s", "model_flops", "hardware_flops"):
            _range(row.get(key), at + key, MAX_FLOPS)
        for key in ("mfu", "hfu"):
            _range(row.get(key), at + key, 1000.0)
        _range(row.get("recompute_overhead"), at + "recompute_overhead", 1000.0, lo=-1000.0)
        _length(row["probes"], at + "probes")
        for j, probe in enumerate(row["probes"]):
            _range(probe["batch"], f"{at}probes[{j}].batch", batch + 1)
            _bytes(probe["peak_bytes"], f"{at}probes[{j}].peak_bytes")


CHECKS = {"run": check_run, "compare": check_compare, "advice": check_advice}


def check(kind: str, doc: dict) -> None:
    """Raise ``Invalid`` when a number of the document ``kind`` is outside its physical range."""
    if kind in CHECKS:
        CHECKS[kind](doc)


# What the views read (pages/_views.py, present/tables.py); everything else is dropped.
RUN_CONFIG = ("model", "width", "batch", "seq", "depth", "dtype", "policy", "objective", "heads", "stack",
              "model_module", "input_shape")  # the user's block: its factory as text, never loaded
ENV_KEEP = ("backend", "device_kind", "device_count", "jax")
STEP_KEEP = ("median", "p25", "p75", "min", "max", "repeats", "warmup", "ci_low", "ci_high")
MEMORY_KEEP = tuple(f"{p}_bytes" for p in ("argument", "output", "alias", "temp", "generated_code", "peak"))
TOTALS_KEEP = ("residual_bytes", "activation_residual_bytes", "parameter_residual_bytes", "dots_saved",
               "dots_recomputed", "recompute_flops")
HLO_KEEP = ("dot_count", "excess_dots_vs_no_remat", "excess_flops_vs_no_remat", "identical_to")
DETAIL = ("dots", "residuals", "memory_timeline", "notes")
COMPARE_KEEP = ("schema", "config", "environment", "policies", "rows", "fastest", "fastest_group",
                "fastest_reason", "pareto", "pareto_reason", "programs", "failed", "method")
ADVICE_KEEP = ("schema", "kind", "budget_bytes", "budget_source", "config", "policies", "rows",
               "recommended", "near_ties", "reason", "search_s", "notes", "timed", "peak_flops_per_s",
               "peak_source", "method", "environment", "decision", "time_budget_s", "rounds",
               "stopped_because", "timing", "peak_kind", "precision", "static", "attention", "log")
TEXT = 2000  # characters kept of an error message or a configuration value of an error row


def _short(value):
    """Short strings interned (one copy for thousands of rows); long ones cut to ``TEXT``."""
    if isinstance(value, str):
        return sys.intern(value) if len(value) <= 64 else value[:TEXT]
    return value


def pick(part, keys) -> dict | None:
    """The ``keys`` of the object ``part`` that it has (None when it is not an object)."""
    if not isinstance(part, dict):
        return None
    return {k: _short(part[k]) for k in keys if k in part}


def compact(kind: str, doc: dict, detailed: bool = False) -> dict:
    """The fields of a valid document that the views draw; ``detailed`` keeps a run's tables too."""
    if kind == "compare":
        return {**{k: doc[k] for k in COMPARE_KEEP if k in doc},
                "environment": pick(doc["environment"], ENV_KEEP)}
    if kind == "advice":
        return {k: doc[k] for k in ADVICE_KEEP if k in doc}
    if kind == "error":
        err = doc["error"]
        out = {"config": pick(doc["config"], ("policy", "width", "batch", "model")),
               "error": {"kind": _short(err["kind"]), "message": _short(err["message"])}}
        if doc.get("environment") is not None:
            out["environment"] = pick(doc["environment"], ENV_KEEP)
        return out
    out = {"schema": doc.get("schema", 1),
           "config": dict(doc["config"]) if detailed else pick(doc["config"], RUN_CONFIG),
           "environment": pick(doc["environment"], ENV_KEEP)}
    step = doc.get("step_time_s")
    if step is not None:
        out["step_time_s"] = pick(step, (*STEP_KEEP, "samples") if detailed else STEP_KEEP)
    for key, keep in (("memory", MEMORY_KEEP), ("totals", TOTALS_KEEP), ("hlo", HLO_KEEP),
                      ("compile", ("compile_s", "log") if detailed else ("compile_s",)),
                      ("gradient_check", ("ok",))):
        if doc.get(key) is not None:
            out[key] = pick(doc[key], keep)
    if doc.get("flops") is not None:
        out["flops"] = doc["flops"]
    if detailed:
        out.update({k: doc[k] for k in DETAIL if doc.get(k) is not None})
    return out

"""Reading results files (run, sweep, comparison and advice documents) safely: size, schema, types, ranges.

Only ``json`` touches the bytes, one document at a time (``docstream``): nothing is executed or
unpickled and the whole text is never held. A file over ``MAX_BYTES`` is refused whole; otherwise
every document (a line of a ``.jsonl`` file, the one document of a ``.json`` file, or each item of a
JSON list) is checked on its own, types then physical ranges (``docfields``), and a bad one is named
with the reason while the good ones are kept, compact (only what the views draw). Documents without
``schema`` (written before it existed) are read as schema 1 when they have its shape; a newer schema
is refused with a sentence. At most ``MAX_KEPT`` documents are kept per file and the reading stops
with a sentence when the process's memory would pass its budget.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import BinaryIO

from remat_lab.config import ConfigError, RunConfig, mesh_devices
from remat_lab.store import docfields, docstream
from remat_lab.store.bytecache import deep_size
from remat_lab.store.docfields import Invalid, echo

SCHEMA = 1
MAX_BYTES = 20 * 1024 * 1024  # matches the upload widget's limit (20 MB)
MAX_PROBLEMS = 20  # messages kept per file (the count says how many more)
MAX_KEPT = 20_000  # runs and error rows kept per file; the reading stops there
MAX_BIG_KEPT = 20  # comparisons and advice kept per file (each is drawn in full)
DETAIL_RUNS = 3  # the first runs of a file keep their per-dot, residual and timeline detail
DETAIL_BYTES = 16 * 1024 * 1024  # ... when that detail takes at most this much memory

NUM = "number"  # int or float, not bool
OPT = object()  # marker: the key may be missing or null


@dataclass
class Loaded:
    """What one file held: valid runs, comparisons and error rows (compact), and a message per bad part."""

    name: str
    runs: list[dict] = field(default_factory=list)
    compares: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    advice: list[dict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    bad: int = 0  # documents refused
    nbytes: int = 0  # the file's size
    sha256: str = ""  # of the file's bytes, when the caller hashed them (the cache's key)
    stopped: str = ""  # why the reading stopped before the end of the file, in words
    details_dropped: int = 0  # runs kept without their detail tables (too big)

    def refuse(self, where: str, why: str) -> None:
        self.bad += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(f"{where}: {why}")

    @property
    def count(self) -> int:
        return len(self.runs) + len(self.compares) + len(self.errors) + len(self.advice)


def _type_name(value) -> str:
    return {dict: "an object", list: "a list", str: "text", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")


def _is(value, kind) -> bool:
    if kind == NUM:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))


def _check(doc: dict, spec: dict, path: str = "") -> None:
    """Each key of ``spec``: a kind (NUM, str, bool, int, list, dict), a nested spec, or (OPT, kind)."""
    for key, kind in spec.items():
        where = f"{path}{key}"
        optional = isinstance(kind, tuple) and kind[0] is OPT
        kind = kind[1] if optional else kind
        if key not in doc or doc[key] is None:
            if optional:
                continue
            raise Invalid(f"{where} is missing")
        value = doc[key]
        if isinstance(kind, dict):
            if not isinstance(value, dict):
                raise Invalid(f"{where} must be an object, not {_type_name(value)}")
            _check(value, kind, where + ".")
        elif not _is(value, kind):
            want = "a number" if kind == NUM else _type_name(kind())
            raise Invalid(f"{where} must be {want}, not {_type_name(value)}")


ENV = {"backend": str, "device_kind": str, "device_count": int, "jax": str}
STEP = {"median": NUM, "p25": NUM, "p75": NUM, "min": NUM, "max": NUM, "repeats": int, "warmup": int,
        "samples": (OPT, list), "ci_low": (OPT, NUM), "ci_high": (OPT, NUM)}  # ci: sweeps, interleaved
MEMORY = {**{f"{p}_bytes": NUM for p in ("argument", "output", "alias", "temp", "generated_code", "peak")},
          "by_kind": (OPT, dict), "by_kind_source": (OPT, str), "by_kind_other": (OPT, dict)}
# XLA's and JAX's log lines and warnings, summarized (program/native_log.Captured.document)
LOG = {"lines": int, "xla_remat_lines": list, "xla_lines": list, "warnings": list,
       "warnings_total": int, "shown_with": (OPT, str)}
TOTALS = {**{k: NUM for k in ("residual_bytes", "activation_residual_bytes", "parameter_residual_bytes",
                              "dots_saved", "dots_recomputed")}, "recompute_flops": (OPT, NUM)}
HLO = {"dot_count": (OPT, NUM), "excess_dots_vs_no_remat": (OPT, NUM),
       "excess_flops_vs_no_remat": (OPT, NUM), "identical_to": (OPT, str)}
RUN = {"config": dict, "environment": ENV, "step_time_s": (OPT, STEP), "memory": (OPT, MEMORY),
       "totals": (OPT, TOTALS), "hlo": (OPT, HLO), "compile": (OPT, {"compile_s": NUM, "log": (OPT, LOG)}),
       "gradient_check": (OPT, {"ok": (OPT, bool)}), "dots": (OPT, list), "residuals": (OPT, list),
       "memory_timeline": (OPT, dict), "notes": (OPT, list), "flops": (OPT, NUM),
       "memory_measured": (OPT, {"measured_peak_bytes": NUM, "text": (OPT, str)})}
COMPARE_ROW = {"policy": str, "median_s": NUM, "ci_low_s": NUM, "ci_high_s": NUM, "samples_s": list,
               "peak_bytes": (OPT, NUM), "fastest": bool, "pareto": bool, "same_program_as": (OPT, str)}
COMPARE = {"config": dict, "environment": ENV, "policies": list, "rows": list, "fastest_reason": str,
           "pareto": list, "pareto_reason": (OPT, str), "programs": list, "failed": list,
           "method": {"rounds": int, "calls_per_round": int, "interval": str}}
CONFIG_KEYS = ("model", "width", "batch", "seq", "depth", "dtype", "policy", "objective")  # what views read
# The user's block (model user): its factory's name, kept as text (reading a document never loads it).
USER_CONFIG = {"model_module": (OPT, str), "input_shape": (OPT, list)}
PROBE = {"batch": int, "peak_bytes": NUM, "fits": bool}
ADVICE_ROW = {"policy": str, "max_batch": int, "peak_bytes": (OPT, NUM), "next_batch": (OPT, int),
              "next_peak_bytes": (OPT, NUM), "probes": list, "step_time_s": (OPT, NUM),
              "step_time_ci_s": (OPT, list), "examples_per_s": (OPT, NUM),
              "examples_per_s_ci": (OPT, list), "model_flops": (OPT, NUM), "no_remat_flops": (OPT, NUM),
              "hardware_flops": (OPT, NUM), "mfu": (OPT, NUM), "hfu": (OPT, NUM),
              "recompute_overhead": (OPT, NUM), "policy_recompute_overhead": (OPT, NUM),
              "xla_recompute_overhead": (OPT, NUM), "xla_remat_note": (OPT, str),
              "limited_by": (OPT, str), "race": (OPT, str),
              "not_timed": (OPT, str), "reason": (OPT, str),
              "same_program_as": (OPT, str), "per_device_batch": (OPT, int), "devices": (OPT, int),
              "by_kind": (OPT, dict), "by_kind_source": (OPT, str)}
PRECISION = {"params": str, "compute": str, "optimizer": str}
# An advice's static bytes per device (parameters, gradients, optimizer state; program/footprint.py)
STATIC = {"static_bytes_per_device": NUM, "fits": bool, "min_devices": (OPT, int)}
ADVICE = {"kind": str, "budget_bytes": NUM, "config": dict, "environment": ENV, "policies": list,
          "rows": list, "recommended": (OPT, str), "reason": str, "search_s": NUM, "timed": bool,
          "notes": (OPT, list), "peak_flops_per_s": (OPT, NUM), "peak_source": (OPT, str),
          "budget_source": (OPT, str), "method": (OPT, dict), "peak_kind": (OPT, str),
          "decision": (OPT, {"pick": (OPT, str), "why": str, "cannot_show": (OPT, list)}),
          "time_budget_s": (OPT, NUM), "rounds": (OPT, NUM), "stopped_because": (OPT, str),
          "timing": (OPT, dict), "precision": (OPT, PRECISION), "static": (OPT, STATIC),
          "attention": (OPT, str), "log": (OPT, LOG)}
ERROR_ROW = {"config": dict, "error": {"kind": str, "message": str}, "environment": (OPT, ENV)}


def _config(raw: dict, *, policy_optional: bool = False) -> None:
    """The configuration must be one this version can run (names and ranges of ``RunConfig``)."""
    needed = [k for k in CONFIG_KEYS if k not in raw and not (policy_optional and k == "policy")]
    if needed:
        raise Invalid(f"config.{needed[0]} is missing")
    _check(raw, USER_CONFIG, "config.")
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    if policy_optional and "policy" not in values:
        values["policy"] = "custom" if values.get("save_names") or values.get("offload_names") else "no_remat"
    try:
        RunConfig(**values)
    except TypeError as err:
        raise Invalid(f"config has a field this version does not know ({echo(str(err).split(' ')[-1], 40)})"
                      ) from None
    except ConfigError as err:
        raise Invalid(f"config: {err}") from None


def _finite(value, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise Invalid(f"{where} is not a finite number")


def classify(doc) -> str:
    """The kind of one valid document: run, compare, advice or error. Raises ``Invalid`` with the
    reason: a field of the wrong type, or a number outside its physical range."""
    kind = _kind(doc)
    docfields.check(kind, doc)
    return kind


def _kind(doc) -> str:
    """The kind of one document whose fields have the types the views read; ``Invalid`` if not."""
    if not isinstance(doc, dict):
        raise Invalid(f"a document must be a JSON object, not {_type_name(doc)}")
    schema = doc.get("schema", SCHEMA)  # no schema: written before it existed, read as 1
    if not _is(schema, int):
        raise Invalid(f"schema must be a whole number, not {_type_name(schema)}")
    if schema > SCHEMA:
        raise Invalid(f"written with results schema {echo(schema)}; this version reads schema {SCHEMA}: "
                      "open it with a newer Remat Lab")
    if schema < 1:
        raise Invalid(f"results schema {echo(schema)} is not one this version reads (1)")
    if "error" in doc:
        _check(doc, ERROR_ROW)
        return "error"
    if doc.get("kind") == "advice":
        return _advice(doc)
    if "rows" in doc and "policies" in doc:
        _check(doc, COMPARE)
        _config(doc["config"], policy_optional=True)
        for i, row in enumerate(doc["rows"]):
            if not isinstance(row, dict):
                raise Invalid(f"rows[{i}] must be an object, not {_type_name(row)}")
            _check(row, COMPARE_ROW, f"rows[{i}].")
            if not all(_is(s, NUM) for s in row["samples_s"]):
                raise Invalid(f"rows[{i}].samples_s must hold numbers only")
        return "compare"
    if "config" not in doc:
        raise Invalid("not a Remat Lab result: no config (expected the output of run --json, "
                      "sweep or compare --json)")
    _check(doc, RUN)
    _config(doc["config"])
    for key in ("median", "p25", "p75", "ci_low", "ci_high"):
        _finite((doc.get("step_time_s") or {}).get(key), f"step_time_s.{key}")
    for key, value in (doc.get("step_time_s") or {}).items():
        if key == "samples" and not all(_is(s, NUM) for s in value or []):
            raise Invalid("step_time_s.samples must hold numbers only")
    for key in ("dots", "residuals"):
        if not all(isinstance(r, dict) for r in doc.get(key) or []):
            raise Invalid(f"{key} must be a list of objects")
    _log((doc.get("compile") or {}).get("log"), "compile.log")
    kinds = (doc.get("memory") or {}).get("by_kind") or {}
    if not all(_is(v, NUM) for k, v in kinds.items() if k != "method"):
        raise Invalid("memory.by_kind must hold numbers (and its method)")
    if not all(_is(v, NUM) for v in ((doc.get("memory") or {}).get("by_kind_other") or {}).values()):
        raise Invalid("memory.by_kind_other must hold numbers")
    return "run"


def _log(log: dict | None, where: str) -> None:
    """A log summary's lists hold text only (the app shows them as code, never as Markdown)."""
    for key in ("xla_remat_lines", "xla_lines", "warnings"):
        if not all(isinstance(v, str) for v in (log or {}).get(key) or []):
            raise Invalid(f"{where}.{key} must be a list of text")


def _advice(doc: dict) -> str:
    """An ``advise --json`` document: its model (no batch, no policy: those are searched), rows and
    probes with the types the Advisor view reads."""
    _check(doc, ADVICE)
    if not doc["budget_bytes"] > 0:
        raise Invalid("budget_bytes must be positive")
    raw = doc["config"]
    try:  # the searched batch is per device: one example on each of the mesh's rows at least
        batch = mesh_devices(raw.get("mesh") or "") * int(raw.get("microbatches") or 1)
    except (ConfigError, TypeError, ValueError):
        batch = 1  # a bad mesh or count is named by the check below
    _config({"batch": batch, "policy": "no_remat", **{k: v for k, v in raw.items()
                                                       if k not in ("save_names", "offload_names")}})
    for i, row in enumerate(doc["rows"]):
        if not isinstance(row, dict):
            raise Invalid(f"rows[{i}] must be an object, not {_type_name(row)}")
        _check(row, ADVICE_ROW, f"rows[{i}].")
        for j, probe in enumerate(row["probes"]):
            if not isinstance(probe, dict):
                raise Invalid(f"rows[{i}].probes[{j}] must be an object, not {_type_name(probe)}")
            _check(probe, PROBE, f"rows[{i}].probes[{j}].")
        for key in ("step_time_ci_s", "examples_per_s_ci"):
            ci = row.get(key)
            if ci is not None and not (len(ci) == 2 and all(_is(v, NUM) for v in ci)):
                raise Invalid(f"rows[{i}].{key} must be two numbers")
        for key in ("step_time_s", "examples_per_s", "mfu", "hfu"):
            _finite(row.get(key), f"rows[{i}].{key}")
    if not all(isinstance(n, str) for n in doc.get("notes") or []):
        raise Invalid("notes must be a list of strings")
    _log(doc.get("log"), "log")
    return "advice"


def _keep(loaded: Loaded, kind: str, doc: dict, where: str) -> None:
    """Keep the compact copy of a valid document; stops the reading past ``MAX_KEPT``."""
    if kind in ("compare", "advice"):
        if len(loaded.compares) + len(loaded.advice) >= MAX_BIG_KEPT:
            loaded.refuse(where, f"not kept: one file may hold at most {MAX_BIG_KEPT} comparisons "
                                 "and advice")
            return
        (loaded.compares if kind == "compare" else loaded.advice).append(docfields.compact(kind, doc))
        return
    if kind == "error":
        loaded.errors.append(docfields.compact(kind, doc))
    else:
        detailed = len(loaded.runs) < DETAIL_RUNS and any(doc.get(k) for k in docfields.DETAIL)
        if detailed and deep_size({k: doc.get(k) for k in docfields.DETAIL}) > DETAIL_BYTES:
            detailed = False
            loaded.details_dropped += 1
        loaded.runs.append(docfields.compact(kind, doc, detailed))
    if len(loaded.runs) + len(loaded.errors) >= MAX_KEPT:
        raise docstream.OverBudget(f"reading stopped after {MAX_KEPT:,} documents, the most one "
                                   "file may give; the rest of the file is not read")


def load(name: str, data: bytes | BinaryIO, *, guard: docstream.Guard | None = None) -> Loaded:
    """Every valid document of one uploaded file (``data``: its bytes, or a seekable binary file
    read as a stream), compact, and a message for each part that is not."""
    f = io.BytesIO(data) if isinstance(data, bytes | bytearray) else data
    size = f.seek(0, io.SEEK_END)
    loaded = Loaded(name, nbytes=size)
    if size > MAX_BYTES:
        loaded.refuse(name, f"{size / 2**20:.1f} MiB is over the {MAX_BYTES // 2**20} MiB limit "
                            "for a results file; split it (JSON lines can be cut at any line)")
        return loaded
    guard = guard or docstream.Guard()
    try:
        guard.check()
        for where, doc in docstream.documents(f, name, size, loaded.refuse, guard):
            try:
                kind = classify(doc)
            except Invalid as err:
                loaded.refuse(where, str(err))
                continue
            _keep(loaded, kind, doc, where)
    except docstream.OverBudget as err:
        loaded.stopped = str(err)
    if loaded.count == 0 and not loaded.problems and not loaded.stopped:
        loaded.refuse(name, "no documents")
    return loaded


def describe_environment(env: dict | None) -> str:
    """``env`` in words: "NVIDIA H100 × 8, jax 0.10.2", "CPU × 1, jax 0.10.2"."""
    if not env:
        return "unknown environment"
    kind = str(env.get("device_kind") or env.get("backend") or "unknown device")
    if kind.lower() == "cpu":
        kind = "CPU"
    return f"{kind} × {env.get('device_count', '?')}, jax {env.get('jax', '?')}"

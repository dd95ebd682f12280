"""Sweeps: a grid of configurations, run one by one, appended as JSON lines and resumed from the file.

Shared by the Sweep page and ``python -m remat_lab sweep``. Every row is one JSON document on one
line: a ``run_experiment`` document (without program texts), or, for a configuration that was
refused or failed, ``{"schema", "config", "environment", "error": {"kind", "message"}}``. A row is
written with a single ``write`` and flushed, so an interrupted sweep leaves whole rows; a line cut
by a hard kill, at the end or (after appends) in the middle, is dropped and the file repaired when the
sweep resumes. One sweep at a time writes a file: ``claim`` holds an exclusive lock on it.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from remat_lab.config import ConfigError, RunConfig

SCHEMA = 1  # the version of the result documents (see results.py for the reader)
AXES = ("model", "width", "batch", "seq", "depth", "stack", "dtype", "policy")


def config_key(config: dict) -> str:
    """A configuration as a canonical string: the identity used to skip finished rows."""
    defaults = {"target": "local", "target_devices": 1, "vocab": 512, "kv_heads": 0, "head_dim": 0,
                "mlp_dim": 0, "tie_embeddings": False, "param_dtype": "", "step": "grad",
                "microbatches": 1, "preset": "", "compile_only": False}  # newer than some sweep files
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in sorted(config.items())
                       if not (k in defaults and v == defaults[k])}, sort_keys=True)


def build_grid(base: RunConfig, **axes: Iterable) -> list[dict]:
    """The product of ``axes`` (names from ``AXES``: lists of values) over ``base``, as config dicts.

    Axes left out or empty keep ``base``'s value. The dicts are not validated here: a combination
    that ``RunConfig`` refuses (a transformer width its heads do not divide) becomes an error row.
    Axes that a model ignores are pinned to the base value for it (seq for the mlp), so the grid
    has no duplicate runs.
    """
    unknown = set(axes) - set(AXES)
    if unknown:
        raise ValueError(f"unknown sweep axis {sorted(unknown)[0]!r}; axes: {', '.join(AXES)}")
    values = {a: list(dict.fromkeys(axes.get(a) or [getattr(base, a)])) for a in AXES}
    grid, seen = [], set()
    for combo in itertools.product(*(values[a] for a in AXES)):
        cfg = {**base.as_dict(), **dict(zip(AXES, combo))}
        if cfg["model"] == "mlp":
            cfg["seq"] = base.seq
        if cfg["depth"] == 1:
            cfg["stack"] = base.stack
        if cfg["policy"] != "custom":
            cfg["save_names"], cfg["offload_names"] = (), ()
        key = config_key(cfg)
        if key not in seen:
            seen.add(key)
            grid.append(cfg)
    return grid


def error_row(config: dict, kind: str, message: str, environment: dict | None = None) -> dict:
    """The row of a configuration that was ``refused`` (ConfigError) or ``failed`` (XLA)."""
    return {"schema": SCHEMA, "config": {k: list(v) if isinstance(v, tuple) else v
                                         for k, v in config.items()},
            "environment": environment, "error": {"kind": kind, "message": message}}


class SweepFileError(ValueError):
    """The ``--out`` file cannot be a sweep file to resume; the message says why."""


def _row_of(line: str) -> dict | None:
    """The row on ``line``; None when the line is a row cut short (a ``{`` that does not parse)."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("config"), dict) else {}


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a sweep file (none when it does not exist). A row cut by a kill (the last line
    without its newline, or a line that starts a row and does not parse) is not a row; any other
    line that is not a row means the file is something else: ``SweepFileError``."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.endswith("\n"):
                    break  # the last line, cut by a kill: not a row
                doc = _row_of(line)
                if doc is None and line.lstrip().startswith("{"):
                    continue  # a row cut by a kill, with rows appended after it
                if not doc:
                    raise SweepFileError(f"{path} line {n} is not a sweep row: is it the right file? "
                                         "Choose another --out to start a new sweep.")
                rows.append(doc)
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as err:
        raise SweepFileError(f"{path} cannot be read as a sweep file ({err}).") from None
    return rows


def claim(path: str | os.PathLike) -> IO[str]:
    """``path`` opened for appending rows, locked against a second sweep on the same file (the lock
    goes with the returned file: close it to release). Take it before ``read_rows``."""
    f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (the caller closes it)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise SweepFileError(f"another sweep is writing to {path}; wait for it to finish or "
                             "choose another --out.") from None
    return f


def done_keys(rows: Iterable[dict], retry_failed: bool = False) -> set[str]:
    """The configurations ``rows`` finished (with ``retry_failed``, error rows do not count)."""
    return {config_key(r["config"]) for r in rows if not (retry_failed and r.get("error"))}


def repair(path: str | os.PathLike) -> None:
    """Drop the rows a kill cut short (the last line without its newline, or cut lines with rows
    after them), in place, so that appending starts a new row and every line is one."""
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return
    with open(p, "rb+") as f:
        data = f.read()
        lines = data.split(b"\n")
        whole, tail = lines[:-1], lines[-1]  # tail: b"" when the file ends with a newline
        kept = [ln for ln in whole if _row_of(ln.decode("utf-8", "replace")) is not None]
        if not tail and len(kept) == len(whole):
            return
        f.seek(0)
        f.write(b"".join(ln + b"\n" for ln in kept))
        f.truncate()


def append_row(f: IO[str], row: dict) -> None:
    """One row as one line, written whole and flushed."""
    f.write(json.dumps(row) + "\n")
    f.flush()


@dataclass
class Outcome:
    """What ``run_grid`` did with one configuration: ``row`` (the written document), its index."""

    index: int
    row: dict
    skipped: bool = False


Runner = Callable[[RunConfig], dict]


def run_one(config: dict, run: Runner, environment: Callable[[], dict] | None = None) -> dict:
    """The row of one configuration: ``run``'s document (texts dropped) or an error row."""
    from remat_lab.program.backend import ExecutionError  # JAX is imported only when a sweep runs

    env = environment or (lambda: None)
    try:
        cfg = RunConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in config.items()})
    except (ConfigError, TypeError) as err:
        return error_row(config, "refused", str(err), env())
    try:
        doc = dict(run(cfg))
    except ConfigError as err:
        return error_row(config, "refused", str(err), env())
    except ExecutionError as err:
        return error_row(config, "failed", str(err), env())
    doc.pop("texts", None)
    return {"schema": SCHEMA, **doc}


def run_grid(grid: list[dict], run: Runner, *, skip: set[str] = frozenset(),
             write: Callable[[dict], None] | None = None,
             environment: Callable[[], dict] | None = None) -> Iterator[Outcome]:
    """Run ``grid`` in order, yielding each configuration's outcome after ``write`` has stored it.

    Configurations whose key is in ``skip`` are not run (``Outcome.skipped``; their row is only the
    config). Refused and failed configurations become error rows and the sweep goes on.
    """
    for i, config in enumerate(grid):
        if config_key(config) in skip:
            yield Outcome(i, {"config": config}, skipped=True)
            continue
        row = run_one(config, run, environment)
        if write is not None:
            write(row)
        yield Outcome(i, row)

"""Sweeps: a grid of configurations, run one by one, appended as JSON lines and resumed from the file.

Shared by the Sweep page and ``python -m remat_lab sweep``. Every row is one JSON document on one
line: a ``run_experiment`` document (without program texts), or, for a configuration that was
refused or failed, ``{"schema", "config", "environment", "error": {"kind", "message"}}``. A row is
written with a single ``write`` and flushed, so an interrupted sweep leaves whole rows; a line cut
by a hard kill is dropped (and the file repaired) when the sweep resumes.
"""

from __future__ import annotations

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
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in sorted(config.items())},
                      sort_keys=True)


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


def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a sweep file (none when it does not exist). A last line cut by a kill is not a
    row; any other line that is not a row means the file is something else: ``SweepFileError``."""
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.endswith("\n"):
                    break  # the last line, cut by a kill: not a row
                try:
                    doc = json.loads(line)
                except ValueError:
                    doc = None
                if not (isinstance(doc, dict) and isinstance(doc.get("config"), dict)):
                    raise SweepFileError(f"{path} line {n} is not a sweep row: is it the right file? "
                                         "Choose another --out to start a new sweep.")
                rows.append(doc)
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError) as err:
        raise SweepFileError(f"{path} cannot be read as a sweep file ({err}).") from None
    return rows


def done_keys(rows: Iterable[dict], retry_failed: bool = False) -> set[str]:
    """The configurations ``rows`` finished (with ``retry_failed``, error rows do not count)."""
    return {config_key(r["config"]) for r in rows if not (retry_failed and r.get("error"))}


def repair(path: str | os.PathLike) -> None:
    """Cut a last line that a kill left without its newline, so that appending starts a new row."""
    p = Path(path)
    if not p.exists() or p.stat().st_size == 0:
        return
    with open(p, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        f.truncate(data.rfind(b"\n") + 1)


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

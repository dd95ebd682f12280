"""Sweeps: a grid of configurations, timed interleaved per cell, appended as JSON lines and resumed.

Shared by the Sweep page and ``python -m remat_lab sweep``. Every row is one JSON document on one
line: a ``run_experiment`` document (without program texts), or, for a configuration that was
refused or failed, ``{"schema", "config", "environment", "error": {"kind", "message"}}``. A row is
written with a single ``write`` and flushed, so an interrupted sweep leaves whole rows; a line cut
by a hard kill, at the end or (after appends) in the middle, is dropped and the file repaired when the
sweep resumes. One sweep at a time writes a file: ``claim`` holds an exclusive lock on it.

A cell of the grid is the configurations that differ only by policy. With ``time_cell`` (the
CLI's ``time_interleaved``), ``run_grid`` compiles and analyses each configuration of a cell
untimed, then times the cell's executables together (``compare.interleaved``: rounds in a shuffled
order) and writes each row's median with its bootstrap 95 % interval (``ci_low``, ``ci_high``).
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
from remat_lab.config.catalog import USER_MODEL

SCHEMA = 1  # the version of the result documents (see results.py for the reader)
AXES = ("model", "width", "batch", "seq", "depth", "stack", "dtype", "policy")


def config_key(config: dict) -> str:
    """A configuration as a canonical string: the identity used to skip finished rows."""
    defaults = {"target": "local", "target_devices": 1, "vocab": 512, "kv_heads": 0, "head_dim": 0,
                "mlp_dim": 0, "tie_embeddings": False, "param_dtype": "", "step": "grad",
                "microbatches": 1, "preset": "", "compile_only": False}  # newer than some sweep files
    derived = () if config.get("model") == "user" else ("input_shape",)  # from batch, seq, width
    return json.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in sorted(config.items())
                       if not (k in defaults and v == defaults[k]) and k not in derived}, sort_keys=True)


def build_grid(base: RunConfig, **axes: Iterable) -> list[dict]:
    """The product of ``axes`` (names from ``AXES``: lists of values) over ``base``, as config dicts.

    Axes left out or empty keep ``base``'s value. The dicts are not validated here: a combination
    that ``RunConfig`` refuses (a transformer width its heads do not divide) becomes an error row.
    Axes that a model ignores are pinned to the base value for it (seq for the mlp; width and seq
    for the user's own block, whose input shape takes each batch as its first axis), so the grid
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
        if cfg["model"] == USER_MODEL:  # its own input: the batch is its first axis
            cfg["width"], cfg["seq"] = base.width, base.seq
            cfg["input_shape"] = (cfg["batch"], *base.input_shape[1:])
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


def cell_key(config: dict) -> str:
    """The cell of ``config``: its key without the policy (the configurations timed together)."""
    return config_key({k: v for k, v in config.items()
                       if k not in ("policy", "save_names", "offload_names")})


def _cells(grid: list[dict]) -> list[list[int]]:
    """Indices of ``grid`` grouped by cell, cells in the order of their first configuration."""
    cells: dict[str, list[int]] = {}
    for i, config in enumerate(grid):
        cells.setdefault(cell_key(config), []).append(i)
    return list(cells.values())


CellTimer = Callable[[list[RunConfig], list[dict]], None]


def time_interleaved(configs: list[RunConfig], docs: list[dict], *, calls: int | None = None,
                     seed: int = 0, progress: Callable[[str], None] | None = None) -> None:
    """Time the steps of one cell's ``configs`` together and write the timing into their ``docs``.

    Each step is compiled again for timing (as ``compare_policies`` does); then, under the timing
    lock, ``compare.interleaved`` runs ``configs[0].repeats`` rounds, each calling every executable
    ``calls`` times (default ``compare.CALLS_PER_ROUND``) in a shuffled order (seeded). Per doc:
    ``step_time_s`` (median, p25, p75, min, max, the samples in seconds, and ``ci_low``/``ci_high``,
    the bootstrap 95 % interval of the median, ``compare.median_interval``), and the fields derived
    from the median (``achieved_flops_per_s``, ``roofline``). Raises ``ExecutionError``.
    """
    from remat_lab.analysis.costs import step_costs
    from remat_lab.analysis.roofline import roofline_report
    from remat_lab.program.backend import xla_error
    from remat_lab.program.timing import MIN_WARMUP_S, step_time_summary, timing_slot
    from remat_lab.studies import compare

    say = progress or (lambda message: None)
    calls = compare.CALLS_PER_ROUND if calls is None else calls
    rounds, warmup = configs[0].repeats, configs[0].warmup
    executables = {str(i): compare._compile(cfg) for i, cfg in enumerate(configs)}
    from remat_lab.studies.progress import Tracker

    with timing_slot(lambda stage: say("waiting: another run is timing (one timing at a time)")):
        head = f"timing {len(configs)} configurations interleaved: {rounds} rounds of {calls} calls"
        # each round's step carries the rounds done and planned (studies/progress)
        track = Tracker(say, planned=rounds, unit="timing rounds", item="round", phase="timing")
        track(head)
        try:
            times = compare.interleaved(executables, rounds=rounds, calls=calls, warmup=warmup, seed=seed,
                                        progress=lambda r: track.finished(None, f"{head}: round {r} done"))
        except Exception as err:
            raise xla_error("running", err) from err
    for i, doc in enumerate(docs):
        samples = times[str(i)]
        med, low, high = compare.median_interval(samples, seed=seed)
        doc["step_time_s"] = {**step_time_summary(samples.ravel(), warmup), "median": med,
                              "ci_low": low, "ci_high": high, "min_warmup_s": MIN_WARMUP_S,
                              "repeats": rounds, "rounds": rounds, "calls_per_round": calls,
                              "interleaved_with": len(configs),
                              "interval": (f"bootstrap {compare.LEVEL:.0%} of the median, "
                                           f"{compare.RESAMPLES} resamples of whole rounds")}
        flops = doc.get("flops")
        doc["achieved_flops_per_s"] = flops / med if flops and med else None
        compiled = executables[str(i)][0]  # bytes accessed with each loop body's scaled by its runs
        bytes_accessed = step_costs(compiled, compiled.as_text())["bytes_accessed"]
        doc["roofline"] = roofline_report(flops, bytes_accessed, med, configs[i].dtype)


def run_grid(grid: list[dict], run: Runner, *, skip: set[str] = frozenset(),
             write: Callable[[dict], None] | None = None,
             environment: Callable[[], dict] | None = None,
             time_cell: CellTimer | None = None) -> Iterator[Outcome]:
    """Run ``grid`` cell by cell, yielding each configuration's outcome after ``write`` stored it.

    Configurations whose key is in ``skip`` are not run (``Outcome.skipped``; their row is only the
    config). Refused and failed configurations become error rows and the sweep goes on. With
    ``time_cell`` (``run`` then untimed, e.g. ``run_experiment(..., timing=False)``), the finished
    configurations of each cell are timed together by ``time_cell(configs, rows)``, and the cell's
    rows are written after it (a cell whose timing fails becomes ``failed`` rows, ``refused`` when
    ``time_cell`` raises ``ConfigError``).
    """
    from remat_lab.program.backend import ExecutionError

    for cell in _cells(grid):
        todo = []
        for i in cell:
            if config_key(grid[i]) in skip:
                yield Outcome(i, {"config": grid[i]}, skipped=True)
            else:
                todo.append(i)
        rows = {i: run_one(grid[i], run, environment) for i in todo}
        ran = [i for i in todo if "error" not in rows[i]]
        if time_cell is not None and ran:
            configs = [RunConfig(**{k: tuple(v) if isinstance(v, list) else v
                                    for k, v in grid[i].items()}) for i in ran]
            try:
                time_cell(configs, [rows[i] for i in ran])
            except (ConfigError, ExecutionError) as err:
                kind = "refused" if isinstance(err, ConfigError) else "failed"
                for i in ran:
                    rows[i] = error_row(grid[i], kind, str(err), rows[i].get("environment"))
        for i in todo:  # the whole cell is written before the first of its outcomes is yielded
            if write is not None:
                write(rows[i])
        for i in todo:
            yield Outcome(i, rows[i])

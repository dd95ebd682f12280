"""The sweep subcommand: a grid timed interleaved per cell, one JSON line a run, appended to --out."""

from __future__ import annotations

import argparse
import signal
import sys

from remat_lab.cli.common import (
    add_user_block_args,
    int_arg,
    list_arg,
    record,
    reported,
    user_block_fields,
)
from remat_lab.cli.format import fmt_time
from remat_lab.cli.progress import StderrProgress
from remat_lab.config import DTYPES, OBJECTIVES, ConfigError, RunConfig, human_bytes, resolve_budget
from remat_lab.model.models import MODELS
from remat_lab.model.policies import DEFAULT_POLICY, POLICIES
from remat_lab.model.stacks import STACKS


def _choice(name: str, allowed) -> object:
    """One of ``allowed`` (a sweep axis's values); anything else names the choices."""
    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"unknown {name} {text[:40]!r}; choose from: "
                                             f"{', '.join(allowed)}")
        return text
    return parse


def add_parsers(sub) -> None:
    """``sweep`` under the subcommands ``sub``."""
    p = sub.add_parser("sweep", help="a grid of configurations, one JSON line each, "
                                     "appended to --out and resumed from it; the policies of one "
                                     "width and batch are timed interleaved, with 95 %% intervals")
    d = RunConfig()
    axes = {"models": (_choice("model", MODELS), d.model), "widths": (int_arg("width"), d.width),
            "batches": (int_arg("batch"), d.batch), "seqs": (int_arg("seq"), d.seq),
            "depths": (int_arg("depth"), d.depth), "stacks": (_choice("stack", STACKS), d.stack),
            "dtypes": (_choice("dtype", DTYPES), d.dtype),
            "policies": (_choice("policy", list(POLICIES)), DEFAULT_POLICY)}
    for flag, (kind, default) in axes.items():
        p.add_argument(f"--{flag}", type=list_arg(kind), default=[default], metavar="A,B",
                       help=f"comma-separated (default: {default})")
    p.add_argument("--heads", type=int_arg("heads"), default=d.heads)
    add_user_block_args(p, "--models", "; each of --batches replaces its first axis")
    p.add_argument("--objective", choices=OBJECTIVES, default=d.objective)
    p.add_argument("--repeats", type=int_arg("repeats"), default=d.repeats,
                   help="timing rounds per cell (each calls every policy's step twice)")
    p.add_argument("--warmup", type=int_arg("warmup"), default=d.warmup)
    p.add_argument("--seed", type=int_arg("seed"), default=d.seed)
    p.add_argument("--memory-budget", default=None, help="refuse configurations estimated above this")
    p.add_argument("--out", default=None, metavar="FILE.jsonl",
                   help="append one JSON line per configuration here (default: stdout); rerunning "
                        "with the same file skips the configurations it holds")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the configurations the file records as refused or failed")
    p.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")


def _head(c: dict) -> str:
    """A configuration in a few words: model, width, batch, policy (your block: its input)."""
    return (f"user {'x'.join(map(str, c.get('input_shape') or ()))} {c.get('policy')}"
            if c.get("model") == "user" else  # its own input: width and seq are not its sizes
            f"{c.get('model')} w{c.get('width')} b{c.get('batch')} {c.get('policy')}")


def _sweep_line(row: dict) -> str:
    """One finished row as a progress line: the configuration, then its time and peak or its error."""
    c, err = row["config"], row.get("error")
    head = _head(c)
    if err:
        return f"{head}: {err['kind']}: {err['message'][:160]}"
    st, mem = row.get("step_time_s") or {}, row.get("memory") or {}
    peak = human_bytes(mem["peak_bytes"]) if mem.get("peak_bytes") is not None else "-"
    ci = (f" (95 % {fmt_time(st['ci_low'])} to {fmt_time(st['ci_high'])})"
          if st.get("ci_low") is not None and st.get("ci_high") is not None else "")
    return f"{head}: median {fmt_time(st.get('median'))}{ci}, peak {peak}"


def _base(args: argparse.Namespace) -> tuple[RunConfig, dict]:
    """The configuration every row starts from, and the model axes swept: models, widths and seqs,
    or (``--model-module``) the user's own block, whose input shape those axes would contradict."""
    common = dict(heads=args.heads, objective=args.objective, repeats=args.repeats,
                  warmup=args.warmup, seed=args.seed)
    if not (args.model_module or args.user_input_shape):
        return RunConfig(**common), {"model": args.models, "width": args.widths, "seq": args.seqs}
    d = RunConfig()
    clash = [flag for flag, value, default in (("--models", args.models, d.model),
                                               ("--widths", args.widths, d.width),
                                               ("--seqs", args.seqs, d.seq)) if value != [default]]
    if clash:
        raise ConfigError(f"{', '.join(clash)} cannot be swept with --model-module: your block's "
                          "input shape (--input-shape) sets its sizes; sweep --batches, --depths, "
                          "--stacks, --dtypes and --policies.")
    return RunConfig(**common, **user_block_fields(args)), {}


def main(args: argparse.Namespace) -> int:
    """The grid, one JSON line per configuration, a progress bar on stderr; Ctrl-C keeps whole rows."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from remat_lab.program.backend import enable_compilation_cache, environment
    from remat_lab.studies import sweep
    from remat_lab.studies.experiment import run_experiment
    from remat_lab.studies.progress import Tracker

    with reported(ConfigError):
        base, shape_axes = _base(args)
    grid = sweep.build_grid(base, batch=args.batches, depth=args.depths, stack=args.stacks,
                            dtype=args.dtypes, policy=args.policies, **shape_axes)
    skip: set[str] = set()
    cannot_write = lambda err: f"cannot write {args.out}: {err.strerror}"
    with reported((ConfigError, sweep.SweepFileError)), reported(OSError, say=cannot_write):
        resolve_budget(args.memory_budget)  # a bad --memory-budget is one error, not a row each
        if args.out:
            skip = sweep.done_keys(sweep.read_rows(args.out), args.retry_failed)
            sweep.repair(args.out)
        out = open(args.out, "a", encoding="utf-8") if args.out else sys.stdout
    todo = sum(sweep.config_key(c) not in skip for c in grid)
    if not args.no_cache:
        enable_compilation_cache()
    console = Console(stderr=True, soft_wrap=True)  # one line per message, also in logs
    console.print(f"sweep: {len(grid)} configurations, {len(grid) - todo} already in "
                  f"{args.out or 'the output'}, {todo} to run")
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeRemainingColumn(), console=console, disable=not todo)
    failed = done = 0
    # Ctrl-C: stop after the configuration in progress (a KeyboardInterrupt raised inside JAX can
    # be swallowed, e.g. in its garbage-collection callback); a second Ctrl-C stops at once.
    stop = []

    def on_interrupt(signum, frame):
        if stop:
            raise KeyboardInterrupt
        stop.append(signum)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        with bar:
            task = bar.add_task("sweep", total=todo)
            # Each step: the bar's text on a terminal, else one plain line on stderr with the
            # configurations done of planned and the time left (studies/progress).
            plain = None if console.is_terminal else StderrProgress(console.file)
            track = Tracker(plain or (lambda m: bar.update(task, description=str(m)[:60])),
                            planned=todo, unit="configurations", item="configuration", phase="sweep")

            def run(cfg: RunConfig) -> dict:
                """Compiled and analysed untimed; then each cell (the policies of one width and
                batch) timed together, interleaved, with a 95 % interval of each median."""
                track(f"{_head(cfg.as_dict())}: compiling and checking")
                return run_experiment(cfg, budget=args.memory_budget, timing=False)

            time_cell = lambda cfgs, docs: sweep.time_interleaved(cfgs, docs, seed=args.seed,
                                                                   progress=lambda m: track(str(m)))
            for outcome in sweep.run_grid(grid, run, skip=skip, environment=environment,
                                          write=lambda row: sweep.append_row(out, row),
                                          time_cell=time_cell):
                if outcome.skipped:
                    continue
                done += 1
                failed += bool(outcome.row.get("error"))
                if not outcome.row.get("error"):
                    record(outcome.row, "sweep")
                line = f"[{done}/{todo}] {_sweep_line(outcome.row)}"
                if plain is None:  # kept above the bar (a plain line says it with the counts)
                    bar.console.print(line, markup=False, highlight=False)
                track.finished(None, line)
                bar.advance(task)
                if stop:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        console.print(f"sweep: interrupted after {done} of {todo}; every finished row is in "
                      f"{args.out or 'the output'}; run the same command again to resume")
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
        if out is not sys.stdout:
            out.close()
    console.print(f"sweep: done: ran {done}, of which {failed} refused or failed"
                  + (f"; {args.out} holds all {len(grid)} configurations" if args.out else ""))
    return 0

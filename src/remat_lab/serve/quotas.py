"""What one job and one click may cost on a shared server: wall-clock deadlines per job kind, public bounds.

A job that runs past its kind's deadline has its worker killed and replaced (``pool.Pool``), and the
visitor reads ``stopped_message``. The deadlines are set for a 2-core CPU container (Streamlit
Community Cloud) with margin over the slowest job the app's own limits allow, so they stop only
runaway jobs; ``$REMAT_LAB_JOB_DEADLINE_S`` scales them all (its value is the ``run`` deadline,
the other kinds keep their ratio to it; ``0`` or ``off``: no deadlines, the default of a private
server, ``REMAT_LAB_PUBLIC=0``).
The clock starts when the worker receives the job: waiting in the queue, for the timing lock or for
a worker to start does not count.

Public servers (``store.history.public_mode``) also bound what one visitor may queue: at most
``PUBLIC_VISITOR_MAX_JOBS`` jobs queued or running at once, all its tabs together (``visitor_cap``;
``visitors`` says who a visitor is), and what one click may queue: a Sweep click
runs at most ``PUBLIC_SWEEP_MAX_RUNS`` configurations (Resume runs the next ones), and the Advisor
is bounded by ``PUBLIC_ADVISOR_*`` (policies, searched batches, budget).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

DEADLINE_ENV = "REMAT_LAB_JOB_DEADLINE_S"
PUBLIC_ENV = "REMAT_LAB_PUBLIC"  # as store.history.PUBLIC_ENV (serve reads it without the store)

# Seconds of worker time per job kind, and why. Measured on 2 shared cores: a default run ~5 s,
# the slowest test run (mlp 512 x 256, 1000 repeats) ~15 s, the 17-policy transformer advice at
# 1000T that started issue 21 131 s (7.7 s per policy, every probe at batches up to 65536).
DEADLINES_S: dict[str, float] = {
    # A backend question: under a second on a started worker; a hung backend is stopped quickly.
    "environment": 30.0,
    "device_limit": 30.0,
    # Compile and analyses, no timing: the largest model under a 1 GiB container's budget compiles
    # (step, no_remat witness, gradient reference) in about 30 s.
    "programs": 90.0,
    "untimed": 90.0,  # a Sweep configuration: the same compiles and checks, timed later with its cell
    # The same plus the timed loop (up to 1000 repeats + 100 warm-up) and the gradient check.
    "run": 120.0,
    # Every selected policy compiled, then timed interleaved: up to 17 policies of ~8 s each.
    "compare": 240.0,
    "mesh_table": 240.0,  # Compare's mesh table: every selected policy compiled on the mesh, not run
    "sweep_time": 240.0,  # a Sweep cell: its policies compiled again and timed interleaved
    # Compile-only probes: a public advice has at most 8 policies x ~27 probes, usually 3 to 6 each.
    "advise_sizes": 120.0,
    # The probes, then each policy compiled at its largest batch and timed (~8 s in all).
    "advise": 180.0,
    # The synthesizer: 2k + 6 probes, its candidates' searches and the named policies' (as advise_sizes).
    "synthesize": 300.0,
    # The planner: a few compiles per mesh and plan, then the best at full size (a 70B model for 256
    # chips: about 15 compiles of a minute or more each).
    "plan": 1800.0,
}
DEFAULT_DEADLINE_S = 120.0  # a kind not in the table

# What each kind is called in the visitor's sentence, and what to try instead.
_WHAT = {
    "environment": ("a question about the backend", "reload the page"),
    "device_limit": ("a question about the backend", "reload the page"),
    "programs": ("a program listing", "try a smaller model (width, batch, seq or depth)"),
    "run": ("a run", "try a smaller model (width, batch, seq or depth) or fewer repeats"),
    "untimed": ("a sweep configuration", "try a smaller model (width, batch, seq or depth)"),
    "compare": ("a comparison", "try fewer policies or a smaller model"),
    "mesh_table": ("the mesh table", "try fewer policies or a smaller model"),
    "sweep_time": ("timing a sweep cell", "try fewer policies or a smaller model"),
    "advise_sizes": ("an advice", "try fewer policies or a smaller model"),
    "advise": ("an advice", "try fewer policies, a smaller model or turning timing off"),
    "synthesize": ("a synthesis", "try fewer named policies or a smaller model"),
    "plan": ("a plan", "try fewer plans or tensor sizes, or a smaller model"),
}

PUBLIC_VISITOR_MAX_JOBS = 2  # one visitor's jobs queued or running at once, all its tabs together
PUBLIC_SWEEP_MAX_RUNS = 48  # one click: ~48 x 5 s = 4 min of worker time, not 1.6 h
PUBLIC_ADVISOR_MAX_POLICIES = 8  # JAX's 7 policies and one more; the advice had 17
PUBLIC_ADVISOR_MAX_BATCH = 4096  # the search's ceiling: at most 2*log2(4096)+3 = 27 probes per policy
PUBLIC_ADVISOR_MAX_BUDGET = 256 << 30  # above any one accelerator's memory today (H200: 141 GB)


def deadlines(overrides: Mapping[str, float] | None = None, env: Mapping[str, str] | None = None
              ) -> dict[str, float | None]:
    """Seconds per job kind (None: no deadline), ``$REMAT_LAB_JOB_DEADLINE_S`` applied, then
    ``overrides`` (a pool's own, e.g. tests' tiny deadlines); key ``"default"`` for other kinds.
    A private instance (``$REMAT_LAB_PUBLIC=0``) has no deadlines unless that variable sets them:
    the user guide's own llama3-8b advice takes minutes, and its owner is the only one waiting."""
    table: dict[str, float | None] = {**DEADLINES_S, "default": DEFAULT_DEADLINE_S}
    env = os.environ if env is None else env
    text = env.get(DEADLINE_ENV, "").strip().lower()
    if not text and private(env):
        text = "off"  # a private instance: its owner's jobs run to the end unless told otherwise
    if text in ("0", "off", "none", "no"):
        table = dict.fromkeys(table)
    elif text:
        try:
            run_s = float(text)
        except ValueError:
            run_s = math.nan
        if math.isfinite(run_s) and run_s > 0:
            scale = run_s / DEADLINES_S["run"]
            table = {k: v * scale for k, v in table.items()}
    table.update(overrides or {})
    return table


def private(env: Mapping[str, str] | None = None) -> bool:
    """Whether this is a private instance (``$REMAT_LAB_PUBLIC=0``): its owner is the only visitor."""
    env = os.environ if env is None else env
    return env.get(PUBLIC_ENV, "").strip().lower() in ("0", "false", "no", "off")


def visitor_cap(env: Mapping[str, str] | None = None) -> int | None:
    """Jobs one visitor may have queued or running at once (None: no cap, a private instance)."""
    return None if private(env) else PUBLIC_VISITOR_MAX_JOBS


def busy_message(cap: int) -> str:
    """The visitor's sentence for a job refused by the per-visitor cap."""
    return (f"Not started: you already have {cap} job{'' if cap == 1 else 's'} running or waiting on "
            "this shared server (from this tab or your others), the most one visitor may have. Try "
            "again when one of them has finished.")


def deadline_for(table: Mapping[str, float | None], kind: str) -> float | None:
    """The deadline of ``kind`` in ``table`` (its ``"default"`` for a kind it does not name)."""
    return table[kind] if kind in table else table.get("default")


def stopped_message(kind: str, seconds: float) -> str:
    """The visitor's sentence for a job stopped at its deadline."""
    what, hint = _WHAT.get(kind, ("this job", "try a smaller request"))
    shown = f"{seconds:.0f}" if seconds >= 10 else f"{seconds:.1f}"
    text = f"Stopped after {shown} s, this server's limit for {what}; {hint}."
    if private():
        # the owner of a private instance set it: name the setting (never shown to web visitors)
        text += f" ${DEADLINE_ENV} sets the limits (0 or off: none)."
    return text


def default_workers(env: Mapping[str, str] | None = None, cores: int | None = None) -> int:
    """Workers when ``$REMAT_LAB_WORKERS`` is unset: one on a public server (visitors' jobs take
    turns, each with the whole machine); on a private instance one per core, but two at most: a
    worker is recycled above half the memory limit (``Pool.max_rss``), so two fit beside each other."""
    if not private(env):
        return 1
    return max(1, min(cores or os.cpu_count() or 1, 2))

"""The advisor's timing: every fitting policy at its largest batch, interleaved, until the best separates.

Which policies run is decided from the compiled peaks the search measured, never from the
width-based estimate: the timed set holds, at once, every timed executable's parameters and input
(interleaving keeps them all alive) plus one step's temporaries and outputs and the process
overhead of the memory model (``config.budget.COMPILE_WORKSPACE``); it must fit what this process
may allocate now (``allowance``). A policy left out gets a ``not_timed`` text with those numbers.

The time budget counts from the first compile for timing: a program is compiled only while its
compile (the slowest so far) would end within the budget (the likeliest winners first where the
roofline estimates them; the others get a ``not_timed`` saying so); each program's first round is
its warm-up (its samples dropped when later rounds follow, ``timing.warmed_up``). Rounds run
round-robin in a shuffled order (as Compare does), one call per policy each, as a race
(``_run_rounds``): from ``MIN_ROUNDS`` on, a policy whose interval of examples/s lies wholly below
the leader's leaves it, close ones get more rounds; it ends when one is left
(``"separated"``), when the time budget has less than one more round left (so the timed phase
keeps the budget plus at most one call of each policy still racing), at ``MAX_ROUNDS``, or when
``should_stop()`` says stop (checked between rounds; finished rounds are kept; a string it returns
is the reason recorded, e.g. ``"deadline"``, else ``"stopped"``). MFU and HFU are stated against
``analysis.roofline.stated_peak``: a vendor figure where the device is known, else this machine's
calibrated best matmul rate, named as such. A fraction over 1 is a calibration error and is
reported, never capped.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import jax
import numpy as np

from remat_lab.analysis.roofline import stated_peak
from remat_lab.config import BUDGET_ENV, RunConfig, human_bytes, limits, resolve_budget
from remat_lab.config.budget import COMPILE_WORKSPACE
from remat_lab.program.backend import device_memory_limit, xla_error
from remat_lab.program.step import abstract_problem, build_problem, make_step, release_other_models
from remat_lab.program.timing import MIN_WARMUP_S, time_executable, timing_slot
from remat_lab.studies.advisor.search import Progress
from remat_lab.studies.compare import median_interval
from remat_lab.studies.progress import Step, Tracker

TIME_BUDGET_S = 8.0  # the engine's default for the timing phase (the CLI's --time-budget: 60 s)
MIN_ROUNDS = 3  # an interval needs rounds: the time budget never stops timing before this many
SEPARATE_MIN_ROUNDS = 5  # separation is judged from this many rounds on
MAX_ROUNDS = 60
CALLS_PER_ROUND = 1
PROCESS_OVERHEAD = COMPILE_WORKSPACE  # the memory model's allowance for XLA and the process
CONTAINER_MARGIN = 64 << 20  # left free under a container's limit (as the worker pool leaves)
SLOW_CALL_S = 0.5  # a round of calls this slow names each policy as it runs
CHEAP_SHARE = 0.1  # rounds up to MIN_ROUNDS run past the budget while they cost this share of it


def tracker(progress: Progress | None, policies: list[str], timing_s: float | None) -> Tracker:
    """The advice's live progress (``studies/progress``): the policies sized (``advisor_sizing``
    counts them, with their rows), the model flops, then the timing (its steps carry their own
    counts: programs compiled, rounds, the time budget left)."""
    return Tracker(progress, planned=len(policies), unit="policies sized", item="policy",
                   phase="sizing", after=f"then up to {timing_s:.0f} s of timing" if timing_s else "")


def allowance(server_budget: str | int | None = None) -> tuple[int, str]:
    """``(bytes, why)``: what the timed runs may allocate now. On a GPU or TPU the device's limit
    (the compiled peak is device memory); on CPU the run budget (``server_budget``,
    ``$REMAT_LAB_MEMORY_BUDGET`` or half this machine's memory), or less when a container's
    limit minus what is in use there now (less a margin) is smaller."""
    device = device_memory_limit()
    if device and server_budget is None:
        return int(device), "the device's memory limit"
    budget = resolve_budget(server_budget, device)
    why = ("the server budget given" if server_budget is not None else
           f"${BUDGET_ENV}" if os.environ.get(BUDGET_ENV) else
           "the run budget: half this machine's memory")
    if device:
        return budget, why
    cg = limits.cgroup_memory()
    if cg["limit"] and cg["usage"] is not None:
        free = cg["limit"] - cg["usage"] - CONTAINER_MARGIN
        if free < budget:
            return max(free, 0), (f"free in this container now: its {human_bytes(cg['limit'])} limit "
                                  f"- {human_bytes(cg['usage'])} in use - a "
                                  f"{human_bytes(CONTAINER_MARGIN)} margin")
    return budget, why


def args_bytes(config: RunConfig) -> int:
    """Bytes of the step's arguments (parameters, input, optimizer state), from their shapes."""
    p = abstract_problem(config)
    leaves = jax.tree_util.tree_leaves((p.args, p.opt_state))
    return int(sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in leaves))


def plan(rows: list[dict], configs: dict[str, RunConfig], allow: int, allow_why: str
         ) -> tuple[list[str], dict[str, str], int]:
    """``(policies to time, {policy: the policy whose program it shares}, bytes held at once)``.

    Programs are taken from the smallest compiled peak up while the set fits ``allow``; a policy
    that does not gets ``not_timed`` with the numbers. Policies compiling to the same program at
    the same batch are timed once and share it.
    """
    owners: dict[tuple, str] = {}
    same_as: dict[str, str] = {}
    for r in rows:
        if r["max_batch"] == 0:
            continue
        key = (r.get("fingerprint"), r["max_batch"])
        if key in owners:
            same_as[r["policy"]] = owners[key]
        else:
            owners[key] = r["policy"]
    by_policy = {r["policy"]: r for r in rows}
    held_args, worst_rest, chosen = 0, 0, []
    for p in sorted(owners.values(), key=lambda p: by_policy[p]["peak_bytes"]):
        r = by_policy[p]
        args = min(args_bytes(configs[p].replace(batch=r["max_batch"])), r["peak_bytes"])
        need = held_args + args + max(worst_rest, r["peak_bytes"] - args) + PROCESS_OVERHEAD
        if need <= allow:
            chosen.append(p)
            held_args += args
            worst_rest = max(worst_rest, r["peak_bytes"] - args)
            continue
        with_others = (f" + {human_bytes(held_args)} of the other timed policies' parameters and "
                       "inputs (alive together while timed interleaved)") if held_args else ""
        r["not_timed"] = (f"not timed: compiled peak {human_bytes(r['peak_bytes'])} at batch "
                          f"{r['max_batch']} + {human_bytes(PROCESS_OVERHEAD)} process overhead"
                          f"{with_others} = {human_bytes(need)}, over the {human_bytes(allow)} this "
                          f"process may allocate for timing ({allow_why}); sized by compiling only")
    for p, owner in same_as.items():
        if owner not in chosen:
            by_policy[p]["not_timed"] = by_policy[owner]["not_timed"]
    used = held_args + worst_rest + PROCESS_OVERHEAD if chosen else 0
    return chosen, {p: o for p, o in same_as.items() if o in chosen}, used


def _interval(samples: list[float], seed: int) -> tuple[float, float, float]:
    return median_interval(np.asarray(samples), seed=seed)


def separated(samples: dict[str, list[float]], batches: dict[str, int], seed: int) -> bool:
    """Whether the best policy's examples/s interval lies wholly above the runner-up's."""
    if len(samples) < 2:
        return False
    rates = []
    for p, s in samples.items():
        med, low, high = _interval(s, seed)
        rates.append((batches[p] / med, batches[p] / high, batches[p] / low))
    rates.sort(reverse=True)
    return rates[0][1] > rates[1][2]


def _race_out(samples: dict[str, list[float]], racing: list[str], batches: dict[str, int],
              seed: int) -> dict[str, str]:
    """``{policy: its leader}`` for the racing policies whose examples/s interval lies wholly below
    the leader's (the policy with the highest median examples/s): clearly slower, out of the race."""
    rates = {}
    for p in racing:
        med, low, high = _interval(samples[p], seed)
        rates[p] = (batches[p] / med, batches[p] / high, batches[p] / low)  # median, low, high
    leader = max(racing, key=lambda p: rates[p][0])
    return {p: leader for p in racing if p != leader and rates[p][2] < rates[leader][1]}


def _run_rounds(executables: dict[str, tuple], batches: dict[str, int], *, warmup: int,
                deadline: float, seed: int, say: Progress, should_stop: Callable[[], bool] | None,
                budget_s: float = 0.0, warm: bool = True) -> tuple[dict[str, list[float]], str, dict]:
    """A race of round-robin rounds: ``(seconds per call per policy, why it stopped, {policy left
    out: (after how many rounds, the leader then)})``.

    Each program is warmed up on its own, then rounds of one call per program still in the race
    run in a shuffled order. From ``MIN_ROUNDS`` on, a program whose examples/s interval lies
    wholly below the leader's leaves the race (it keeps its samples); close ones keep running.
    Without ``warm`` (the advice's timing) there is no separate warm-up: the first round carries
    each program's first call (the caller drops it when later rounds follow). The race ends when
    one program is left (``"separated"``), the time left is less than one more
    round of the programs still racing (``"time budget"``: so the timed phase ends within the
    budget plus at most one call of each; below ``MIN_ROUNDS``, rounds that together cost at most
    ``CHEAP_SHARE`` of ``budget_s`` still run), ``MAX_ROUNDS``, or ``should_stop()``."""
    clock = time.perf_counter
    names = list(executables)
    for compiled, args in executables.values() if warm else ():  # each warmed up on its own first
        time_executable(compiled, args, warmup=warmup, repeats=0, min_warmup_s=MIN_WARMUP_S)
    samples: dict[str, list[float]] = {n: [] for n in names}
    racing, out = list(names), {}
    rng = np.random.default_rng(seed)
    done = 0
    while True:
        left = deadline - clock()
        per_round = sum(float(np.median(samples[n])) for n in racing) if done else 0.0
        if should_stop is not None and (why := should_stop()):
            return samples, why if isinstance(why, str) else "stopped", out
        if done >= MAX_ROUNDS:
            return samples, "max rounds", out
        # an interval needs MIN_ROUNDS: rounds this cheap (a tenth of the budget) still run
        cheap = done < MIN_ROUNDS and (MIN_ROUNDS - done) * per_round <= CHEAP_SHARE * budget_s
        if done and left < per_round and not cheap:
            return samples, "time budget", out
        cap = MAX_ROUNDS if not done else min(MAX_ROUNDS, done + int(max(left, 0) / max(per_round, 1e-9)))
        head = (f"timing round {done + 1} of ≤{cap} · {len(racing)} of {len(names)} policies still "
                f"racing · ~{max(left, 0):.0f} s left")
        say(Step(head, done=done, planned=cap, unit="timing rounds", item="round", at_most=True,
                 left_s=max(left, 0.0), left_why="of the time budget"))
        for k, i in enumerate(rng.permutation(len(racing)), 1):
            compiled, args = executables[racing[i]]
            if per_round / len(racing) >= SLOW_CALL_S:
                say(f"{head} · {racing[i]} ({k} of {len(racing)})")
            t0 = clock()
            jax.block_until_ready(compiled(*args))
            samples[racing[i]].append(clock() - t0)
        done += 1
        if len(names) == 1:
            if done >= SEPARATE_MIN_ROUNDS:
                return samples, "one program", out
            continue
        if done >= MIN_ROUNDS:
            for p, leader in _race_out(samples, racing, batches, seed).items():
                out[p] = (done, leader)
                racing.remove(p)
                say(f"{p} leaves the race after {done} rounds: clearly slower than {leader}")
        if len(racing) == 1:
            return samples, "separated", out


def time_rows(rows: list[dict], configs: dict[str, RunConfig], server_budget, time_budget_s: float,
              seed: int, say: Progress, should_stop: Callable[[], bool] | None = None) -> dict:
    """Time the policies that fit (``plan``) at their largest batches; fill the rows. Returns
    ``{"timed", "rounds", "stopped_because", "time_budget_s", "timing_s", "allowance_bytes",
    "allowance_source", "timed_set_bytes"}``; the time budget counts from here (compiles too)."""
    t0 = time.perf_counter()
    deadline = t0 + time_budget_s
    allow, allow_why = allowance(server_budget)
    chosen, same_as, used = plan(rows, configs, allow, allow_why)
    summary = {"timed": False, "rounds": 0, "stopped_because": None, "time_budget_s": time_budget_s,
               "timing_s": 0.0, "allowance_bytes": allow, "allowance_source": allow_why,
               "timed_set_bytes": used}
    by_policy = {r["policy"]: r for r in rows}
    if all(by_policy[p].get("examples_per_s_estimate") for p in chosen):  # likeliest winners first
        chosen = sorted(chosen, key=lambda p: -by_policy[p]["examples_per_s_estimate"])
    executables, compile_s = {}, []
    for i, p in enumerate(chosen, 1):
        if should_stop is not None and should_stop():
            break
        r = by_policy[p]
        if compile_s and time.perf_counter() + max(compile_s) > deadline:  # the budget keeps compiles
            for q in chosen[i - 1:]:
                by_policy[q]["not_timed"] = (
                    f"not timed: the time budget ({time_budget_s:g} s) was spent compiling "
                    f"{len(executables)} of the {len(chosen)} programs before it for timing")
            break
        t_compile = time.perf_counter()
        say(Step(f"compiling {p} at batch {r['max_batch']} for timing ({i} of {len(chosen)})", done=i - 1,
                 planned=len(chosen), unit="programs compiled for timing", item="program",
                 left_s=max(deadline - time.perf_counter(), 0.0), left_why="of the time budget"))
        release_other_models(configs[p])  # an earlier model's cached parameters off the device
        problem = build_problem(configs[p].replace(batch=r["max_batch"]))
        try:
            compiled = jax.jit(make_step(problem)).trace(*problem.args).lower().compile()
        except Exception as err:  # noqa: BLE001
            r["not_timed"] = f"not timed: {xla_error('compiling', err)}"
            continue
        executables[p] = (compiled, problem.args)
        compile_s.append(time.perf_counter() - t_compile)
    if not executables:
        why = should_stop() if should_stop is not None else None
        summary["stopped_because"] = ((why if isinstance(why, str) else "stopped") if why else
                                      "nothing fits for timing")
        return summary
    batches = {p: by_policy[p]["max_batch"] for p in executables}
    with timing_slot(lambda stage: say("waiting: another run is timing (one timing at a time)")):
        try:
            # No warm-up call apart: the first round is each program's warm-up, its samples
            # dropped when later rounds follow (a step that takes seconds is not run twice first).
            times, why, raced_out = _run_rounds(executables, batches, warmup=1, deadline=deadline,
                                                seed=seed, say=say, should_stop=should_stop,
                                                budget_s=time_budget_s, warm=False)
            summary["warmed_up"] = all(len(t) > 1 for t in times.values() if t)
            times = {p: t[1:] if len(t) > 1 else t for p, t in times.items()}
        except Exception as err:
            raise xla_error("running", err) from err
    rounds = max(len(s) for s in times.values())
    summary.update(rounds=rounds, stopped_because=why, timing_s=time.perf_counter() - t0,
                   left_the_race={p: {"after_rounds": n, "leader": lead}
                                  for p, (n, lead) in raced_out.items()})
    for p in [*executables, *(q for q, o in same_as.items() if o in executables)]:
        r, s = by_policy[p], times[same_as.get(p, p)]
        if same_as.get(p, p) in raced_out:
            n, lead = raced_out[same_as.get(p, p)]
            r["race"] = (f"timed {n} rounds, then left the race: its examples/s interval lay wholly "
                         f"below {lead}'s")
        if not s:
            r["not_timed"] = "not timed: stopped before the first round finished"
            continue
        med, low, high = _interval(s, seed)
        b = r["max_batch"]
        r.update(step_time_s=med, step_time_ci_s=[low, high], examples_per_s=b / med,
                 examples_per_s_ci=[b / high, b / low], rounds=len(s))
        if p in same_as:
            r["same_program_as"] = same_as[p]
    summary["timed"] = rounds > 0
    return summary


def flop_rates(rows: list[dict], dtype: str = "float32") -> dict:
    """Fill each timed row's FLOP rates and, against the stated peak (``stated_peak``), its MFU and
    HFU; a fraction over 1 is kept and named a calibration error in ``rate_error``. Returns the
    stated peak ``{"peak_flops_per_s", "peak_kind", "peak_source"}``."""
    peak = stated_peak(dtype)
    top = peak["peak_flops_per_s"]
    for r in rows:
        r.setdefault("rate_error", None)
        if not r["step_time_s"]:
            continue
        for kind in ("model", "hardware"):
            flops = r[f"{kind}_flops"]
            r[f"{kind}_flops_per_s"] = flops / r["step_time_s"] if flops else None
        if not top:
            continue
        r["mfu"] = r["model_flops_per_s"] / top if r["model_flops_per_s"] else None
        r["hfu"] = r["hardware_flops_per_s"] / top if r["hardware_flops_per_s"] else None
        over = max(r["mfu"] or 0.0, r["hfu"] or 0.0)
        if over > 1:
            r["rate_error"] = (f"calibration error: {over:.2f} × the stated peak "
                               f"({top / 1e9:,.1f} GFLOP/s, {peak['peak_kind']}); the peak is too "
                               "low, the fraction is not capped")
    return peak

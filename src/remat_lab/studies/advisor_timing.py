"""The advisor's timing: each fitting policy at its largest batch, interleaved, and its MFU and HFU.

Every policy that fits is timed at its largest batch (interleaved round-robin, as Compare does) and
its model and hardware FLOP rates are reported against the machine's peak:

- model FLOPs: the ``no_remat`` program's flops at that batch (the work the model needs);
- hardware FLOPs: this policy's program's flops at that batch (recomputation included);
- MFU and HFU: each divided by the step time and by the calibrated peak FLOP/s.
"""

from __future__ import annotations

import time

import jax

from remat_lab.analysis.roofline import calibrate
from remat_lab.config import ConfigError, RunConfig, check_budget, human_bytes, resolve_budget
from remat_lab.program.backend import device_memory_limit, xla_error
from remat_lab.program.step import build_problem, make_step
from remat_lab.program.timing import timing_slot
from remat_lab.studies.advisor_search import Progress
from remat_lab.studies.compare import interleaved, median_interval

TIME_BUDGET_S = 8.0  # the timing of all policies together aims at about this long
MIN_ROUNDS = 3
CALLS_PER_ROUND = 1


def _rounds(per_call: dict[str, float], time_budget_s: float, cap: int) -> int:
    total = sum(per_call.values()) * CALLS_PER_ROUND
    fit = int(time_budget_s / total) if total > 0 else cap
    return max(MIN_ROUNDS, min(cap, fit))


def time_rows(rows: list[dict], configs: dict[str, RunConfig], server_budget, time_budget_s: float,
              seed: int, say: Progress) -> bool:
    """Time each fitting policy at its largest batch, interleaved; fill the rows. True if any."""
    allowed = resolve_budget(server_budget, device_memory_limit())
    executables, same_as = {}, {}
    by_program: dict[tuple, str] = {}
    for r in rows:
        if r["max_batch"] == 0:
            continue
        cfg = configs[r["policy"]].replace(batch=r["max_batch"])
        try:
            check_budget(cfg, allowed)
        except ConfigError:
            r["not_timed"] = (f"not timed: batch {r['max_batch']} is over this server's memory budget "
                              f"({human_bytes(allowed)}) for running; sized by compiling only")
            continue
        key = (r["fingerprint"], r["max_batch"])
        if key in by_program:  # the same program at the same batch: timed once, shared
            same_as[r["policy"]] = by_program[key]
            continue
        by_program[key] = r["policy"]
        say(f"compiling {r['policy']} at batch {r['max_batch']} for timing")
        problem = build_problem(cfg)
        try:
            compiled = jax.jit(make_step(problem)).trace(*problem.args).lower().compile()
        except Exception as err:  # noqa: BLE001
            r["not_timed"] = f"not timed: {xla_error('compiling', err)}"
            continue
        executables[r["policy"]] = (compiled, problem.args)
    if not executables:
        return False
    with timing_slot(lambda stage: say("waiting: another run is timing (one timing at a time)")):
        per_call = {}
        for p, (compiled, args) in executables.items():  # one call each: how long a round takes
            t = time.perf_counter()
            jax.block_until_ready(compiled(*args))
            per_call[p] = time.perf_counter() - t
        cap = max(configs[p].repeats for p in executables)
        rounds = _rounds(per_call, time_budget_s, cap)
        say(f"timing {len(executables)} policies at their largest batches: {rounds} rounds")
        try:
            times = interleaved(executables, rounds=rounds, calls=CALLS_PER_ROUND,
                                 warmup=min(configs[p].warmup for p in executables), seed=seed)
        except Exception as err:
            raise xla_error("running", err) from err
    by_policy = {r["policy"]: r for r in rows}
    for p in list(executables) + list(same_as):
        r = by_policy[p]
        med, low, high = median_interval(times[same_as.get(p, p)], seed=seed)
        b = r["max_batch"]
        r["step_time_s"], r["step_time_ci_s"] = med, [low, high]
        r["examples_per_s"] = b / med
        r["examples_per_s_ci"] = [b / high, b / low]
        r["rounds"] = int(times[same_as.get(p, p)].shape[0])
        if p in same_as:
            r["same_program_as"] = same_as[p]
    return True



def flop_rates(rows: list[dict]) -> tuple[float | None, str | None]:
    """Fill each timed row's FLOP rates and, against the calibrated peak, its MFU and HFU. Returns
    ``(peak FLOP/s, where it came from)``."""
    peak, peak_source = None, None
    try:
        roofs = calibrate()
        peak, peak_source = roofs.get("peak_flops_per_s"), roofs.get("peak_note")
    except Exception:  # noqa: BLE001 - rates without fractions rather than no advice
        peak = None
    for r in rows:
        if not r["step_time_s"]:
            continue
        for kind in ("model", "hardware"):
            flops = r[f"{kind}_flops"]
            r[f"{kind}_flops_per_s"] = flops / r["step_time_s"] if flops else None
        if peak:
            r["mfu"] = min(r["model_flops_per_s"] / peak, 1.0) if r["model_flops_per_s"] else None
            r["hfu"] = min(r["hardware_flops_per_s"] / peak, 1.0) if r["hardware_flops_per_s"] else None
    return peak, peak_source

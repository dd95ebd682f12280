"""The advisor: per policy, the largest batch whose compiled peak fits a memory budget, and which policy
trains the most examples per second there.

XLA's compiled memory analysis is known before anything is allocated, so the search needs compiles,
not runs: each probe lowers and compiles the step on abstract inputs (``jax.ShapeDtypeStruct``) and
reads ``memory.peak_bytes``. Per policy: from a first guess (the previous policy's answer), predictions
from a line through the measured peaks, doubling and bisection, down to the exact batch that fits and
the next one that does not. Then, unless told
not to, every policy that fits is timed at its largest batch (interleaved round-robin, as Compare
does) and its model and hardware FLOP rates are reported against the machine's peak:

- model FLOPs: the ``no_remat`` program's flops at that batch (the work the model needs);
- hardware FLOPs: this policy's program's flops at that batch (recomputation included);
- MFU and HFU: each divided by the step time and by the calibrated peak FLOP/s.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

import jax

from remat_lab.analysis import hlo
from remat_lab.analysis.costs import cost_of, memory_report, step_flops
from remat_lab.analysis.roofline import calibrate
from remat_lab.config import (
    BUDGET_ENV,
    LIMITS,
    ConfigError,
    RunConfig,
    check_budget,
    default_budget_bytes,
    human_bytes,
    parse_bytes,
    resolve_budget,
)
from remat_lab.model.policies import POLICIES
from remat_lab.program.backend import device_memory_limit, environment, xla_error
from remat_lab.program.step import abstract_problem, build_problem, make_step
from remat_lab.program.timing import timing_slot
from remat_lab.studies.compare import _interleaved, median_interval

MAX_BATCH = LIMITS["batch"][1]
TIME_BUDGET_S = 8.0  # the timing of all policies together aims at about this long
MIN_ROUNDS = 3
CALLS_PER_ROUND = 1
PROBE_CACHE_ENTRIES = 1024  # a probe is a few numbers: ~1 KB each

Progress = Callable[[str], None]


class _ProbeCache:
    """Probe results by configuration (a policy's program at one batch), least recently used out."""

    def __init__(self, entries: int):
        self.entries, self._data, self._lock = entries, OrderedDict(), threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        return None

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.entries:
                self._data.popitem(last=False)

    def drop(self, key) -> None:
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()


_PROBES = _ProbeCache(PROBE_CACHE_ENTRIES)


def _probe_key(config: RunConfig) -> RunConfig:
    return config.replace(repeats=1, warmup=0, seed=0)  # none of these changes the program


def compile_abstract(config: RunConfig):
    """The jitted step of ``config`` lowered and compiled on abstract inputs (nothing allocated)."""
    problem = abstract_problem(config)
    try:
        return jax.jit(make_step(problem)).trace(*problem.args).lower().compile()
    except Exception as err:  # XlaRuntimeError and friends
        raise xla_error("compiling", err) from err


def probe(config: RunConfig) -> dict:
    """One compile-only probe: ``{"batch", "peak_bytes", "flops", "fingerprint", "cached", "s"}``.

    ``peak_bytes`` is XLA's compiled peak (``memory.peak_bytes``); ``flops`` the step's flops with
    loop bodies scaled by their trip counts. Results are cached in this process by configuration.
    """
    key = _probe_key(config)
    found = _PROBES.get(key)
    if found is not None:
        return {**found, "cached": True}
    t0 = time.perf_counter()
    compiled = compile_abstract(config)
    text = compiled.as_text()
    memory = memory_report(compiled) or {}
    if memory.get("peak_bytes") is None:
        raise ConfigError("this backend gives no compiled memory analysis, so the advisor cannot "
                          "size batches on it.")
    out = {"batch": config.batch, "peak_bytes": int(memory["peak_bytes"]),
           "flops": step_flops(cost_of(compiled)["flops"], text),
           "fingerprint": hlo.fingerprint(text), "s": time.perf_counter() - t0}
    _PROBES.put(key, out)
    return {**out, "cached": False}


def clear_cache() -> None:
    _PROBES.clear()


def _interpolate(lo: int, p_lo: int, hi: int, p_hi: int, budget: int) -> int:
    """The batch where the line through (lo, p_lo) and (hi, p_hi) reaches ``budget``, rounded down."""
    if p_hi <= p_lo:
        return (lo + hi) // 2
    return lo + int((budget - p_lo) * (hi - lo) // (p_hi - p_lo))


def largest_batch(config: RunConfig, budget: int, *, guess: int | None = None,
                  max_batch: int = MAX_BATCH, progress: Progress | None = None,
                  measure: Callable[[RunConfig], dict] | None = None) -> dict:
    """The largest batch of ``config`` (its policy) whose compiled peak is at most ``budget``.

    The compiled peak grows about linearly with the batch, so the search predicts from a line
    through what it has measured and checks the prediction and the batch after it; bisection
    takes over once a prediction does not narrow the bracket by half. It starts at ``guess`` (the
    previous policy's answer) and its next batch, or at batches 1 and 64. At most about
    2·log2(max_batch) + 3 compiles, usually 3 to 6. Returns ``{"max_batch", "peak_bytes",
    "next_batch", "next_peak_bytes", "probes": [{"batch", "peak_bytes", "fits"}], "compiles",
    "reason"}``: ``max_batch`` 0 when batch 1 does not fit, ``next_batch`` None when even
    ``max_batch`` (the lab's limit) fits.
    """
    say = progress or (lambda message: None)
    measure = measure or probe  # ``probe`` (a compile); tests pass synthetic curves
    probes: dict[int, dict] = {}

    def peak(b: int) -> int:
        if b not in probes:
            say(f"{config.policy}: compiling batch {b}")
            probes[b] = measure(config.replace(batch=b))
        return probes[b]["peak_bytes"]

    def fits(b: int) -> bool:
        return peak(b) <= budget

    def take(b: int, predicted: bool) -> None:
        """``b`` fits: the new ``lo``; after a prediction, the batch after it says whether it is the
        answer (the prediction is usually the boundary or one short of it)."""
        nonlocal lo, hi
        lo = b
        if predicted and lo < max_batch and (hi is None or hi - lo > 1):
            if fits(lo + 1):
                lo += 1
            else:
                hi = lo + 1

    # 1. A bracket: lo fits (0: nothing does yet), hi does not (None: not found yet).
    first = min(max(guess or 1, 1), max_batch)
    lo, hi = (first, None) if fits(first) else (0, first)
    if lo and guess and lo < max_batch:  # is the guess already the answer?
        if not fits(lo + 1):
            hi = lo + 1
        else:
            lo = lo + 1
    far = min(max_batch, 64) if not guess else None
    predicted = False  # upward: one prediction from a line, then doubling
    while hi is None and lo < max_batch:
        b, use = lo * 2, False
        if far and far > lo:
            b, far = far, None
        elif not predicted:
            small = min(probes)
            if lo - small >= 8 and peak(lo) > peak(small):
                pred = _interpolate(small, peak(small), lo, peak(lo), budget)
                if pred > lo:
                    b, use, predicted = pred, True, True
        b = min(b, max_batch)
        if fits(b):
            take(b, use)
        else:
            hi = b
    if hi is not None and lo == 0:  # downward: the first probe did not fit
        while hi > 1 and lo == 0:
            b = hi // 2
            if fits(b):
                lo = b
            else:
                hi = b
    # 2. Narrow the bracket: predict from the line through its ends (and check the batch after a
    # prediction that fits); once a prediction does not halve the bracket, bisect.
    predict = True
    while hi is not None and hi - lo > 1:
        width = hi - lo
        use = predict and lo > 0
        b = _interpolate(lo, peak(lo), hi, peak(hi), budget) if use else (lo + hi) // 2
        b = min(max(b, lo + 1), hi - 1)
        if fits(b):
            take(b, use)
        else:
            hi = b
        predict = predict and hi - lo <= width // 2  # one that does not halve it: bisect from now on
    rows = [{"batch": k, "peak_bytes": v["peak_bytes"], "fits": v["peak_bytes"] <= budget}
            for k, v in sorted(probes.items())]
    if lo == 0:
        reason = (f"does not fit even batch 1: its compiled peak is "
                  f"{human_bytes(probes[1]['peak_bytes'])}, over the budget of {human_bytes(budget)}")
    elif hi is None:
        reason = f"fits the largest batch the lab searches ({max_batch})"
    else:
        reason = (f"batch {lo} peaks at {human_bytes(probes[lo]['peak_bytes'])}; batch {hi} "
                  f"would need {human_bytes(probes[hi]['peak_bytes'])}")
    return {
        "max_batch": lo, "peak_bytes": probes[lo]["peak_bytes"] if lo else None,
        "next_batch": hi, "next_peak_bytes": probes[hi]["peak_bytes"] if hi else None,
        "probes": rows, "compiles": sum(not v["cached"] for v in probes.values()),
        "reason": reason,
    }


def advice_budget(budget: str | int | None = None, device_limit: int | None = None, *,
                  ask_device: bool = True) -> tuple[int, str]:
    """``(bytes, where it came from)``: the given size, else ``$REMAT_LAB_MEMORY_BUDGET``, else the
    device's memory limit (GPU/TPU), else the run budget (half this machine's or container's memory).
    Sizes are written as for ``--memory-budget`` (``512M``, ``2G``, bytes). ``device_limit`` with
    ``ask_device=False``: a limit already known (the app asks its worker), JAX not asked here."""
    if budget is not None:
        if isinstance(budget, bool) or (isinstance(budget, int) and budget <= 0):
            raise ConfigError(f"memory budget must be a positive size; got {budget!r}.")
        return (budget if isinstance(budget, int) else parse_bytes(budget)), "given"
    if os.environ.get(BUDGET_ENV):
        return parse_bytes(os.environ[BUDGET_ENV]), f"${BUDGET_ENV}"
    limit = device_memory_limit() if ask_device and device_limit is None else device_limit
    if limit:
        return int(limit), "the device's memory limit"
    return default_budget_bytes(), "half this machine's (or container's) memory, as for runs"


def _policy_list(policies: Sequence[str] | None) -> list[str]:
    default = [p for p, spec in POLICIES.items() if spec.group == "jax"]
    chosen = list(dict.fromkeys(policies)) if policies else default
    for p in chosen:
        if p not in POLICIES:
            raise ConfigError(f"unknown policy {str(p)[:40]!r}; choose from: {', '.join(POLICIES)}.")
    if not chosen:
        raise ConfigError("no policy given; choose from: " + ", ".join(POLICIES) + ".")
    return chosen


def _rounds(per_call: dict[str, float], time_budget_s: float, cap: int) -> int:
    total = sum(per_call.values()) * CALLS_PER_ROUND
    fit = int(time_budget_s / total) if total > 0 else cap
    return max(MIN_ROUNDS, min(cap, fit))


def _recommend(rows: list[dict], timed: bool) -> tuple[str | None, list[str], str]:
    """The policy with the most examples per second, its near-ties, and a sentence saying why."""
    fits = [r for r in rows if r["max_batch"] > 0]
    if not fits:
        return None, [], "no policy fits batch 1 in this budget: raise the budget or shrink the model"
    if not timed:
        best = max(fits, key=lambda r: (r["max_batch"], -rows.index(r)))
        ties = [r["policy"] for r in fits if r["max_batch"] == best["max_batch"]]
        return (best["policy"], ties,
                f"{_names(ties)} fit{'s' if len(ties) == 1 else ''} the largest batch "
                f"({best['max_batch']}); not timed, so this is by batch alone")
    best = max(fits, key=lambda r: r["examples_per_s"] or 0.0)
    # Near-ties: a policy whose interval of examples/s overlaps the best one's.
    ties = [r["policy"] for r in fits
            if r is best or (r["examples_per_s_ci"] and best["examples_per_s_ci"]
                             and r["examples_per_s_ci"][1] >= best["examples_per_s_ci"][0])]
    # Against the policy without remat: how much bigger a batch and how much faster.
    base = next((r for r in rows if r["policy"] == "no_remat"), None)
    why = f"{best['policy']} fits batch {best['max_batch']}"
    if base is not None and base is not best:
        why += (" where no_remat does not fit batch 1" if base["max_batch"] == 0 else
                " as no_remat does" if base["max_batch"] == best["max_batch"] else
                f" where no_remat fits {base['max_batch']}")
    why += f"; at that batch it processes {best['examples_per_s']:,.0f} examples/s"
    if base is not None and base is not best and base["examples_per_s"]:
        why += (f", {best['examples_per_s'] / base['examples_per_s']:.2f}× no_remat at its "
                "largest batch")
    else:
        rest = [r for r in fits if r is not best and r["examples_per_s"]]
        runner = max(rest, key=lambda r: r["examples_per_s"], default=None)
        if runner is not None:
            why += (f", {best['examples_per_s'] / runner['examples_per_s']:.2f}× the next best "
                    f"({runner['policy']} at batch {runner['max_batch']})")
    others = [p for p in ties if p != best["policy"]]
    if others:
        why += (f"; {_names(others)} {'is' if len(others) == 1 else 'are'} within its timing spread "
                "(a near-tie)")
        group = [r for r in fits if r["policy"] in ties]
        roomiest = max(group, key=lambda r: r["max_batch"])
        if roomiest["max_batch"] > best["max_batch"]:
            why += (f"; of those, {roomiest['policy']} fits the largest batch "
                    f"({roomiest['max_batch']})")
    return best["policy"], ties, why


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def advise(config: RunConfig, budget: str | int | None = None, *,
           policies: Sequence[str] | None = None, timing: bool = True,
           time_budget_s: float = TIME_BUDGET_S, max_batch: int = MAX_BATCH,
           server_budget: str | int | None = None, progress: Progress | None = None,
           seed: int = 0) -> dict:
    """The advice document of ``remat_lab advise --json`` (see the module docstring).

    ``config`` gives the model (its batch and policy are ignored). ``budget``: the device memory
    the user has (default: the device's memory, or half this machine's, as the run budget).
    ``server_budget``: what this process may allocate for the timed runs (default: the same as
    ``run``'s budget); a policy whose largest batch is over it is sized but not timed.
    """
    say = progress or (lambda message: None)
    chosen = _policy_list(policies)
    budget_bytes, budget_source = advice_budget(budget)
    if not 1 <= max_batch <= MAX_BATCH:
        raise ConfigError(f"max_batch must be from 1 to {MAX_BATCH}; got {max_batch!r}.")
    names = {"save_names": config.save_names, "offload_names": config.offload_names}
    base_cfg = config.replace(batch=max(config.batch, 1), repeats=max(config.repeats, 1),
                              policy="no_remat", save_names=(), offload_names=())
    # Validated before anything compiles; custom keeps the configuration's per-name choices.
    configs = {p: base_cfg.replace(policy=p, **(names if p == "custom" else {})) for p in chosen}

    t0 = time.perf_counter()
    rows, guess = [], None
    for i, p in enumerate(chosen, 1):
        found = largest_batch(configs[p], budget_bytes, guess=guess, max_batch=max_batch,
                              progress=lambda m, i=i: say(f"{i}/{len(chosen)} {m}"))
        guess = found["max_batch"] or guess
        rows.append({"policy": p, **found})
    # Model FLOPs at each policy's largest batch: the no_remat program's count at that batch.
    for r in rows:
        r.update(step_time_s=None, step_time_ci_s=None, examples_per_s=None, examples_per_s_ci=None,
                 model_flops=None, hardware_flops=None, model_flops_per_s=None,
                 hardware_flops_per_s=None, mfu=None, hfu=None, recompute_overhead=None,
                 not_timed=None)
        if r["max_batch"] == 0:
            continue
        at = configs[r["policy"]].replace(batch=r["max_batch"])
        say(f"counting model flops at batch {r['max_batch']}")
        r["hardware_flops"] = probe(at)["flops"]
        r["model_flops"] = probe(base_cfg.replace(batch=r["max_batch"]))["flops"]
        r["fingerprint"] = probe(at)["fingerprint"]
    search_s = time.perf_counter() - t0

    timed = False
    if timing:
        timed = _time_rows(rows, configs, server_budget, time_budget_s, seed, say)
    peak, peak_source = None, None
    if timed:
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
                if r["mfu"] is not None and r["hfu"] is not None:
                    r["recompute_overhead"] = r["hfu"] - r["mfu"]
    recommended, ties, reason = _recommend(rows, timed)
    notes = _notes(configs, rows)
    for r in rows:
        r.pop("fingerprint", None)
    return {
        "schema": 1,  # the results schema (see results.py)
        "kind": "advice",
        "budget_bytes": budget_bytes,
        "budget_source": budget_source,
        "config": {**{k: v for k, v in base_cfg.as_dict().items() if k not in ("batch", "policy")},
                   **({k: list(v) for k, v in names.items()} if "custom" in chosen else {})},
        "policies": chosen,
        "rows": rows,
        "recommended": recommended,
        "near_ties": [p for p in ties if p != recommended],
        "reason": reason,
        "search_s": search_s,
        "notes": notes,
        "timed": timed,
        "peak_flops_per_s": peak,
        "peak_source": peak_source,
        "method": {
            "probe": "lower + compile on jax.ShapeDtypeStruct inputs; XLA's compiled memory "
                     "analysis peak (generated code + arguments + outputs - aliases + temp)",
            "search": "from the previous policy's answer (batches 1 and 64 for the first): "
                      "linear predictions checked with the batch after, doubling, bisection; "
                      "exact to one batch",
            "timing": (f"interleaved round-robin at each policy's largest batch, {CALLS_PER_ROUND} "
                       "call per round; bootstrap 95 % interval of the median"),
            "model_flops": "the no_remat program's flops at the same batch (loop bodies scaled by "
                           "their trip counts)",
            "hardware_flops": "this policy's program's flops at that batch (recomputation included)",
            "mfu": "model flops / step time / peak FLOP/s (calibrated on this machine)",
            "hfu": "hardware flops / step time / peak FLOP/s",
        },
        "environment": environment(),
    }


def _notes(configs: dict[str, RunConfig], rows: list[dict]) -> list[str]:
    """What this backend cannot show, and rows that were sized but not timed."""
    notes = []
    if jax.default_backend() == "cpu":
        offload = [p for p, c in configs.items()
                   if POLICIES[p].offloads or p.startswith("offload") or c.offload_names]
        if offload:
            notes.append(f"XLA CPU has no separate host memory: {', '.join(offload)} offload nothing "
                         "here (the compiled peak keeps those tensors on the device); on a GPU or "
                         "TPU they can fit a larger batch.")
        if next(iter(configs.values())).dtype == "bfloat16":
            notes.append("XLA CPU computes bfloat16 products in float32: step times, MFU and HFU are "
                         "against the float32 peak; on a GPU or TPU bfloat16 runs at its own rate.")
    if any(r.get("not_timed") for r in rows):
        notes.append("Some policies were sized but not timed: their largest batch is estimated over "
                     "what this machine may allocate (see each row).")
    return notes


def _time_rows(rows: list[dict], configs: dict[str, RunConfig], server_budget, time_budget_s: float,
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
            times = _interleaved(executables, rounds=rounds, calls=CALLS_PER_ROUND,
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


def probe_seconds(config: RunConfig, repeats: int = 5) -> list[float]:
    """Seconds of ``repeats`` uncached compile-only probes of ``config`` (the probe cache cleared
    before each; XLA's persistent cache, when on, still applies): for the benchmark."""
    out = []
    for _ in range(repeats):
        _PROBES.drop(_probe_key(config))
        t = time.perf_counter()
        probe(config)
        out.append(time.perf_counter() - t)
    return out


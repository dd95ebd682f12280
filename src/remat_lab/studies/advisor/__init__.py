"""The advisor's document: per policy the largest batch that fits a memory budget, and which one to use.

For each policy, ``advisor_search`` finds the largest batch whose compiled peak (compile-only probes)
fits the budget; unless told not to, ``advisor_timing`` times every policy that fits at that batch and
reports its MFU and HFU. This module chooses the budget and the policies, recommends the policy that
trains the most examples per second (with its near-ties and a sentence saying why), adds notes on what
this backend cannot show, and writes it all as the document of ``remat_lab advise --json``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import jax

from remat_lab.analysis.estimate import BASIS
from remat_lab.analysis.xla_remat import sentence
from remat_lab.config import (
    BUDGET_ENV,
    LOCAL,
    ConfigError,
    RunConfig,
    default_budget_bytes,
    get_target,
    human_bytes,
    mfu_model_flops,
    parse_bytes,
)
from remat_lab.config.targets import GPU_USABLE_FRACTION, TPU_USABLE_FRACTION
from remat_lab.model.attention import for_config
from remat_lab.model.policies import POLICIES
from remat_lab.program.backend import ExecutionError, device_memory_limit, environment, xla_error
from remat_lab.program.footprint import crowded_sentence, fit, no_fit_sentence
from remat_lab.program.native_log import logged
from remat_lab.program.optimizer import precision
from remat_lab.studies.advisor.batch_search import largest_batch  # noqa: F401 - re-exported
from remat_lab.studies.advisor.decision import decide, sig
from remat_lab.studies.advisor.estimates import estimate_rows, prediction_basis, recommend_by_estimate
from remat_lab.studies.advisor.search import (  # noqa: F401 - re-exported: the advisor's public names
    MAX_BATCH,
    PROBE_CACHE_ENTRIES,
    Progress,
    batch_unit,
    clear_cache,
    compile_abstract,
    device_fields,
    probe,
    probe_seconds,
)
from remat_lab.studies.advisor.sizing import FLOPS_RTOL, WORKERS, model_flops_at, size_policies, xla_free
from remat_lab.studies.advisor.timing import (  # noqa: F401 - re-exported too
    CALLS_PER_ROUND,
    MAX_ROUNDS,
    MIN_ROUNDS,
    TIME_BUDGET_S,
    flop_rates,
    time_rows,
    tracker,
)


def advice_budget(budget: str | int | None = None, device_limit: int | None = None, *,
                  ask_device: bool = True, target: str = LOCAL) -> tuple[int, str]:
    """``(bytes, where it came from)``: the given size; on a named target, the memory JAX may use on
    it (``Target.usable_bytes``: 75 % of a GPU's, JAX's default preallocation, 95 % of a TPU's HBM);
    else ``$REMAT_LAB_MEMORY_BUDGET``, the device's memory limit (GPU/TPU) or the run budget (half
    this machine's or container's memory). Sizes are written as for ``--memory-budget`` (``512M``,
    ``2G``, bytes). ``device_limit`` with ``ask_device=False``: a limit already known (the app asks
    its worker), JAX not asked here."""
    if budget is not None:
        if isinstance(budget, bool) or (isinstance(budget, int) and budget <= 0):
            raise ConfigError(f"memory budget must be a positive size; got {budget!r}.")
        return (budget if isinstance(budget, int) else parse_bytes(budget)), "given"
    if target != LOCAL:
        t = get_target(target)
        share = GPU_USABLE_FRACTION if t.platform == "cuda" else TPU_USABLE_FRACTION
        rule = ("JAX's default preallocation on a GPU (XLA_PYTHON_CLIENT_MEM_FRACTION)"
                if t.platform == "cuda" else "what JAX may use of a TPU's HBM")
        return t.usable_bytes(), (f"{share:.0%} of the {target}'s {human_bytes(t.memory_bytes)}, "
                                  f"{rule}")  # the page has a box, the CLI --budget: neither named here
    if os.environ.get(BUDGET_ENV):
        return parse_bytes(os.environ[BUDGET_ENV]), f"${BUDGET_ENV}"
    limit = device_memory_limit() if ask_device and device_limit is None else device_limit
    if limit:
        return int(limit), "the device's memory limit"
    return default_budget_bytes(), "half this machine's (or container's) memory, as for runs"


def _policy_list(policies: Sequence[str] | None, model: str = "") -> list[str]:
    """The policies given, or JAX's (and, for the llm, whose names they are, MaxText's recipes)."""
    groups = ("jax", "maxtext") if model == "llm" else ("jax",)
    default = [p for p, spec in POLICIES.items() if spec.group in groups]
    chosen = list(dict.fromkeys(policies)) if policies else default
    for p in chosen:
        if p not in POLICIES:
            raise ConfigError(f"unknown policy {str(p)[:40]!r}; choose from: {', '.join(POLICIES)}.")
    if not chosen:
        raise ConfigError("no policy given; choose from: " + ", ".join(POLICIES) + ".")
    return chosen


def _recommend(rows: list[dict], timed: bool) -> tuple[str | None, list[str], str]:
    """The policy with the most examples per second, its near-ties, and a sentence saying why."""
    fits = [r for r in rows if r["max_batch"] > 0]
    if not fits:
        return None, [], "no policy fits batch 1 in this budget: raise the budget or shrink the model"
    if not timed:
        # equal batches: the most headroom (the smallest compiled peak) first
        best = max(fits, key=lambda r: (r["max_batch"], -(r.get("peak_bytes") or 0), -rows.index(r)))
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
    why += f"; at that batch it processes {sig(best['examples_per_s'])} examples/s"
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


def _overheads(row: dict, free: dict) -> None:
    """A fitting row's recomputation as shares of no_remat's program flops: the compiled program's
    (``recompute_overhead``) = the policy's own (``policy_recompute_overhead``: its program as
    written, XLA's pass's limit lifted) + XLA's (``xla_recompute_overhead``: what XLA's own
    rematerialization pass added trying to fit; ``xla_remat``, ``analysis/xla_remat``)."""
    row["xla_remat"] = free["xla_remat"]
    model, hardware = row["no_remat_flops"], row["hardware_flops"]
    if not model or not hardware:
        return
    row["recompute_overhead"] = hardware / model - 1
    extra = free["xla_remat"]["extra_flops"]
    if extra is not None:
        row["xla_recompute_overhead"] = extra / model
        row["policy_recompute_overhead"] = (hardware - extra) / model - 1
    note = sentence(free["xla_remat"], sig)
    if note:
        row["xla_remat_note"] = note


def _no_fit_row(static: dict, config: RunConfig) -> dict:
    """A policy's row when the static bytes alone exceed the budget: no batch, nothing compiled;
    ``next_peak_bytes`` is those bytes, what any batch's peak holds at least (``limited_by``)."""
    need = static["static_bytes_per_device"]
    return {"max_batch": 0, "per_device_batch": 0, "peak_bytes": None, "next_batch": batch_unit(config),
            "next_peak_bytes": need, "probes": [], "compiles": 0, "limited_by": "static_bytes",
            "reason": f"does not fit even batch 1 per device: {human_bytes(need)} before any activation"}


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@logged("log")  # XLA's and JAX's log lines and warnings: summarized in the document
def advise(config: RunConfig, budget: str | int | None = None, *,
           policies: Sequence[str] | None = None, timing: bool = True,
           time_budget_s: float = TIME_BUDGET_S, max_batch: int = MAX_BATCH,
           server_budget: str | int | None = None, progress: Progress | None = None,
           seed: int = 0, should_stop: Callable[[], bool] | None = None,
           workers: int = WORKERS) -> dict:
    """The advice document of ``remat_lab advise --json`` (see the module docstring).

    ``config`` gives the model (its batch and policy are ignored). ``budget``: the device memory
    the user has (default: the device's memory, or half this machine's, as the run budget).
    ``server_budget``: what this process may allocate for the timed runs (default: the same as
    ``run``'s budget, or what a container has free); a policy whose compiled peak at its largest
    batch plus the process overhead is over it is sized but not timed (``advisor_timing.plan``).
    ``time_budget_s``: seconds for the timing (rounds stop earlier once the best separates);
    ``should_stop``: checked between rounds, finished rounds are kept. ``workers``: policies
    sized at once, in threads (``advisor_sizing``; the answers are the same with 1).
    """
    chosen = _policy_list(policies, config.model)
    budget_bytes, budget_source = advice_budget(budget, target=config.target)
    on_target = config.target != LOCAL
    timing = timing and not on_target  # nothing runs on a named target: estimates instead
    if not 1 <= max_batch <= MAX_BATCH:
        raise ConfigError(f"max_batch must be from 1 to {MAX_BATCH}; got {max_batch!r}.")
    names = {"save_names": config.save_names, "offload_names": config.offload_names}
    base_cfg = config.replace(batch=max(config.batch, 1), repeats=max(config.repeats, 1),
                              policy="no_remat", save_names=(), offload_names=())
    # Validated before anything compiles; custom keeps the configuration's per-name choices.
    configs = {p: base_cfg.replace(policy=p, **(names if p == "custom" else {})) for p in chosen}

    t0, say = time.perf_counter(), tracker(progress, chosen, time_budget_s if timing else None)
    # Parameters, gradients and optimizer state per device, from the configuration alone: over
    # the budget nothing fits at any batch, answered before any compile (program/footprint.py).
    static = fit(base_cfg, budget_bytes)
    timing = timing and static["fits"]
    try:
        sized = (size_policies(configs, budget_bytes, max_batch=max_batch, progress=say, workers=workers)
                 if static["fits"] else {p: _no_fit_row(static, base_cfg) for p in chosen})
    except ExecutionError as err:  # a compile over the device's memory: a preset's said in devices
        raise xla_error("compiling", err.__cause__ or err, base_cfg) from err
    rows = [{"policy": p, **sized[p], **device_fields(configs[p], sized[p])} for p in chosen]
    # Model FLOPs: the no_remat program's count at each policy's largest batch.
    answers = {r["max_batch"] for r in rows if r["max_batch"]}
    say.phase("model flops", planned=len(answers), unit="batches counted", item="batch",
              after="then each answer's program read")
    model_flops, on_line = model_flops_at(
        base_cfg, answers, lambda b: say.finished(None, f"model flops: no_remat's program at batch {b}"))
    say.phase("answers", planned=sum(1 for r in rows if r["max_batch"]), unit="answers read",
              item="policy", after="then the timing" if timing else "")
    for r in rows:
        r.update(step_time_s=None, step_time_ci_s=None, examples_per_s=None, examples_per_s_ci=None,
                 model_flops=None, no_remat_flops=None, hardware_flops=None, model_flops_per_s=None,
                 hardware_flops_per_s=None, mfu=None, hfu=None, recompute_overhead=None,
                 policy_recompute_overhead=None, xla_recompute_overhead=None, xla_remat=None,
                 not_timed=None, rate_error=None, rounds=None)
        if r["max_batch"] == 0:
            continue
        at = configs[r["policy"]].replace(batch=r["max_batch"])
        r["hardware_flops"] = probe(at)["flops"]
        r["no_remat_flops"] = model_flops[r["max_batch"]]
        r["model_flops"] = mfu_model_flops(at, r["no_remat_flops"])
        r["fingerprint"] = probe(at)["fingerprint"]
        _overheads(r, xla_free(at))
        said = (f"XLA's own rematerialization rewrote the program at batch {r['max_batch']} "
                "(compiled again with its limit lifted)" if r["xla_remat"]["applied"]
                else f"its program at batch {r['max_batch']} read")
        say.finished(None, f"{r['policy']}: {said}")
    search_s = time.perf_counter() - t0

    timing_doc = (time_rows(rows, configs, server_budget, time_budget_s, seed, say, should_stop)
                  if timing else {"timed": False, "rounds": 0, "stopped_because": None,
                                  "time_budget_s": None})
    timed = timing_doc["timed"]
    stated = flop_rates(rows, config.dtype) if timed else {}
    if on_target:
        estimate_rows(rows, configs, config.target, probe)
        recommended, ties, reason = recommend_by_estimate(rows, config.target, _recommend)
    else:
        recommended, ties, reason = _recommend(rows, timed)
    if not static["fits"]:
        reason = f"no policy fits: {config.preset or config.model} {no_fit_sentence(static)}"
    elif recommended is None and config.preset:  # a published shape: more devices, never a smaller model
        reason = "no policy fits: " + crowded_sentence(static, batch_unit(base_cfg))
    cannot_show = _notes(configs, rows)
    notes = cannot_show + _rate_notes(rows, stated)
    if on_line:
        notes.append(f"model flops at {on_line} of the batches read on the line through no_remat's "
                     f"compiled counts at the batches around them (those lie on one line within "
                     f"{FLOPS_RTOL:.0e} of each); the others compiled")
    for r in rows:
        r.pop("fingerprint", None)
    doc = {
        "schema": 1,  # the results schema (see results.py)
        "kind": "advice",
        "decision": None,  # filled below from the rest (advisor_decision.decide)
        "budget_bytes": budget_bytes, "budget_source": budget_source,
        "precision": precision(base_cfg),
        # the llm: the attention kernel its programs compiled with (flash's fallback said)
        "attention": for_config(base_cfg).describe() if base_cfg.model == "llm" else None,
        "static": static,  # parameters, gradients, optimizer state per device; min_devices if over
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
        "time_budget_s": timing_doc["time_budget_s"],
        "rounds": timing_doc["rounds"],
        "stopped_because": timing_doc["stopped_because"],
        "timing": {k: v for k, v in timing_doc.items() if k not in ("timed", "rounds",
                                                                    "stopped_because")},
        "peak_flops_per_s": stated.get("peak_flops_per_s"),
        "peak_kind": stated.get("peak_kind"),
        "peak_source": stated.get("peak_source"),
        "method": {
            "probe": "lower + compile on jax.ShapeDtypeStruct inputs; XLA's compiled memory "
                     "analysis peak (generated code + arguments + outputs - aliases + temp)",
            "search": "per device and microbatch (global batch = that x data x fsdp x "
                      "microbatches), from the answer of the policy that finished last (batches "
                      "1 and 2 for the first) and a line from its batch-independent bytes; two "
                      "policies searched at once in threads, one lowering like an earlier policy "
                      "starts from its answer: linear predictions checked with the batch after, "
                      "doubling, bisection; exact to one batch",
            "timing": (f"interleaved round-robin at each policy's largest batch, {CALLS_PER_ROUND} "
                       f"call per round, at least {MIN_ROUNDS} rounds, then until the best "
                       "policy's examples/s interval lies above the runner-up's, the time budget "
                       f"(compiles for timing included) ends or {MAX_ROUNDS} rounds; bootstrap "
                       "95 % interval of the median. Timed only where the compiled peak at the "
                       "largest batch + the process overhead (all timed policies' parameters and "
                       "inputs alive together) fits what this process may allocate"),
            "model_flops": "per device: for the llm MaxText's model flops (6 x the matrix weights "
                           "a token uses x tokens, plus causal attention), else no_remat_flops",
            "no_remat_flops": "the no_remat program's flops at the same batch (loop bodies scaled "
                              "by their trip counts): compiled, or on the line through no_remat's "
                              "probes where three or more lie exactly on one",
            "hardware_flops": "this policy's program's flops at that batch (recomputation included)",
            "mfu": "model flops / step time / the stated peak (peak_source: a vendor figure "
                   "where the device is known, else the calibrated best matmul rate); over 1 is a "
                   "calibration error, never capped",
            "hfu": "hardware flops / step time / the stated peak",
            "recompute_overhead": "hardware flops / no_remat flops - 1 = policy_recompute_overhead "
                                  "(the policy's program as written) + xla_recompute_overhead (what "
                                  "XLA's own rematerialization pass added trying to fit the device)",
            "xla_remat": "instructions named *.remat* in the optimized HLO (XLA's rematerialization "
                         "pass's clones); its flops and peak against a second compile with the "
                         "pass's memory limit lifted; failed: its peak did not fall, rose, or "
                         "stayed over the device's memory (device_bytes); model flops always from "
                         "a program the pass did not rewrite",
        },
        "environment": environment(),
        **({"target": get_target(config.target, config.network).as_dict(), "estimate_basis": BASIS,
            "prediction_basis": prediction_basis(get_target(config.target, config.network))}
           if on_target else {}),
    }
    doc["decision"] = decide(doc, cannot_show)
    return doc


def _notes(configs: dict[str, RunConfig], rows: list[dict]) -> list[str]:
    """What this backend cannot show (the decision's ``cannot_show``)."""
    notes = []
    target = next(iter(configs.values())).target
    if target != LOCAL:
        notes.append(f"Compiled for the {target} without the device: batches are sized by its compiled "
                     "peak; step times and examples/s are predictions (and roofline bounds beside them), "
                     "not measurements.")
    elif jax.default_backend() == "cpu":
        offload = [p for p, c in configs.items()
                   if POLICIES[p].offloads or p.startswith("offload") or c.offload_names]
        if offload:
            notes.append(f"XLA CPU has no separate host memory: {', '.join(offload)} offload nothing "
                         "here (the compiled peak keeps those tensors on the device); on a GPU or "
                         "TPU they can fit a larger batch.")
        if next(iter(configs.values())).dtype == "bfloat16":
            notes.append("XLA CPU computes bfloat16 products in float32: step times, MFU and HFU are "
                         "against the float32 peak; on a GPU or TPU bfloat16 runs at its own rate.")
    return notes


def _rate_notes(rows: list[dict], stated: dict) -> list[str]:
    """Rows sized but not timed, the peak MFU and HFU are stated against, and calibration errors."""
    notes = []
    if any(r.get("not_timed") for r in rows):
        notes.append("Some policies were sized but not timed: each row's note gives the numbers "
                     "(compiled peak + process overhead against what this process may allocate).")
    if stated.get("peak_kind") == "calibrated":
        notes.append("MFU and HFU are against this machine's calibrated best matmul rate, not a "
                     "vendor peak.")
    bad = [r["policy"] for r in rows if r.get("rate_error")]
    if bad:
        notes.append(f"Calibration error: {', '.join(bad)} ran above the stated peak (MFU or HFU "
                     "over 1, shown uncapped): the peak is too low; recalibrate on an idle machine "
                     "(`python -m remat_lab calibrate`).")
    return notes

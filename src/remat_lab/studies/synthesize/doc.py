"""The synthesis document (``synthesize --json``, kind ``"synthesis"``) from a finished synthesis run."""

from __future__ import annotations

from remat_lab.config import LOCAL, RunConfig, get_target
from remat_lab.program.backend import environment
from remat_lab.studies.synthesize.refine import objective as _key
from remat_lab.studies.synthesize.solve import Model, Plan
from remat_lab.studies.synthesize.text import (
    METHOD,
    command,
    custom_flags,
    jax_code,
    maxtext_yaml,
    named_texts,
    run_command,
)


def at_named_batch(candidates: list[dict], named: dict, goal: str) -> dict | None:
    """The best compiled plan that fits at the named policy's batch, against that policy: its
    ``flops`` and the named policy's (each program's own), ``fewer_flops`` (theirs less ours) and,
    where no_remat has a flop count there, both recomputed flops and ``fewer_recomputed_share``.
    None when no plan was compiled to fit at that batch."""
    rows = [c for c in candidates if c.get("fits") and c["batch"] == named["max_batch"]
            and c.get("flops") is not None]
    if not rows or named.get("flops") is None:
        return None
    best = min(rows, key=lambda r: _key({**r, "max_batch": named["max_batch"]}, "min-recompute"))
    ours, theirs = best.get("recomputed_flops"), named.get("recomputed_flops")
    return {"plan": best["plan"], "max_batch": named["max_batch"], "source": best.get("source"),
            "peak_bytes": best["peak_bytes"], "flops": best["flops"], "named_flops": named["flops"],
            "fewer_flops": named["flops"] - best["flops"],
            "recomputed_flops": ours, "named_recomputed_flops": theirs,
            "fewer_recomputed_share": (1 - ours / theirs) if theirs and ours is not None else None,
            "baseline": "no_remat" if ours is not None and theirs is not None else "named"}


def _baseline_note(answer: dict | None, vs: dict, config: RunConfig) -> str | None:
    """Said when no_remat has no flop count at the answer's batch (a TPU refuses it over its HBM)."""
    if answer is None or answer.get("recomputed_flops") is not None or answer.get("flops") is None:
        return None
    where = f"over the {config.target}'s HBM, refused by libtpu" if config.target != LOCAL else \
        "no flop count"
    at = vs.get("at_named_batch") if vs else None
    tail = (f"; recomputation is reported against the best named policy (recomputed_baseline): "
            f"against {vs['policy']} at its batch {at['max_batch']}, {at['fewer_flops'] / 1e9:.4g} "
            "GFLOP fewer per step, each program's own compiled flops" if at else "")
    return (f"no_remat at the answer's batch has no flop count ({where}): recomputed flops "
            "(a program's less no_remat's) are not given there, never estimated; plans at the same "
            f"batch were ranked by their own compiled flops (the same order){tail}")


def document(run, base: RunConfig, config: RunConfig, model: Model | None, probes, named: list,
             goal: str, b: int | None, budget: int, budget_source: str, offload: bool, notes: list,
             static: dict, chosen: list[str], default_policies: list[str]) -> dict:
    """The document; ``run``: the synthesis's ``_Run`` (``candidates``, ``unit``, ``model_flops``)."""
    names = model.names if model else ()
    fits = [c for c in run.candidates if c.get("fits")]
    best = min(fits, key=lambda r: _key(r, goal), default=None)
    best_named = min((r for r in named if r["fits"]), key=lambda r: _key(r, goal), default=None)
    beats = best is not None and (best_named is None or _key(best, goal) <= _key(best_named, goal))
    answer = best if beats else best_named
    if best is not None and not beats:
        notes.append(f"no synthesized plan beats {best_named['policy']} on this goal (same compiles): "
                     "the answer is that named policy")
    plan = Plan(tuple(best["plan"]["save"]), tuple(best["plan"]["offload"]),
                best["plan"]["remat_layers"]) if best else None
    vs = {}
    if best is not None and best_named is not None:
        theirs, ours = best_named.get("recomputed_flops"), best.get("recomputed_flops")
        vs = {"policy": best_named["policy"], "max_batch": best_named["max_batch"],
              "batch_gain": best["max_batch"] - best_named["max_batch"],
              "recomputed_flops": theirs, "flops": best_named.get("flops"),
              "recompute_saved_share": (1 - ours / theirs) if theirs and ours is not None else None,
              "at_named_batch": at_named_batch(run.candidates, best_named, goal)}
    said = _baseline_note(answer, vs, base)
    if said:
        notes.append(said)
    errors = model_error(run.candidates)
    if errors:
        notes.append(f"the model's error on the {errors['compiled']} compiled candidates (compiled "
                     f"less predicted peak, of the compiled): {100 * errors['min_share']:+.1f} % to "
                     f"{100 * errors['max_share']:+.1f} % (each candidate's predicted_peak_bytes, "
                     "peak_bytes, error_share)")
    at = (answer or {}).get("max_batch") or 0
    # What is handed out describes the answer: the plan's texts, or the named policy's own.
    texts = {"custom": None, "code": None, "maxtext_yaml": None, "run_command": None}
    if beats and plan is not None:
        texts = {"custom": custom_flags(plan, base.depth), "code": jax_code(plan),
                 "maxtext_yaml": maxtext_yaml(plan, names, base.depth),
                 "run_command": run_command(base, plan, at or run.unit)}
    elif answer is not None:
        texts = named_texts(base, best_named["policy"], at or run.unit)
    host_bw = get_target(base.target).host_bandwidth_bytes_per_s if base.target != LOCAL else None
    offloaded = (answer or {}).get("offloaded_bytes")
    return {
        "schema": 1, "kind": "synthesis", "goal": goal,
        "config": {k: v for k, v in config.as_dict().items()
                   if k not in ("batch", "policy", "save_names", "offload_names", "remat_layers")},
        "budget_bytes": budget, "budget_source": budget_source, "static": static,
        "names": list(names), "offload": {"allowed": offload, "why": notes[0]},
        "answer": ("plan" if beats else best_named["policy"]) if answer else None,
        "plan": plan.as_dict(names) if plan and beats else None,
        "best_plan": plan.as_dict(names) if plan and not beats else None,
        "max_batch": at, "per_device_batch": (answer or {}).get("per_device_batch") or 0,
        # the answer's own largest batch searched (a named policy's always; a plan's unless the
        # compiles ran out: then a batch it was compiled to fit)
        "max_batch_exact": None if answer is None or goal != "max-batch" else
        bool(answer.get("max_batch_exact", True)),
        "peak_bytes": (answer or {}).get("peak_bytes"),
        "recomputed_flops": (answer or {}).get("recomputed_flops"),
        "recomputed_baseline": None if answer is None else (
            "no_remat" if answer.get("recomputed_flops") is not None else
            "named" if (vs.get("at_named_batch") or {}).get("fewer_flops") is not None else None),
        "flops": (answer or {}).get("flops"),
        "model_flops": run.model_flops(at // run.unit) if at and model else None,
        "offloaded_bytes": offloaded,
        "offload_s": 2 * offloaded / host_bw if offloaded and host_bw else None,
        "named": named, "best_named": vs or None, "model_error": errors,
        "candidates": run.candidates, "probes": probes or [],
        "costs": _costs(model) if model else None,
        **{k: texts[k] for k in ("custom", "code", "maxtext_yaml")},
        "command": command(config, budget, goal, b * run.unit if b else None,
                           chosen if chosen != default_policies else None),
        "policies": chosen,
        "run_command": texts["run_command"],
        "notes": notes, "method": METHOD, "environment": environment(),
        **({"target": get_target(base.target, base.network).as_dict()} if base.target != LOCAL else {}),
    }


def model_error(candidates: list[dict]) -> dict | None:
    """The model's error over every compiled candidate: ``{"compiled", "min_share", "max_share",
    "max_abs_share"}`` of each one's ``error_share`` (compiled less predicted peak, of the
    compiled); None when none was compiled."""
    shares = [c["error_share"] for c in candidates if c.get("error_share") is not None]
    if not shares:
        return None
    return {"compiled": len(shares), "min_share": min(shares), "max_share": max(shares),
            "max_abs_share": max(abs(x) for x in shares)}


def _costs(model: Model) -> dict:
    """The fitted model as data: per name and choice, bytes and flops per example (per device)."""
    return {"intercept_full": model.intercept_full, "slope_full": model.slope_full,
            "intercept_base": model.intercept_base, "slope_base": model.slope_base,
            "recompute_per_example": model.recompute, "recompute_basis": model.recompute_basis,
            "layers": model.layers, "layer_counts": list(model.layer_counts),
            "names": [{"name": n, "choice": c, "bytes_per_example": model.bytes[(n, c)],
                       "flops_spared_per_example": model.flops[(n, c)],
                       "host_bytes_per_example": model.host[(n, c)],
                       **({"offload_saving_per_example": model.offload_saving.get(n, 0.0)}
                          if c == "offload" else {})}
                      for n in model.names for c in ("save", "offload") if (n, c) in model.bytes]}

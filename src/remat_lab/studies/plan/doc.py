"""The plan document: the compiled plans ranked, the model's error, the published row beside them."""

from __future__ import annotations

from remat_lab.analysis.predict import rates
from remat_lab.config import RunConfig, batch_rows, get_target, llm_model_flops, parameter_counts, parse_mesh
from remat_lab.config import published as pub
from remat_lab.config.cli_flags import run_command
from remat_lab.studies.plan.fit import relative_error
from remat_lab.studies.plan.search import Space
from remat_lab.studies.plan.space import plan_label
from remat_lab.studies.plan.texts import maxtext_flags, maxtext_yaml

METHOD = ("Each mesh's first plan is compiled at two per-device batches of one step and every other "
          "plan at the largest (the mesh's batch-independent bytes shared; a plan the compiler refuses there "
          "at the smallest too; the first with accumulation steps, what accumulating adds on that mesh): the "
          "compiled peak and the "
          "predicted step (analysis/predict.py) are lines in the per-device batch. Every split of the "
          "global batch into per-device batch x accumulation steps, with and without the optimizer's "
          "state on the host (the plan's peak: the compiler brings the moments back for the update; "
          "their transfer over the host link added to the step), is predicted "
          "from them; the families of the best candidates are then measured on their own (a second "
          "batch where their line had one point, their own compile with accumulation steps where "
          "they accumulate) and every candidate predicted again; the best are compiled at full size, "
          "best first, until the top ones compiled fit "
          "and one the fit did not compile was among them. Every figure of a plan is its compile's.")


# The step prediction's stated error: the seventeen held-out published runs predicted within 0.85x
# to 1.19x of their measured steps, none outside 20 % (README, "Predicted step"; tests/test_predict.py).
STEP_ERROR = 0.20


def _rates(config: RunConfig, step_s: float | None) -> dict:
    """Predicted tokens/s per device and MFU (MaxText's model flops, ``config.budget``, at the bf16
    peak; attention causal, and the full square as MaxText's published runs count) at ``step_s``
    (``analysis/predict.rates``)."""
    return rates(step_s, model_flops=llm_model_flops(config) / config.target_devices,
                 model_flops_full_attention=llm_model_flops(config, causal=False) / config.target_devices,
                 tokens=config.batch * config.seq / config.target_devices,
                 target=get_target(config.target, config.network))


def plan_row(space: Space, config: RunConfig, found: dict, predicted: dict | None) -> dict:
    """One compiled plan as the document gives it."""
    step = found.get("predicted_s") or found.get("bound_s")
    found_rates = _rates(config, step)
    return {"mesh": config.mesh, "plan": (predicted or {}).get("plan") or _plan_of(config),
            "plan_text": plan_label((predicted or {}).get("plan") or _plan_of(config)),
            "policy": config.policy, "save_names": list(config.save_names),
            "offload_names": list(config.offload_names),
            "per_device_batch": config.batch / config.microbatches / config.target_devices,
            "batch_per_row": config.batch // config.microbatches // batch_rows(parse_mesh(config.mesh)),
            "microbatches": config.microbatches, "global_batch": config.batch,
            "optimizer_offload": config.optimizer_offload, "compiled": True,
            "fits": not found["refused"] and found["peak_bytes"] <= space.hbm,
            "refused": found["refused"], "peak_bytes": found["peak_bytes"],
            "predicted_peak_bytes": (predicted or {}).get("predicted_peak_bytes"),
            "predicted_s": found.get("predicted_s"), "bound_s": found.get("bound_s"),
            "step_basis": "prediction" if found.get("predicted_s") else "roofline bound",
            **found_rates,
            "limited_by": found.get("limited_by"), "xla_remat": found.get("xla_remat"),
            "maxtext_yaml": maxtext_yaml(config), "maxtext_flags": maxtext_flags(config),
            "run_command": run_command(config)}


def _plan_of(config: RunConfig) -> str:
    if config.policy != "custom":
        return config.policy
    parts = [f"save:{','.join(config.save_names)}" if config.save_names else "",
             f"offload:{','.join(config.offload_names)}" if config.offload_names else ""]
    return "|".join(p for p in parts if p) or "offload:"


def published_rows(config: RunConfig, sequences: int | None) -> list[str]:
    """Catalogued runs of the same model, chips and sequence length and, given one, global batch."""
    out = []
    for name, run in pub.RUNS.items():
        knobs = run["knobs"]
        if (run.get("lab_preset", run["model"]) == config.preset and run["target"] == config.target
                and run["devices"] == config.target_devices and knobs.get("max_target_length") == config.seq
                and (sequences is None or knobs["per_device_batch_size"] * run["devices"] == sequences)):
            out.append(name)
    return out


def _against_published(best: dict | None, pub: dict | None) -> dict:
    """The top plan against the published configuration: better only when its predicted advantage
    exceeds the step prediction's stated error (``STEP_ERROR``); within it, they match."""
    if not (best and pub):
        return {"beats_published": None, "against_published": None}
    ratio = best["predicted_tokens_per_s_per_device"] / pub["predicted_tokens_per_s_per_device"]
    verdict = "beats" if ratio > 1 + STEP_ERROR else "below" if ratio < 1 - STEP_ERROR else "matches"
    same = best.get("same_as") == f"the published configuration {pub['name']}"
    return {"beats_published": verdict == "beats",
            "against_published": {"verdict": "matches" if same else verdict, "ratio": ratio,
                                  "step_error": STEP_ERROR, "same_program": same}}


def document(space: Space, result: dict, published: dict[str, RunConfig], top: int) -> dict:
    """``plan --json``: the top compiled plans by predicted tokens/s per device, each fitting; the
    model's error on every compiled candidate the fit did not use; the published rows beside."""
    by_key = {(c["family"], c["per_device_batch"], c["microbatches"]): c for c in result["candidates"]}
    # the estimate by hand, made before any compile, set against each compiled candidate
    instant = {(r["family"], r["per_device_batch"], r["microbatches"]): r for r in result.get("instant", [])}
    rows, errors, by_hand = [], [], []
    for key, found in result["compiled"].items():
        if found.get("error"):
            continue
        fam, b, m = key
        predicted = by_key.get(key)
        row = plan_row(space, fam.apply(space.config, b, m), found, {**(predicted or {}), "plan": fam.plan})
        checked = result.get("before_check", {}).get(key)
        row["held_out"] = checked is not None
        row["predicted_before_compile"] = checked
        row["same_as"] = found.get("same_as")
        row["estimate_gap"] = found.get("estimate_gap")
        row["predicted_before_refinement"] = result.get("before_refinement", {}).get(key)
        row["instant_peak_bytes"] = (instant.get(key) or {}).get("instant_peak_bytes")
        if row["instant_peak_bytes"] and not found["refused"]:
            by_hand.append(relative_error(row["instant_peak_bytes"], found["peak_bytes"]))
        # a compile at a batch only the model needed (not a split of the global batch) is no answer
        row["answers"] = predicted is not None or (space.sequences is None and m == 1)
        rows.append(row)
        if checked and not found["refused"]:
            errors.append(relative_error(checked, found["peak_bytes"]))
    # the refinement's compiles as the model predicted them before (a borrowed or one-point line)
    corrected = [relative_error(p, result["compiled"][k]["peak_bytes"])
                 for k, p in result.get("before_refinement", {}).items()
                 if not result["compiled"].get(k, {}).get("error") and not result["compiled"][k]["refused"]]
    fitting = sorted((r for r in rows if r["fits"] and r["answers"]),
                     key=lambda r: -(r["predicted_tokens_per_s_per_device"] or 0))
    pubs = []
    for name, cfg in published.items():
        found = result["extra"].get(name) or {}
        if found.get("error") or not found:
            pubs.append({"name": name, "error": found.get("error", "not compiled")})
            continue
        pubs.append({"name": name, "source": pub.source_link(pub.RUNS[name]["source"]),
                     "measured": pub.RUNS[name].get("measured"), **plan_row(space, cfg, found, None)})
    best = fitting[0] if fitting else None
    pub_best = max((p for p in pubs if p.get("predicted_tokens_per_s_per_device")),
                   key=lambda p: p["predicted_tokens_per_s_per_device"], default=None)
    return {
        "schema": 1, "kind": "plan", "config": space.config.as_dict(), "target": space.target.name,
        **parameter_counts(space.config),  # parameters; a mixture of experts' active_parameters
        "devices": space.devices, "slices": space.slices, "hbm_bytes": space.hbm,
        "global_batch_sequences": space.sequences,
        "global_batch_tokens": space.sequences * space.config.seq if space.sequences else None,
        "meshes": list(space.rows), "left_out": space.left_out,
        "synthesized": getattr(space, "synthesized", {}),
        "plans": fitting[:top], "compiled_rows": rows,
        "published_row": pub_best, "published_rows": pubs,
        **_against_published(best, pub_best),
        "wall_s": result["wall_s"], "workers": result.get("workers"), "ray": result.get("ray"),
        "candidates_predicted": len(result["candidates"]),
        "candidates_compiled": len(result["compiled"]) + len(result["extra"]),
        # the compiles of each phase: fitting the model, measuring the best families, the check
        "compiles_by_phase": result.get("phases"),
        "memory_model_error": {"max": max(errors) if errors else None,
                               "mean": sum(errors) / len(errors) if errors else None,
                               "compiled_candidates": len(errors)},
        "instant": [{"mesh": r["family"].mesh, "plan": r["family"].plan,
                     "optimizer_offload": r["family"].optimizer_offload,
                     "per_device_batch": r["per_device_batch"] * batch_rows(parse_mesh(r["family"].mesh))
                     / space.devices, "microbatches": r["microbatches"],
                     **{k: v for k, v in r.items() if k.startswith("instant_")}}
                    for r in result.get("instant", [])[:10]],
        "instant_error": {"max": max(by_hand) if by_hand else None,
                          "median": sorted(by_hand)[len(by_hand) // 2] if by_hand else None,
                          "compiled_candidates": len(by_hand)},
        "refinement_error": {"max": max(corrected) if corrected else None,
                             "mean": sum(corrected) / len(corrected) if corrected else None,
                             "compiled_candidates": len(corrected)},
        # a candidate never compiled says so: it is the model's, never ranked as a compiled plan
        "estimates": [{"compiled": (c["family"], c["per_device_batch"], c["microbatches"])
                       in result["compiled"],
                       "mesh": c["family"].mesh, "plan": c["family"].plan,
                       "optimizer_offload": c["family"].optimizer_offload,
                       "per_device_batch": c["per_device_batch"], "microbatches": c["microbatches"],
                       "predicted_peak_bytes": c["predicted_peak_bytes"],
                       "predicted_fits": c["predicted_fits"], "model_step_s": c["model_step_s"],
                       "model_tokens_per_s_per_device": c["model_tokens_per_s_per_device"]}
                      for c in result["candidates"]],
        "method": METHOD,
    }

"""A published run held against the lab: compiled for its chips; fits, flops and step time side by side."""

from __future__ import annotations

from remat_lab.analysis.costs import step_costs
from remat_lab.analysis.estimate import estimate_step
from remat_lab.analysis.predict import MFU_DEFINITIONS, predict_step
from remat_lab.analysis.traffic import traffic_of
from remat_lab.config import RunConfig, get_target
from remat_lab.config import published as pub
from remat_lab.program.analysis_compile import compile_past_hbm
from remat_lab.program.backend import ExecutionError, needed_bytes, out_of_memory, refused_memory
from remat_lab.program.mesh import granules
from remat_lab.program.timing import Progress
from remat_lab.studies.advisor import search
from remat_lab.studies.experiment import run_experiment


def config_for(name: str) -> tuple[RunConfig, list[str]]:
    """The lab configuration of published run ``name`` and what differs from MaxText's program."""
    fields, differences = pub.translate(pub.run_named(name))
    preset = fields.pop("preset")
    return RunConfig.from_preset(preset, **fields), differences


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def check(name: str, progress: Progress | None = None) -> dict:
    """Compile published run ``name`` as the lab (``config_for``) for its target and hold it against
    the record (``judge``). Raises ConfigError where the lab cannot express the run. A TPU run
    libtpu refuses for HBM is still predicted (``past_hbm_prediction``)."""
    config, _ = config_for(name)
    try:
        return judge(name, run_experiment(config, timing=False, progress=progress))
    except ExecutionError as err:
        if not out_of_memory(err):
            raise
        doc = judge(name, None, refused=err)
        if get_target(config.target).platform != "tpu" or refused_memory(err) != "hbm":
            return doc
        if (doc["temp_bytes"] or 0) > PAST_HBM_AT_MOST * doc["hbm_bytes"]:  # no run measured it so
            doc["prediction_basis"] = (f"none: its temporaries are over {PAST_HBM_AT_MOST:g} times the "
                                       "chip's HBM, so it is not compiled past HBM")
        else:
            doc.update(past_hbm_prediction(config, doc["measured_step_s"]))
            doc["timing"] = mfu_timing(doc)
        return doc


# A refused program is compiled past HBM only this far over the chip (the catalogued refused runs
# are 1.01-1.16 times over; far over, libtpu does not finish it either, after as long again).
PAST_HBM_AT_MOST = 2.0


def past_hbm_prediction(config: RunConfig, measured_s: float | None) -> dict:
    """``program_flops``, ``bound_s``, ``predicted_s`` and their terms for a TPU training program
    libtpu refuses for HBM, from the program it writes when told to finish anyway
    (``compile_past_hbm``): the kernels and collectives the run ran where its own compiler fit it
    (the catalogued refused runs were measured with older JAX and libtpu). Its peak is not read.
    Only the basis, saying why, where libtpu cannot finish it either (far over HBM: an invalid
    program)."""
    problem, lowered = search.lowered_program(config)
    try:
        compiled = compile_past_hbm(lowered)
    except Exception as err:  # libtpu's own refusal, quoted
        line = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        return {"prediction_basis": f"none: libtpu does not finish this program past HBM either ({line})"}
    text = compiled.as_text()
    target, where = get_target(config.target, config.network), granules(getattr(problem, "mesh", None))
    costs = step_costs(compiled, text)
    estimate = estimate_step(costs["flops"], costs["bytes_accessed"], target, config.dtype,
                             traffic_of(text, where))
    pred = predict_step(target, estimate, text=text, granules=where, overlap=config.collective_overlap)
    return {"program_flops": costs["flops"], "bound_s": estimate.get("estimate_s"),
            "estimate_s": estimate.get("estimate_s"), "predicted_s": pred["predicted_s"],
            "prediction_basis": f"{PAST_HBM} {pred['basis']}",
            "prediction": {k: v for k, v in pred.items() if k != "basis"},
            "bound_over_measured": _ratio(estimate.get("estimate_s"), measured_s),
            "predicted_over_measured": _ratio(pred["predicted_s"], measured_s)}


PAST_HBM = ("From the program libtpu writes when told to finish a compile it refuses for HBM "
            "(xla_tpu_no_crash_on_oom): the kernels and collectives the run ran where its own, older "
            "compiler fit it in the chip.")


def judge(name: str, result: dict | None, refused: Exception | None = None) -> dict:
    """Published run ``name`` beside the lab's compile of it (``result``, the document of
    ``run_experiment``; None with ``refused``, the compiler's out-of-memory refusal): ``fits`` (the
    per-device peak within the chip's HBM, and on TPU libtpu's own HBM check passed; refused:
    ``fits`` False with the bytes the compiler says it needs), the lab's program flops and MaxText's
    model flops per device, the measured step time against the lab's estimate (its terms in
    ``estimate_terms``: the collectives within slices or hosts and across them apart)."""
    run = pub.run_named(name)
    config, differences = config_for(name)
    target = get_target(run["target"], run.get("network", ""))
    hbm = target.memory_bytes
    doc = {"name": name, "title": run["title"], "source": pub.source_link(run["source"]),
           "measured": run.get("measured"), "config": config.as_dict(), "differences": differences,
           # the host network that prices its collectives across hosts or slices, and why that one
           "network": {"name": target.network or None, "dcn_bytes_per_s": target.dcn_bytes_per_s,
                       "source": target.dcn_source, "why": run.get("network_note")},
           "hbm_bytes": hbm, "note": run.get("note"), "refused_memory": None, "host_bytes_needed": None,
           # knobs whose default differed in the MaxText the run ran, and why (translate reads them)
           "maxtext_defaults": run.get("maxtext_defaults") and {
               "knobs": run["maxtext_defaults"], "why": run.get("maxtext_defaults_note")}}
    measured = pub.measured_step_s(run)
    doc["measured_step_s"] = measured["step_s"] if measured else None
    doc["measured_step_from"] = measured["from"] if measured else None
    doc["source_model_flops"] = pub.model_flops_per_device(run)
    doc["source_model_flops_full_square"] = pub.model_flops_per_device(run, causal=False)
    doc["mfu_definition"] = pub.mfu_definition(run)
    if result is None:
        where = refused_memory(refused)
        needed = needed_bytes(refused)
        doc.update(refused_memory=where, host_bytes_needed=needed if where == "host" else None)
        doc.update(fits=False, refused=str(refused), peak_bytes=None,
                   temp_bytes=needed if where == "hbm" else None,
                   program_flops=None, lab_model_flops=None, estimate_s=None, estimate_basis=None,
                   estimate_over_measured=None, program_over_source_flops=None, notes=[],
                   estimate_terms=None, bound_s=None, predicted_s=None, prediction_basis=None,
                   predicted_over_measured=None, bound_over_measured=None, prediction=None)
        return doc
    mem = result["memory"] or {}
    peak = mem.get("peak_bytes")
    timing = result.get("timing") or {}
    doc.update(fits=peak is not None and peak <= hbm, refused=None, peak_bytes=peak,
               temp_bytes=mem.get("temp_bytes"), program_flops=result.get("flops"),
               lab_model_flops=(result.get("baseline") or {}).get("flops"),
               estimate_s=timing.get("estimate_s"), estimate_basis=timing.get("estimate_basis"),
               notes=result.get("notes") or [])
    terms = timing.get("estimate") or {}
    doc["estimate_terms"] = {k: terms.get(k) for k in (
        "bound", "compute_s", "memory_s", "offload_s", "collectives_s", "collectives_ici_s",
        "collectives_dcn_s", "interconnect_bytes_per_s", "dcn_bytes_per_s")} if terms else None
    doc["estimate_over_measured"] = _ratio(doc["estimate_s"], doc["measured_step_s"])
    # issue 47's two figures: the roofline (a lower bound) and the prediction, each held against
    # the measured step
    doc["bound_s"] = timing.get("bound_s", doc["estimate_s"])
    doc["predicted_s"] = timing.get("predicted_s")
    doc["prediction_basis"] = timing.get("prediction_basis")
    doc["prediction"] = {k: v for k, v in (timing.get("prediction") or {}).items() if k != "basis"}
    doc["bound_over_measured"] = _ratio(doc["bound_s"], doc["measured_step_s"])
    doc["predicted_over_measured"] = _ratio(doc["predicted_s"], doc["measured_step_s"])
    doc["program_over_source_flops"] = _ratio(doc["program_flops"], doc["source_model_flops"])
    doc["timing"] = mfu_timing(doc)
    return doc


def mfu_timing(doc: dict) -> dict:
    """A check's predicted step as MFU on both of MaxText's counts of attention, from the record's
    own model flops (``source_model_flops``: causal; ``source_model_flops_full_square``) at the
    chip's bf16 peak, and the one the published MFU uses (``published_mfu_definition``, the key of
    the figure to hold it against: ``mfu_definition``'s match of its MFU and tokens/s). Reads only
    the document, so a stored check gives it too."""
    run, step = pub.run_named(doc["name"]), doc.get("predicted_s")
    peak = get_target(run["target"]).peak_flops["bfloat16"]
    causal, full = (f / step / peak if step and f else None for f in (
        doc.get("source_model_flops"), doc.get("source_model_flops_full_square")))
    matches = (doc.get("mfu_definition") or {}).get("matches")
    key = {"full_square": "predicted_mfu_full_attention", "causal": "predicted_mfu"}.get(matches)
    return {"predicted_s": step, "predicted_mfu": causal, "predicted_mfu_full_attention": full,
            "mfu_definitions": MFU_DEFINITIONS,
            "published_mfu": (run.get("measured") or {}).get("mfu"),
            "published_mfu_definition": key,
            "predicted_mfu_as_published": {"predicted_mfu": causal,
                                           "predicted_mfu_full_attention": full}.get(key)}

"""A frozen config -> build, lower, compile, time, size and dissect -> one JSON-ready result.

``run_experiment`` is the one entry point used by the CLI, the app and the benchmarks, so every
number the app shows can be reproduced with ``python -m remat_lab run --json``.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from remat_lab.analysis import collectives
from remat_lab.analysis.by_kind import memory_by_kind
from remat_lab.analysis.by_kind import source as by_kind_source
from remat_lab.analysis.by_kind_buffers import compile_with_dump, read_kinds
from remat_lab.analysis.costs import cost_of, memory_report, program_flops, step_costs
from remat_lab.analysis.dissect import Dissection, dissect
from remat_lab.analysis.estimate import estimate_step
from remat_lab.analysis.gradcheck import check_gradients
from remat_lab.analysis.predict import MFU_DEFINITIONS, predict_step
from remat_lab.analysis.predict import rates as prediction_rates
from remat_lab.analysis.roofline import roofline_report
from remat_lab.analysis.timeline import compile_dumped, memory_timeline
from remat_lab.analysis.traffic import traffic_of
from remat_lab.analysis.xla_remat import rematerialized, sentence
from remat_lab.analysis.xla_remat import report as xla_remat_report
from remat_lab.config import (
    LOCAL,
    RunConfig,
    check_budget,
    check_compiled,
    get_target,
    mfu_flops,
    resolve_budget,
)
from remat_lab.config.budget import sig
from remat_lab.model.models import block_names
from remat_lab.program.analysis_compile import compile_unlimited
from remat_lab.program.backend import (  # noqa: F401  (ExecutionError: the studies' error type)
    ExecutionError,
    device_memory_limit,
    environment,
    needed_bytes,
    out_of_memory,
    xla_error,
)
from remat_lab.program.mesh import granules, to_host
from remat_lab.program.native_log import logged
from remat_lab.program.step import (
    Problem,
    build_problem,
    device_model_report,
    jit_program,
    jit_step,
    logits_bytes,
    model_report,
    problem_for,
    program_args,
    release_other_models,
)
from remat_lab.program.timing import (
    MIN_WARMUP_S,
    Progress,
    step_time_summary,
    time_keeping_output,
    timing_slot,
)
from remat_lab.program.tracing import TRACING, trace_and_lower
from remat_lab.studies.device_checks import allocator_before, allocator_report, fitted_check
from remat_lab.studies.witness_compiles import Witnesses, baseline_program  # noqa: F401 (re-exported)

# The no_remat witness and its cache live in ``witness_compiles`` (beside the main compile).
# the prediction's rates a compile-only run's ``timing`` carries (``analysis.predict.rates``)
RATES = ("predicted_mfu", "predicted_mfu_full_attention", "predicted_tokens_per_s_per_device")
STAGES = ("waiting", "building", "lowering", "compiling", "timing", "checking", "dissecting")


def _check_sharded(problem, grads, loss, jaxpr) -> tuple[dict, float]:
    """The gradient check of a step on a mesh: its loss and gradients, gathered whole into this
    process, against the same single-device reference (on the same values, gathered too); and
    the gradients' global L2 norm."""
    leaves, x, grads = to_host((problem.leaves, problem.x, grads))
    gathered = type(problem)(**{**vars(problem), "leaves": list(leaves), "x": x, "mesh": None,
                                "specs": None})  # the same problem, whole on this host
    check = check_gradients(gathered, list(grads), loss, jaxpr)
    return check, float(np.sqrt(sum(np.sum(np.square(g, dtype=np.float64)) for g in grads)))


@logged("compile.log")  # XLA's and JAX's log lines and warnings: summarized in the document
def run_experiment(config: RunConfig, *, budget: str | int | None = None, timing: bool = True,
                   progress: Progress | None = None) -> dict:
    """Everything about one configuration, as the JSON document of ``remat_lab run --json``.

    Raises ``ConfigError`` (over budget) before anything is allocated and ``ExecutionError`` when
    XLA fails. With ``timing=False`` the step is compiled and dissected but not timed.
    """
    progress = progress or (lambda stage: None)
    if config.target != LOCAL or config.compile_only:
        return _run_on_target(config, progress)
    # On an accelerator the budget is the device's memory and the compile's own memory analysis
    # answers it (a compile costs seconds); on a CPU host the estimate guards the host's memory.
    device_limit = device_memory_limit()
    budget_bytes = resolve_budget(budget, device_limit)
    if device_limit is None:
        check_budget(config, budget_bytes)
    progress("building")
    release_other_models(config)  # on an accelerator: an earlier model's parameters off it
    problem = build_problem(config)
    step = jit_step(problem)  # on a mesh: explicit shardings (sharding.py)
    # no_remat's program and (on a CPU host) the reference, in threads; on an accelerator the
    # reference is not run beside the compile: the device's memory is the step's
    witnesses = Witnesses(config, problem, reference=device_limit is None)
    progress("lowering")
    t0 = time.perf_counter()
    try:
        # Trace once: the same jaxpr is lowered here and read by the dissection.
        traced, lowered = trace_and_lower(step, *problem.args)
        t1 = time.perf_counter()
        progress("compiling")
        # With XLA's dump on: the memory timeline reads it (None on a persistent-cache hit).
        compiled, dump = compile_dumped(lowered)
        t2 = time.perf_counter()
    except Exception as err:  # XlaRuntimeError and friends
        witnesses.settle()
        raise xla_error("compiling", err, config) from err
    witnesses.settle()  # before the timed calls: nothing else on the cores meanwhile
    if device_limit is not None:
        check_compiled(config, memory_report(compiled), budget_bytes)

    result = {"schema": 1, "config": config.as_dict(), "environment": environment(),
              "compile": {"lower_s": t1 - t0, "compile_s": t2 - t1}}
    cost = cost_of(compiled)
    text = compiled.as_text()
    flops, bytes_accessed, source = program_flops(compiled, text)
    result["compile"]["xla_remat"] = _xla_remat(config, lowered, text, flops, memory_report(compiled))
    try:
        out, before = None, allocator_before()
        if timing:
            with timing_slot(progress):
                progress("timing")
                samples, out = time_keeping_output(compiled, problem.args, warmup=config.warmup,
                                                   repeats=config.repeats, min_warmup_s=MIN_WARMUP_S)
            result["step_time_s"] = {**step_time_summary(samples, config.warmup),
                                     "min_warmup_s": MIN_WARMUP_S}
        else:
            result["step_time_s"] = None
        progress("checking")
        if out is None:  # the last timed call's output is the step's (same executable, same inputs)
            out = compiled(*problem.args)
        result["memory_measured"] = allocator_report(before, memory_report(compiled), "gradient step")
        if device_limit is not None:  # the gradients on the host: the device's room for the reference
            out = jax.device_get(out)
    except Exception as err:
        raise xla_error("running", err) from err
    loss, grads = (None, out) if config.objective == "grad" else (float(out[0]), out[1])
    median = result["step_time_s"]["median"] if timing else None
    result["flops"] = flops
    result["flops_xla"] = cost["flops"]  # XLA's own count: a scan's loop body counted once
    result["flops_source"] = source
    result["achieved_flops_per_s"] = flops / median if flops and median else None
    # The roofs are calibrated (measured once per machine, cached): only a timed run needs them.
    # Bytes accessed, like flops, count a loop body once: scaled by the loops' factor (program_flops).
    result["roofline"] = (roofline_report(flops, bytes_accessed, median, config.dtype) if timing
                          else None)
    # Against an independent plain-jax.numpy implementation of the model, and structurally: the
    # step's jaxpr has remat equations exactly when the policy asks for remat.
    if problem.mesh is None:  # a user block: vs itself unremat'd; smaller where the device is full
        del out
        check = fitted_check(problem, grads, loss, traced.jaxpr)
    else:
        check, grad_norm = _check_sharded(problem, grads, loss, traced.jaxpr)
    result["loss"] = loss  # None for objective grad: the step returns no loss
    result["memory"] = memory_report(compiled)

    progress("dissecting")
    base, left_out = witnesses.baseline_or_left_out(device_limit is not None)
    # What holds the peak (timeline.py): from the dump above, or an uncached copy after a cache hit;
    # its phases judged against the no_remat witness (analysis/witness.py).
    t3 = time.perf_counter()
    result["memory_timeline"] = memory_timeline(lowered, compiled=compiled, dump=dump, depth=config.depth,
                                                 names=block_names(config), paths=problem.paths,
                                                 witness=base and base["text"])
    result["compile"]["timeline_s"] = time.perf_counter() - t3
    dis: Dissection = dissect(problem, text, step_jaxpr=traced.jaxpr, flops=flops, baseline=base,
                              backend=jax.default_backend())
    result["hlo"] = dis.compiled
    result["baseline"] = _baseline_doc(base, left_out)
    result["gradient_check"] = check
    if problem.mesh is not None:
        result["sharding"] = {**collectives.report(problem, text, result["memory"], base and base["text"]),
                              "grad_norm": grad_norm}
    result["residuals"] = dis.residuals
    result["dots"] = dis.dots
    result["totals"] = dis.totals
    result["notes"] = [n for n in (left_out, _retried(witnesses)) if n] + dis.notes
    result["texts"] = dis.texts
    return _with_program(config, result, problem)


def _compiled_sections(config: RunConfig, problem, traced, lowered, compiled, dump, progress: Progress,
                       witnesses: Witnesses) -> dict:
    """What the compiled program alone shows: memory, its timeline, the dissection against the
    no_remat witness on the same backend or target, collectives on a mesh."""
    text = compiled.as_text()
    costs = step_costs(compiled, text)
    flops = costs["flops"]
    out = {"flops": flops, "flops_xla": cost_of(compiled)["flops"], "flops_source": costs["source"],
           "memory": memory_report(compiled), "bytes_accessed": costs["bytes_accessed"],
           "costs": costs}
    out["xla_remat"] = _xla_remat(config, lowered, text, flops, out["memory"])
    progress("dissecting")
    base, out["witness_left_out"] = witnesses.baseline_or_left_out(config.target != LOCAL)
    witness_text = base["text"] if base is not None else None
    t0 = time.perf_counter()
    out["memory_timeline"] = memory_timeline(lowered, compiled=compiled, dump=dump, depth=config.depth,
                                             names=block_names(config), paths=problem.paths,
                                             witness=witness_text)
    out["timeline_s"] = time.perf_counter() - t0
    backend = jax.default_backend() if config.target == LOCAL else get_target(config.target).platform
    out["dissection"] = dissect(problem, text, step_jaxpr=traced.jaxpr, flops=flops, baseline=base,
                                backend=backend)
    out["baseline"] = base
    if problem.mesh is not None:
        out["sharding"] = collectives.report(problem, text, out["memory"], witness_text)
    return out


def _lowered_program(problem: Problem):
    """The training program of ``problem``, lowered under the tracing lock."""
    with TRACING:
        return jit_program(problem).lower(*program_args(problem))


def _xla_remat(config: RunConfig, lowered, text: str, flops: float | None, memory: dict | None) -> dict:
    """Whether XLA's own rematerialization pass rewrote the step (``analysis/xla_remat``) and, when
    it did, what it added: against a second compile with the pass's limit lifted."""
    found = len(rematerialized(text))
    peak = (memory or {}).get("peak_bytes")
    if not found:
        return xla_remat_report(0, flops, peak)
    platform = jax.default_backend() if config.target == LOCAL else get_target(config.target).platform
    device = None if config.target == LOCAL else get_target(config.target).memory_bytes
    try:
        free = compile_unlimited(lowered, platform)
    except Exception:  # the limit cannot be lifted here: the pass's clones are still counted
        return xla_remat_report(found, flops, peak, device_bytes=device)
    free_text = free.as_text()
    return xla_remat_report(found, flops, peak, {"flops": program_flops(free, free_text)[0],
                                                 "peak_bytes": (memory_report(free) or {}).get("peak_bytes")},
                            device_bytes=device)


def _with_program(config: RunConfig, result: dict, problem: Problem) -> dict:
    """The document completed with the model's sizes, the whole training step's memory (step
    train: the AdamW update compiled with parameters and state donated; the timing, the gradient
    check and the dissection stay the gradient step's) and the memory by kind at the peak."""
    model = model_report(problem)
    result["model"] = model
    buffers = None
    if config.step == "train":
        t0 = time.perf_counter()
        try:  # with XLA's dump: the memory by kind is read from this program's own buffers
            compiled, dump = compile_with_dump(_lowered_program(problem))
        except Exception as err:
            raise xla_error("compiling the training step", err, config) from err
        result["compile"]["train_compile_s"] = time.perf_counter() - t0
        _train_prediction(config, result, compiled.as_text(), granules(problem.mesh))
        result["memory_gradient_step"] = result["memory"]
        result["memory"] = memory_report(compiled)
        buffers = read_kinds(dump, result["memory"], depth=config.depth, names=block_names(config))
        if "sharding" in result:  # one device's memory is the training step's, as ``memory``
            result["sharding"]["per_device"] = result["memory"]
        result["notes"] = [*result["notes"], (
            "memory is the whole training step's (the AdamW update, parameters and optimizer state "
            "donated)" + ("; so is the predicted step" if (result.get("timing") or {}).get("predicted_s")
                          else "")
            + "; the roofline bound, the gradient check and the per-dot tables are the gradient "
            "step's, whose remat decisions are the same")]
    note = sentence(result["compile"].get("xla_remat"), sig)
    if note:  # next to the memory and flops it changed
        result["notes"] = [*result["notes"], note]
    # which of a TPU's two figures the peak is, when they disagree (analysis/costs.memory_report)
    result["notes"] = [*result["notes"], *((result.get("memory") or {}).get("notes") or [])]
    logits = logits_bytes(config, per_device=True)  # on a mesh, as the memory: one device's
    if result["memory"]:
        kinds = memory_by_kind(result["memory"], device_model_report(problem),
                               train=config.step == "train", logits_bytes=logits,
                               timeline=result.get("memory_timeline"),
                               buffers=buffers if config.step == "train" else None)
        result["memory"].update(by_kind=kinds, by_kind_source=by_kind_source(kinds),  # other's parts
                                by_kind_other=(buffers or {}).get("other_parts") if kinds else None)
    return result


def _train_prediction(config: RunConfig, result: dict, text: str, where: list[int] | None) -> None:
    """On a target the prediction is the whole training step's (its kernels include the AdamW
    update, as a measured step does), not the gradient step's; libtpu's figures stay as read."""
    timing = result.get("timing") or {}
    if config.target == LOCAL or not timing.get("predicted_s"):
        return
    target, old = get_target(config.target, config.network), timing["prediction"]
    pred = predict_step(target, timing["estimate"], text=text, granules=where,
                        overlap=config.collective_overlap)
    pred.update({k: v for k, v in old.items() if k.startswith("libtpu")})
    pred.update(prediction_rates(pred["predicted_s"], **mfu_flops(
                                     config, (result.get("baseline") or {}).get("flops")),
                                 tokens=_tokens_per_device(config), target=target))
    timing.update({k: pred.get(k) for k in RATES}, predicted_s=pred["predicted_s"],
                  prediction=pred, prediction_basis=pred["basis"])


def _tokens_per_device(config: RunConfig) -> float:
    """Tokens (llm: batch x seq; other models: examples) a device takes per step."""
    per_step = config.batch * (config.seq if config.model == "llm" else 1)
    return per_step / max(config.target_devices, 1)


def _run_on_target(config: RunConfig, progress: Progress) -> dict:
    """Compile-only (a named target, or ``compile_only``): the step lowered on abstract inputs
    (placed on the target's devices), compiled, analysed; nothing is allocated or run, so no step
    time and no gradient check."""
    target = None if config.target == LOCAL else get_target(config.target, config.network)
    where = "this machine" if target is None else config.target
    progress("building")
    problem = problem_for(config)
    witnesses = Witnesses(config, problem, reference=False)  # no_remat's program, in a thread
    progress("lowering")
    t0 = time.perf_counter()
    try:
        traced, lowered = trace_and_lower(jit_step(problem), *problem.args)
        t1 = time.perf_counter()
        progress("compiling")
        compiled, dump = compile_dumped(lowered, read_only=True)
        t2 = time.perf_counter()
    except Exception as err:
        witnesses.settle()
        raise xla_error(f"compiling for {where}", err, config) from err
    sec = _compiled_sections(config, problem, traced, lowered, compiled, dump, progress, witnesses)
    dis, base = sec["dissection"], sec["baseline"]
    if target is not None:
        estimate = estimate_step(sec["flops"], sec["bytes_accessed"], target, config.dtype,
                                 traffic_of(dis.texts["compiled_hlo"], granules(problem.mesh)))
        c = sec["costs"]
        prediction = predict_step(target, estimate, text=dis.texts["compiled_hlo"],
                                  optimal_seconds=c["optimal_seconds"],
                                  loop_factor=c["loop_factor"], kernel_flops=c["kernel_flops"],
                                  granules=granules(problem.mesh),
                                  overlap=config.collective_overlap)
        prediction.update(prediction_rates(
            prediction["predicted_s"], **mfu_flops(config, base and base["flops"]),
            tokens=_tokens_per_device(config), target=target))
        reason = f"compiled for {config.target} without the device: nothing was run"
    else:
        estimate = {"estimate_s": None, "basis": "compile-only on this machine: no step time"}
        prediction = {"predicted_s": None, "basis": "compile-only on this machine: no step time"}
        reason = "compile-only: nothing was allocated or run"
    result = {
        "schema": 1, "config": config.as_dict(), "environment": environment(),
        "compile": {"lower_s": t1 - t0, "compile_s": t2 - t1, "timeline_s": sec["timeline_s"],
                    "xla_remat": sec["xla_remat"]},
        "step_time_s": None,
        "timing": {"measured": False, "predicted_s": prediction["predicted_s"],
                   **{k: prediction.get(k) for k in RATES}, "mfu_definitions": MFU_DEFINITIONS,
                   "prediction_basis": prediction["basis"], "prediction": prediction,
                   "bound_s": estimate["estimate_s"], "estimate_s": estimate["estimate_s"],
                   "estimate_basis": estimate["basis"], "estimate": estimate, "reason": reason},
        "flops": sec["flops"], "flops_xla": sec["flops_xla"], "flops_source": sec["flops_source"],
        "achieved_flops_per_s": None,
        "roofline": None, "loss": None, "memory": sec["memory"],
        "memory_timeline": sec["memory_timeline"], "hlo": dis.compiled,
        "baseline": _baseline_doc(base, sec["witness_left_out"]),
        "gradient_check": {"ok": None, "reason": reason + " (the check compares computed gradients)"},
    }
    if target is not None:
        result["target"] = target.as_dict()
    if "sharding" in sec:
        result["sharding"] = sec["sharding"]
    notes = [n for n in (sec["witness_left_out"], _retried(witnesses)) if n] + dis.notes
    result.update(residuals=dis.residuals, dots=dis.dots, totals=dis.totals, notes=notes,
                  texts=dis.texts)
    return _with_program(config, result, problem)


def _baseline_doc(base: dict | None, left_out: str | None) -> dict:
    """The document's ``baseline``: no_remat's flops and peak, or why its compile was left out."""
    if base is None:
        return {"policy": "no_remat", "flops": None, "peak_bytes": None, "left_out": left_out}
    return {"policy": "no_remat", "flops": base["flops"],
            "peak_bytes": (base["memory"] or {}).get("peak_bytes")}


def _retried(witnesses: Witnesses) -> str | None:
    """The note for a witness traced again alone after JAX's tracing store was found occupied."""
    if not getattr(witnesses, "retried", False):
        return None
    return ("The no_remat witness, traced in a thread beside this program, met JAX's tracing store "
            "already written (StoreException: Store occupied); it was traced again alone, after "
            "the main program, and its figures are that second trace's.")

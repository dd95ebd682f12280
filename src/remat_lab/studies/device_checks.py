"""A run's checks fitted to the device it ran on: the gradient check, and the allocator's measure.

The gradient check runs on a smaller step when the whole one's reference does not fit beside it; the
allocator's measured peak stands beside the compiled one. On an accelerator the step's own program
can fill the device: the plain reference (no remat) then does not fit beside it. The check is never
fatal for that: it runs again on the same model at half the batch, then at half the depth, the
policy's own step and the reference both, until a pair fits, and says what it checked (``scope``,
``checked``). A check that cannot run at all is skipped with its reason (``ok`` None).
"""

from __future__ import annotations

import jax

from remat_lab.analysis.gradcheck import check_gradients
from remat_lab.config import RunConfig, human_bytes
from remat_lab.config.catalog import SEQ_MODELS
from remat_lab.program.failures import out_of_memory
from remat_lab.program.step import Problem, build_problem, jit_step
from remat_lab.program.tracing import trace_and_lower


def smaller(config: RunConfig):
    """The configurations a fitted check tries, in order: the batch halved down to one (to the
    microbatch count with accumulation), then the depth halved down to one block."""
    batch, depth = config.batch, config.depth
    floor = max(config.microbatches, 1)
    while batch > floor:
        batch = max(floor, (batch // 2) // floor * floor)
        yield config.replace(batch=batch)
    while depth > 1:
        depth //= 2
        extra = {"remat_layers": min(config.remat_layers, depth)} if config.remat_layers else {}
        yield config.replace(batch=batch, depth=depth, **extra)


def _scope(config: RunConfig, whole: RunConfig | None = None) -> str:
    sizes = f"batch {config.batch}" + (f", seq {config.seq}" if config.model in SEQ_MODELS else "") + \
        f", depth {config.depth}"
    if whole is None:
        return f"the step as configured ({sizes}): the loss and every gradient leaf"
    return (f"the same model and policy at {sizes} (configured: batch {whole.batch}, depth "
            f"{whole.depth}): the policy's step compiled and run again there, the loss and every "
            "gradient leaf against the reference")


def _split(config: RunConfig, out):
    return (None, out) if config.objective == "grad" else (float(out[0]), out[1])


def _skipped(reason: str) -> dict:
    return {"ok": None, "skipped": True, "reason": reason, "scope": "nothing: the check was skipped"}


def _error_line(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:300]}"


def fitted_check(problem: Problem, grads, loss, jaxpr) -> dict:
    """``check_gradients`` of the step; where its reference runs out of the device's memory, the
    check of the largest smaller step (``smaller``) whose step and reference both fit. ``grads``
    should be on the host already (the step's output released), so the reference has the room."""
    config = problem.config
    try:
        return {**check_gradients(problem, grads, loss, jaxpr), "scope": _scope(config)}
    except Exception as err:
        if not out_of_memory(err):
            return _skipped(f"the reference could not run: {_error_line(err)}")
        first = _error_line(err)
    del grads
    for sub_config in smaller(config):
        try:
            sub = build_problem(sub_config)
            traced, lowered = trace_and_lower(jit_step(sub), *sub.args)
            out = lowered.compile()(*sub.args)
            sub_loss, sub_grads = _split(sub_config, out)
            sub_grads = jax.device_get(sub_grads)
            del out
            check = check_gradients(sub, sub_grads, sub_loss, traced.jaxpr)
        except Exception as err:
            if out_of_memory(err):
                continue
            return _skipped(f"the reference did not fit beside the step ({first}), and the smaller "
                            f"check at batch {sub_config.batch}, depth {sub_config.depth} failed: "
                            f"{_error_line(err)}")
        return {**check, "scope": _scope(sub_config, config),
                "checked": {"batch": sub_config.batch, "depth": sub_config.depth,
                            "of_batch": config.batch, "of_depth": config.depth,
                            "why": f"the whole step's reference did not fit the device beside it "
                                   f"({first})"}}
    return _skipped(f"the reference did not fit the device beside the step even at batch "
                    f"{max(config.microbatches, 1)} and depth 1 ({first})")


def allocator_before() -> dict | None:
    """The allocator's figures before the timed calls (None where the backend keeps none: CPU)."""
    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:
        return None
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return {"peak_bytes_in_use": stats["peak_bytes_in_use"], "bytes_in_use": stats.get("bytes_in_use", 0),
            "bytes_reserved": stats.get("bytes_reserved")}


def allocator_report(before: dict | None, compiled_memory: dict | None, program: str,
                     after: dict | None = None) -> dict | None:
    """The allocator's measure of the timed program beside its compiled peak.

    ``measured_peak_bytes``: the step's buffers at their peak (the allocator's peak in use less what
    this process held besides the step's arguments before it ran) plus, where the runtime reserves
    a program's temporaries apart from its buffers (a TPU: ``bytes_reserved``), the reservation the
    timed calls added. Exact when the step set the process's peak (``step_set_peak``) and its
    reservation is new; else an upper bound an earlier program hides, and said."""
    after = after if after is not None else allocator_before()
    if before is None or after is None or not compiled_memory:
        return None
    compiled = compiled_memory.get("peak_bytes")
    args = compiled_memory.get("argument_bytes") or 0
    other = max(0, before["bytes_in_use"] - args)  # alive before the step, not its arguments
    set_peak = after["peak_bytes_in_use"] > before["peak_bytes_in_use"]
    top = after["peak_bytes_in_use"] if set_peak else max(after["bytes_in_use"], before["bytes_in_use"])
    buffers = top - other
    reserved_after = after.get("bytes_reserved")
    reserved = None if reserved_after is None else reserved_after - (before.get("bytes_reserved") or 0)
    fresh = reserved is None or reserved > 0
    if reserved is not None and reserved <= 0:  # the executable reserved before (a cached run)
        reserved = reserved_after
    measured = buffers + (reserved or 0)
    out = {"program": program, "allocator_peak_bytes": after["peak_bytes_in_use"],
           "in_use_before_bytes": before["bytes_in_use"], "other_bytes": other,
           "buffers_bytes": buffers, "reserved_bytes": reserved,
           "measured_peak_bytes": measured, "compiled_peak_bytes": compiled,
           "step_set_peak": set_peak, "exact": set_peak and fresh}
    if not compiled:
        return out
    diff = measured - compiled
    out["difference_bytes"] = diff
    parts = (f"its buffers at their peak ({human_bytes(buffers)}: the allocator's peak in use, less "
             f"{human_bytes(other)} this process held beside the step's arguments)")
    if reserved is not None:
        parts += f" and the {human_bytes(reserved)} the runtime reserved for its temporaries"
    out["text"] = (
        f"Measured on the device: {parts}, {human_bytes(measured)} in all, "
        f"{human_bytes(abs(diff))} ({abs(diff) / compiled:.1%}) {'above' if diff >= 0 else 'below'} "
        f"the compiled peak of the {program} ({human_bytes(compiled)}, XLA's memory analysis)"
        + ("; the allocator rounds each buffer and reservation up to its block size." if out["exact"]
           else "; an earlier program in this process set the allocator's peak or reserved its "
                "temporaries, so this is an upper bound: run the step in a fresh process for its own."))
    return out

"""A target's predicted step time: each kernel of the compiled program at its rate, transfers beside them.

The roofline (``estimate.py``) stays what it is: a lower bound, ``bound_s``. The prediction is a
second figure, never mixed with it, for a target with a ``step_model`` in ``config/targets.json``:
the compiled program's kernels one by one (``kernels.kernels_of``), run one after another: a GEMM
at ``gemm_efficiency`` of the peak of its dtype and precision (``estimate.rate_class``), fused
attention (cuDNN's, or Pallas splash on a TPU) at ``attention_forward_efficiency`` /
``attention_backward_efficiency`` of the bf16 peak, each no faster than its bytes at
``hbm_efficiency`` of the HBM bandwidth; every other kernel at its bytes over that bandwidth.
On a GPU each collective runs as XLA's schedule places it (``schedule.walk``: hidden behind the
kernels between its start and done, the rest waited for) and host transfers beside the kernels; on
a TPU collectives and host transfers run beside the kernels (as MaxText's runs overlapped them;
``benchmarks/tpu_step_model.py schedule`` shows the step as today's libtpu writes them): the step
is the longer of the kernels and the transfers (the roofline's collective and offload terms). It is
never shorter than the bound's compute term (the flops at the peak: ``limited_by`` "bound" when it
exceeds the kernels'). The bound's memory term is no floor: XLA's bytes accessed count bytes the
chip does not move (operands libtpu keeps in on-chip VMEM, an in-place update's whole buffer, a
sliced read's whole operand), and on a v5e gpt2-small's training step at batch 4 ran in 0.79x of
that term (``benchmarks/chip/tpu-v5e.jsonl``); a prediction under it says so (``bound_note``).

* **GPU** (H100, H200): the fractions were measured on an H200 (their ``source``).
* **TPU** (v5p, v6e): one MXU efficiency is fitted to one published run (MaxText's Llama 3.1 8B
  gold run on v6e-256) and held against the others out of sample (``benchmarks/tpu_step_model.py``);
  HBM at libtpu's own 0.9 of the spec. The v5e's MXU efficiency and HBM factor are fitted on a
  lent v5e chip (``benchmarks/chip_catalogue.py fit``, half its catalogue held out). libtpu's own cost
  model (``optimal_seconds``) is read and shown (``libtpu_optimal_s``) but not used: it is far
  off (98.8 s against the 8B run's measured 4.55 s, read at one and two unrolled layers,
  ``studies/tpu_cost_model.py``) and negative for programs with loops (libtpu 0.0.52). On small
  programs it is a roofline (``tests/test_predict.py``: 197 TFLOP/s, 737.6 GB/s on v5e).

Where a term cannot be priced (a GEMM whose shape does not read, an unknown custom call), its
share of the kernels is named in ``unpriced``.
"""

from __future__ import annotations

from remat_lab.analysis import schedule
from remat_lab.analysis.estimate import rate_class
from remat_lab.analysis.kernels import kernels_of
from remat_lab.config import COLLECTIVE_OVERLAPS, Target

GPU_BASIS = ("predicted: the compiled program's kernels in sequence, each GEMM at {gemm:.0%} of its "
             "dtype's peak, cuDNN attention at {fwd:.0%} forward / {bwd:.0%} backward, every kernel "
             "no faster than its bytes at {hbm:.0%} of HBM bandwidth; each collective as XLA's "
             "schedule runs it (hidden behind the kernels between its start and done, the rest "
             "waited for), host transfers beside them; never under the flops at the peak. Rates measured: "
             "{source}")
TPU_BASIS = ("no prediction for this TPU: libtpu's own cost model (optimal_seconds, shown as "
             "libtpu_optimal_s where the program's figure is meaningful) is far from MaxText's "
             "measured steps (the Llama 3.1 8B gold run on v6e-256: 98.8 s against 4.55 s) and "
             "negative for programs with loops (libtpu 0.0.52); only the roofline bound is given")
TPU_FITTED_BASIS = ("predicted: the compiled program's kernels in sequence, each GEMM and splash "
                    "attention kernel at {mxu:.0%} of the bf16 peak, every kernel no faster than "
                    "its bytes at {hbm:.0%} of HBM bandwidth; collectives and host transfers "
                    "beside them (the step is the longer of the two, never under the flops at the peak). "
                    "Rates {source}")
NONE_BASIS = "no prediction for {name}: no measured kernel rates for it (only a lower bound)"


def kernels_seconds(rows: list[dict], target: Target, model: dict) -> dict:
    """The kernels of ``rows`` (``kernels_of``) one after another at ``model``'s fractions (a
    ``step_model``: ``gemm_efficiency``, ``attention_forward_efficiency``,
    ``attention_backward_efficiency``, ``hbm_efficiency``): ``kernels_s``, ``by_kind_s`` and what
    could not be priced (``unpriced``, ``unpriced_share`` of the kernels' bytes)."""
    peak_bf16 = target.peak_flops["bfloat16"]
    hbm = target.bandwidth_bytes_per_s * float(model["hbm_efficiency"])
    seconds = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    by_name: dict[str, float] = {}
    unpriced_bytes, total_bytes, unpriced = 0.0, 0.0, []
    for row in rows:
        if row["kind"] == "collective":
            continue
        memory = row["bytes"] / hbm
        total_bytes += row["runs"] * row["bytes"]
        compute = 0.0
        if row["kind"] in ("gemm", "attention") and row["flops"] is None:
            unpriced.append(row.get("name", row["kind"]))
            unpriced_bytes += row["runs"] * row["bytes"]
        elif row["kind"] == "gemm":
            peak = target.peak_flops.get(rate_class(target, row["dtype"] or "bf16",
                                                    row["precision"] or "DEFAULT"), peak_bf16)
            compute = row["flops"] / (peak * float(model["gemm_efficiency"]))
        elif row["kind"] == "attention":
            key = f"attention_{row['direction']}_efficiency"
            compute = row["flops"] / (peak_bf16 * float(model[key]))
        seconds[row["kind"]] += row["runs"] * max(compute, memory)
        if "name" in row:
            by_name[row["name"]] = max(compute, memory)
    return {"kernels_s": sum(seconds.values()), "by_kind_s": seconds, "unpriced": unpriced,
            "unpriced_share": unpriced_bytes / total_bytes if total_bytes else 0.0,
            "by_name_s": by_name}


def basis(target: Target) -> str:
    """What ``target``'s ``predicted_s`` is, in words (its step model's, or why there is none)."""
    m = target.step_model
    if not m:
        return TPU_BASIS if target.platform == "tpu" else NONE_BASIS.format(name=target.name)
    if target.platform == "tpu":
        return TPU_FITTED_BASIS.format(mxu=m["gemm_efficiency"], hbm=m["hbm_efficiency"],
                                       source=m["source"])
    return GPU_BASIS.format(gemm=m["gemm_efficiency"], fwd=m["attention_forward_efficiency"],
                            bwd=m["attention_backward_efficiency"], hbm=m["hbm_efficiency"],
                            source=m["source"])


def _kernel_model(rows: list[dict], target: Target, bound: dict, events: dict | None = None,
                  overlap: str = "") -> dict:
    """The kernels and the transfers beside them; never under the bound's compute term (then the
    bound is the prediction, said so). Its memory term may be over the kernels (XLA's
    ``bytes_accessed`` counts an in-place update's whole buffer, a sliced read's whole operand and
    operands kept in on-chip memory): the prediction stays the kernels', said so. On a
    GPU with the program's schedule (``schedule.events``), the collectives run as it lets them:
    the kernels plus the waits for what the schedule does not hide (``exposed_collectives_s``). On
    a TPU the collectives run beside the kernels, unless ``overlap`` (``COLLECTIVE_OVERLAPS``) says
    the run's libtpu flags leave some as libtpu writes them: then the schedule's walk with the rest
    beside."""
    priced = kernels_seconds(rows, target, target.step_model)
    by_name = priced.pop("by_name_s")
    kernels = priced["kernels_s"]
    offload = bound.get("offload_s") or 0.0
    beside = (bound.get("collectives_s") or 0.0) + offload
    scheduled = {}
    beside_kinds = COLLECTIVE_OVERLAPS.get(overlap) if target.platform == "tpu" else ()
    if events is not None and beside_kinds is not None:
        found = schedule.walk(events, by_name, target, beside_kinds)
        scheduled = {"exposed_collectives_s": found["exposed_s"],
                     "scheduled_collectives_s": found["collectives_s"]}
        kernels, beside = found["step_s"], offload + found["beside_s"]
    floor = bound.get("compute_s") or 0.0  # the flops at the peak: no program runs faster
    limited = "kernels" if kernels >= beside else "transfers"
    if floor > max(kernels, beside):
        limited = "bound"
    note = None
    if (bound.get("estimate_s") or 0.0) > max(kernels, beside, floor):
        note = (f"The roofline bound ({bound['estimate_s'] * 1e3:.4g} ms, {bound.get('bound')}-bound) is "
                "over this prediction: its memory term is XLA's bytes accessed at the spec bandwidth, "
                "which count bytes the chip does not move (operands kept in on-chip memory, an "
                "in-place update's whole buffer); it is not a floor here.")
    said = "" if target.platform != "tpu" or beside_kinds is None else (
        f" Collectives (collective_overlap {overlap}): "
        + (f"{', '.join(k + 's' for k in beside_kinds)} beside the kernels, the rest" if beside_kinds
           else "every one") + " as libtpu's schedule writes it, the kernels waiting for each "
        "synchronous one (the run's libtpu flags overlap no others).")
    return {"predicted_s": max(kernels, beside, floor), **priced, **scheduled, "transfers_s": beside,
            "limited_by": limited, "basis": _sentences(basis(target) + said, note),
            "bound_note": note}


def _tpu(optimal_s: float | None, loop_factor: float) -> dict:
    meaningful = optimal_s is not None and optimal_s > 0 and loop_factor == 1.0
    return {"predicted_s": None, "libtpu_optimal_s": optimal_s if meaningful else None,
            "libtpu_optimal_raw": optimal_s, "basis": TPU_BASIS}


def _sentences(text: str, more: str | None) -> str:
    """``text``, then ``more`` as its own sentence (``text`` may end without a full stop)."""
    if not more:
        return text
    return f"{text}{'' if text.rstrip().endswith('.') else '.'} {more}"


def predict_step(target: Target, bound: dict, *, text: str | None = None,
                 kernels: list[dict] | None = None, optimal_seconds: float | None = None,
                 loop_factor: float = 1.0, kernel_flops: float = 0.0,
                 granules: list[int] | None = None, events: dict | None = None,
                 overlap: str = "") -> dict:
    """The prediction for one compiled step on ``target`` (see the module's docstring):
    ``predicted_s`` (None where the target has no model), its terms and ``basis``. ``bound``:
    ``estimate.estimate_step``'s answer for the same program; ``text``: its optimized HLO, or
    ``kernels``: ``kernels.kernels_of`` of it (GPU); ``optimal_seconds``, ``loop_factor``,
    ``kernel_flops``: libtpu's figure, the program's loop factor and its fused kernels' flops
    (TPU); ``events``: ``schedule.events`` of it (GPU; read from ``text`` with ``granules``, each
    device's host, when not given; a TPU's too with an ``overlap``, its ``collective_overlap``)."""
    if target.step_model and (text or kernels is not None):
        walked = target.platform != "tpu" or COLLECTIVE_OVERLAPS.get(overlap) is not None
        if events is None and text is not None and walked:
            events = schedule.events(text, granules)
        if walked and events is None and target.platform == "tpu":
            raise ValueError(f"a prediction with collective_overlap {overlap!r} needs the schedule")
        out = _kernel_model(kernels if kernels is not None else kernels_of(text), target, bound, events,
                            overlap)
        if target.platform == "tpu":
            out.update({k: v for k, v in _tpu(optimal_seconds, loop_factor).items()
                        if k.startswith("libtpu")})
        return out
    if target.platform == "tpu":
        return _tpu(optimal_seconds, loop_factor)
    return {"predicted_s": None, "basis": NONE_BASIS.format(name=target.name)}


# What each MFU counts as attention's model flops (MaxText's ``calculate_tflops_training_per_device``)
MFU_DEFINITIONS = {
    "predicted_mfu": "causal attention (half the score square), as MaxText counts today",
    "predicted_mfu_full_attention": "full-square attention, as MaxText's tiering.md and its "
                                    "published v6e runs count"}


def rates(predicted_s: float | None, *, model_flops: float | None, tokens: float | None,
          target: Target, model_flops_full_attention: float | None = None) -> dict:
    """``predicted_mfu`` (model flops per device, attention causal, over the predicted step at the
    bf16 peak), ``predicted_mfu_full_attention`` (the same with ``model_flops_full_attention``,
    attention the full square: MaxText's published definition) and
    ``predicted_tokens_per_s_per_device``; None where a part is unknown."""
    if not predicted_s:
        return {"predicted_mfu": None, "predicted_mfu_full_attention": None,
                "predicted_tokens_per_s_per_device": None}
    peak = target.peak_flops.get("bfloat16")
    mfu = lambda flops: flops / (predicted_s * peak) if flops and peak else None
    return {"predicted_mfu": mfu(model_flops),
            "predicted_mfu_full_attention": mfu(model_flops_full_attention),
            "predicted_tokens_per_s_per_device": tokens / predicted_s if tokens else None}

"""What fills a device's memory at the compiled peak: parameters, optimizer state, gradients, activations.

Two methods, named in the result's ``method``:

* **timeline** (where the memory timeline is of the same program as ``memory``, the gradient step):
  the buffers live at the timeline's peak, attributed by what they hold: parameters are the
  parameter arguments (the model's bytes), gradients the step's outputs, logits the buffers whose
  checkpoint name is ``logits``, activations the other buffers with a source (a layer or a name),
  ``other`` the rest of ``memory.peak_bytes``: the input, buffers with no source, constants, the
  gaps XLA's packing of the temporary memory leaves, generated code.
* **size** (the fallback: no dump of the program, or one this reader cannot read): by size from
  what is known exactly (the parameters' and the optimizer state's bytes, both arguments of the
  step; the gradients, one per parameter in its dtype; the logits of a language model, batch x seq
  x vocab in the compute dtype, per microbatch) against XLA's compiled figures: activations are the
  rest of the temporary memory, ``other`` the generated code and what is left. Each at its own
  dtype (mixed precision: float32 master weights and gradients, the moments in the optimizer's
  dtype, bfloat16 activations), which ``method`` names when the model report gives ``precision``.

* **buffers** (the training step, from its own compile's dump: ``by_kind_buffers``): the
  parameters' and the optimizer state's argument allocations, and the buffers live at its peak
  (gradients, activations, logits) read from XLA's buffer assignment; on a TPU its HBM's only.
  The size split is the fallback where no dump was written, and says so (``source``).

On a TPU (a memory report with ``peak_source``, ``analysis/costs.py``) the gradient step's kinds
are by size: the timeline counts every buffer, also those libtpu keeps in the chip's on-chip VMEM,
which take no HBM (every temporary of a width-1024 mlp at batch 4096 on four v5e chips, fsdp=4),
while the peak is HBM.

A kind is never negative: an estimate larger than the memory it is taken from is cut to it.
"""

from __future__ import annotations

from remat_lab.analysis import by_kind_buffers

KINDS = ("parameters", "optimizer_state", "gradients", "activations", "logits", "other")
METHOD = ("parameters and optimizer_state: their argument bytes; gradients: the parameters' bytes "
          "(the gradient step's outputs, the training step's temporaries); logits: batch x seq x "
          "vocab in the compute dtype per microbatch, one chunk's seq with loss_chunks (llm); "
          "activations: the temporary memory left; "
          "other: generated code and the rest of the peak")
METHOD_TIMELINE = ("from the memory timeline's buffers at its peak: parameters: the parameter "
                   "arguments; gradients: the step's outputs; logits: buffers named logits; "
                   "activations: the other buffers with a source (a layer or a checkpoint name); "
                   "other: the rest of peak_bytes (the input, buffers with no source, constants, "
                   "the temporary memory's packing gaps, generated code)")


def _from_timeline(memory: dict, model: dict, timeline: dict) -> dict | None:
    at = timeline.get("at_peak") or []
    params = int(model["parameter_bytes"])
    leaves = sum(b["bytes"] for b in at if b["kind"] == "parameter" and b["op_name"].startswith("leaves["))
    if leaves != params:
        return None  # the arguments are not the model's parameters as this reader knows them
    peak = int(memory["peak_bytes"])
    grads = sum(b["bytes"] for b in at if b["phase"] == "output")
    logits = sum(b["bytes"] for b in at if b["kind"] != "parameter" and b["phase"] != "output"
                 and b.get("name") == "logits")
    acts = sum(b["bytes"] for b in at if b["kind"] != "parameter" and b["phase"] != "output"
               and b.get("name") != "logits" and (b.get("name") or b["layer"] != "other"))
    grads = min(grads, max(peak - params, 0))
    logits = min(logits, max(peak - params - grads, 0))
    acts = min(acts, max(peak - params - grads - logits, 0))
    kinds = {"parameters": params, "optimizer_state": 0, "gradients": grads, "activations": acts,
             "logits": logits}
    kinds["other"] = max(peak - sum(kinds.values()), 0)
    return {**kinds, "method": METHOD_TIMELINE}


def memory_by_kind(memory: dict | None, model: dict, *, train: bool, logits_bytes: int = 0,
                   timeline: dict | None = None, buffers: dict | None = None) -> dict:
    """``{kind: bytes}`` summing to ``memory["peak_bytes"]``, plus ``method``; {} without memory.

    ``timeline``: the memory timeline of the same program as ``memory`` (the gradient step's);
    ``buffers``: ``by_kind_buffers.kinds_from_buffers`` of the same program as ``memory`` (the
    training step's). With either the kinds come from the buffers at the peak, else by size
    (``source`` says which).
    """
    if not memory or memory.get("peak_bytes") is None:
        return {}
    if buffers is not None:
        return {**{k: int(buffers[k]) for k in KINDS}, "method": by_kind_buffers.METHOD}
    hbm_only = memory.get("peak_source") is not None  # TPU: the timeline holds VMEM buffers too
    if timeline and timeline.get("at_peak") and not train and not hbm_only:
        found = _from_timeline(memory, model, timeline)
        if found is not None:
            return found
    params = int(model["parameter_bytes"])
    state = int(model["optimizer_state_bytes"]) if train else 0
    temp = int(memory["temp_bytes"])
    grads = int(model.get("gradient_bytes", params))  # one per parameter, in the parameters' dtype
    if train:  # the gradients live in the temporary memory, beside the activations and logits
        grads = min(grads, temp)
        temp -= grads
    logits = min(int(logits_bytes), temp)
    kinds = {"parameters": params, "optimizer_state": state, "gradients": grads,
             "activations": temp - logits, "logits": logits}
    kinds["other"] = max(int(memory["peak_bytes"]) - sum(kinds.values()), 0)
    p = model.get("precision")
    dtypes = "" if not p else (f"; dtypes: parameters and gradients {p['params']}, "
                               + (f"optimizer state {p['optimizer']}, " if train else "")
                               + f"activations and logits {p['compute']}")
    return {**kinds, "method": METHOD + dtypes}


def source(kinds: dict) -> str | None:
    """``"buffers"`` where ``kinds`` (``memory_by_kind``'s) were read from the program's buffers,
    ``"size split (fallback)"`` where split by size; None for no kinds."""
    if not kinds:
        return None
    read = kinds.get("method") in (METHOD_TIMELINE, by_kind_buffers.METHOD)
    return by_kind_buffers.SOURCE if read else by_kind_buffers.FALLBACK

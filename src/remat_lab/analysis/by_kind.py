"""What fills a device's memory at the compiled peak: parameters, optimizer state, gradients, activations.

Attributed by size from what is known exactly (the parameters' and the optimizer state's bytes, both
arguments of the step; the gradients, one per parameter in its dtype; the logits of a language
model, batch x seq x vocab in the compute dtype, per microbatch) against XLA's compiled figures: the
activations are the rest of the temporary memory, ``other`` the generated code and what is left. A
kind is never negative: an estimate larger than the temporary memory it is taken from is cut to it.
"""

from __future__ import annotations

KINDS = ("parameters", "optimizer_state", "gradients", "activations", "logits", "other")
METHOD = ("parameters and optimizer_state: their argument bytes; gradients: the parameters' bytes "
          "(the gradient step's outputs, the training step's temporaries); logits: batch x seq x "
          "vocab in the compute dtype per microbatch (llm); activations: the temporary memory left; "
          "other: generated code and the rest of the peak")


def memory_by_kind(memory: dict | None, model: dict, *, train: bool, logits_bytes: int = 0) -> dict:
    """``{kind: bytes}`` summing to ``memory["peak_bytes"]``, plus ``method``; {} without memory."""
    if not memory or memory.get("peak_bytes") is None:
        return {}
    params = int(model["parameter_bytes"])
    state = int(model["optimizer_state_bytes"]) if train else 0
    temp = int(memory["temp_bytes"])
    grads = params
    if train:  # the gradients live in the temporary memory, beside the activations and logits
        grads = min(grads, temp)
        temp -= grads
    logits = min(int(logits_bytes), temp)
    kinds = {"parameters": params, "optimizer_state": state, "gradients": grads,
             "activations": temp - logits, "logits": logits}
    kinds["other"] = max(int(memory["peak_bytes"]) - sum(kinds.values()), 0)
    return {**kinds, "method": METHOD}

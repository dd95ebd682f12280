"""The names a configuration may use: models and their checkpoint names, stacks, policy ids, presets (no JAX).

The model layer builds what these names stand for (``model/models.py``, ``model/llm.py``,
``model/stacks.py``, ``model/policies.py``); ``model/policies.py`` checks at import that its registry
has exactly ``POLICY_IDS``, in this order. ``PRESETS``: published model shapes (``presets.json``).
"""

from __future__ import annotations

import json
from pathlib import Path

from .moe_config import MOE_DEFAULTS

MODELS = ("mlp", "seq_mixer", "transformer", "llm")
# Models that use seq: x is (batch, seq, width), or for llm integer tokens (batch, seq).
SEQ_MODELS = ("seq_mixer", "transformer", "llm")
# The user's own block (RunConfig.model_module, local only): its checkpoint names are found by tracing
# it (model/user_block.py), so ``names_of`` has none for it.
USER_MODEL = "user"
# The checkpoint_name tags of each model's block, in program order (MaxText's for the transformer).
NAMES = {
    "mlp": ("l1", "l2"),
    "seq_mixer": ("l1", "scores", "mix", "l2"),
    "transformer": ("query_proj", "key_proj", "value_proj", "context", "out_proj", "mlpwi_0",
                    "mlpwi_1", "mlpwo"),
    # The decoder LM: MaxText's block names, "decoder_layer_input" (a block's input, named inside
    # the scanned block as MaxText's decoders do) first; "embed" (the token embedding's output) and
    # "logits" (the vocabulary projection) lie outside the per-block remat, so a policy cannot move them.
    "llm": ("embed", "decoder_layer_input", "query_proj", "key_proj", "value_proj", "context",
            "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo", "logits"),
}


# A mixture of experts' block (llm, experts > 0; model/moe.py): the router's logits, the dispatched
# tokens, each expert projection (MaxText's moe_ names inside its dense ones) and the combine.
MOE_NAMES = ("moe_router_logits", "moe_dispatch", "mlpwi_0", "moe_mlpwi_0", "mlpwi_1", "moe_mlpwi_1",
             "mlpwo", "moe_mlpwo", "moe_combine")


def names_of(model: str, experts: int = 0) -> tuple[str, ...]:
    """The ``checkpoint_name`` tags in ``model``'s block, in program order (none for the user's block:
    ``model.models.block_names`` traces it); the llm with ``experts``: ``MOE_NAMES`` for its MLP's."""
    if model == USER_MODEL:
        return ()
    if model == "llm" and experts:
        dense = NAMES["llm"]
        return (*dense[:dense.index("mlpwi_0")], *MOE_NAMES, "logits")
    return NAMES[model]


STACKS = ("scan", "loop")

# The policy registry's ids in the order the app lists them (model/policies.py builds each).
POLICY_IDS = (
    "no_remat", "nnx_remat_default", "nothing_saveable", "everything_saveable", "dots_saveable",
    "dots_with_no_batch_dims_saveable", "offload_dot_with_no_batch_dims",
    "full", "minimal", "minimal_with_context", "save_dot_with_context_except_mlp",
    "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj", "save_out_proj",
    "qkv_proj_offloaded", "minimal_offloaded",
    "custom",
)
DEFAULT_POLICY = "dots_with_no_batch_dims_saveable"
# MaxText's recipes that keep checkpoint names (model/policies.py builds them; config/budget.py's
# estimate keeps what they save): id -> the names saved on the device, or offloaded to the host
# (``*_offloaded``), as MaxText's ``get_remat_policy`` lists them, with the fused ``qkv_proj`` and
# ``mlpwi`` a model may lack.
_MINIMAL = ("query_proj", "value_proj", "key_proj", "qkv_proj", "out_proj", "mlpwi_0", "mlpwi_1",
            "mlpwi", "mlpwo")
_QKV = ("query_proj", "value_proj", "key_proj", "qkv_proj")
RECIPE_NAMES: dict[str, tuple[str, ...]] = {
    "minimal": _MINIMAL,
    "minimal_with_context": (*_MINIMAL, "context"),
    "save_dot_with_context_except_mlp": (*_QKV, "context", "out_proj"),
    "save_dot_except_mlpwi": (*_QKV, "out_proj", "mlpwo"),
    "save_dot_except_mlp": (*_QKV, "out_proj"),
    "save_qkv_proj": _QKV,
    "save_out_proj": ("out_proj",),
    "qkv_proj_offloaded": ("query_proj", "value_proj", "key_proj"),
    "minimal_offloaded": _MINIMAL,
}


# Published decoder shapes, by name: the llm fields they fill, their source and parameter count;
# loss_chunks, the vocabulary loss's slices, is this lab's choice per preset (presets.json's about).
PRESET_FIELDS = ("width", "depth", "heads", "kv_heads", "head_dim", "mlp_dim", "vocab", "seq",
                 "tie_embeddings", "loss_chunks", "experts", "experts_per_token", "expert_mlp_dim",
                 "shared_experts", "router_gating")
# A dense preset leaves the mixture-of-experts fields out: these (RunConfig's defaults) fill them.
DENSE = {"experts": 0, **{k: MOE_DEFAULTS[k] for k in PRESET_FIELDS[10:] if k != "experts"}}
PRESETS: dict[str, dict] = {name: {**DENSE, **p} for name, p in json.loads(
    (Path(__file__).with_name("presets.json")).read_text())["presets"].items()}
PRESET_NAMES = ("", *PRESETS)  # "" = no preset
# A preset's (and the CLI's llm training step's) dtypes unless some are given: MaxText's weight_dtype
# float32 and dtype bfloat16, the common mixed-precision recipe; RECIPE_TEXT says it.
RECIPE = {"dtype": "bfloat16", "param_dtype": "float32", "optimizer_dtype": "float32"}
RECIPE_TEXT = ("recipe: float32 master weights and moments, bfloat16 compute (the common "
               "mixed-precision recipe)")

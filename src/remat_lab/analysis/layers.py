"""Layer attribution: which layer of which block an operation or a parameter belongs to.

The models run every layer in a ``jax.named_scope`` and every block in ``block{i}`` (``model/``), so
jaxpr name stacks, HLO ``op_name`` metadata and parameter paths all name their layer. The jaxpr
dissection, the memory timeline and the tables use these readers and no others. A user's own block
has no scope the readers know: its products and the values it keeps are named by their
``checkpoint_name`` tags instead (``named_layer``).
"""

from __future__ import annotations

import re

# Layer scopes (and parameter path components): the mlp/seq_mixer layers and the transformer's.
_LAYERS = "l1|l2|mix|attn_norm|q_proj|k_proj|v_proj|attn|o_proj|mlp_norm|wi_0|wi_1|wo"
_LAYER = re.compile(rf"\b({_LAYERS})\b")
_BLOCK = re.compile(r"\bblock(\d+)\b")
_PATH_LAYER = re.compile(rf"(?:blocks\.(?:(\d+)\.)?)?({_LAYERS})\b")


def layer_of(name_stack: str, depth: int) -> str:
    """``'jvp(block1)/l2'`` -> ``'1.l2'`` when depth > 1, ``'l2'`` when depth is 1."""
    layers = _LAYER.findall(name_stack)
    blocks = _BLOCK.findall(name_stack)
    layer = layers[-1] if layers else "other"
    if depth > 1 and blocks:
        return f"{blocks[-1]}.{layer}"
    return layer


def layer_of_path(path: str, depth: int) -> str:
    """A parameter path (``'blocks.1.l2.kernel'``) -> its layer, as ``layer_of`` names it."""
    m = _PATH_LAYER.match(path)
    if not m:
        return "input" if path == "x" else "other"
    block, layer = m.groups()
    return f"{block}.{layer}" if depth > 1 and block is not None else layer


def named_layer(layer: str, name: str | None) -> str:
    """``layer`` as ``layer_of`` named it, or, where no scope names it (``'other'``, ``'1.other'``:
    a user's block, the llm's logits), its ``checkpoint_name`` tag in its place (``'1.up_proj'``)."""
    block, dot, last = layer.rpartition(".")
    return f"{block}{dot}{name}" if last == "other" and name else layer

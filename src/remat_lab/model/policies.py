"""The checkpoint-policy registry: id -> how to build it, a label, a description and the code.

Three groups: JAX's own policies (decided per primitive, e.g. on ``dot_general``), MaxText's remat
recipes (``remat_policy=`` in MaxText's configs; decided per ``checkpoint_name``, built exactly as
MaxText's ``get_remat_policy`` builds them, including the names a model may lack such as the fused
``qkv_proj`` and ``mlpwi``) and ``custom``: save / offload / recompute per name of the model
(``RunConfig.save_names``/``offload_names``), MaxText's ``custom`` recipe.
Ids and code use JAX's own names so users can paste them. ``save_anything_except_these_names``
is left out on purpose: in jax it is ``lambda *_, **__: True`` (it saves everything and ignores
the names it is given), so listing it would show a policy that does not do what it says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax

from remat_lab.config.catalog import DEFAULT_POLICY, POLICY_IDS, RECIPE_NAMES  # noqa: F401


@dataclass(frozen=True)
class Policy:
    """One registry entry. ``remat`` False means no ``nnx.remat`` at all."""

    id: str
    label: str
    description: str
    code: str
    build: Callable[[], Callable | None]
    remat: bool = True
    group: str = "jax"  # one of GROUPS
    saves: tuple[str, ...] = ()  # checkpoint names a name policy saves on the device
    offloads: tuple[str, ...] = ()  # ... and those it offloads to pinned host memory


GROUPS = {"jax": "JAX policies", "maxtext": "MaxText recipes", "custom": "Custom (per tensor)"}


_cp = jax.checkpoint_policies


def _quoted(names) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _offload_policy(saves, offloads) -> Callable:
    return _cp.save_and_offload_only_these_names(
        names_which_can_be_saved=list(saves), names_which_can_be_offloaded=list(offloads),
        offload_src="device", offload_dst="pinned_host")


def _offload_code(saves, offloads) -> str:
    return ("@nnx.remat(policy=jax.checkpoint_policies.save_and_offload_only_these_names(\n"
            f"    names_which_can_be_saved=[{_quoted(saves)}],\n"
            f"    names_which_can_be_offloaded=[{_quoted(offloads)}],\n"
            '    offload_src="device", offload_dst="pinned_host"))')


def _save_names(pid: str, description: str) -> Policy:
    """A MaxText recipe that saves its names (``RECIPE_NAMES``) on the device and recomputes the rest."""
    names = RECIPE_NAMES[pid]
    return Policy(pid, f"{pid} (MaxText)", description,
                  "@nnx.remat(policy=jax.checkpoint_policies.save_only_these_names(\n"
                  f"    {_quoted(names)}))",
                  lambda: _cp.save_only_these_names(*names), group="maxtext", saves=names)


def _offload_names(pid: str, description: str) -> Policy:
    """A MaxText recipe that offloads its names (``RECIPE_NAMES``) to pinned host memory and
    recomputes the rest."""
    names = RECIPE_NAMES[pid]
    return Policy(pid, f"{pid} (MaxText)", description, _offload_code((), names),
                  lambda: _offload_policy((), names), group="maxtext", offloads=names)


_MAXTEXT = [
    Policy("full", "full (MaxText)",
           "MaxText's full remat: policy None, JAX's default; saves only the block's inputs and "
           "recomputes everything else.",
           "@nnx.remat  # MaxText remat_policy=full: policy=None", lambda: None, group="maxtext"),
    _save_names("minimal",
                "Saves every projection output (q, k, v, out and the MLP's); recomputes the "
                "attention scores, softmax and context, the norms and activations."),
    _save_names("minimal_with_context",
                "minimal plus the attention context (the output before the out projection): "
                "only the norms, scores, softmax and activations are recomputed."),
    _save_names("save_dot_with_context_except_mlp",
                "Saves the attention projections and context; the MLP is recomputed."),
    _save_names("save_dot_except_mlpwi",
                "Saves the attention projections and the MLP's output projection; the MLP's input "
                "projections are recomputed."),
    _save_names("save_dot_except_mlp",
                "Saves the attention projections (q, k, v, out); the whole MLP is recomputed."),
    _save_names("save_qkv_proj",
                "Saves the query, key and value projections; everything else is recomputed."),
    _save_names("save_out_proj",
                "Saves only the attention's output projection."),
    _offload_names("qkv_proj_offloaded",
                   "Offloads the query, key and value projections to pinned host memory; "
                   "everything else is recomputed."),
    _offload_names("minimal_offloaded",
                   "minimal, but the projections go to pinned host memory instead of staying on "
                   "the device."),
]

POLICIES: dict[str, Policy] = {
    p.id: p
    for p in [
        Policy("no_remat", "No remat (baseline)",
               "No nnx.remat: autodiff keeps every value the backward pass needs.",
               "# no nnx.remat: call model(x) directly", lambda: None, remat=False),
        Policy("nnx_remat_default", "nnx.remat (default policy)",
               "Bare @nnx.remat: saves only the block's inputs and recomputes the rest.",
               "@nnx.remat", lambda: None),
        Policy("nothing_saveable", "nothing_saveable",
               "Saves nothing inside the block; the backward pass recomputes every value.",
               "@nnx.remat(policy=jax.checkpoint_policies.nothing_saveable)",
               lambda: _cp.nothing_saveable),
        Policy("everything_saveable", "everything_saveable",
               "Every value may be saved: the same residuals as no remat.",
               "@nnx.remat(policy=jax.checkpoint_policies.everything_saveable)",
               lambda: _cp.everything_saveable),
        Policy("dots_saveable", "dots_saveable",
               "Any dot_general result may be saved, batch dims or not.",
               "@nnx.remat(policy=jax.checkpoint_policies.dots_saveable)",
               lambda: _cp.dots_saveable),
        Policy("dots_with_no_batch_dims_saveable", "dots_with_no_batch_dims_saveable",
               "dot_general results without paired batch axes may be saved; the rest is recomputed.",
               "@nnx.remat(policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)",
               lambda: _cp.dots_with_no_batch_dims_saveable),
        Policy("offload_dot_with_no_batch_dims", "offload_dot_with_no_batch_dims",
               "Like dots_with_no_batch_dims_saveable, but moves those dot results to host memory.",
               "@nnx.remat(policy=jax.checkpoint_policies.offload_dot_with_no_batch_dims(\n"
               '    "device", "pinned_host"))',
               lambda: _cp.offload_dot_with_no_batch_dims("device", "pinned_host")),
        *_MAXTEXT,
        Policy("custom", "custom (per tensor)",
               "Choose for each checkpoint name of the model: save on the device, offload to "
               "pinned host memory, or recompute (MaxText's custom: tensors_on_device, "
               "tensors_to_offload).",
               _offload_code((), ()), lambda: _offload_policy((), ()), group="custom"),
    ]
}

if tuple(POLICIES) != POLICY_IDS:  # the configuration validates against the catalog's ids
    raise ImportError("model/policies.py and config/catalog.py list different policy ids")


def build_policy(config) -> Callable | None:
    """The policy callable ``nnx.remat(policy=...)`` gets for ``config`` (a ``RunConfig``); None for
    JAX's default policy. Only meaningful when ``get_policy(config.policy).remat``."""
    if config.policy == "custom":
        return _offload_policy(config.save_names, config.offload_names)
    return get_policy(config.policy).build()


def policy_code(config) -> str:
    """The decorator line(s) for ``config``'s policy, with custom's chosen names filled in."""
    if config.policy == "custom":
        return _offload_code(config.save_names, config.offload_names)
    return get_policy(config.policy).code


def policy_names(config) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(saved, offloaded)``: the checkpoint names ``config``'s policy keeps; empty for JAX's."""
    if config.policy == "custom":
        return tuple(config.save_names), tuple(config.offload_names)
    entry = get_policy(config.policy)
    return entry.saves, entry.offloads


def get_policy(policy_id: str) -> Policy:
    """The registry entry for ``policy_id``; unknown ids raise ``KeyError``."""
    return POLICIES[policy_id]

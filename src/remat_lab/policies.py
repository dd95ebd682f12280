"""The checkpoint-policy registry: id -> how to build it, a label, a description and the code.

Ids and code use JAX's own names so users can paste them. ``save_anything_except_these_names``
is left out on purpose: in jax it is ``lambda *_, **__: True`` (it saves everything and ignores
the names it is given), so listing it would show a policy that does not do what it says.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax


@dataclass(frozen=True)
class Policy:
    """One registry entry. ``remat`` False means no ``nnx.remat`` at all."""

    id: str
    label: str
    description: str
    code: str
    build: Callable[[], Callable | None]
    remat: bool = True


_cp = jax.checkpoint_policies

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
    ]
}

DEFAULT_POLICY = "dots_with_no_batch_dims_saveable"


def get_policy(policy_id: str) -> Policy:
    """The registry entry for ``policy_id``; unknown ids raise ``KeyError``."""
    return POLICIES[policy_id]

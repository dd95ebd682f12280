"""The training step's optimizer and a step's precision: AdamW with both moments in the optimizer dtype.

``optimizer`` is AdamW as ``optax.adamw`` chains it (Adam's scaling, decoupled weight decay, the
learning rate) with the first and the second moment stored in ``config.optimizer_dtype_used``
(``_scale_by_adam``); ``precision`` names the dtypes of a step: master weights (and their
gradients), compute, moments. The training step (``step.make_train_step``) uses the first; the
run and advice documents carry the second.
"""

from __future__ import annotations

import jax.numpy as jnp
import optax

from remat_lab.config import RunConfig

LEARNING_RATE = 1e-4  # adamw's (constant) step size; memory and time do not depend on it
WEIGHT_DECAY = 1e-4  # optax.adamw's default


def _scale_by_adam(dtype) -> optax.GradientTransformation:
    """``optax.scale_by_adam`` with both moments stored in ``dtype``. In optax 0.2.8 ``mu_dtype``
    sets only the first moment's; the second is made like the parameters (``tree.zeros_like``) and
    cast back to its own dtype after each update (``tree.cast_like(nu, state.nu)``): so a second
    moment made in ``dtype`` here stays in it. Each update computes in the wider of the gradient's
    and the moment's dtype and stores in ``dtype``."""
    adam = optax.scale_by_adam(mu_dtype=dtype)

    def init(params) -> optax.ScaleByAdamState:
        state = adam.init(params)
        return state._replace(nu=optax.tree.cast(state.nu, dtype))

    return optax.GradientTransformation(init, adam.update)


def optimizer(config: RunConfig) -> optax.GradientTransformation:
    """The training step's optimizer: AdamW as ``optax.adamw`` chains it (Adam's scaling, decoupled
    weight decay, the learning rate), both moments in ``config.optimizer_dtype_used`` (the
    parameters' dtype unless set; ``_scale_by_adam``). The state is ``optax.adamw``'s, so it is
    laid out on a mesh like its parameters (``mesh.state_specs``)."""
    return optax.chain(_scale_by_adam(jnp.dtype(config.optimizer_dtype_used)),
                       optax.add_decayed_weights(WEIGHT_DECAY),
                       optax.scale_by_learning_rate(LEARNING_RATE))


def precision(config: RunConfig) -> dict:
    """The dtypes of a step: ``params`` (the master weights; their gradients too), ``compute``
    (activations and products) and ``optimizer`` (AdamW's two moments)."""
    return {"params": config.param_dtype_used, "compute": config.dtype,
            "optimizer": config.optimizer_dtype_used}

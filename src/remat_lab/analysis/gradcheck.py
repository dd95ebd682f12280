"""Check a step's loss and gradients against an independent plain-jax.numpy model, and that remat was applied.

The lead's wiring in ``run_experiment`` (after the step ran and was traced)::

    from remat_lab.analysis.gradcheck import check_gradients
    check = check_gradients(problem, grads, loss, traced.jaxpr)   # loss None for objective "grad"

**Reference.** ``reference_loss_and_grads`` re-implements each model's forward math in plain
``jax.numpy`` on the problem's own parameter values (looked up by their path names, e.g.
``'blocks.1.l2.kernel'``) and differentiates it with ``jax.value_and_grad`` -- no NNX module, no
model class, no ``nnx.remat``. It is evaluated in the step's dtype with the NNX model's rounding
points (``x @ kernel + bias`` in the dtype, relu, for seq_mixer the scaled score product, a softmax
shifted by its (stop-gradient) row max, the mixing product; the output summed in float32).

Why not a float32 (upcast) reference for bfloat16 steps? bfloat16 rounding of the activations,
amplified through relu masks and the softmax, moves single bf16 gradient entries by up to ~50 % of
their leaf's max against a float32 evaluation of the same parameters (measured: 120 u * S at width
128, batch 64). A bound wide enough to admit that could not catch a 3 % error.

Why two evaluations? XLA may keep a bfloat16 intermediate in float32 inside a fusion
(``xla_allow_excess_precision``, on by default). Which intermediates it keeps depends on the
program: in seq_mixer the no_remat step keeps the softmax's ``exp`` in float32, while
``everything_saveable`` must store it as a bfloat16 residual. The two differ by up to 12 u * S per
entry and 3 u norm-wise -- more than a 1 % error. So in bfloat16 the reference is compiled twice:
as XLA compiles it by default, and with ``xla_allow_excess_precision=False`` (every intermediate
rounded, the jaxpr's literal semantics). The step passes when it is within the bound of either.
In float32 the two coincide.

Why a third, rematerialised, evaluation? XLA 0.12 keeps a remat'd step's recomputation (XLA 0.10's
CPU compiler merged it back into the forward): the recomputed forward lies in other fusions, where
XLA keeps other intermediates in float32, so the backward reads differently rounded values than
either evaluation above computes (seq_mixer, bfloat16, width 32, seq 8, depth 3: 1.38 u * S per
entry from the default one, 6.4 u from the rounded one; the same distance from a float32
evaluation as both, 3.6 u norm-wise). So for a remat'd policy (not the llm, not the user's block)
the reference is also compiled with each block under ``jax.checkpoint`` (nothing saved): the same
plain model, the recomputation's rounding points. Measured on CPU there: no_remat matches the
default evaluation, everything_saveable is within the rounded one's bound, and every other policy
matches the rematerialised one bit for bit.

**Bound.** See ``gradcheck_bounds``: the bounds, from the dtype and the reduction sizes.

**The llm**'s reference is ``reference_llm.py`` (same rules). Its bound uses ``K = max(width,
mlp_dim, vocab, batch * seq)`` and the transformer's per-element allowance; the loss bound the mean
``|ce|`` over the ``batch * (seq - 1)`` labelled positions in place of ``sum|out|``.

**The user's block** (model ``user``) has no plain-jnp implementation here: its reference is the
same block without remat (``_user_reference``: the lab's stack of the user's module on the same
parameters and input, each block called directly, no ``nnx.remat``), compiled apart. Not
independent of the block's own code, it checks what the policy changes: a remat'd stack whose
recomputation or saved values are wrong gives other gradients than the same stack run once.
Bounds as for the built-ins (``gradcheck_bounds``: the compute dtype, ``K`` from the input and the
widest parameter axis); in bfloat16 both reference compiles, as above.

**Structure.** ``remat_applied(jaxpr)`` says whether the traced step contains a remat equation
(primitive ``remat2`` in current JAX, ``checkpoint``/``remat`` in others; nested jaxprs included);
it must match the policy's registry entry (``remat=True`` for all but ``no_remat``), else the check
fails: a step that silently lost its remat computes the same numbers.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax._src import core as jax_core

from remat_lab.analysis.gradcheck_bounds import (
    RTOL_ULPS,
    UNIT_ROUNDOFF,
    _leaf_errors,
    bound_parameters,
    loss_bound,
)
from remat_lab.analysis.reference_llm import llm_loss_and_abs
from remat_lab.config.catalog import USER_MODEL
from remat_lab.model.llm import next_token_loss
from remat_lab.model.policies import get_policy
from remat_lab.model.stacks import run_stack

REFERENCE = "plain jax.numpy, no NNX, no remat"
USER_REFERENCE = "the same block without remat (policy no_remat): same parameters, same input"
MOE_REFERENCE = ("the same mixture-of-experts llm without remat (no plain-jnp one here yet; "
                 "tests/test_moe.py holds the MoE layer to one)")
__all__ = ["UNIT_ROUNDOFF", "bound_parameters", "check_gradients", "reference_loss_and_grads",
           "remat_applied", "_leaf_errors"]
REMAT_PRIMITIVES = ("remat2", "checkpoint", "remat")


# --- the independent model -------------------------------------------------------------------

def _relu(z: jax.Array) -> jax.Array:
    return jnp.where(z > 0, z, jnp.zeros_like(z))  # derivative 0 at 0, like jax.nn.relu


def _linear(h: jax.Array, params: dict, name: str) -> jax.Array:
    return h @ params[name + ".kernel"] + params[name + ".bias"]


def _softmax(s: jax.Array) -> jax.Array:
    e = jnp.exp(s - jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True)))
    return e / jnp.sum(e, axis=-1, keepdims=True)


def _rms_norm(h: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    """RMS normalisation with flax's rounding points: statistics and scaling in float32, the result
    in h's dtype. ``h`` is converted twice, as flax does (once for the statistics, once for the
    scaling), so in bfloat16 the two cotangents are rounded apart and added in bfloat16."""
    var = jnp.mean(jax.lax.square(h.astype(jnp.float32)), axis=-1, keepdims=True)
    return (h.astype(jnp.float32) * (jax.lax.rsqrt(var + eps) * scale)).astype(h.dtype)


# Each block's parameters by their in-block names (``l1.kernel``), per model.
BLOCK_LEAVES = {
    "mlp": ("l1.kernel", "l1.bias", "l2.kernel", "l2.bias"),
    "seq_mixer": ("l1.kernel", "l1.bias", "l2.kernel", "l2.bias"),
    "transformer": ("attn_norm.scale", "q_proj.kernel", "k_proj.kernel", "v_proj.kernel",
                    "o_proj.kernel", "mlp_norm.scale", "wi_0.kernel", "wi_1.kernel", "wo.kernel"),
}


def _transformer_block(h: jax.Array, p: dict) -> jax.Array:
    """One pre-norm decoder block on ``h: (B, N, D)``; the heads come from ``q_proj.kernel: (D, H, K)``.

    ``h + attn(norm(h))`` with causal softmax attention, then ``+ wo(silu(wi_0 m) * wi_1 m)``.
    """
    a = _rms_norm(h, p["attn_norm.scale"])
    q, k, v = (jnp.einsum("bnd,dhk->bnhk", a, p[f"{n}_proj.kernel"]) for n in "qkv")
    n = h.shape[-2]
    scores = jnp.einsum("bnhk,bmhk->bhnm", q, k) / math.sqrt(q.shape[-1])
    scores = jnp.where(jnp.tril(jnp.ones((n, n), dtype=bool)), scores, jnp.finfo(scores.dtype).min)
    context = jnp.einsum("bhnm,bmhk->bnhk", _softmax(scores), v)
    h = h + jnp.einsum("bnhk,hkd->bnd", context, p["o_proj.kernel"])
    m = _rms_norm(h, p["mlp_norm.scale"])
    gate, up = m @ p["wi_0.kernel"], m @ p["wi_1.kernel"]
    return h + (gate * jax.lax.logistic(gate) * up) @ p["wo.kernel"]


BLOCK_LEAVES["llm"] = BLOCK_LEAVES["transformer"]  # the llm block's leaves have the same names


def _stacked(paths, depth: int) -> bool:
    """True for a scan stack's parameters: ``blocks.l1.kernel`` with a leading layer axis."""
    return depth > 1 and not any(p.startswith("blocks.0.") for p in paths)


def _layer_params(params: dict, i: int, depth: int) -> dict:
    """Layer ``i``'s parameters by their in-block names (``l1.kernel``): from ``blocks.{i}.`` of a
    loop stack, or slice ``i`` of a scan stack's stacked ``blocks.`` arrays (a Python loop here, not
    a scan: the reference does not share the stack's implementation)."""
    if depth == 1:
        return params
    if _stacked(params, depth):
        return {k.removeprefix("blocks."): v[i] for k, v in params.items() if k.startswith("blocks.")}
    pre = f"blocks.{i}."
    return {k.removeprefix(pre): v for k, v in params.items() if k.startswith(pre)}


def _block(p: dict, h: jax.Array, model: str) -> jax.Array:
    """One block of the mlp, seq_mixer or transformer on ``h``."""
    if model == "transformer":
        return _transformer_block(h, p)
    h = _relu(_linear(h, p, "l1"))
    if model == "seq_mixer":
        scores = jnp.einsum("bnd,bmd->bnm", h, h) / math.sqrt(h.shape[-1])
        h = jnp.einsum("bnm,bmd->bnd", _softmax(scores), h)
    return _relu(_linear(h, p, "l2"))


# The rematerialised evaluation's blocks: the backward recomputes every block's forward.
_REMAT_BLOCK = jax.checkpoint(_block, policy=jax.checkpoint_policies.nothing_saveable,
                              static_argnums=(2,))


def reference_forward(params: dict, x: jax.Array, model: str, depth: int,
                      remat: bool = False) -> jax.Array:
    """The model output from ``{path: array}`` parameters, in plain jax.numpy; ``remat``: each
    block under ``jax.checkpoint`` (nothing saved), for the recomputation's rounding points."""
    h = x
    for i in range(depth):
        h = (_REMAT_BLOCK if remat else _block)(_layer_params(params, i, depth), h, model)
    return h


def reference_loss(params: dict, x: jax.Array, model: str, depth: int) -> jax.Array:
    """The loss of the plain-jnp model: the output summed in float32."""
    return jnp.sum(reference_forward(params, x, model, depth), dtype=jnp.float32)


def _loss_and_abs(params: dict, x: jax.Array, model: str, depth: int, remat: bool = False,
                  chunks: int = 1):
    """The loss and what bounds its rounding: ``(sum|out|, sqrt(sum out^2))`` (the llm: its mean
    ``|ce|`` and NaN, see ``gradcheck_bounds.loss_bound``)."""
    if model == "llm":
        loss, mean_abs = llm_loss_and_abs(params, x, depth, chunks)
        return loss, (mean_abs, jnp.float32(jnp.nan))
    out = reference_forward(params, x, model, depth, remat).astype(jnp.float32)
    return jnp.sum(out), (jnp.sum(jnp.abs(out)), jnp.sqrt(jnp.sum(jnp.square(out))))


@functools.lru_cache(maxsize=8)
def _compiled(model: str, depth: int, shapes: tuple, x_shape: tuple, dtype: str, excess: bool,
              remat: bool = False, chunks: int = 1):
    fn = jax.jit(jax.value_and_grad(functools.partial(_loss_and_abs, model=model, depth=depth,
                                                      remat=remat, chunks=chunks), has_aux=True))
    params = {path: jax.ShapeDtypeStruct(shape, dtype) for path, shape in shapes}
    x_dtype = jnp.int32 if model == "llm" else dtype
    lowered = fn.lower(params, jax.ShapeDtypeStruct(x_shape, x_dtype))
    # The default compile is how the step itself is compiled; the other rounds every intermediate.
    return lowered.compile() if excess else lowered.compile(
        compiler_options={"xla_allow_excess_precision": False})


def _check_paths(paths: list[str], depth: int, model: str = "mlp") -> None:
    if model == "llm":  # the blocks under layers., then the embedding, final norm and lm_head
        _check_paths([p[7:] for p in paths if p.startswith("layers.")], depth, "transformer")
        outer, need = {p for p in paths if p[:7] != "layers."}, {"embed.embedding", "final_norm.scale"}
        if not need <= outer <= need | {"lm_head.kernel"}:
            raise ValueError(f"unexpected llm parameter paths {sorted(outer)}")
        return
    if depth == 1:
        prefixes = [""]
    elif _stacked(paths, depth):
        prefixes = ["blocks."]
    else:
        prefixes = [f"blocks.{i}." for i in range(depth)]
    want = {f"{pre}{leaf}" for pre in prefixes for leaf in BLOCK_LEAVES[model]}
    if set(paths) != want or len(paths) != len(want):
        raise ValueError(f"unexpected parameter paths {sorted(paths)}; expected {sorted(want)}")


def _user_loss_and_abs(leaves: list, x: jax.Array, graphdef, treedef, llm: bool = False):
    """The user's stack without remat: its output summed in float32, as the step's loss, and
    ``(sum|out|, sqrt(sum out^2))``; ``llm`` (a mixture of experts): the llm's loss without remat,
    its mean ``|ce|`` (the loss: every cross-entropy is positive) and NaN, as ``_loss_and_abs``."""
    model = nnx.merge(graphdef, jax.tree_util.tree_unflatten(treedef, leaves))
    if llm:
        loss = next_token_loss(model(x), x)
        return loss, (loss, jnp.float32(jnp.nan))
    out = run_stack(model, lambda block, h: block(h), x).astype(jnp.float32)
    return jnp.sum(out), (jnp.sum(jnp.abs(out)), jnp.sqrt(jnp.sum(jnp.square(out))))


@functools.lru_cache(maxsize=8)
def _compiled_user(graphdef, treedef, shapes: tuple, x_shape: tuple, x_dtype: str, excess: bool,
                   llm: bool = False):
    fn = jax.jit(jax.value_and_grad(functools.partial(_user_loss_and_abs, graphdef=graphdef,
                                                      treedef=treedef, llm=llm), has_aux=True))
    lowered = fn.lower([jax.ShapeDtypeStruct(s, d) for s, d in shapes],
                       jax.ShapeDtypeStruct(x_shape, x_dtype))
    return lowered.compile() if excess else lowered.compile(
        compiler_options={"xla_allow_excess_precision": False})


def _user_reference(problem, excess_precision: bool = True) -> tuple:
    """``_reference`` of the user's block: the same block without remat (module docstring)."""
    leaves = [jnp.asarray(leaf) for leaf in problem.leaves]
    x = jnp.asarray(problem.x)
    shapes = tuple((tuple(a.shape), a.dtype.name) for a in leaves)
    fn = _compiled_user(problem.graphdef, problem.treedef, shapes, tuple(x.shape), x.dtype.name,
                        excess_precision, problem.config.model == "llm")
    (loss, (abs_sum, l2)), grads = fn(leaves, x)
    return float(loss), [np.asarray(g) for g in grads], float(abs_sum), float(l2)


def reference_loss_and_grads(problem, dtype=None, *, excess_precision: bool = True,
                             remat: bool = False) -> tuple[float, list[np.ndarray], float]:
    """``(loss, grads in problem.paths order, sum|out|)`` of the plain-jnp model.

    The gradients are NumPy views of the reference's arrays in its dtype (no float64 copies:
    ``_leaf_errors`` widens them a chunk at a time).

    ``dtype`` defaults to the step's (``jnp.float32`` gives an upcast evaluation);
    ``excess_precision=False`` compiles with every intermediate rounded to the dtype; ``remat``
    evaluates each block under ``jax.checkpoint`` (not for the llm or the user's block).
    """
    return _reference(problem, dtype, excess_precision, remat)[:3]


def _reference(problem, dtype=None, excess_precision: bool = True, remat: bool = False
               ) -> tuple[float, list[np.ndarray], float, float]:
    """``reference_loss_and_grads`` and ``sqrt(sum out^2)`` (NaN for the llm)."""
    cfg = problem.config
    if cfg.model == USER_MODEL or cfg.experts:  # the user's block; a mixture of experts
        return _user_reference(problem, excess_precision)
    dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
    _check_paths(problem.paths, cfg.depth, cfg.model)
    params = {p: jnp.asarray(leaf).astype(dtype) for p, leaf in zip(problem.paths, problem.leaves)}
    x = jnp.asarray(problem.x) if cfg.model == "llm" else jnp.asarray(problem.x).astype(dtype)
    shapes = tuple(sorted((p, tuple(v.shape)) for p, v in params.items()))
    fn = _compiled(cfg.model, cfg.depth, shapes, tuple(x.shape), dtype.name, excess_precision,
                   remat and cfg.model != "llm", cfg.loss_chunks if cfg.model == "llm" else 1)
    (loss, (abs_sum, l2)), grads = fn(params, x)
    return (float(loss), [np.asarray(grads[p]) for p in problem.paths], float(abs_sum), float(l2))


# --- the structural check --------------------------------------------------------------------

def _jaxprs(jaxpr):
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)  # ClosedJaxpr -> Jaxpr
    yield jaxpr
    for eqn in jaxpr.eqns:
        for sub in jax_core.jaxprs_in_params(eqn.params):
            yield from _jaxprs(sub)


def remat_applied(step_jaxpr) -> bool:
    """Whether the traced step (a ``ClosedJaxpr`` or ``Jaxpr``) contains a remat equation."""
    return any(eqn.primitive.name in REMAT_PRIMITIVES
               for jx in _jaxprs(step_jaxpr) for eqn in jx.eqns)


# --- the check -------------------------------------------------------------------------------

def _compare(problem, grads, loss, ref) -> dict:
    """Errors of ``grads``/``loss`` against one reference evaluation, and what is out of bound."""
    widest = max((max(np.shape(leaf), default=1) for leaf in problem.leaves), default=1)
    cfg, b = problem.config, bound_parameters(problem.config, widest)
    u, acc = b["u"], b["acc"]
    rtol, atol = RTOL_ULPS * u, b["c_elem"] * u + acc
    ref_loss, ref_grads, abs_out, l2_out = ref
    failures: list[str] = []
    if len(grads) != len(ref_grads):
        failures.append(f"{len(grads)} gradient leaves, expected {len(ref_grads)}")
    max_abs = max_rel = 0.0
    for path, g, r in zip(problem.paths, grads, ref_grads):
        g, r = np.asarray(g), np.asarray(r)
        if g.shape != r.shape:
            failures.append(f"{path}: shape {g.shape}, expected {r.shape}")
            max_abs = max_rel = math.inf
            continue
        worst, scale, leaf_failures = _leaf_errors(path, g, r, rtol, atol, u, acc)
        failures += leaf_failures
        max_abs = max(max_abs, worst)
        max_rel = max(max_rel, worst / scale if scale else (math.inf if worst else 0.0))
    loss_err = None
    if loss is not None:
        loss_err = abs(float(loss) - ref_loss)
        loss_tol = loss_bound(cfg, abs_out, l2_out)
        if not loss_err <= loss_tol:  # also catches NaN
            failures.append(f"loss: {float(loss):.8g} vs {ref_loss:.8g} (bound {loss_tol:.3g})")
    return {"loss_err": loss_err, "grad_max_abs_err": max_abs, "grad_max_rel_err": max_rel,
            "rtol": rtol, "atol": atol, "failures": failures}


def check_gradients(problem, grads, loss, step_jaxpr) -> dict:
    """Compare the step's ``loss`` (None for objective ``grad``) and ``grads`` (in
    ``problem.paths`` order) with the plain-jnp reference, and ``step_jaxpr`` (the traced step,
    e.g. ``jax.jit(make_step(problem)).trace(*problem.args).jaxpr``) with the policy's remat flag.

    ``rtol`` multiplies ``|ref|`` per element; ``atol`` multiplies the leaf's ``max|ref|`` (it is
    relative to the leaf's scale); the scale test and the loss bound are in the module docstring,
    ``bound_parameters(problem.config)`` gives every parameter. In bfloat16 the errors reported are
    those against the reference evaluation (default or no excess precision) the step is closer to.
    """
    cfg = problem.config
    result = _compare(problem, grads, loss, _reference(problem))
    others = [dict(excess_precision=False)]
    if get_policy(cfg.policy).remat and cfg.model not in ("llm", USER_MODEL):
        others.append(dict(remat=True))  # the recomputation's rounding (module docstring)
    for how in others if cfg.dtype != "float32" else ():
        if not result["failures"]:
            break
        other = _compare(problem, grads, loss, _reference(problem, **how))
        if (len(other["failures"]), other["grad_max_rel_err"]) < (len(result["failures"]),
                                                                 result["grad_max_rel_err"]):
            result = other
    failures = list(result["failures"])
    expected = get_policy(cfg.policy).remat
    applied = None if step_jaxpr is None else remat_applied(step_jaxpr)
    if applied is None:
        failures.append("remat: no traced step given, cannot tell whether the policy was applied")
    elif applied != expected:
        failures.append(f"remat: policy {cfg.policy} expects {'a' if expected else 'no'} "
                        f"remat equation, the traced step has {'one' if applied else 'none'}")
    user = cfg.model == USER_MODEL
    return {"reference": USER_REFERENCE if user else MOE_REFERENCE if cfg.experts else REFERENCE,
            "independent": not (user or cfg.experts),
            "loss_err": result["loss_err"],
            "grad_max_abs_err": result["grad_max_abs_err"],
            "grad_max_rel_err": result["grad_max_rel_err"],
            "max_abs_err": result["grad_max_abs_err"], "max_rel_err": result["grad_max_rel_err"],
            "rtol": result["rtol"], "atol": result["atol"],
            "remat_applied": applied, "remat_expected": expected,
            "ok": not failures, "failures": failures}

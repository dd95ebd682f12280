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
rounded, the jaxpr's literal semantics). The step passes when it is within the bound of either
(measured on CPU: every policy matches one of the two bit for bit). In float32 the two coincide.

**Bound.** ``u`` is the unit roundoff of the step's dtype (bfloat16 ``2**-8``, float32
``2**-24``), ``u_acc = 2**-24`` that of the float32 accumulation (dots and the loss sum accumulate
in float32 in both dtypes), ``K = max(width, rows)`` the longest reduction feeding any gradient
(``rows`` = batch * seq for seq_mixer, batch for mlp, 1 for batch 0: the kernel and bias gradients
sum over rows, the backward products over width), ``d`` the depth, ``acc = C_ACC * sqrt(d * K) *
u_acc`` (float32 accumulation reordered along d chained reductions of K terms) and, per leaf,
``S = max|r|`` and ``n_eff = (sum r^2)^2 / sum r^4`` (its effective number of entries). Leaf ``g``
with reference ``r`` passes when all its entries are finite and

* per element:  ``|g - r| <= 2u * |r| + (C_ELEM * u + acc) * S``: one ulp of the entry (the
  programs may round the last step to neighbouring values) plus half an ulp of the leaf's scale;
* leaf scale:  ``|<g - r, r>| / <r, r> <= (C_SCALE + 6 / sqrt(n_eff)) * u + acc``: round-to-nearest
  is unbiased, so a leaf-wide scale error beyond half an ulp is not rounding; ``6 / sqrt(n_eff)``
  is three standard deviations of the projection of independent one-ulp noise.

With ``C_ELEM = C_SCALE = 1`` and ``C_ACC = 4``: in bfloat16 a whole leaf scaled by 1.01 (2.56 u)
fails the scale test on any leaf with ``n_eff > 15``, one scaled by 1.03 (7.7 u) fails per
element, and zeroing entries below 2 % of the leaf's max fails per element wherever an entry lies
between 0.4 % and 2 % of it; in float32 a 1e-4 relative error fails both tests up to ``d * K`` of
about 1e5. A single bf16 entry off by less than about one ulp is not detectable.

The loss is compared apart: ``|loss - ref| <= (C_LOSS * u + C_ACC * sqrt(n) * u_acc) * sum|out|``
with ``n`` the number of output entries (each may round to a neighbouring value, ``C_LOSS = 2``;
the float32 sum of ``n`` terms may be reordered).

**The llm**'s reference is ``reference_llm.py`` (same rules). Its bound uses ``K = max(width,
mlp_dim, vocab, batch * seq)`` and the transformer's per-element allowance; the loss bound the mean
``|ce|`` over the ``batch * (seq - 1)`` labelled positions in place of ``sum|out|``.

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
from jax._src import core as jax_core

from remat_lab.analysis.reference_llm import llm_loss_and_abs
from remat_lab.model.policies import get_policy

REFERENCE = "plain jax.numpy, no NNX, no remat"
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8}
ACC_ROUNDOFF = 2.0**-24  # float32 accumulation, kept for bfloat16 too
RTOL_ULPS = 2.0  # one ulp of the entry, in units of u
C_ELEM = 1.0  # half an ulp of the leaf's largest entry
# Per block, the transformer rounds far more bfloat16 intermediates between a parameter and the
# loss (RMSNorm, q/k/v, scores, softmax, context, two MLP branches, residual adds), and RMSNorm and
# softmax amplify a neighbouring rounding. Measured on CPU (width 64, seq 16, depth 2, every policy,
# both stacks, two seeds): legitimate per-element differences reach 6 u * S. Its per-element
# allowance is C_ELEM_DEEP * sqrt(depth) instead of C_ELEM; a leaf-wide 1 % error is still caught
# by the scale test, which does not change.
C_ELEM_DEEP = {"transformer": 6.0, "llm": 6.0}
C_SCALE = 1.0  # a leaf-wide scale error of half an ulp
C_NOISE = 6.0  # three standard deviations of one-ulp noise projected on the leaf
C_ACC = 4.0  # float32 accumulation: C_ACC * sqrt(terms) * u_acc
C_LOSS = 2.0  # one ulp per output entry, for the loss
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


def reference_forward(params: dict, x: jax.Array, model: str, depth: int) -> jax.Array:
    """The model output from ``{path: array}`` parameters, in plain jax.numpy."""
    h = x
    for i in range(depth):
        p = _layer_params(params, i, depth)
        if model == "transformer":
            h = _transformer_block(h, p)
            continue
        h = _relu(_linear(h, p, "l1"))
        if model == "seq_mixer":
            scores = jnp.einsum("bnd,bmd->bnm", h, h) / math.sqrt(h.shape[-1])
            h = jnp.einsum("bnm,bmd->bnd", _softmax(scores), h)
        h = _relu(_linear(h, p, "l2"))
    return h


def reference_loss(params: dict, x: jax.Array, model: str, depth: int) -> jax.Array:
    """The loss of the plain-jnp model: the output summed in float32."""
    return jnp.sum(reference_forward(params, x, model, depth), dtype=jnp.float32)


def _loss_and_abs(params: dict, x: jax.Array, model: str, depth: int):
    if model == "llm":
        return llm_loss_and_abs(params, x, depth)
    out = reference_forward(params, x, model, depth)
    return jnp.sum(out, dtype=jnp.float32), jnp.sum(jnp.abs(out), dtype=jnp.float32)


@functools.lru_cache(maxsize=8)
def _compiled(model: str, depth: int, shapes: tuple, x_shape: tuple, dtype: str, excess: bool):
    fn = jax.jit(jax.value_and_grad(functools.partial(_loss_and_abs, model=model, depth=depth),
                                    has_aux=True))
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


def reference_loss_and_grads(problem, dtype=None, *, excess_precision: bool = True
                             ) -> tuple[float, list[np.ndarray], float]:
    """``(loss, grads in problem.paths order, sum|out|)`` of the plain-jnp model.

    The gradients are NumPy views of the reference's arrays in its dtype (no float64 copies:
    ``_leaf_errors`` widens them a chunk at a time).

    ``dtype`` defaults to the step's (``jnp.float32`` gives an upcast evaluation);
    ``excess_precision=False`` compiles with every intermediate rounded to the dtype.
    """
    cfg = problem.config
    dtype = jnp.dtype(cfg.dtype if dtype is None else dtype)
    _check_paths(problem.paths, cfg.depth, cfg.model)
    params = {p: jnp.asarray(leaf).astype(dtype) for p, leaf in zip(problem.paths, problem.leaves)}
    x = jnp.asarray(problem.x) if cfg.model == "llm" else jnp.asarray(problem.x).astype(dtype)
    shapes = tuple(sorted((p, tuple(v.shape)) for p, v in params.items()))
    fn = _compiled(cfg.model, cfg.depth, shapes, tuple(x.shape), dtype.name, excess_precision)
    (loss, abs_sum), grads = fn(params, x)
    return (float(loss), [np.asarray(grads[p]) for p in problem.paths],
            float(abs_sum))


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

def _c_elem(config) -> float:
    """The per-element allowance in ulps of the leaf's largest entry (see C_ELEM_DEEP)."""
    deep = C_ELEM_DEEP.get(config.model)
    return C_ELEM if deep is None else deep * math.sqrt(config.depth)


def bound_parameters(config) -> dict:
    """The bound's parameters for ``config`` (see the module docstring)."""
    if config.model == "llm":
        rows = config.batch * config.seq
        k = max(config.width, config.mlp_dim_used, config.vocab, rows)
    else:
        rows = math.prod(config.input_shape[:-1])
        k = max(config.width * (4 if config.model == "transformer" else 1), rows)  # 4w: the MLP's wo
    return {"u": UNIT_ROUNDOFF[config.dtype], "u_acc": ACC_ROUNDOFF, "K": k, "d": config.depth,
            "acc": C_ACC * math.sqrt(config.depth * k) * ACC_ROUNDOFF, "rtol_ulps": RTOL_ULPS,
            "c_elem": _c_elem(config), "c_scale": C_SCALE, "c_noise": C_NOISE, "c_acc": C_ACC,
            "c_loss": C_LOSS}


CHUNK = 1 << 18  # entries of a leaf compared at a time (2 MiB per float64 temporary)


def _chunks(a: np.ndarray):
    """``a`` flattened, in float64 slices of at most CHUNK entries (no float64 copy of the leaf)."""
    flat = a.reshape(-1)
    for start in range(0, flat.size, CHUNK):
        yield start, flat[start:start + CHUNK].astype(np.float64)


def _leaf_errors(path: str, g: np.ndarray, r: np.ndarray, rtol: float, atol: float, u: float,
                 acc: float) -> tuple[float, float, list[str]]:
    """``(worst |g - r|, max |r|, failures)`` of one leaf, computed in float64 chunk by chunk.

    The same tests as on whole float64 copies (per element, then the leaf-wide scale test), with
    the host memory of one chunk: a width-4096 model's leaves are 64 MiB each in float32.
    """
    bad = scale = 0.0
    r2 = r4 = 0.0
    for _, rc in _chunks(r):
        scale = max(scale, float(np.max(np.abs(rc), initial=0.0)))
        r2 += float(np.sum(rc * rc))
        r4 += float(np.sum(rc**4))
    for _, gc in _chunks(g):
        bad += int(np.sum(~np.isfinite(gc)))
    if bad:
        return math.inf, scale, [f"{path}: {int(bad)} non-finite entries"]
    worst, count, top, cross = 0.0, 0, (-math.inf, 0), 0.0
    for (start, gc), (_, rc) in zip(_chunks(g), _chunks(r)):
        diff = gc - rc
        err = np.abs(diff)
        worst = max(worst, float(np.max(err, initial=0.0)))
        excess = err - (rtol * np.abs(rc) + atol * scale)
        count += int(np.sum(excess > 0))
        if excess.size and float(np.max(excess)) > top[0]:
            top = (float(np.max(excess)), start + int(np.argmax(excess)))
        cross += float(np.sum(diff * rc))
    failures = []
    if count:
        i = np.unravel_index(top[1], g.shape)
        failures.append(f"{path}: {count} of {g.size} entries out of bound, worst at "
                        f"{tuple(int(k) for k in i)}: {float(g[i]):.6g} vs {float(r[i]):.6g} "
                        f"(leaf max {scale:.3g})")
    if r2 > 0:
        n_eff = r2 * r2 / r4
        bias = cross / r2
        bias_tol = (C_SCALE + C_NOISE / math.sqrt(n_eff)) * u + acc
        if abs(bias) > bias_tol:
            failures.append(f"{path}: scaled by {1 + bias:.6g} against the reference "
                            f"(bound {bias_tol:.3g})")
    return worst, scale, failures


def _compare(problem, grads, loss, ref) -> dict:
    """Errors of ``grads``/``loss`` against one reference evaluation, and what is out of bound."""
    cfg, b = problem.config, bound_parameters(problem.config)
    u, acc = b["u"], b["acc"]
    rtol, atol = RTOL_ULPS * u, b["c_elem"] * u + acc
    ref_loss, ref_grads, abs_out = ref
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
        n_out = cfg.batch * (cfg.seq - 1) if cfg.model == "llm" else math.prod(cfg.input_shape)
        loss_tol = (C_LOSS * u + C_ACC * math.sqrt(n_out) * ACC_ROUNDOFF) * abs_out
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
    result = _compare(problem, grads, loss, reference_loss_and_grads(problem))
    if result["failures"] and cfg.dtype != "float32":
        other = _compare(problem, grads, loss,
                         reference_loss_and_grads(problem, excess_precision=False))
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
    return {"reference": REFERENCE, "independent": True, "loss_err": result["loss_err"],
            "grad_max_abs_err": result["grad_max_abs_err"],
            "grad_max_rel_err": result["grad_max_rel_err"],
            "max_abs_err": result["grad_max_abs_err"], "max_rel_err": result["grad_max_rel_err"],
            "rtol": result["rtol"], "atol": result["atol"],
            "remat_applied": applied, "remat_expected": expected,
            "ok": not failures, "failures": failures}

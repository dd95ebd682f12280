"""The gradient check's bounds: what rounding allows, from the step's dtype and its reduction sizes.

``u`` is the unit roundoff of the step's compute dtype (``config.dtype``: bfloat16 ``2**-8``,
float32 ``2**-24``; with float32 master weights and bfloat16 compute it is bfloat16's, since the
float32 gradients are those of bfloat16 products), ``u_acc = 2**-24`` that of the float32
accumulation (dots and the loss sum accumulate in float32 in both dtypes), ``K = max(width,
rows)`` the longest reduction feeding any gradient (``rows`` = batch * seq for seq_mixer, batch
for mlp, 1 for batch 0: the kernel and bias gradients sum over rows, the backward products over
width), ``d`` the depth, ``acc = C_ACC * sqrt(d * K) *
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

The loss is compared apart (``loss_bound``). The loss is the float32 sum of the ``n`` output
entries; each may differ from the reference's by ``c_elem`` ulps of itself (1 for mlp and
seq_mixer, ``6 * d**0.3`` for the transformer, as a gradient entry), independently and
without bias (round to nearest), so the sum differs by about ``c_elem * u * sqrt(sum out^2)``, not
``u * sum|out|``: ``|loss - ref| <= (C_LOSS * c_elem * u + acc) * sqrt(sum out^2) + C_ACC *
sqrt(n) * u_acc * sum|out|`` (``acc``: each entry's float32 accumulations reordered; the last
term: the float32 sum reordered). Measured on CPU (bfloat16, every policy): mlp and seq_mixer
match the closer reference's loss exactly; the transformer at depth 8 (width 64) differs by up
to 3.4 u * sqrt(sum out^2). A bfloat16 loss off by 0.1 % is then caught wherever
``sum|out| / sqrt(sum out^2)`` (about ``sqrt(n)`` for outputs of one sign) exceeds
``C_LOSS * c_elem * u / 0.001``: from a few hundred output entries for the mlp. The llm's loss
is a mean cross-entropy: its bound keeps ``C_LOSS_LLM * u`` times the mean ``|ce|``.
"""

from __future__ import annotations

import math

import numpy as np

UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8}
ACC_ROUNDOFF = 2.0**-24  # float32 accumulation, kept for bfloat16 too
RTOL_ULPS = 2.0  # one ulp of the entry, in units of u
C_ELEM = 1.0  # half an ulp of the leaf's largest entry
# Per block, the transformer rounds far more bfloat16 intermediates between a parameter and the
# loss (RMSNorm, q/k/v, scores, softmax, context, two MLP branches, residual adds), and RMSNorm and
# softmax amplify a neighbouring rounding. Measured on CPU (width 64, seq 16, depth 2, every policy,
# both stacks, two seeds): legitimate per-element differences reach 6 u * S; at depth 8 (width 64,
# seq 8, every policy) 6.2 u * S under scan and 9.1 u * S under loop, against the closer
# reference. The allowance is C * depth**p (C_ELEM_DEEP: (C, p)) instead of C_ELEM: for the
# transformer 6 * depth**0.3 (11.2 u at depth 8, where one entry off by 5 % of the leaf's max,
# 12.8 u, fails); the llm keeps 6 * sqrt(depth). A
# leaf-wide 1 % error is caught by the scale test, which does not change.
C_ELEM_DEEP = {"transformer": (6.0, 0.3), "llm": (6.0, 0.5)}
C_SCALE = 1.0  # a leaf-wide scale error of half an ulp
C_NOISE = 6.0  # three standard deviations of one-ulp noise projected on the leaf
C_ACC = 4.0  # float32 accumulation: C_ACC * sqrt(terms) * u_acc
# Small entries whose sign flips the per-element test cannot see (|r| <= atol * S / (2 - rtol)):
# in each of FLIP_BANDS bands |r| <= that edge / 2**k holding FLIP_MIN_ENTRIES entries or more,
# the projection <g - r, r> / <r, r> over the band is -2 when every sign is flipped, -1 when the
# entries are zeroed or g is noise independent of r, near 0 for rounding of a nonzero r. Measured
# on CPU (bfloat16 transformer, depth 8, every policy, both stacks): down to -0.54 against the
# closer reference, -1.22 against the other. Below -C_FLIP: flipped.
FLIP_BANDS = 5
FLIP_MIN_ENTRIES = 32
C_FLIP = 1.75
C_LOSS = 3.0  # three standard deviations of one-ulp noise per output entry, summed
C_LOSS_LLM = 2.0  # one ulp of the mean |ce| (the llm)


def _c_elem(config) -> float:
    """The per-element allowance in ulps of the leaf's largest entry (see C_ELEM_DEEP)."""
    deep = C_ELEM_DEEP.get(config.model)
    return C_ELEM if deep is None else deep[0] * config.depth ** deep[1]


def bound_parameters(config, widest: int = 0) -> dict:
    """The bound's parameters for ``config`` (see the module docstring). The user's block (model
    user): ``K = max(features, widest, rows)``, ``widest`` its longest parameter axis (its hidden
    width, unknown to the configuration), ``features`` the input's last axis."""
    if config.model == "llm":
        rows = config.batch * config.seq
        k = max(config.width, config.mlp_dim_used, config.vocab, rows)
    elif config.model == "user":
        rows = math.prod(config.input_shape[:-1])
        k = max(config.input_shape[-1], widest, rows)
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
    # max |r| and the non-finite count are exact in the leaves' own dtypes: read a chunk at a time
    # without float64 copies, before the one float64 pass below.
    scale, bad = 0.0, 0
    for start in range(0, r.size, CHUNK):
        scale = max(scale, float(np.max(np.abs(r.reshape(-1)[start:start + CHUNK]), initial=0.0)))
    for start in range(0, g.size, CHUNK):
        chunk = g.reshape(-1)[start:start + CHUNK]
        bad += int(chunk.size - np.count_nonzero(np.isfinite(chunk)))
    if bad:
        return math.inf, scale, [f"{path}: {bad} non-finite entries"]
    worst, count, top, r4 = 0.0, 0, (-math.inf, 0), 0.0
    edges = atol * scale / (2 - rtol) * 0.5 ** np.arange(FLIP_BANDS)  # flips hidden per element
    ascending = edges[::-1]
    # Per count n of bands an entry lies in (0 .. FLIP_BANDS): entries, sum r^2, sum (g - r) r.
    per_n = np.zeros((3, FLIP_BANDS + 1))
    for (start, gc), (_, rc) in zip(_chunks(g), _chunks(r)):
        diff = gc - rc
        err = np.abs(diff)
        mag = np.abs(rc)
        # An entry lies in bands 0 .. n-1, n = how many edges are >= |r| (none when r is 0):
        # one histogram over n, summed from the top below, instead of a test per band.
        n = FLIP_BANDS - np.searchsorted(ascending, mag, side="left")
        n[rc == 0] = 0
        sq = rc * rc
        per_n += [np.bincount(n, weights=w, minlength=FLIP_BANDS + 1) for w in (None, sq, diff * rc)]
        r4 += float(np.dot(sq, sq))
        worst = max(worst, float(np.max(err, initial=0.0)))
        excess = err - (rtol * mag + atol * scale)
        count += int(np.count_nonzero(excess > 0))
        if excess.size:
            i = int(np.argmax(excess))
            if float(excess[i]) > top[0]:
                top = (float(excess[i]), start + i)
    band = np.cumsum(per_n[:, ::-1], axis=1)[:, ::-1][:, 1:]  # band k: every entry with n > k
    r2, cross = float(per_n[1].sum()), float(per_n[2].sum())
    failures = []
    if count:
        i = np.unravel_index(top[1], g.shape)
        failures.append(f"{path}: {count} of {g.size} entries out of bound, worst at "
                        f"{tuple(int(k) for k in i)}: {float(g[i]):.6g} vs {float(r[i]):.6g} "
                        f"(leaf max {scale:.3g})")
    for edge, (n, br2, bcross) in zip(edges, band.T):
        if n >= FLIP_MIN_ENTRIES and br2 > 0 and bcross / br2 < -C_FLIP:
            failures.append(f"{path}: the {int(n)} entries below {edge:.3g} have their signs flipped "
                            f"against the reference (projection {bcross / br2:.3g}, bound "
                            f"{-C_FLIP:g})")
            break
    if r2 > 0:
        n_eff = r2 * r2 / r4
        bias = cross / r2
        bias_tol = (C_SCALE + C_NOISE / math.sqrt(n_eff)) * u + acc
        if abs(bias) > bias_tol:
            failures.append(f"{path}: scaled by {1 + bias:.6g} against the reference "
                            f"(bound {bias_tol:.3g})")
    return worst, scale, failures




def loss_bound(config, abs_out: float, l2_out: float) -> float:
    """How far the step's loss may lie from the reference's (see the module docstring):
    ``abs_out`` is ``sum|out|`` (the llm: the mean ``|ce|``), ``l2_out`` is ``sqrt(sum out^2)``
    (NaN for the llm)."""
    u = UNIT_ROUNDOFF[config.dtype]
    if config.model == "llm" or not math.isfinite(l2_out):
        n = config.batch * (config.seq - 1)
        return (C_LOSS_LLM * u + C_ACC * math.sqrt(n) * ACC_ROUNDOFF) * abs_out
    n = math.prod(config.input_shape)
    b = bound_parameters(config)  # c_elem ulps per entry, as for a gradient entry (see C_ELEM_DEEP)
    return (C_LOSS * b["c_elem"] * u + b["acc"]) * l2_out + C_ACC * math.sqrt(n) * ACC_ROUNDOFF * abs_out

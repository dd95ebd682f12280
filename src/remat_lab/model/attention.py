"""The llm's causal grouped-query attention kernels: full, chunked (flash's algorithm in plain JAX), fused.

Every kernel maps ``q: (B, N, H, K)``, ``k, v: (B, N, G, K)`` (G divides H; query head ``h`` reads
key/value head ``h // (H // G)``) to the context ``(B, N, H, K)`` in the dtype, scaled by
``1 / sqrt(K)``, scores softmaxed in float32. The caller tags the output ``context``
(``llm.DecoderBlock``), so a policy's names mean the same thing whichever kernel runs.

* ``full_attention``: the ``(B, G, R, N, N)`` scores materialized (R = H // G), as MaxText's
  ``dot_product`` attention; autodiff saves them for the backward pass.
* ``chunked_attention``: blockwise with an online softmax (FlashAttention-2, Dao 2023) in plain
  JAX: query blocks in a ``lax.map``, key blocks below the diagonal in a ``fori_loop``, unmasked
  (blocks above it are never computed), then the diagonal block in ``diagonal_splits`` sub-blocks of
  which only those at or below its diagonal are computed (a whole diagonal block would compute
  half a block of masked scores a query block: 25 % over the causal work at four blocks), float32
  running max, sum and accumulator; a ``custom_vjp`` whose forward
  keeps only the output and the float32 log-sum-exp ``(B, G, R, N)`` and whose backward recomputes
  each block's probabilities from them, in two passes (dk and dv per key block, dq per query block)
  that each accumulate one block at a time. Memory is linear in ``seq`` for a fixed block. A sequence
  that is not a multiple of the block is padded with zeros at the end: causality hides the padded
  keys from every real query, and the padded queries' rows are dropped (their cotangents are 0).
  The output and the log-sum-exp are tagged ``context`` inside the forward rule, as Pallas splash
  attention tags its residuals (``residual_checkpoint_name``), so saving ``context`` keeps the
  backward pass from recomputing the kernel's forward.
* ``cudnn_attention``: ``jax.nn.dot_product_attention(implementation="cudnn")`` (cuDNN's fused
  flash attention, GPUs); ``splash_attention``: Pallas splash attention (TPUs), q pre-scaled as
  MaxText does. ``select`` picks one for ``attention="flash"`` where it traces for the platform,
  else ``chunked``, and says which and why (``Attention.used``, ``Attention.note``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax
from jax.ad_checkpoint import checkpoint_name

from remat_lab.config import LOCAL, RunConfig, get_target

F32 = jnp.float32
SPLASH_BLOCKS = (512, 256, 128)  # splash's query/key block: the largest that divides seq (lanes: 128)


def full_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Grouped-query causal attention with the ``(B, G, R, N, N)`` scores materialized."""
    b, n, h, d = q.shape
    g = k.shape[2]
    q = q.reshape(b, n, g, h // g, d)
    scores = jnp.einsum("bngrk,bmgk->bgrnm", q, k) / math.sqrt(d)
    causal = jnp.tril(jnp.ones((n, n), dtype=bool))
    scores = jnp.where(causal, scores.astype(F32), jnp.finfo(F32).min)
    p = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bgrnm,bmgk->bngrk", p, v).reshape(b, n, h, d)


# --- chunked: the online softmax over blocks -----------------------------------------------------

def _pad(x: jax.Array, to: int) -> jax.Array:
    """``x`` with its sequence axis (1) padded with zeros to ``to``."""
    return x if x.shape[1] == to else jnp.pad(x, [(0, 0), (0, to - x.shape[1])] + [(0, 0)] * (x.ndim - 2))


DIAGONAL_SPLITS = (4, 2)  # a diagonal block is split into this many sub-blocks (the first dividing it)


def diagonal_splits(blk: int) -> int:
    """How many sub-blocks a diagonal block of ``blk`` tokens is split into (1 where none divides)."""
    return next((k for k in DIAGONAL_SPLITS if blk % k == 0), 1)


def _scores(qi: jax.Array, kj: jax.Array, masked: bool = False) -> jax.Array:
    """The scaled float32 scores ``(B, G, R, q, k)`` of a query and a key block; ``masked``: the two
    cover the same positions (a diagonal sub-block), -inf above its diagonal."""
    s = jnp.einsum("bqgrd,bkgd->bgrqk", qi, kj, preferred_element_type=F32) / math.sqrt(qi.shape[-1])
    if not masked:
        return s
    n = qi.shape[1]
    return jnp.where(jnp.arange(n)[:, None] >= jnp.arange(n)[None, :], s, -jnp.inf)


def _online(carry: tuple, s: jax.Array, vj: jax.Array) -> tuple:
    """The online softmax's running max, sum and float32 accumulator after the scores ``s`` of one
    key block (values ``vj``)."""
    m, total, acc = carry
    m_new = jnp.maximum(m, jnp.max(s, axis=-1))
    p = jnp.exp(s - m_new[..., None])
    corr = jnp.exp(m - m_new)
    pv = jnp.einsum("bgrqk,bkgd->bgrqd", p.astype(vj.dtype), vj, preferred_element_type=F32)
    return m_new, total * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv


def _pieces(x: jax.Array, k: int, axis: int) -> list[jax.Array]:
    return jnp.split(x, k, axis=axis)


def _forward(q: jax.Array, k: jax.Array, v: jax.Array, block: int) -> tuple[jax.Array, jax.Array]:
    """The context ``(B, N, H, K)`` in the dtype and the log-sum-exp ``(B, G, R, Np)`` in float32
    (Np: N padded to whole blocks). Query block i reads key blocks j < i whole, unmasked, then its
    diagonal block split in ``diagonal_splits`` sub-blocks, of which only those at or below the diagonal."""
    b, n, h, d = q.shape
    g = k.shape[2]
    blk = min(block, n)
    nb, parts = -(-n // blk), diagonal_splits(blk)
    qp = _pad(q, nb * blk).reshape(b, nb * blk, g, h // g, d)
    kp, vp = _pad(k, nb * blk), _pad(v, nb * blk)

    def query_block(i):
        qi, ki, vi = (lax.dynamic_slice_in_dim(x, i * blk, blk, axis=1) for x in (qp, kp, vp))

        def key_block(j, carry):
            kj, vj = (lax.dynamic_slice_in_dim(x, j * blk, blk, axis=1) for x in (kp, vp))
            return _online(carry, _scores(qi, kj), vj)

        shape = (b, g, h // g, blk)
        carry = lax.fori_loop(0, i, key_block, (jnp.full(shape, -jnp.inf, F32), jnp.zeros(shape, F32),
                                                jnp.zeros((*shape, d), F32)))
        qs, ks, vs = _pieces(qi, parts, 1), _pieces(ki, parts, 1), _pieces(vi, parts, 1)
        done = []
        for a in range(parts):  # the diagonal block: sub-blocks at or below its diagonal
            state = tuple(_pieces(x, parts, 3)[a] for x in carry)
            for c in range(a + 1):
                state = _online(state, _scores(qs[a], ks[c], masked=a == c), vs[c])
            done.append(state)
        m, total, acc = (jnp.concatenate(x, axis=3) for x in zip(*done, strict=True))
        return (acc / total[..., None]).astype(q.dtype), m + jnp.log(total)

    out, lse = lax.map(query_block, jnp.arange(nb))  # (nb, B, G, R, blk, K), (nb, B, G, R, blk)
    out = jnp.transpose(out, (1, 0, 4, 2, 3, 5)).reshape(b, nb * blk, h, d)[:, :n]
    return out, jnp.transpose(lse, (1, 2, 3, 0, 4)).reshape(b, g, h // g, nb * blk)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def chunked_attention(q: jax.Array, k: jax.Array, v: jax.Array, block: int = 512) -> jax.Array:
    """Grouped-query causal attention over ``block``-token query and key blocks (online softmax);
    memory linear in the sequence. ``block`` larger than the sequence: one block."""
    return _forward(q, k, v, block)[0]


def _chunked_fwd(q, k, v, block):
    out, lse = _forward(q, k, v, block)
    out, lse = checkpoint_name(out, "context"), checkpoint_name(lse, "context")
    return out, (q, k, v, out, lse)


def _chunked_bwd(block, res, dout):
    """FlashAttention-2's backward as two passes (as JAX's Pallas flash kernels split it): per key
    block j, the query blocks i >= j give its dk and dv; per query block i, the key blocks j <= i
    give its dq. Each pass recomputes p from the log-sum-exp, ``ds = p * (dp - rowsum(dout *
    out))``, and accumulates one block in float32, kept in the dtype once done: no accumulator
    spans the sequence (two more block products a block pair than one pass with a whole-sequence
    float32 dq). The diagonal block pair is read in sub-blocks as the forward reads it."""
    q, k, v, out, lse = res
    b, n, h, d = q.shape
    g = k.shape[2]
    r, blk = h // g, min(block, n)
    nb, parts = -(-n // blk), diagonal_splits(blk)
    grouped = lambda x: _pad(x, nb * blk).reshape(b, nb * blk, g, r, d)
    qp, op, dop = grouped(q), grouped(out), grouped(dout)
    kp, vp = _pad(k, nb * blk), _pad(v, nb * blk)
    delta = jnp.einsum("bngrd,bngrd->bgrn", dop.astype(F32), op.astype(F32))
    scale = 1.0 / math.sqrt(d)

    def rows(i):
        """Query block i's q, dout (B, blk, G, R, K), log-sum-exp and delta (B, G, R, blk)."""
        return (*(lax.dynamic_slice_in_dim(x, i * blk, blk, axis=1) for x in (qp, dop)),
                *(lax.dynamic_slice_in_dim(x, i * blk, blk, axis=3) for x in (lse, delta)))

    def ds_of(qi, doi, lse_i, delta_i, kj, vj, masked=False):
        """A query and a key block's probabilities and score gradient (in the dtype)."""
        p = jnp.exp(_scores(qi, kj, masked) - lse_i[..., None])
        dp = jnp.einsum("bqgrd,bkgd->bgrqk", doi, vj, preferred_element_type=F32)
        return p, (p * (dp - delta_i[..., None]) * scale).astype(q.dtype)

    def diagonal(i):
        """Block (i, i) in sub-blocks at or below its diagonal: ``(a, c, p, ds, q_a, do_a, k_c)``."""
        qi, doi, lse_i, delta_i = rows(i)
        qs, dos, ks, vs = (_pieces(x, parts, 1) for x in (qi, doi, *(
            lax.dynamic_slice_in_dim(y, i * blk, blk, axis=1) for y in (kp, vp))))
        ls, deltas = _pieces(lse_i, parts, 3), _pieces(delta_i, parts, 3)
        for a in range(parts):
            for c in range(a + 1):
                p, ds = ds_of(qs[a], dos[a], ls[a], deltas[a], ks[c], vs[c], masked=a == c)
                yield a, c, p, ds, qs[a], dos[a], ks[c]

    def key_block(j):
        kj, vj = (lax.dynamic_slice_in_dim(x, j * blk, blk, axis=1) for x in (kp, vp))

        def query_block(i, carry):
            dk, dv = carry
            qi, doi, lse_i, delta_i = rows(i)
            p, ds = ds_of(qi, doi, lse_i, delta_i, kj, vj)
            dv = dv + jnp.einsum("bgrqk,bqgrd->bkgd", p.astype(v.dtype), doi, preferred_element_type=F32)
            return dk + jnp.einsum("bgrqk,bqgrd->bkgd", ds, qi, preferred_element_type=F32), dv

        zero = jnp.zeros((b, blk, g, d), F32)
        dk, dv = lax.fori_loop(j + 1, nb, query_block, (zero, zero))
        dks, dvs = _pieces(dk, parts, 1), _pieces(dv, parts, 1)
        for _, c, p, ds, qa, doa, _ in diagonal(j):
            dvs[c] = dvs[c] + jnp.einsum("bgrqk,bqgrd->bkgd", p.astype(v.dtype), doa,
                                         preferred_element_type=F32)
            dks[c] = dks[c] + jnp.einsum("bgrqk,bqgrd->bkgd", ds, qa, preferred_element_type=F32)
        return jnp.concatenate(dks, axis=1).astype(k.dtype), jnp.concatenate(dvs, axis=1).astype(v.dtype)

    def query_block(i):
        qi, doi, lse_i, delta_i = rows(i)

        def key_block_dq(j, dq):
            kj, vj = (lax.dynamic_slice_in_dim(x, j * blk, blk, axis=1) for x in (kp, vp))
            _, ds = ds_of(qi, doi, lse_i, delta_i, kj, vj)
            return dq + jnp.einsum("bgrqk,bkgd->bqgrd", ds, kj, preferred_element_type=F32)

        dqs = _pieces(lax.fori_loop(0, i, key_block_dq, jnp.zeros((b, blk, g, r, d), F32)), parts, 1)
        for a, _, _, ds, _, _, kc in diagonal(i):
            dqs[a] = dqs[a] + jnp.einsum("bgrqk,bkgd->bqgrd", ds, kc, preferred_element_type=F32)
        return jnp.concatenate(dqs, axis=1).astype(q.dtype)

    dk, dv = lax.map(key_block, jnp.arange(nb))  # (nb, B, blk, G, K) each, in the dtype
    dq = lax.map(query_block, jnp.arange(nb))  # (nb, B, blk, G, R, K)
    whole = lambda x: jnp.transpose(x, (1, 0, 2, 3, 4)).reshape(b, nb * blk, g, d)[:, :n]
    dq = jnp.transpose(dq, (1, 0, 2, 3, 4, 5)).reshape(b, nb * blk, h, d)[:, :n]
    return dq, whole(dk), whole(dv)


chunked_attention.defvjp(_chunked_fwd, _chunked_bwd)


# --- the targets' fused kernels --------------------------------------------------------------------

def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """cuDNN's fused flash attention (GPUs; bfloat16 or float16, head size <= 128 here)."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")


def splash_block(n: int) -> int | None:
    """Splash attention's block for ``n`` tokens: the largest of ``SPLASH_BLOCKS`` dividing it."""
    return next((b for b in SPLASH_BLOCKS if n % b == 0), None)


@functools.lru_cache(maxsize=8)
def _splash_kernel(n: int, heads: int, interpret: bool = False):
    """Pallas splash attention's causal multi-head kernel for one example (cached: the mask's
    block structure is computed in NumPy when it is made)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    blk = splash_block(n)
    sizes = sk.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                          block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk, block_kv_dq=blk)
    mask = sm.MultiHeadMask([sm.CausalMask((n, n))] * heads)
    return sk.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                              residual_checkpoint_name="context", interpret=interpret)


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, interpret: bool = False) -> jax.Array:
    """Pallas splash attention (TPUs) over the batch; ``interpret``: Pallas' interpreter (tests)."""
    kernel = _splash_kernel(q.shape[1], q.shape[2], interpret)
    heads_first = lambda x: jnp.swapaxes(x, 1, 2)
    scaled = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
    return heads_first(jax.vmap(kernel)(heads_first(scaled), heads_first(k), heads_first(v)))


# --- which kernel runs --------------------------------------------------------------------------

@dataclass(frozen=True)
class Attention:
    """The kernel a configuration's attention uses: ``used`` is ``full``, ``chunked``, ``cudnn``
    or ``splash``; ``note`` says why ``flash`` fell back to chunked ("" otherwise). On a mesh,
    splash runs per device under ``shard_map`` (``mesh``, the batch axes ``rows``, ``heads``)."""

    requested: str
    used: str
    block: int = 512
    note: str = ""
    mesh: jax.sharding.Mesh | None = None
    rows: object = None
    heads: str | None = None

    def __call__(self, q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        if self.used == "chunked":
            return chunked_attention(q, k, v, self.block)
        if self.used == "full":
            return full_attention(q, k, v)
        kernel = cudnn_attention if self.used == "cudnn" else splash_attention
        if self.mesh is None or self.used != "splash":  # cuDNN's call partitions itself
            return kernel(q, k, v)
        spec = jax.sharding.PartitionSpec(self.rows, None, self.heads, None)
        return jax.shard_map(kernel, mesh=self.mesh, in_specs=(spec, spec, spec), out_specs=spec,
                             check_vma=False)(q, k, v)

    def describe(self) -> str:
        """``attention_used`` in a document: the kernel, its block, and why flash fell back."""
        what = {"full": "full (seq x seq scores)", "chunked": f"chunked (block {self.block})",
                "cudnn": "flash: cuDNN (jax.nn.dot_product_attention, implementation='cudnn')",
                "splash": "flash: Pallas splash attention"}[self.used]
        return f"{what}, in place of flash: {self.note}" if self.note else what


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def _flash(platform: str, q: jax.ShapeDtypeStruct, k: jax.ShapeDtypeStruct) -> tuple[str, str]:
    """(``cudnn`` or ``splash``, "") where the fused kernel traces for ``platform`` at these
    shapes, else (``chunked``, the reason)."""
    if platform not in ("cuda", "gpu", "tpu"):
        return "chunked", f"no fused attention kernel compiles for {platform}"
    if platform == "tpu" and splash_block(q.shape[1]) is None:
        return "chunked", (f"Pallas splash attention needs seq a multiple of {SPLASH_BLOCKS[-1]} "
                           f"(got {q.shape[1]})")
    kernel = splash_attention if platform == "tpu" else cudnn_attention
    name = "Pallas splash attention" if platform == "tpu" else "cuDNN flash attention"
    try:
        jax.eval_shape(kernel, q, k, k)
    except Exception as err:  # cuDNN missing or refusing the shape/dtype; Pallas refusing the shape
        why = _first_line(err)
        if "cuDNN not found" in why:  # jax._src.cudnn.fused_attention_stablehlo.check_cudnn_version
            why += " (jax reads the installed cuDNN library's version to trace the fused call)"
        return "chunked", f"{name} does not trace here: {why}"
    return ("splash" if platform == "tpu" else "cudnn"), ""


@functools.lru_cache(maxsize=32)
def select(requested: str, block: int, platform: str, q: tuple, kv: tuple, dtype: str,
           mesh: jax.sharding.Mesh | None = None, rows: object = None,
           heads: str | None = None) -> Attention:
    """The kernel for ``requested`` (``full``, ``chunked``, ``flash``) on ``platform`` (a target's
    ``cuda``/``tpu``, or the local backend's ``cpu``/``gpu``/``tpu``) at global shapes ``q`` and
    ``kv`` (``(B, N, H, K)``, ``(B, N, G, K)``) in ``dtype``."""
    block = min(block, q[1])
    if requested != "flash":
        return Attention(requested, requested, block)
    used, note = _flash(platform, jax.ShapeDtypeStruct(q, dtype), jax.ShapeDtypeStruct(kv, dtype))
    return Attention(requested, used, block, note, mesh, rows, heads)


def for_config(config: RunConfig, mesh: jax.sharding.Mesh | None = None, rows: object = None) -> Attention:
    """``select`` for an llm ``RunConfig``: its attention on the platform its step compiles for
    (a named target's, else the local backend's), at one microbatch's shapes. On a ``mesh``:
    ``rows``, the batch's axes (``program/mesh.py``); heads over ``tensor`` when the mesh has it."""
    platform = jax.default_backend() if config.target == LOCAL else get_target(config.target).platform
    b, n, hd = config.batch // config.microbatches, config.seq, config.head_dim_used
    heads = "tensor" if mesh is not None and "tensor" in mesh.axis_names else None
    return select(config.attention, config.attention_block, platform, (b, n, config.heads, hd),
                  (b, n, config.kv_heads_used, hd), config.dtype, mesh, rows, heads)


AttentionFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]
FULL = Attention("full", "full")

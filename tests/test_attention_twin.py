"""The llm's chunked attention against a plain FlashAttention-2-style twin, in memory (issue 45, item 10).

The twin is written here, apart from the lab: a ``custom_vjp`` reading blocks in place, the forward
keeping the output and the float32 log-sum-exp, the backward in two passes (dk and dv per key
block over the query blocks at or below it, dq per query block over the key blocks at or before
it), each accumulating one block in float32 and keeping it in the dtype. It runs inside a plain
training step (the lab's blocks, a ``lax.scan`` under ``jax.checkpoint``, ``optax.adamw``, the
parameters laid out for fsdp), compiled for 8 H100s without them:

* the same plain step with the lab's kernel in place of the twin's holds the same bytes within
  1 % (0.61 % at the test's size, 540,672 B: one query block's q and the log-sum-exp and delta
  rows the lab's kernel slices for its diagonal block's sub-blocks; 256 B apart before issue 67,
  when it computed whole diagonal blocks as the twin does, 25 % more score work at four blocks);
* the lab's own program of the configuration is no more than 3 % over the plain one (0.977 at the
  test's size, 86,714,464 B against 88,795,872; 0.970 before issue 67).

At the issue's scaled recipe (2026-12-05, this file run as a script): the lab 3,663,282,912 B a
device, the plain step with the twin's kernel 3,631,791,840 (the lab 1.0087 of it, within the
issue's 3 %), the plain step with the lab's kernel 3,663,282,912, the lab's to the byte: the
0.87 % left lies between the two kernels, not the steps (not yet traced to an instruction).

Before the lab's backward was split in two passes it held a float32 dq over the whole sequence,
and before that float32 dk and dv stacks too (13 % over a plain program of the scaled recipe).
Two ways of writing the twin that are not FlashAttention-2's memory: unrolled in Python, XLA's
schedule of the straight-line program holds 2.3 times the bytes; with every loop over all blocks
and a ``lax.cond`` skipping those above the diagonal, 1.7 times.

``python tests/test_attention_twin.py`` compiles the issue's scaled recipe (width 2048, depth 4,
seq 4096, 8 x H100, fsdp=8, full) all three ways and prints the peaks (minutes here); the test
compiles a smaller one.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from remat_lab.config import RunConfig

F32 = jnp.float32
TOLERANCE = 0.03  # the bound: the lab's peak within 3 % of the twin's
KERNEL_GAP = 0.01  # the lab's kernel in the plain step against the twin's (see the docstring)
SMALL = RunConfig(model="llm", width=512, depth=2, heads=4, kv_heads=2, head_dim=128, mlp_dim=1536,
                  vocab=4096, seq=2048, batch=8, dtype="bfloat16", step="train", target="h100",
                  target_devices=8, mesh="fsdp=8", policy="full", attention="chunked",
                  attention_block=512, loss_chunks=8, compile_only=True)
RECIPE = RunConfig.from_preset("llama3-8b", width=2048, depth=4, seq=4096, batch=16, step="train",
                               target="h100", target_devices=8, mesh="fsdp=8", policy="full",
                               attention="chunked", loss_chunks=8, compile_only=True)


def flash2(block: int):
    """A FlashAttention-2-style causal grouped-query attention ``(q (B,N,H,K), k, v (B,N,G,K)) ->
    (B,N,H,K)`` over ``block``-token blocks (N a multiple of it), the blocks above the diagonal
    never visited; one block's float32 accumulators at a time."""

    class split:  # (B, N, ...) read a block at a time in place: x[i] is block i (B, block, ...)
        def __init__(self, x):
            self.x, self.shape = x, (x.shape[1] // block, x.shape[0], block, *x.shape[2:])

        def __getitem__(self, i):
            return jax.lax.dynamic_slice_in_dim(self.x, i * block, block, axis=1)

        def astype(self, dtype):
            return self.x.astype(dtype)

    def join(x):  # (nb, B, block, ...) -> (B, N, ...)
        x = jnp.moveaxis(x, 0, 1)
        return x.reshape(x.shape[0], -1, *x.shape[3:])

    def scores(qi, kj, i, j):
        s = jnp.einsum("bqgrd,bkgd->bgrqk", qi, kj, preferred_element_type=F32) / math.sqrt(qi.shape[-1])
        rows, cols = i * block + jnp.arange(block), j * block + jnp.arange(block)
        return jnp.where(rows[:, None] >= cols[None, :], s, -jnp.inf)

    def grouped(q, k):
        b, n, h, d = q.shape
        return q.reshape(b, n, k.shape[2], h // k.shape[2], d)

    def forward(q, k, v):
        qs, ks, vs = split(grouped(q, k)), split(k), split(v)
        nb, b, _, g, r, d = qs.shape

        def query_block(i, qi):
            def key_block(j, carry):
                def update(carry):
                    m, total, acc = carry
                    s = scores(qi, ks[j], i, j)
                    m_new = jnp.maximum(m, s.max(-1))
                    p, c = jnp.exp(s - m_new[..., None]), jnp.exp(m - m_new)
                    acc = acc * c[..., None] + jnp.einsum("bgrqk,bkgd->bgrqd", p.astype(v.dtype), vs[j],
                                                          preferred_element_type=F32)
                    return m_new, total * c + p.sum(-1), acc

                return update(carry)

            shape = (b, g, r, block)
            m, total, acc = jax.lax.fori_loop(0, i + 1, key_block, (
                jnp.full(shape, -jnp.inf, F32), jnp.zeros(shape, F32), jnp.zeros((*shape, d), F32)))
            return jnp.einsum("bgrqd->bqgrd", acc / total[..., None]).astype(q.dtype), m + jnp.log(total)

        out, lse = jax.lax.map(lambda i: query_block(i, qs[i]), jnp.arange(nb))
        return join(out).reshape(q.shape), lse  # lse: (nb, B, G, R, block)

    @jax.custom_vjp
    def attention(q, k, v):
        return forward(q, k, v)[0]

    def fwd(q, k, v):
        out, lse = forward(q, k, v)
        return out, (q, k, v, out, lse)

    def bwd(res, dout):
        q, k, v, out, lse = res
        qs, ks, vs, dos = split(grouped(q, k)), split(k), split(v), split(grouped(dout, k))
        delta = jnp.einsum("bngrd,bngrd->bgrn", dos.astype(F32), grouped(out, k).astype(F32))
        nb, b, _, g, r, d = qs.shape

        def ds_of(i, j):
            p = jnp.exp(scores(qs[i], ks[j], i, j) - lse[i][..., None])
            dp = jnp.einsum("bqgrd,bkgd->bgrqk", dos[i], vs[j], preferred_element_type=F32)
            delta_i = jax.lax.dynamic_slice_in_dim(delta, i * block, block, axis=3)
            return p, (p * (dp - delta_i[..., None]) / math.sqrt(d)).astype(q.dtype)

        def dkv_block(j):  # one key block's dk and dv over the query blocks at or below it
            def body(i, carry):
                def update(carry):
                    p, ds = ds_of(i, j)
                    dk, dv = carry
                    return (dk + jnp.einsum("bgrqk,bqgrd->bkgd", ds, qs[i], preferred_element_type=F32),
                            dv + jnp.einsum("bgrqk,bqgrd->bkgd", p.astype(v.dtype), dos[i],
                                            preferred_element_type=F32))

                return update(carry)

            zero = jnp.zeros((b, block, g, d), F32)
            dk, dv = jax.lax.fori_loop(j, nb, body, (zero, zero))
            return dk.astype(k.dtype), dv.astype(v.dtype)

        def dq_block(i):  # one query block's dq over the key blocks at or before it
            def body(j, dq):
                def update(dq):
                    return dq + jnp.einsum("bgrqk,bkgd->bqgrd", ds_of(i, j)[1], ks[j],
                                           preferred_element_type=F32)

                return update(dq)

            return jax.lax.fori_loop(0, i + 1, body, jnp.zeros((b, block, g, r, d), F32)).astype(q.dtype)

        dk, dv = jax.lax.map(dkv_block, jnp.arange(nb))
        dq = jax.lax.map(dq_block, jnp.arange(nb))
        return join(dq).reshape(q.shape), join(dk), join(dv)

    attention.defvjp(fwd, bwd)
    return attention


def plain_peak(config: RunConfig, kernel=None) -> int:
    """The peak of a plain training step of ``config`` with the twin's attention (or ``kernel``):
    the lab's blocks, each under ``jax.checkpoint(nothing_saveable)`` in a ``lax.scan`` with its
    parameters gathered (as fsdp gathers them for use) and the batch over fsdp; ``optax.adamw``
    with float32 moments; parameters and state donated, laid out by the lab's rules."""
    from remat_lab.model.llm import chunked_next_token_loss
    from remat_lab.model.models import build_model, llm_options
    from remat_lab.program.mesh import param_specs
    from remat_lab.program.targets import target_devices

    dtypes = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
    mesh = jax.sharding.Mesh(target_devices(config.target, config.target_devices), ("fsdp",))
    model = nnx.eval_shape(lambda: build_model("llm", config.width, config.depth, seed=0,
                                               dtype=dtypes[config.dtype], stack="scan",
                                               heads=config.heads, **llm_options(config, dtypes)))
    graphdef, state = nnx.split(model)
    leaves, treedef = jax.tree.flatten(state)
    shardings = [NamedSharding(mesh, s) for s in param_specs(state, config)]
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = lambda a: jax.lax.with_sharding_constraint(
        a, NamedSharding(mesh, PartitionSpec("fsdp", *(None,) * (a.ndim - 1))))
    attention = kernel or flash2(config.attention_block)  # partitioned by XLA over the batch, as the lab's

    def loss(flat, tokens):
        llm = nnx.merge(graphdef, jax.tree.unflatten(treedef, flat))
        llm.layers.blocks.attention = attention
        block_def, stacked = nnx.split(llm.layers.blocks)

        def block(st, h):
            st = jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, replicated), st)
            return rows(nnx.merge(block_def, st)(rows(h)))

        remat = jax.checkpoint(block, policy=jax.checkpoint_policies.nothing_saveable)
        h, _ = jax.lax.scan(lambda h, st: (remat(st, h), None), llm.embed(tokens), stacked)
        return chunked_next_token_loss(lambda c: rows(llm.head(c)), h, tokens, config.loss_chunks)

    tx = optax.adamw(1e-3, weight_decay=0.1, mu_dtype=F32)

    def train(flat, opt_state, tokens):
        value, grads = jax.value_and_grad(loss)(flat, tokens)
        updates, opt_state = tx.update(grads, opt_state, flat)
        return value, optax.apply_updates(flat, updates), opt_state

    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(leaves, shardings)]
    opt_shardings = (optax.ScaleByAdamState(count=replicated, mu=shardings, nu=shardings),
                     optax.EmptyState(), optax.EmptyState())
    opt_abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                jax.eval_shape(tx.init, abstract), opt_shardings)
    tokens = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32,
                                  sharding=NamedSharding(mesh, PartitionSpec("fsdp", None)))
    step = jax.jit(train, donate_argnums=(0, 1), out_shardings=(replicated, shardings, opt_shardings))
    ma = step.lower(abstract, opt_abstract, tokens).compile().memory_analysis()
    return (ma.argument_size_in_bytes + ma.output_size_in_bytes - ma.alias_size_in_bytes
            + ma.temp_size_in_bytes)


def lab_peak(config: RunConfig) -> int:
    from remat_lab.studies.advisor.search import probe

    return probe(config)["peak_bytes"]


def test_the_twins_kernel_is_attention():
    """The twin computes causal grouped-query attention and its gradient (float32, against the
    whole-square softmax written out)."""
    key = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(key[0], (2, 64, 4, 16))
    k, v = (jax.random.normal(key[i], (2, 64, 2, 16)) for i in (1, 2))
    dout = jax.random.normal(key[3], q.shape)

    def whole(q, k, v):
        kk, vv = (jnp.repeat(x, 2, axis=2) for x in (k, v))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, kk) / 4.0
        s = jnp.where(jnp.tril(jnp.ones((64, 64), bool)), s, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), vv)

    twin = flash2(16)
    assert jnp.allclose(twin(q, k, v), whole(q, k, v), atol=1e-5)
    got = jax.vjp(twin, q, k, v)[1](dout)
    want = jax.vjp(whole, q, k, v)[1](dout)
    for a, b in zip(got, want):
        assert jnp.allclose(a, b, atol=1e-4), float(jnp.max(jnp.abs(a - b)))


def _three(config: RunConfig) -> dict:
    from remat_lab.model.attention import chunked_attention

    labs_kernel = lambda q, k, v: chunked_attention(q, k, v, config.attention_block)
    return {"lab": lab_peak(config), "plain": plain_peak(config),
            "plain_with_labs_kernel": plain_peak(config, labs_kernel)}


def test_the_llm_program_holds_what_a_flash2_twin_holds():
    peaks = _three(SMALL)
    plain = peaks["plain"]
    assert abs(peaks["plain_with_labs_kernel"] - plain) <= KERNEL_GAP * plain, peaks
    assert peaks["lab"] <= (1 + TOLERANCE) * plain, peaks


if __name__ == "__main__":
    peaks = _three(RECIPE)
    print("scaled recipe, 8 x H100, bytes a device: " + ", ".join(f"{k} {v:,}" for k, v in peaks.items())
          + f"; lab / plain {peaks['lab'] / peaks['plain']:.4f}")

"""A decoder language model: token embedding, decoder blocks (GQA, rotary), final norm, vocabulary loss.

``LLM`` is Llama-shaped: ``embed`` (``vocab x width``), ``depth`` ``DecoderBlock``s in a stack
(``stacks.py``: scan or loop, each block through the step's ``block_fn``, i.e. ``nnx.remat`` with the
policy), a final RMSNorm and the vocabulary projection (``lm_head``, or the embedding's transpose
when ``tie_embeddings``). A block is the transformer block of ``models.py`` extended: grouped-query
attention (``kv_heads`` key/value heads, each shared by ``heads // kv_heads`` query heads), head size
``head_dim`` (which need not be ``width // heads``), rotary position embedding on queries and keys
(base ``ROPE_THETA``, halves rotated as in Llama/MaxText), a gated SiLU MLP of hidden size
``mlp_dim`` (given ``moe``, a mixture of experts instead: ``moe.py``); no biases. Checkpoint names
are MaxText's (``query_proj``, ``key_proj``,
``value_proj`` after the rotation, ``context``, ``out_proj``, ``mlpwi_0``, ``mlpwi_1``, ``mlpwo``,
and ``decoder_layer_input``, the block's input, named first thing inside the block as MaxText's
decoders name it: under ``full`` it is the remat's input, saved anyway; a ``custom`` policy may save,
offload or recompute it like any name, and offloading it moves each layer's input to host memory)
plus ``embed`` and ``logits`` outside the blocks (no per-block policy reaches them).

**Logits.** ``next_token_loss`` is MaxText's loss with ``num_vocab_tiling`` 1: the full
``(batch, seq, vocab)`` logits in the compute dtype (one matrix product; nothing tiled over the
vocabulary), cast to float32 (MaxText's ``cast_logits_to_fp32``), the labels one-hot, and
``cross_entropy_with_logits`` (MaxText's and T5X's, with its custom gradient
``softmax - one_hot``); each position weighted (MaxText's ``targets_segmentation != 0``), the sum
divided by the weights' sum. XLA fuses the float32 work into its neighbours: the step holds the
logits in the dtype and nothing else of their size (checked against MaxText 0.2.5's own compile
of ``llama3-8b-8192`` on v6e-256, docs/published.md).
``chunked_next_token_loss`` (``loss_chunks`` > 1; MaxText's vocabulary tiling is the same idea)
computes the same sum over slices of the sequence, each slice's final norm, projection and loss
under ``jax.checkpoint`` in a ``lax.scan``, so only one slice's logits are live (the ``logits``
name tags each slice's). Labels are the inputs shifted by one (``labels[:, t] = tokens[:, t + 1]``);
the last position has no label and weight 0; the loss is the mean over the ``batch * (seq - 1)``
labelled positions. Attention is ``attention.py``'s kernel the caller passes (``full`` by default:
scores softmaxed in float32, the probabilities cast back to the dtype; ``chunked``, or a target's
fused ``flash``), always tagged ``context``.

Initialisation: embedding and ``lm_head``
normal(0.02) (Hugging Face's ``initializer_range``), so the loss at init is close to ``ln(vocab)``;
projections flax's default (lecun normal); norm scales 1.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from remat_lab.model.attention import FULL, AttentionFn
from remat_lab.model.moe import ExpertLayout, MoeMlp
from remat_lab.model.stacks import blocks_of, build_stack, run_stack

BlockFn = Callable[[nnx.Module, jax.Array], jax.Array]

ROPE_THETA = 10000.0  # the rotary base frequency (shapes, memory and FLOPs do not depend on it)
EMBED_INIT_STD = 0.02


def rotary(x: jax.Array, theta: float = ROPE_THETA) -> jax.Array:
    """Rotate ``x: (B, N, H, K)`` by position (axis 1): pairs ``(i, i + K/2)``, angles in float32."""
    n, k = x.shape[1], x.shape[-1]
    inv_freq = theta ** (-jnp.arange(0, k, 2, dtype=jnp.float32) / k)  # (K/2,)
    angles = jnp.arange(n, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # (N, K/2)
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class DecoderBlock(nnx.Module):
    """A pre-norm decoder block on ``x: (B, N, width)``: ``x + attn(norm(x))``, then ``+ mlp(norm(.))``."""

    def __init__(self, width: int, *, heads: int, kv_heads: int, head_dim: int, mlp_dim: int,
                 rngs: nnx.Rngs, dtype=jnp.float32, param_dtype=jnp.float32, moe: tuple = ()):
        kw = dict(use_bias=False, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        norm = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.attn_norm = nnx.RMSNorm(width, **norm)
        self.q_proj = nnx.LinearGeneral(width, (heads, head_dim), **kw)
        self.k_proj = nnx.LinearGeneral(width, (kv_heads, head_dim), **kw)
        self.v_proj = nnx.LinearGeneral(width, (kv_heads, head_dim), **kw)
        self.o_proj = nnx.LinearGeneral((heads, head_dim), width, axis=(-2, -1), **kw)
        self.mlp_norm = nnx.RMSNorm(width, **norm)
        if moe:  # a mixture of experts (moe.py) in place of the gated MLP
            self.moe = MoeMlp(width, **dict(moe), rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        else:
            self.moe = None
            self.wi_0 = nnx.Linear(width, mlp_dim, **kw)
            self.wi_1 = nnx.Linear(width, mlp_dim, **kw)
            self.wo = nnx.Linear(mlp_dim, width, **kw)
        self.attention: AttentionFn = FULL  # the kernel (attention.py); LLM.__call__ may set another

    def __call__(self, x: jax.Array) -> jax.Array:
        x = checkpoint_name(x, "decoder_layer_input")
        with jax.named_scope("attn_norm"):
            h = self.attn_norm(x)
        with jax.named_scope("q_proj"):
            q = checkpoint_name(rotary(self.q_proj(h)), "query_proj")  # (B, N, H, K)
        with jax.named_scope("k_proj"):
            k = checkpoint_name(rotary(self.k_proj(h)), "key_proj")  # (B, N, G, K)
        with jax.named_scope("v_proj"):
            v = checkpoint_name(self.v_proj(h), "value_proj")
        with jax.named_scope("attn"):
            context = checkpoint_name(self.attention(q, k, v), "context")
        with jax.named_scope("o_proj"):
            x = x + checkpoint_name(self.o_proj(context), "out_proj")
        with jax.named_scope("mlp_norm"):
            h = self.mlp_norm(x)
        if self.moe is not None:
            with jax.named_scope("moe"):
                return x + self.moe(h)
        with jax.named_scope("wi_0"):
            gate = checkpoint_name(self.wi_0(h), "mlpwi_0")
        with jax.named_scope("wi_1"):
            up = checkpoint_name(self.wi_1(h), "mlpwi_1")
        with jax.named_scope("wo"):
            return x + checkpoint_name(self.wo(jax.nn.silu(gate) * up), "mlpwo")


class LLM(nnx.Module):
    """Embedding, a stack of ``DecoderBlock``s, final RMSNorm, vocabulary projection (tied or not)."""

    def __init__(self, *, vocab: int, width: int, depth: int, heads: int, kv_heads: int,
                 head_dim: int, mlp_dim: int, tie_embeddings: bool, stack: str, rngs: nnx.Rngs,
                 dtype=jnp.float32, param_dtype=jnp.float32, moe: tuple = ()):
        init = nnx.initializers.normal(EMBED_INIT_STD)
        self.embed = nnx.Embed(vocab, width, dtype=dtype, param_dtype=param_dtype,
                               embedding_init=init, rngs=rngs)

        def make(r: nnx.Rngs) -> nnx.Module:
            return DecoderBlock(width, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                mlp_dim=mlp_dim, rngs=r, dtype=dtype, param_dtype=param_dtype, moe=moe)

        self.layers = build_stack(make, depth, stack, rngs=rngs)
        self.final_norm = nnx.RMSNorm(width, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
        self.lm_head = None if tie_embeddings else nnx.Linear(
            width, vocab, use_bias=False, kernel_init=init, rngs=rngs, dtype=dtype,
            param_dtype=param_dtype)

    def hidden(self, tokens: jax.Array, block_fn: BlockFn | None = None,
               attention: AttentionFn | None = None,
               expert_layout: ExpertLayout | None = None) -> jax.Array:
        """The last block's output ``(B, N, width)``; each block through ``block_fn``, its
        attention ``attention`` (a kernel of ``attention.py``; default full), a mixture of
        experts' dispatched values laid out by ``expert_layout`` (a mesh's expert axis)."""
        for block in blocks_of(self.layers):
            if attention is not None:
                block.attention = attention
            if expert_layout is not None and block.moe is not None:
                block.moe.layout = expert_layout
        with jax.named_scope("embed"):
            h = checkpoint_name(self.embed(tokens), "embed")
        return run_stack(self.layers, block_fn or (lambda block, y: block(y)), h)

    def head(self, h: jax.Array) -> jax.Array:
        """The final norm and the vocabulary projection: logits ``(..., vocab)`` in the dtype."""
        with jax.named_scope("final_norm"):
            h = self.final_norm(h)
        with jax.named_scope("logits"):
            logits = self.embed.attend(h) if self.lm_head is None else self.lm_head(h)
            return checkpoint_name(logits, "logits")

    def __call__(self, tokens: jax.Array, block_fn: BlockFn | None = None,
                 attention: AttentionFn | None = None,
                 expert_layout: ExpertLayout | None = None) -> jax.Array:
        """The logits ``(B, N, vocab)`` in the compute dtype (``hidden``, then ``head``)."""
        return self.head(self.hidden(tokens, block_fn, attention, expert_layout))


@jax.custom_vjp
def cross_entropy_with_logits(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """``-sum(targets * log_softmax(logits), -1)``: MaxText's ``max_utils.cross_entropy_with_logits``
    (T5X's) without its z-loss, with its custom gradient ``softmax(logits) - targets``. ``logits``
    and ``targets`` (one-hot) ``(..., V)``; the result ``(...)``."""
    lse = jax.scipy.special.logsumexp(logits, axis=-1, keepdims=True)
    return -jnp.sum(targets * (logits - lse), axis=-1)


def _cross_entropy_fwd(logits: jax.Array, targets: jax.Array):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp_shifted = jnp.exp(shifted)
    sum_exp = jnp.sum(exp_shifted, axis=-1, keepdims=True)
    loss = -jnp.sum(targets * (shifted - jnp.log(sum_exp)), axis=-1)
    return loss, (logits, targets, exp_shifted, sum_exp)


def _cross_entropy_bwd(res, g: jax.Array):
    logits, targets, exp_shifted, sum_exp = res
    g_logits = g[..., None] * (exp_shifted / sum_exp - targets)
    return jnp.asarray(g_logits, logits.dtype), None


cross_entropy_with_logits.defvjp(_cross_entropy_fwd, _cross_entropy_bwd)


IGNORE = -1  # the label of a position with no next token: one-hot all zeros, weight 0


def _labels(tokens: jax.Array, fill: int = 0) -> jax.Array:
    """``tokens`` shifted left by one (``labels[:, t] = tokens[:, t + 1]``), the last position
    ``fill``."""
    return jnp.concatenate([tokens[:, 1:], jnp.full_like(tokens[:, :1], fill)], axis=1)


def _token_losses(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Each position's float32 cross-entropy, as MaxText's train step takes it (``num_vocab_tiling``
    1): the logits cast to float32 (``cast_logits_to_fp32``), the labels one-hot (``IGNORE``: all
    zeros), then ``cross_entropy_with_logits``."""
    one_hot = jax.nn.one_hot(labels, logits.shape[-1], dtype=jnp.float32)
    return cross_entropy_with_logits(logits.astype(jnp.float32), one_hot)


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy of ``logits: (B, N, V)`` against ``tokens`` shifted by one, in
    float32, as MaxText's loss: each position's ``_token_losses`` times its weight (1 where a
    label is, 0 at the last position, whose label is ``IGNORE``: MaxText's
    ``targets_segmentation != 0``), summed, divided by the weights' sum (``batch * (seq - 1)``).
    The weights come from the labels, as MaxText's from its data, not from a constant: XLA then
    fuses the gradient of the float32 cross-entropy into the vocabulary projection's two backward
    matrix products, so no ``(B, N, V)`` gradient is ever materialised, as in MaxText's compiled
    step (with constant weights it writes one, a second logits-sized buffer in the dtype)."""
    labels = _labels(tokens, IGNORE)
    with jax.named_scope("loss"):
        weights = (labels != IGNORE).astype(jnp.float32)
        ce = _token_losses(logits, labels) * weights
        return jnp.sum(ce) / jnp.sum(weights)


def chunked_next_token_loss(head: Callable[[jax.Array], jax.Array], h: jax.Array, tokens: jax.Array,
                            chunks: int) -> jax.Array:
    """``next_token_loss(head(h), tokens)`` over ``chunks`` slices of the sequence: a ``lax.scan``
    whose body (under ``jax.checkpoint``) makes one slice's logits ``(B, ceil(N / chunks), V)``,
    takes its float32 cross-entropy and adds it up, so the whole logits are never live (the
    backward pass makes each slice's again). ``h: (B, N, width)`` before the final norm; a
    sequence that ``chunks`` does not divide is padded at the end with weight 0; ``chunks`` above
    ``N`` is ``N`` chunks of one token."""
    b, n, width = h.shape
    chunks = min(chunks, n)
    size = -(-n // chunks)
    pad = size * chunks - n
    labels = _labels(tokens)
    weights = (jnp.arange(n + pad) < n - 1).astype(jnp.float32).reshape(chunks, size)

    def split(x: jax.Array) -> jax.Array:  # (B, N, ...) -> (chunks, B, size, ...), zeros appended
        if pad:  # a concatenation, not jnp.pad: its linearization keeps no padding-value residual
            x = jnp.concatenate([x, jnp.zeros((b, pad, *x.shape[2:]), x.dtype)], axis=1)
        return jnp.swapaxes(x.reshape(b, chunks, size, *x.shape[2:]), 0, 1)

    @jax.checkpoint
    def piece(h_c: jax.Array, labels_c: jax.Array, weights_c: jax.Array) -> jax.Array:
        logits = head(h_c)
        with jax.named_scope("loss"):
            return jnp.sum(_token_losses(logits, labels_c) * weights_c)

    def body(total: jax.Array, xs) -> tuple[jax.Array, None]:
        return total + piece(*xs), None

    with jax.named_scope("loss_chunks"):
        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (split(h), split(labels), weights))
    return total / (b * (n - 1))

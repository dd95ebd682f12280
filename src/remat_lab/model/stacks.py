"""Stacks of blocks: an unrolled Python loop, or a scan over layers stacked on a leading axis.

``loop`` is what a first draft writes: ``depth`` separate blocks called one after another, which
XLA sees as one long unrolled program. ``scan`` is how production JAX code is written (Flax's
scan-over-layers idiom, MaxText's ``scan_layers``): the blocks are created with ``nnx.vmap`` so
every parameter has a leading layer axis, and ``nnx.scan`` runs one block body ``depth`` times.
On XLA CPU the difference decides whether a remat policy changes memory at all (see the Guide).
Scopes name the operations: ``block{i}`` around each looped block, ``layers`` around the scanned
body, so the jaxprs and the HLO say where an operation came from.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import nnx

from remat_lab.config.catalog import STACKS  # noqa: F401

Block = nnx.Module
BlockFn = Callable[[nnx.Module, jax.Array], jax.Array]


class LoopStack(nnx.Module):
    """``depth`` blocks, each with its own parameters, called in a Python loop (unrolled)."""

    def __init__(self, make_block: Callable[[nnx.Rngs], Block], depth: int, *, rngs: nnx.Rngs):
        self.blocks = nnx.List([make_block(rngs) for _ in range(depth)])


class ScanStack(nnx.Module):
    """``depth`` blocks with parameters stacked on a leading layer axis, run by ``nnx.scan``."""

    def __init__(self, make_block: Callable[[nnx.Rngs], Block], depth: int, *, rngs: nnx.Rngs):
        @nnx.split_rngs(splits=depth)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def create(rngs: nnx.Rngs) -> Block:
            return make_block(rngs)

        self.blocks = create(rngs)


def build_stack(make_block: Callable[[nnx.Rngs], Block], depth: int, stack: str, *,
                rngs: nnx.Rngs) -> nnx.Module:
    """The bare block when ``depth`` is 1 (no stack), else a ``LoopStack`` or a ``ScanStack``."""
    if depth == 1:
        return make_block(rngs)
    if stack == "scan":
        return ScanStack(make_block, depth, rngs=rngs)
    return LoopStack(make_block, depth, rngs=rngs)


def run_stack(model: nnx.Module, block_fn: BlockFn, x: jax.Array) -> jax.Array:
    """Apply every block of ``model`` to ``x`` in order, each through ``block_fn(block, x)``.

    ``block_fn`` is where the remat policy goes (``nnx.remat(call, policy=...)``): inside the scanned
    body for a ``ScanStack``, around each block for a ``LoopStack``.
    """
    if isinstance(model, ScanStack):
        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def body(x: jax.Array, block: Block) -> jax.Array:
            with jax.named_scope("layers"):
                return block_fn(block, x)

        return body(x, model.blocks)
    blocks = list(model.blocks) if isinstance(model, LoopStack) else [model]
    for i, block in enumerate(blocks):
        with jax.named_scope(f"block{i}"):
            x = block_fn(block, x)
    return x


def blocks_of(model: nnx.Module) -> list[nnx.Module]:
    """The blocks of a loop stack (or the bare block), in order; a scan stack is one stacked block."""
    if isinstance(model, LoopStack):
        return list(model.blocks)
    if isinstance(model, ScanStack):
        return [model.blocks]
    return [model]

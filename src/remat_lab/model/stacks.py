"""Stacks of blocks: an unrolled Python loop, or a scan over layers stacked on a leading axis.

``loop`` is what a first draft writes: ``depth`` separate blocks called one after another, which
XLA sees as one long unrolled program. ``scan`` is how production JAX code is written (Flax's
scan-over-layers idiom, MaxText's ``scan_layers``): the blocks are created with ``nnx.vmap`` so
every parameter has a leading layer axis, and ``nnx.scan`` runs one block body ``depth`` times.
On XLA CPU the difference decides whether a remat policy changes memory at all (see the Guide).
Scopes name the operations: ``block{i}`` around each looped block, ``layers`` around the scanned
body, so the jaxprs and the HLO say where an operation came from. ``Partial``: only the first
``layers`` blocks remat'd, the rest saved whole (Megatron's ``recompute_num_layers``): two scans
over the two slices of the stacked layers, or the loop's blocks called two ways.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Partial:
    """A block function that remats only the first ``layers`` blocks of a stack (``remat``) and
    calls the rest directly (``plain``: every value they make saved whole). Called as a block
    function it is ``remat`` (a bare block, depth 1)."""

    remat: BlockFn
    plain: BlockFn
    layers: int

    def __call__(self, block: nnx.Module, x: jax.Array) -> jax.Array:
        return self.remat(block, x)


def _scan(blocks: Block, block_fn: BlockFn, x: jax.Array) -> jax.Array:
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def body(x: jax.Array, block: Block) -> jax.Array:
        with jax.named_scope("layers"):
            return block_fn(block, x)

    return body(x, blocks)


def _sliced(blocks: Block, lo: int, hi: int) -> Block:
    """Layers ``lo:hi`` of a scan stack's stacked blocks (each leaf sliced on its layer axis)."""
    graphdef, state = nnx.split(blocks)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a[lo:hi], state))


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
    body for a ``ScanStack``, around each block for a ``LoopStack``. A ``Partial`` remats the first
    ``layers`` blocks and calls the rest plainly (a scan stack: one scan over each slice).
    """
    if isinstance(model, ScanStack):
        depth = jax.tree.leaves(nnx.state(model.blocks))[0].shape[0]
        if not isinstance(block_fn, Partial) or block_fn.layers >= depth:
            return _scan(model.blocks, block_fn, x)
        if block_fn.layers:
            x = _scan(_sliced(model.blocks, 0, block_fn.layers), block_fn.remat, x)
        return _scan(_sliced(model.blocks, block_fn.layers, depth), block_fn.plain, x)
    blocks = list(model.blocks) if isinstance(model, LoopStack) else [model]
    for i, block in enumerate(blocks):
        with jax.named_scope(f"block{i}"):
            fn = block_fn
            if isinstance(block_fn, Partial):
                fn = block_fn.remat if i < block_fn.layers else block_fn.plain
            x = fn(block, x)
    return x


def blocks_of(model: nnx.Module) -> list[nnx.Module]:
    """The blocks of a loop stack (or the bare block), in order; a scan stack is one stacked block."""
    if isinstance(model, LoopStack):
        return list(model.blocks)
    if isinstance(model, ScanStack):
        return [model.blocks]
    return [model]

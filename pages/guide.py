"""Guide: what the app measures and how to read it."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

import streamlit as st  # noqa: E402

from pages import _shared  # noqa: E402

_shared.page_start("Guide", "How to read Remat Lab.")

st.markdown(r"""
### What a checkpoint policy controls
Reverse-mode autodiff runs the forward pass, keeps some intermediate values (the **residuals**)
and uses them in the backward pass. `nnx.remat` (`jax.checkpoint`) wraps a block so that autodiff
asks a **policy** about every value the block computes: *save it* (keep it in memory until the
backward pass), *offload it* (keep it in another memory space, e.g. host memory) or *recompute it*
(run that part of the forward pass again inside the backward pass). The policy trades memory for
compute; it never changes the math, so the gradients must match the no-remat baseline.

### The batch-dims rule
`dots_with_no_batch_dims_saveable` lets a `dot_general` result be saved only when the product has
**no batch dimensions**, i.e. no axis that appears on both operands and is paired rather than
contracted. What counts is the `dot_general`'s dimension numbers, not whether your data has a batch:

| product | batch dims? | saveable under the rule? |
|---|---|---|
| `(D,) @ (D,F)`: one vector times a shared matrix | none | yes |
| `(B,D) @ (D,F)`: rows times a shared matrix | none; B is a free axis of the left operand | yes |
| `(B,N,D) @ (B,D,F)`: batched matmul (token mixing) | **B is paired** (both sides) | no: recomputed |

So a dense layer's product is saveable whatever the batch size, while the token-mixing products of
`seq_mixer` are not. `dots_saveable` allows all of them. *Saveable* is permission, not an order: JAX
still keeps only what the backward pass needs, which is why the per-dot table shows the verdict and
what was saved side by side.

### Why `grad` alone can make every policy compile the same at depth 1
With `jax.grad` the loss value is not an output, so the forward pass only exists to feed the
backward pass. With a single block the backward pass starts right where the forward pass ends:
*saving* a value (compute it in the forward pass and keep it) and *recomputing* it (compute it
again at the start of the backward pass) leave the same operations in the same order with nothing
in between, and XLA's dead-code and common-subexpression elimination remove the copy nobody needs.
Every policy then compiles to the same program: same dots, same memory, same time, although the
jaxprs differ. With `value_and_grad` the loss needs the whole forward pass, so a recomputation is
real extra work; with depth > 1 later blocks run between a block's forward and backward passes,
so what it saves must be held meanwhile. The per-dot table shows both the jaxpr's verdict and
whether the compiled program really recomputes (`recomputed in HLO`); the notes explain disagreements.

### Why equal forward values prove nothing
Every policy computes the same forward function, so equal losses say nothing about what was
saved. Remat Lab checks **gradients** against the no-remat baseline and reads the residuals from
the vjp jaxpr and the recomputations from the step jaxpr and the compiled HLO.

### How the memory numbers are defined
From XLA's `compiled.memory_analysis()` of the whole step:
**peak = generated_code + argument + output − alias + temp**. `alias` is output memory that
reuses an argument buffer, so it is subtracted. XLA's own `peak_memory_in_bytes` field is shown
in the JSON as `xla_peak_memory_bytes`; on CPU it leaves out temp, so the app uses the sum above.
Residual bytes are the sizes of the values the vjp keeps, arguments included.

### What CPU can and cannot show
On CPU, timing is noisy at small sizes (look at the p25–p75 spread), the memory analysis has only
the fields above and there is no separate device memory: `offload_dot_with_no_batch_dims` names
`pinned_host`, which on CPU is the same RAM, so offloading saves nothing measurable. On GPU and
TPU, offloaded residuals really move to host memory (the `host_*` fields), recomputation costs real
accelerator time, and the memory analysis reflects device HBM, which is what remat is for.
""")

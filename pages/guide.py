"""Guide: what the app measures and how to read it."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

from urllib.parse import urlencode  # noqa: E402

import streamlit as st  # noqa: E402

from pages import _llm_views, _mesh, _shared  # noqa: E402

_shared.page_start("Guide", "How to read Remat Lab.")


def _open(text: str, **config) -> str:
    """A markdown link that opens ``config`` in Explore (the app reads its settings from the URL)."""
    return f"[{text}](/?{urlencode(config)})"


STACK = dict(model="mlp", width=256, batch=128, depth=8)
st.markdown(f"""
### Five lessons, each one click away
Measured here (XLA CPU, jax 0.12.0.1); each link opens the configuration in Explore. The app opens
on the first lesson's stack (mlp 256 × 128, depth 8, scan), chosen because the policies' compiled
peaks differ there: 10.4 MiB for nothing_saveable, 11.7 MiB for no_remat, 12.4 MiB for
dots_with_no_batch_dims_saveable, one step in about 8 ms on 2 cores; Compare shows that spread.

1. **The stack decides what the policy can move.** mlp 256 × 128, depth 8: nothing_saveable needs
   2.25 MiB of temp under scan against no_remat's 3.50 MiB (0.64×), and under an unrolled loop
   0.38 against 2.25 MiB; yet under the loop every policy's live peak is the same 8.4 MiB, at the
   step's very end, where parameters and gradients dominate (see Memory over the program).
   {_open("scan, nothing_saveable", **STACK, stack="scan", policy="nothing_saveable")} ·
   {_open("loop, nothing_saveable", **STACK, stack="loop", policy="nothing_saveable")}
2. **A saveable policy can hold more than no remat.** The same stack under scan with
   dots_with_no_batch_dims_saveable needs 4.25 MiB of temp, more than no_remat's 3.50.
   {_open("scan, dots_with_no_batch_dims_saveable", **STACK, stack="scan",
          policy="dots_with_no_batch_dims_saveable")}
3. **Compare the compiled program, not the jaxpr.** The seed's case (one vector, width 128) under
   nothing_saveable: the backward jaxpr recomputes both products and, with XLA 0.12, so does the
   compiled program: 5 products against no_remat's 3, 49 % more flops (XLA 0.10's CPU compiler
   merged them away; the dissection reads what the compiler kept, whichever it is).
   {_open("seed case, nothing_saveable", model="mlp", width=128, batch=0, depth=1,
          policy="nothing_saveable")}
4. **With `grad` alone the forward pass is dead code.** mlp 256 × 64, objective grad:
   nothing_saveable compiles to no_remat's products and flops: nothing is recomputed.
   {_open("grad, nothing_saveable", model="mlp", width=256, batch=64, depth=1,
          policy="nothing_saveable", objective="grad")}
5. **The largest batch is not the fastest.** In 64 MiB the same scanned stack fits batch 3786 under
   nothing_saveable and 2271 under no_remat (the Advisor finds each by compiling only), but
   recomputing costs a third more flops: on 2 CPU cores no_remat and the savers process as many or
   more examples per second at their smaller batches. Set the budget to 64M on
   [the Advisor](/advisor?{urlencode(dict(STACK, stack="scan"))}).
""")

st.markdown(f"""
### Memory over the program
Explore's **Memory over the program** chart follows XLA's schedule of the compiled step (x: the
instruction index) and stacks the bytes live at each instruction by what they are: **parameter**
(the weights and the input), **output** (the gradients and the loss being written), **forward**
(activations the forward pass keeps for the backward pass), **recomputed** (values the backward
pass computes again under remat) and **backward** (the backward pass's temporaries). The dashed
line marks the peak; the table under it lists the buffers live there, largest first, with the
instruction that produced each and its `op_name`. Compare overlays the policies' totals (x: the
fraction of the program, so programs of different lengths line up) and says what each holds at
its peak. The live peak can sit below XLA's memory analysis: that counts allocations (a temp
block reserved for the whole program, with gaps where value lifetimes do not fit), the timeline
counts values; the caption under the chart gives both.

What to look for, on the default stack (mlp 256 × 128, depth 8):
- **Scan against loop.** Under scan the peak sits in the backward pass and its *forward* band is
  the policy's doing: nothing_saveable keeps only each layer's input (plus a little recomputed),
  no_remat keeps more. Under the unrolled loop every policy peaks at the very end, where the
  gradients and parameters dominate, and the live peak there is the same for all.
  {_open("scan, nothing_saveable", **STACK, stack="scan", policy="nothing_saveable")} ·
  {_open("loop, nothing_saveable", **STACK, stack="loop", policy="nothing_saveable")}
- **Saveable holds more.** Under scan, dots_with_no_batch_dims_saveable's forward band at the peak
  is wider than no_remat's: it keeps both products' float32 outputs for every layer.
  {_open("scan, dots_with_no_batch_dims_saveable", **STACK, stack="scan",
         policy="dots_with_no_batch_dims_saveable")}
""")

BIG = dict(model="mlp", width=1024, batch=4096, depth=8, stack="scan", dtype="bfloat16")
PEAKS = {  # MiB, measured 2026-12-04 with the Advisor's probe (see below); (local, h100, tpu-v5e)
    "no_remat": (330.1, 312.1, 236.3), "nothing_saveable": (212.1, 180.1, 109.6),
    "dots_with_no_batch_dims_saveable": (338.1, 308.1, 275.9)}
ROWS = "\n".join(f"| {p} | " + " | ".join(
    _open(f"{v:.1f} MiB" + (f" ({v / PEAKS['no_remat'][i]:.2f}×)" if p != "no_remat" else ""),
          **BIG, policy=p, **({"target": t} if t != "local" else {}))
    for i, (t, v) in enumerate(zip(("local", "h100", "tpu-v5e"), peaks))) + " |"
    for p, peaks in PEAKS.items())
st.markdown(f"""
### A sixth lesson: the same policy saves different amounts on different accelerators
The sidebar's **Target** compiles the configuration for a GPU or TPU that is not attached (nothing
runs: memory, products and the timeline are the compiled program's; the time is a roofline
**estimate**). Compiled peaks per device of a scanned mlp 1024 × 4096, depth 8, bfloat16, measured
2026-12-04 on this app's server (2 Intel Xeon cores, XLA CPU as local, jax 0.12.0.1); each cell
opens that configuration and target in Explore:

| policy | local (XLA CPU) | H100 | TPU v5e |
|---|---|---|---|
{ROWS}

nothing_saveable keeps the least everywhere, but by different amounts: 0.64× of no_remat's peak on
CPU, 0.58× on the H100 and 0.46× on the TPU v5e; and the saveable policy's rank changes: 2 % above
no_remat on CPU, 1 % below it on the H100, 17 % above it on the v5e. The CPU's figures are larger
still (it computes bf16 products in float32). [Targets](/targets?{urlencode(BIG)}) puts chosen
policies and targets side by side and says so in words when the ranking itself changes.
""")

_llm_views.guide_lesson()
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

### Why `grad` alone makes every policy compile the same products at depth 1
With `jax.grad` the loss value is not an output, so the forward pass only exists to feed the
backward pass. With a single block the backward pass starts right where the forward pass ends:
*saving* a value (compute it in the forward pass and keep it) and *recomputing* it (compute it
again at the start of the backward pass) leave the same operations in the same order with nothing
in between, and XLA's dead-code and common-subexpression elimination remove the copy nobody needs.
Every policy then compiles to the same products, although the jaxprs differ; not quite to the
same program (jax 0.12, mlp 256 × 64): everything_saveable keeps a relu's mask as booleans where
the others keep the float32 value it is compared from (48 KiB less memory), and nothing_saveable
fuses the relu's derivative differently. With `value_and_grad` the loss needs the whole forward
pass, so a recomputation is real extra work; with depth > 1 later blocks run between a block's
forward and backward passes, so what it saves must be held meanwhile. The per-dot table shows both
the jaxpr's verdict and whether the compiled program really recomputes (its `compiled` column);
the notes explain disagreements.

### How "recomputed in the compiled program" is known
Not from XLA's `op_name` metadata: XLA drops it on products it rewrites, and when common-subexpression
elimination merges two copies the survivor may carry either one's name. Remat Lab compiles the
`no_remat` step of the same configuration and objective as a second program and counts: the
policy's extra product instructions (and extra flops) are the recomputations that survived. A row
is marked only when the product's size (result elements, contracted size, batch size) tells it
apart; otherwise it says *not attributable*. Two programs equal up to names and metadata are
reported as *the same compiled program*.

### Scan against a Python loop of remat'd blocks
JAX protects a recomputation with an optimization barrier so the compiler cannot merge it with the
forward product it repeats. XLA 0.10's CPU compiler removed that barrier early and merged each
block's recomputation back into its forward product, so in an unrolled stack the policy barely
moved memory. XLA 0.12 (this app's) keeps the recomputation in both stacks: the dissection shows
16 recomputed products of 64 (scan) and of 63 (loop) for nothing_saveable at depth 8. Production
code scans over stacked layers (`jax.lax.scan`); the loop is there to compare with.

That is what the **Stack** setting shows (depth > 1). `scan` (the default) builds the blocks with
`nnx.vmap`, so every parameter has a leading layer axis, and runs them with `nnx.scan`, the remat
policy inside the scanned body; `loop` calls separate blocks in a Python loop. Measured with XLA
CPU (jax 0.12.0.1), mlp width 256, batch 128, depth 8, XLA's temp bytes:

| stack | no_remat | nothing_saveable | dots_with_no_batch_dims_saveable |
|---|---|---|---|
| loop | 2.25 MiB | 0.38 MiB | 1.38 MiB |
| scan | 3.50 MiB | 2.25 MiB (0.64×) | 4.25 MiB (more than no remat) |

Under the loop the temp bytes fall with the policy, but the step's live peak does not (8.4 MiB
for all three): it comes at the very end, where the parameters and their gradients fill memory.
Under scan a saveable policy can hold *more* than no remat. No remat keeps exactly what the
backward pass needs: each layer's input, the first relu's output and the two relu masks (booleans,
one byte per value). `dots_with_no_batch_dims_saveable` keeps both products' outputs in float32 (the
relus are then recomputed from them) and still each layer's input: more bytes per layer, times
every layer in the stacked residuals. Under scan a row of the per-dot and residual tables stands for every
layer (the `layers` column), and products are counted per execution (XLA's own flop count counts
a loop body once; the app scales it).

### Why equal forward values prove nothing
Every policy computes the same forward function, so equal losses say nothing about what was
saved. Remat Lab checks **gradients** against a second, independent implementation of the model
in plain `jax.numpy` (no NNX, no remat), with bounds from the dtype's precision tight enough that a
1 % error on one bfloat16 leaf fails, and checks that the step's jaxpr contains remat exactly when
the policy asks for it. It reads the residuals from the vjp jaxpr and the recomputations from the
step jaxpr and from the compiled program compared with the no-remat one.

### How the memory numbers are defined
From XLA's `compiled.memory_analysis()` of the whole step:
**peak = generated_code + argument + output − alias + temp**. `alias` is output memory that
reuses an argument buffer, so it is subtracted. XLA's own `peak_memory_in_bytes` field is shown
in the JSON as `xla_peak_memory_bytes`; on CPU it leaves out temp, so the app uses the sum above.
Residual bytes are the sizes of the values the vjp keeps; the headline counts the **activations**
only, with parameters, the input and broadcast zeros (which XLA folds away) shown apart.

### What CPU can and cannot show
On CPU, timing is noisy at small sizes (look at the p25–p75 spread), the memory analysis has only
the fields above and there is no host memory space: `offload_dot_with_no_batch_dims` asks for
`pinned_host`, but the compiled CPU program keeps every value in device memory, so the app reports
the offload as a no-op (`offloaded in compiled program` unticked). XLA CPU also computes bfloat16
products in float32, converting around each dot, so bf16 time and memory on CPU are not a bf16
accelerator's; the app says so where it sees it. On GPU and
TPU, offloaded residuals really move to host memory (the `host_*` fields), recomputation costs real
accelerator time, and the memory analysis reflects device HBM, which is what remat is for.
""")

st.markdown(f"""
### Device meshes
Started with several devices (GPUs, or `REMAT_LAB_HOST_DEVICES=4` for emulated CPU devices), the
sidebar gets mesh controls and Explore and Compare show per-device memory and the collectives by
phase. The rules: {_mesh.guide_text()}

Measured on 4 emulated CPU devices (mlp, scan, width 256, batch 64, depth 4): under `fsdp=4` each
device holds a quarter of the parameters; nothing_saveable and dots_saveable both gather the
weights again in the backward pass (16 recomputed all-gathers, one per parameter of each of the 4
blocks; no_remat has none),
because the input gradients need the gathered weights and a dot policy saves products, not weights;
everything_saveable gathers nothing again, at no_remat's memory. XLA CPU all-reduces gradients
(no reduce-scatter). Emulated devices share this machine's cores and have no interconnect: their
memory per device is real, their step times are not a cluster's.
""")

"""Guide: what the app measures and how to read it."""

import sys
from pathlib import Path

if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)

from urllib.parse import urlencode  # noqa: E402

import streamlit as st  # noqa: E402

from pages import _docs, _llm_views, _mesh, _shared  # noqa: E402

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

st.markdown(_docs.section("guide.md", "timeline"))
st.markdown(f"""
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
st.markdown(_docs.section("guide.md", "reading"))
st.caption("The sections above are `docs/guide.md`'s *Reading the numbers*; the whole manual is in the "
           "repository's `docs/` folder.")

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

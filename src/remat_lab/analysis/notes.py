"""The dissection's explanations: a note on each dot row and the notes on the whole program.

Plain sentences for the tables (``dissect``): why a dot the policy saves is not stored, how many
of the backward jaxpr's recomputations do not survive XLA (and why, with objective grad), offload
without host memory, bf16 products run in float32, and a name policy's names that the model lacks
or the backward pass never needs.
"""

from __future__ import annotations

from remat_lab.model.models import block_names
from remat_lab.model.policies import get_policy, policy_names


def dot_note(row: dict, cfg, compiled: dict, compared: bool, sharded: bool = False) -> str:
    """The ``note`` of one dot row: where its verdict, the jaxpr and the compiled program disagree."""
    verdict = row["policy_verdict"]
    if not get_policy(cfg.policy).remat:
        return ("no remat: autodiff keeps what the backward needs (here values derived from this "
                "dot), nothing is recomputed") if not row["saved"] else ""
    parts = []
    if row["recomputed"] and compared and sharded:
        parts.append("recomputed in the jaxpr; on a device mesh the compiled program's products are "
                     "per-device shards, so this dot cannot be matched to one by size (see the "
                     "program's total vs no_remat)")
    elif row["recomputed"] and compared and row["recomputed_in_compiled"] is False:
        parts.append("the backward jaxpr recomputes this dot, but the compiled program has no more "
                     "products of its size than no_remat's: XLA computes it once")
    elif row["recomputed"] and row["recomputed_in_compiled"] is None and compared:
        parts.append("recomputed in the jaxpr; the compiled program keeps some recomputations of "
                     "products of this size but not all, and which ones cannot be told apart")
    if verdict in ("save", "offload") and not row["saved"] and not row["recomputed"]:
        parts.append("saveable, but not stored: the backward needs only values derived from it, "
                     "which are kept instead")
    if verdict in ("save", "offload") and row["recomputed"]:
        parts.append("saveable, yet recomputed: JAX chose to recompute it")
    if verdict == "recompute" and not row["recomputed"] and not row["saved"]:
        parts.append("not needed by the backward pass: neither stored nor recomputed")
    if row["offloaded"] and not row["offloaded_in_compiled"]:
        parts.append("offloaded in the jaxpr only: the compiled program has no host memory space, "
                     "so the value stays in device memory")
    return "; ".join(parts)


def program_notes(cfg, dots: list[dict], compiled: dict, backend: str) -> list[str]:
    """Notes on the whole program: same as no_remat's, recomputations XLA merged, offload without
    host memory, bf16 products upcast."""
    notes = []
    jaxpr_rec = sum(d["layers"] for d in dots if d["recomputed"])
    excess = compiled.get("excess_dots_vs_no_remat")
    if compiled.get("identical_to") and compiled["identical_to"] != cfg.policy:  # not itself
        notes.append(f"The compiled program is the same as {compiled['identical_to']}'s (same "
                     "instructions up to names and metadata): whatever the jaxpr says, this policy "
                     "changes nothing once compiled.")
    if jaxpr_rec and excess is not None and excess < jaxpr_rec:
        unattributed = sum(d["layers"] for d in dots
                           if d["recomputed"] and d["recomputed_in_compiled"] is None)
        said = (f"The backward jaxpr recomputes {jaxpr_rec} product(s) per step; the compiled program runs "
                f"{max(excess, 0)} more product(s) than no_remat's, so "
                f"{jaxpr_rec - max(excess, 0)} recomputation(s) do not happen.")
        if unattributed:
            said += (f" {max(excess, 0)} product(s) are recomputed, not attributable to rows: "
                     f"{unattributed} candidates have the same size.")
        if cfg.objective == "grad":
            said += (" With objective grad the loss is not returned: the forward products are "
                     "dead code and the backward's recomputed copies are the only ones left.")
        notes.append(said)
    if any(d["offloaded"] for d in dots) and not compiled.get("host_memory"):
        notes.append(f"Offload is a no-op on this backend ({backend}): the jaxpr moves the saved "
                     "products to pinned host memory, but the compiled program has no host memory "
                     "space and no host transfers, so they stay in device memory. Any memory "
                     "difference from the device-saving twin (dots_with_no_batch_dims_saveable) "
                     "is not offload.")
    if compiled.get("bf16_upcast"):
        notes.append("bfloat16 on XLA CPU: every product is computed in float32 (XLA converts the "
                     "bf16 operands around each dot), so time and temp memory are not those of a "
                     "bf16 accelerator.")
    return notes


def mesh_note(cfg, compiled: dict) -> str:
    """Why a sharded program's recomputations are counted in all, not per dot."""
    excess = compiled.get("excess_dots_vs_no_remat")
    return (f"On the device mesh ({cfg.mesh}) the compiled program is one device's, its "
            "products shards of the jaxpr's: which dots it recomputes cannot be told by "
            f"size. In all it runs {excess} product(s) more than no_remat on the same mesh.")


def name_notes(cfg, residuals: list[dict]) -> list[str]:
    """Notes on a name policy's names: those this model does not have, and those it has that the
    backward pass never needs (so nothing is saved for them)."""
    saved, offloaded = policy_names(cfg)
    named = list(dict.fromkeys((*saved, *offloaded)))
    model_names = block_names(cfg)
    present = [n for n in model_names if n in named]
    notes = []
    missing = [n for n in named if n not in model_names]
    if missing:
        notes.append(f"{cfg.policy} names {', '.join(missing)}, which the {cfg.model} model does not "
                     f"have (its names: {', '.join(model_names)}); "
                     + (f"only {', '.join(present)} apply." if present else
                        "none of its names apply, so it saves nothing inside the block, like full."))
    kept = {r["name"] for r in residuals if r.get("name")}
    unused = [n for n in present if n not in kept]
    if unused:
        notes.append(f"{', '.join(unused)}: saveable by {cfg.policy}, but no residual carries it: "
                     "the backward pass does not need the value itself (a block's last projection "
                     "only feeds the residual sum, whose gradient does not depend on it).")
    return notes

"""The planner's first answer in seconds: every candidate's peak and step by hand, uncompiled.

Before any compile the search's space is priced by hand, so a user sees the likely best plans at
once and the compiled answers replace them as they land. Per device, for a decoder LM:

* **static**: the parameters, their gradients and AdamW's state on the mesh (``program/footprint``:
  abstract leaves laid out by the mesh's rules, nothing compiled);
* **saved**: every layer keeps what its plan saves on the device: its input (the remat boundary,
  unless offloaded) and each saved name, at the tokens of the device's batch row (a tensor group
  shares one: the heads and the MLP's hidden axis split over it, and the saved layer inputs; the
  width of the other names not);
* **working**: one layer's activations live while its backward runs (every name once) and the
  vocabulary projection's logits in the compute dtype, one loss chunk;
* **accumulation**: float32 gradient sums, one per parameter shard, when the step accumulates;
* **step**: MaxText's model flops, plus the forward products of the names the plan recomputes, at
  the target's measured GEMM efficiency (``step_model``): compute only, no collectives or transfers.

It is an estimate to rank by and is labelled one: the document sets it beside each compiled
candidate (``instant_error``), and no returned figure is ever its.
"""

from __future__ import annotations

from remat_lab.config import RunConfig, batch_rows, parse_mesh
from remat_lab.config.budget import llm_model_flops
from remat_lab.model.policies import get_policy
from remat_lab.program.footprint import static_bytes
from remat_lab.studies.plan.space import Family, plan_fields

BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# the names whose last axis is the heads' or the MLP's hidden one (split over a tensor group)
SPLIT = ("query_proj", "key_proj", "value_proj", "context", "mlpwi_0", "mlpwi_1")


def widths(config: RunConfig) -> dict[str, int]:
    """Each checkpoint name's features per token."""
    hd, w = config.head_dim_used, config.width
    q, kv, mlp = config.heads * hd, config.kv_heads_used * hd, config.mlp_dim_used
    return {"decoder_layer_input": w, "query_proj": q, "key_proj": kv, "value_proj": kv, "context": q,
            "out_proj": w, "mlpwi_0": mlp, "mlpwi_1": mlp, "mlpwo": w}


def kept(plan: str, names) -> tuple[set[str], set[str]]:
    """``(saved on the device, offloaded)`` of ``names``: no_remat keeps them all; otherwise the
    layer input is saved unless the plan offloads it."""
    fields = plan_fields(plan)
    if fields["policy"] == "custom":
        saves, offloads = set(fields["save_names"]), set(fields["offload_names"])
    else:
        spec = get_policy(fields["policy"])
        if not spec.remat:
            return set(names), set()
        saves, offloads = set(spec.saves), set(spec.offloads)
    if "decoder_layer_input" not in offloads:
        saves.add("decoder_layer_input")
    return (saves - offloads) & set(names), offloads & set(names)


def _forward_flops(config: RunConfig, name: str) -> float:
    """The forward flops per token that produce ``name`` (0 for the layer input)."""
    w, hd = config.width, config.head_dim_used
    per = {"query_proj": 2 * w * config.heads * hd, "key_proj": 2 * w * config.kv_heads_used * hd,
           "value_proj": 2 * w * config.kv_heads_used * hd, "out_proj": 2 * config.heads * hd * w,
           "mlpwi_0": 2 * w * config.mlp_dim_used, "mlpwi_1": 2 * w * config.mlp_dim_used,
           "mlpwo": 2 * config.mlp_dim_used * w,
           "context": 2 * config.seq * config.heads * hd}  # q k^T and p v, causal: half of 4
    return float(per.get(name, 0))


class Instant:
    """The estimate over one question's space (``search.Space``): ``row(family, b, m)``."""

    def __init__(self, space) -> None:
        self.space, self.config = space, space.config
        self.static: dict[str, dict] = {}
        self.dtype = BYTES.get(self.config.dtype, 4)
        self.widths = widths(self.config)
        rates = dict(space.target.step_model or {})
        self.rate = space.target.peak_flops.get(self.config.dtype, max(space.target.peak_flops.values())) \
            * float(rates.get("gemm_efficiency", 0.5))

    def _static(self, mesh: str) -> dict:
        if mesh not in self.static:
            self.static[mesh] = static_bytes(self.config.replace(mesh=mesh))
        return self.static[mesh]

    def row(self, fam: Family, b: int, m: int) -> dict:
        """One candidate's estimated per-device peak and step (``b`` sequences a batch row and
        microbatch, ``m`` microbatches)."""
        cfg, sizes = self.config, parse_mesh(fam.mesh)
        tensor = sizes.get("tensor", 1)
        static = self._static(fam.mesh)
        tokens = b * cfg.seq  # a batch row's tokens, which every device of its tensor group sees
        per_token = {n: w * self.dtype / (tensor if n in SPLIT else 1) for n, w in self.widths.items()}
        saves, _ = kept(fam.plan, self.widths)
        # the scan's saved layer inputs are laid out over the tensor group too
        stored = {**per_token, "decoder_layer_input": per_token["decoder_layer_input"] / tensor}
        saved = cfg.depth * tokens * sum(stored[n] for n in saves)
        working = tokens * sum(per_token.values())
        logits = tokens * cfg.vocab * self.dtype / tensor / max(cfg.loss_chunks, 1)
        acc = 2 * static["parameter_bytes"] if m > 1 else 0  # float32 sums of bf16/f32 parameter shards
        peak = static["static_bytes_per_device"] + saved + working + logits + acc
        rows = batch_rows(sizes)
        flops = llm_model_flops(cfg.replace(batch=b * rows * m)) / self.space.devices
        _, offloads = kept(fam.plan, self.widths)
        recomputed = set(self.widths) - saves - offloads - {"decoder_layer_input"}
        extra = b * rows * m * cfg.seq * cfg.depth * sum(_forward_flops(cfg, n) for n in recomputed) \
            / self.space.devices
        step = (flops + extra) / self.rate + self.space.offload_s(fam)
        tok = self.space.tokens_per_device(fam, b, m)
        return {"family": fam, "per_device_batch": b, "microbatches": m, "instant_peak_bytes": int(peak),
                "instant_fits": peak <= self.space.hbm, "instant_step_s": step,
                "instant_tokens_per_s_per_device": tok / step if step else None}


def estimate(space, most: int = 64) -> list[dict]:
    """Every candidate of ``space`` priced by hand, best first among those estimated to fit."""
    est = Instant(space)
    rows = [est.row(fam, b, m) for fam in space.families
            for b, m in space.splits(fam.mesh, most)]
    rows.sort(key=lambda r: (not r["instant_fits"], -(r["instant_tokens_per_s_per_device"] or 0),
                             r["microbatches"], r["instant_peak_bytes"]))
    return rows

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
* **gathered weights**: FSDP gathers a layer's weights for use, two layers' at a time in a scan,
  every layer's in an unrolled stack (XLA's scheduler gathers ahead), over the tensor group;
* **step**: MaxText's model flops, plus the forward products of the names the plan recomputes, at
  the target's measured GEMM efficiency (``step_model``), or the mesh's collectives if they take
  longer (``collectives_s``: FSDP's weight gathers forward, again backward, and the gradients'
  reduce-scatter; a tensor group's two all-reduces of a layer's activations each way; a mixture of
  experts' all-to-all of its routed tokens each way; across slices or hosts the gradients'
  all-reduce, at the cross-slice rate), so meshes that move different bytes read different steps.

It is an estimate to rank by and is labelled one: the document sets it beside each compiled
candidate (``instant_error``), and no returned figure is ever its. Its terms were shaped by looking
at two questions' compiled peaks (Llama 3.1 70B on 256 v6e, Llama 2 7B on 16 H100s): they are
not held-out figures.
"""

from __future__ import annotations

import itertools

from remat_lab.config import RunConfig, batch_rows, parse_mesh
from remat_lab.config.budget import llm_model_flops, llm_parameters
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
        self.host_bw = space.target.host_bandwidth_bytes_per_s
        # model flops are linear in the batch (a split's batch need not divide the question's mesh)
        self.per_sequence = llm_model_flops(self.config) / self.config.batch
        self.gathered = llm_parameters(self.config) * self.dtype  # every layer's weights, gathered

    def _static(self, mesh: str) -> dict:
        if mesh not in self.static:
            self.static[mesh] = static_bytes(self.config.replace(mesh=mesh))
        return self.static[mesh]

    def parts(self, mesh: str, b: int, m: int) -> dict:
        """What a plan's estimate adds up on ``mesh`` at ``b`` sequences a batch row and microbatch
        and ``m`` microbatches: ``base`` bytes (static, working set, logits, gradient sums), each
        name's bytes when saved (``bytes``), its forward flops when recomputed (``flops``, per
        device), and the model's flops per device (``model_flops``)."""
        cfg, sizes = self.config, parse_mesh(mesh)
        tensor = sizes.get("tensor", 1)
        static = self._static(mesh)
        tokens = b * cfg.seq  # a batch row's tokens, which every device of its tensor group sees
        per_token = {n: w * self.dtype / (tensor if n in SPLIT else 1) for n, w in self.widths.items()}
        # the scan's saved layer inputs are laid out over the tensor group too
        stored = {**per_token, "decoder_layer_input": per_token["decoder_layer_input"] / tensor}
        working = tokens * sum(per_token.values())
        logits = tokens * cfg.vocab * self.dtype / tensor / max(cfg.loss_chunks, 1)
        acc = 2 * static["parameter_bytes"] if m > 1 else 0  # float32 sums of bf16/f32 parameter shards
        # FSDP gathers each layer's weights for use: a scan holds one layer's at a time, an unrolled
        # stack lets XLA's scheduler gather them all ahead (Llama 2 7B unrolled on 16 H100s: the
        # compiled peaks sit about its 13.5 GB of bf16 weights over the saved activations)
        gathered = self.gathered / tensor * (1 if cfg.stack != "scan" else 2 / cfg.depth)
        global_tokens = b * batch_rows(sizes) * m * cfg.seq
        return {"base": static["static_bytes_per_device"] + working + logits + acc + gathered,
                "bytes": {n: cfg.depth * tokens * v for n, v in stored.items()},
                "flops": {n: global_tokens * cfg.depth * _forward_flops(cfg, n) / self.space.devices
                          for n in self.widths},
                "model_flops": self.per_sequence * global_tokens / cfg.seq / self.space.devices,
                "collectives_s": self.collectives_s(mesh, b, m)}

    def collectives_s(self, mesh: str, b: int, m: int) -> float:
        """The mesh's collectives a step, in seconds, each at its link's rate: a ring moves (n-1)/n
        of the gathered bytes per device (an all-reduce twice that)."""
        cfg, sizes, target = self.config, parse_mesh(mesh), self.space.target
        ici = target.interconnect_bytes_per_s or 0.0
        dcn = target.dcn_bytes_per_s or ici
        if not ici:
            return 0.0
        tensor, expert = sizes.get("tensor", 1), sizes.get("expert", 1)
        fsdp = sizes.get("fsdp", 1) * expert
        weights = self.gathered / tensor  # one device's tensor shard of every layer's weights, gathered
        ring = (fsdp - 1) / fsdp
        seconds = 3 * m * weights * ring / ici  # gathered forward, again backward; gradients reduce-scattered
        tokens = b * cfg.seq
        if tensor > 1:  # two all-reduces a layer forward, two backward (and the recompute's forward)
            seconds += 6 * m * cfg.depth * tokens * cfg.width * self.dtype * 2 * (tensor - 1) / tensor / ici
        if expert > 1 and cfg.experts:  # the routed tokens out and back, forward and backward
            moved = tokens * cfg.width * self.dtype * cfg.experts_per_token * (expert - 1) / expert
            seconds += 4 * m * cfg.depth * moved / ici
        replicas = sizes.get("data", 1)
        if replicas > 1:
            seconds += 2 * weights / fsdp * (replicas - 1) / replicas / dcn
        return seconds

    def price(self, parts: dict, saves: set[str], offloads: set[str], m: int) -> tuple[float, float]:
        """``(peak bytes, step seconds)`` of a plan from ``parts``: saved names on the device,
        offloaded ones moved to the host and back each step (beside the compute), the rest recomputed."""
        peak = parts["base"] + sum(parts["bytes"][n] for n in saves)
        recomputed = set(self.widths) - saves - offloads - {"decoder_layer_input"}
        compute = (parts["model_flops"] + sum(parts["flops"][n] for n in recomputed)) / self.rate
        host = 2 * m * sum(parts["bytes"][n] for n in offloads) / self.host_bw if self.host_bw else 0.0
        return peak, max(compute, host, parts["collectives_s"])

    def row(self, fam: Family, b: int, m: int) -> dict:
        """One candidate's estimated per-device peak and step (``b`` sequences a batch row and
        microbatch, ``m`` microbatches)."""
        saves, offloads = kept(fam.plan, self.widths)
        parts = self.parts(fam.mesh, b, m)
        peak, step = self.price(parts, saves, offloads, m)
        step += self.space.offload_s(fam)
        tok = self.space.tokens_per_device(fam, b, m)
        return {"family": fam, "per_device_batch": b, "microbatches": m, "instant_peak_bytes": int(peak),
                "instant_collectives_s": parts["collectives_s"],
                "instant_compute_s": self.price({**parts, "collectives_s": 0.0}, saves, offloads, m)[1],
                "instant_fits": peak <= self.space.hbm, "instant_step_s": step,
                "instant_tokens_per_s_per_device": tok / step if step else None}

    def synthesized(self, mesh: str, margin: float = 0.9) -> str | None:
        """The per-name plan this estimate ranks best on ``mesh``: every name saved, offloaded
        (where the target has host memory) or recomputed (the layer input saved or offloaded), at
        each split of the global batch, the most tokens/s whose estimated peak is within ``margin``
        of the HBM (the estimate's error), ties to the fewer names kept, one step, the larger batch; as a plan
        (``save:..|offload:..``), None when none fits. A candidate for the compiles to prove."""
        names = list(self.widths)
        choices = [("save", "offload") if n == "decoder_layer_input" else
                   ("save", "offload", "recompute") for n in names]
        if not self.host_bw:
            choices = [tuple(c for c in cs if c != "offload") for cs in choices]
        best, key = None, None
        for b, m in self.space.splits(mesh, 64):
            parts = self.parts(mesh, b, m)
            tok = self.space.tokens_per_device(Family(mesh, "full"), b, m)
            for picks in itertools.product(*choices):
                saves = {n for n, c in zip(names, picks) if c == "save"}
                offloads = {n for n, c in zip(names, picks) if c == "offload"}
                peak, step = self.price(parts, saves, offloads, m)
                if peak > margin * self.space.hbm:
                    continue
                rank = (-tok / step, len(saves) + len(offloads), m, -b)
                if key is None or rank < key:
                    key, best = rank, (saves - {"decoder_layer_input"}, offloads)
        if best is None:
            return None
        saves, offloads = ([n for n in names if n in chosen] for chosen in best)
        text = "|".join(p for p in (f"save:{','.join(saves)}" if saves else "",
                                    f"offload:{','.join(offloads)}" if offloads else "") if p)
        return text or "full"


def estimate(space, most: int = 64) -> list[dict]:
    """Every candidate of ``space`` priced by hand, best first among those estimated to fit."""
    est = getattr(space, "by_hand", None) or Instant(space)  # the one that synthesized its plans
    rows = [est.row(fam, b, m) for fam in space.families
            for b, m in space.splits(fam.mesh, most)]
    # ties (the same tokens/s: compute scales with the batch): one step first, then the larger batch
    # (with no global batch, "as large as fits"), then the smaller peak
    rows.sort(key=lambda r: (not r["instant_fits"], -(r["instant_tokens_per_s_per_device"] or 0),
                             r["microbatches"], -r["per_device_batch"], r["instant_peak_bytes"]))
    return rows

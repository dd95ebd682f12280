"""The planner's search space: meshes, remat plans and the batch splits of a global batch (no JAX)."""

from __future__ import annotations

from dataclasses import dataclass

from remat_lab.config import ConfigError, RunConfig, batch_rows, get_target, parse_mesh
from remat_lab.config.targets import GPUS_PER_HOST

# The remat plans searched by default: MaxText's named policies from the most saved to the least,
# and the per-name offload plan of MaxText's tuned v6e runs (the layer's input and q, k, v moved to
# the host: ``llama3_1-70b-8192``). Names as ``--policies`` gives them; ``offload:a,b`` a custom plan.
DEFAULT_PLANS = ("save_qkv_proj", "minimal_with_context", "full",
                 "offload:decoder_layer_input,query_proj,key_proj,value_proj")
DEFAULT_TENSOR = (1, 4)  # tensor-parallel sizes tried within a slice or host


@dataclass(frozen=True)
class Family:
    """Configurations alike but for the batch split: one mesh, one remat plan, optimizer offload."""

    mesh: str
    plan: str  # a named policy, or "offload:names" / "save:names|offload:names" (custom)
    optimizer_offload: bool = False

    def apply(self, config: RunConfig, per_device_batch: int, microbatches: int) -> RunConfig:
        """``config`` with this family's mesh, plan and offload at ``per_device_batch`` sequences
        a device (and microbatch) and ``microbatches`` steps of accumulation."""
        rows = batch_rows(parse_mesh(self.mesh))
        fields = dict(mesh=self.mesh, optimizer_offload=self.optimizer_offload,
                      batch=per_device_batch * rows * microbatches, microbatches=microbatches,
                      **plan_fields(self.plan))
        return config.replace(**fields)


def plan_fields(plan: str) -> dict:
    """A plan's RunConfig fields: ``full`` -> policy full; ``offload:a,b`` (optionally
    ``save:c|offload:a,b``) -> policy custom with those names saved / offloaded, the rest recomputed."""
    if ":" not in plan:
        return {"policy": plan, "save_names": (), "offload_names": ()}
    parts = dict(p.split(":", 1) for p in plan.split("|"))
    if set(parts) - {"save", "offload"}:
        raise ConfigError(f"plan {plan[:60]!r}: a custom plan is offload:NAMES or save:NAMES|offload:NAMES.")
    names = {k: tuple(n for n in v.split(",") if n) for k, v in parts.items()}
    return {"policy": "custom", "save_names": names.get("save", ()),
            "offload_names": names.get("offload", ())}


def plan_label(plan: str) -> str:
    """A plan in words for a table: ``offload decoder_layer_input, query_proj`` or the policy."""
    if plan == "synthesized":
        return "synthesized (each mesh's per-name plan, by the estimate by hand)"
    if ":" not in plan:
        return plan
    return "; ".join(f"{k} {v.replace(',', ', ')}" for k, v in (p.split(":", 1) for p in plan.split("|")))


def slices_of(target: str, devices: int, slices: int | None) -> int:
    """Slices (TPU) or hosts (GPU: 8 GPUs each) the devices span: given, or a GPU's hosts."""
    if slices:
        if devices % slices:
            raise ConfigError(f"{devices} devices cannot be split into {slices} slices or hosts.")
        return slices
    if get_target(target).platform != "tpu" and devices > GPUS_PER_HOST:
        if devices % GPUS_PER_HOST:
            raise ConfigError(f"{devices} GPUs are not whole hosts of {GPUS_PER_HOST}.")
        return devices // GPUS_PER_HOST
    return 1


def meshes(config: RunConfig, devices: int, slices: int, tensor: tuple[int, ...] = DEFAULT_TENSOR
           ) -> tuple[list[str], list[str]]:
    """The meshes to search over ``devices`` in ``slices``: FSDP within a slice or host (times
    ``tensor`` in each size given), and across slices or hosts data or FSDP parallelism; a mixture
    of experts also splits its experts over an ``expert`` axis. The second item: the meshes left
    out, each with why (a size that does not divide the model)."""
    per = devices // slices
    inner = []
    for t in tensor:
        if per % t:
            continue
        experts = [e for e in (1, 4, 8) if config.experts and config.experts % e == 0
                   and (per // t) % e == 0] or [1]
        for e in experts:
            axes = {"fsdp": per // t // e, "expert": e, "tensor": t}
            inner.append(",".join(f"{a}={n}" for a, n in axes.items() if n > 1) or "fsdp=1")
    outer = [""] if slices == 1 else [f"dcn_data={slices}", f"dcn_fsdp={slices}"]
    out, left = [], []
    for o in outer:
        for i in inner:
            mesh = ",".join(p for p in (o, i) if p)
            try:
                config.replace(mesh=mesh, batch=batch_rows(parse_mesh(mesh)), microbatches=1)
            except ConfigError as err:
                left.append(f"{mesh}: {err}")
                continue
            out.append(mesh)
    return out, left


def splits(sequences_per_row: int, max_microbatches: int = 64) -> list[tuple[int, int]]:
    """``(per_device_batch, microbatches)`` pairs whose product is ``sequences_per_row``: every
    divisor, largest per-device batch first, at most ``max_microbatches`` steps of accumulation."""
    return [(sequences_per_row // m, m) for m in range(1, min(sequences_per_row, max_microbatches) + 1)
            if sequences_per_row % m == 0]

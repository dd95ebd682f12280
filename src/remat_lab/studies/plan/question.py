"""One planning question's space: its meshes, sequences per batch row, families, and how a split is priced."""

from __future__ import annotations

from remat_lab.config import ConfigError, RunConfig, batch_rows, get_target, parse_mesh
from remat_lab.config.budget import optimizer_state_bytes
from remat_lab.studies.plan.space import Family, meshes, slices_of, splits

# A candidate predicted within this share of the HBM is still compiled: the model's error is a few %.
PREDICTION_SLACK = 0.05
# The plan that stands for each mesh's per-name plan synthesized by the estimate by hand.
SYNTHESIZED = "synthesized"


class Space:
    """What the search ranges over for one question: the families, each mesh's sequences per batch
    row, the HBM, and how a split's step and offload are priced."""

    def __init__(self, config: RunConfig, tokens: int | None, slices: int | None,
                 tensor: tuple[int, ...], plans: tuple[str, ...], offload: bool) -> None:
        if config.target == "local" or config.model != "llm":
            raise ConfigError("plan searches a decoder LM (--preset or --model llm) for a named "
                              "target (--target and --target-devices): it compiles, never runs.")
        self.config = config.replace(step="train", compile_only=True, microbatches=1,
                                     policy="full", save_names=(), offload_names=())
        self.target = get_target(config.target, config.network)
        self.devices = config.target_devices
        self.slices = slices_of(config.target, self.devices, slices)
        if tokens is not None and (tokens <= 0 or tokens % config.seq):
            raise ConfigError(f"the global batch of {tokens} tokens is not whole sequences of "
                              f"{config.seq}; give a multiple of {config.seq}.")
        self.sequences = None if tokens is None else tokens // config.seq
        found, self.left_out = meshes(self.config, self.devices, self.slices, tensor)
        self.rows: dict[str, int | None] = {}
        for mesh in found:
            rows = batch_rows(parse_mesh(mesh))
            if self.sequences is not None and self.sequences % rows:
                self.left_out.append(f"{mesh}: {self.sequences} sequences do not split over its "
                                     f"{rows} batch rows")
                continue
            self.rows[mesh] = None if self.sequences is None else self.sequences // rows
        if not self.rows:
            raise ConfigError("no mesh fits the question: " + "; ".join(self.left_out[:4]))
        offloads = (False, True) if offload and self.target.host_bandwidth_bytes_per_s else (False,)
        self.hbm = self.target.memory_bytes
        self.synthesized: dict[str, str | None] = {}
        self.by_hand = None  # the estimate by hand, kept when it synthesized plans (its static bytes)
        if SYNTHESIZED in plans:  # each mesh's per-name plan by the estimate by hand, to be compiled
            from remat_lab.studies.plan.instant import Instant

            self.by_hand = Instant(self)
            self.synthesized = {m: self.by_hand.synthesized(m) for m in self.rows}
        self.families = []
        for m in self.rows:
            mine = [self.synthesized.get(m) if p == SYNTHESIZED else p for p in plans]
            for p in dict.fromkeys(p for p in mine if p):
                self.families += [Family(m, p, o) for o in offloads]

    def splits(self, mesh: str, most: int | None) -> list[tuple[int, int]]:
        """A mesh's (per-device batch, microbatches): the global batch's splits, or with no global
        batch every per-device batch up to ``most`` in one step."""
        per_row = self.rows[mesh]
        if per_row is None:
            return [(b, 1) for b in range(1, max(most or 1, 1) + 1)]
        return splits(per_row)

    def state_per_device(self, family: Family) -> float:
        """AdamW's bytes on one device (its moments sharded like the parameters: over all devices
        but the data-parallel replicas)."""
        replicas = parse_mesh(family.mesh).get("data", 1)
        return optimizer_state_bytes(self.config) / (self.devices / replicas)

    def offload_s(self, family: Family) -> float:
        """Optimizer offload's transfer a step: the moments to the device and back over the host link."""
        if not family.optimizer_offload:
            return 0.0
        return 2 * self.state_per_device(family) / self.target.host_bandwidth_bytes_per_s

    def tokens_per_device(self, family: Family, b: int, m: int) -> float:
        rows = batch_rows(parse_mesh(family.mesh))
        return b * m * rows * self.config.seq / self.devices

"""The accelerators a configuration can be compiled for without the hardware: names and spec figures.

Pure data from ``targets.json`` beside this file (no JAX): memory, dense peak FLOP/s by dtype,
memory, host link, interconnect and cross-slice (data-centre network) bandwidth per device, and
where each figure comes from; a GPU's host networks (the machine's NICs decide the figure across
hosts: ``Target.on_network``, ``get_target(name, network)``).
``local`` is the attached backend, run and timed; every other target is compile-only
(``program/targets.py`` makes its devices).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .mesh_text import _show

LOCAL = "local"
MAX_TARGET_DEVICES = 512  # 2 x v6e-256 (MaxText's 405B); 512 v5p chips (v5p:8x8x8)
GPUS_PER_HOST = 8  # a GPU host (A3, DGX): its GPUs share NVLink; hosts meet over the network
# JAX preallocates this fraction of a GPU's memory for its arrays by default
# (XLA_PYTHON_CLIENT_MEM_FRACTION); the rest is the CUDA context, cuBLAS/cuDNN workspaces, NCCL.
GPU_USABLE_FRACTION = 0.75
# On a TPU JAX may use the whole HBM; the runtime keeps a little for itself (program code, infeed).
# libtpu compiles one compile-only device's program against 15.25 of a v4 TensorCore's 16 GiB
# (memory_bytes is per device: half a v4 chip), 15.75 of a v5e's 16 GiB and 31.25 of a v6e's 32
# (its "available HBM" when a compile is over; tests/test_tpu_memory.py): 95 % stays under all.
TPU_USABLE_FRACTION = 0.95


@dataclass(frozen=True)
class Target:
    """One accelerator: figures per device (``peak_flops``: dtype -> dense FLOP/s)."""

    name: str
    platform: str  # "cuda" or "tpu"
    device_kind: str
    memory_bytes: int
    peak_flops: Mapping[str, float]
    bandwidth_bytes_per_s: float
    source: str
    config_file: str | None = None  # GPU: XLA GpuTargetConfig text in program/target_specs/
    topology: str | None = None  # TPU: libtpu topology of one chip, e.g. "v5e:1x1"
    host_bandwidth_bytes_per_s: float | None = None  # host link (PCIe), one direction
    interconnect_bytes_per_s: float | None = None  # what one device sends into a ring collective
    host_link_source: str = ""
    interconnect_source: str = ""
    # what one device sends per second across slices (TPU: the data-centre network) or hosts (GPU:
    # the host's network), one direction: the host's figure over its devices
    dcn_bytes_per_s: float | None = None
    dcn_source: str = ""
    # GPU: the rates the step-time prediction prices each kernel at (``analysis/predict.py``):
    # fractions of the peak and the HBM bandwidth, measured, with their ``source``; None: none
    step_model: Mapping[str, object] | None = None
    # the host networks a GPU target can sit on (name -> (dcn_bytes_per_s, dcn_source)): the
    # machine decides the cross-host figure (A3 High's is half A3 Mega's); ``network`` names the
    # default, the one the figures above are; ``on_network`` takes another
    network: str = ""
    networks: Mapping[str, tuple[float, str]] = dataclasses.field(default_factory=dict)
    # the default price: ``usd_per_chip_hour``, ``devices_per_chip``, ``source``, ``as_of`` (a
    # figure to edit: region, commitment and discounts change it); None: no sourced default
    price: Mapping[str, object] | None = None

    def usd_per_device_hour(self) -> float | None:
        """The default price of one of this target's devices an hour (a v4 device is half a chip)."""
        if not self.price:
            return None
        return float(self.price["usd_per_chip_hour"]) / int(self.price.get("devices_per_chip", 1))

    def usable_bytes(self) -> int:
        """The memory JAX can give the program by default (the advisor's default budget), per
        device as compiled (a compile-only TPU v4 device is one TensorCore: half a chip)."""
        fraction = GPU_USABLE_FRACTION if self.platform == "cuda" else TPU_USABLE_FRACTION
        return int(self.memory_bytes * fraction)

    def on_network(self, name: str) -> Target:
        """This target on host network ``name`` (one of ``networks``; "" = the default)."""
        if not name or name == self.network:
            return self
        if name not in self.networks:
            known = ", ".join(self.networks) or "none but its default"
            raise ConfigError(f"network {_show(name)} is not one {self.name} knows; its networks: {known}.")
        dcn, source = self.networks[name]
        return dataclasses.replace(self, network=name, dcn_bytes_per_s=dcn, dcn_source=source)

    def as_dict(self) -> dict:
        """The ``target`` section of a result document."""
        return {"name": self.name, "platform": self.platform, "device_kind": self.device_kind,
                "memory_bytes": self.memory_bytes, "peak_flops": dict(self.peak_flops),
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s, "source": self.source,
                "host_bandwidth_bytes_per_s": self.host_bandwidth_bytes_per_s,
                "interconnect_bytes_per_s": self.interconnect_bytes_per_s,
                "host_link_source": self.host_link_source,
                "interconnect_source": self.interconnect_source,
                "dcn_bytes_per_s": self.dcn_bytes_per_s, "dcn_source": self.dcn_source,
                "network": self.network, "networks": list(self.networks),
                "step_model": None if self.step_model is None else dict(self.step_model),
                "price": None if self.price is None else dict(self.price), "deviceless": True}


def _load() -> dict[str, Target]:
    raw = json.loads((Path(__file__).with_name("targets.json")).read_text())
    return {t["name"]: Target(name=t["name"], platform=t["platform"], device_kind=t["device_kind"],
                              memory_bytes=int(t["memory_bytes"]),
                              peak_flops={k: float(v) for k, v in t["peak_flops"].items()},
                              bandwidth_bytes_per_s=float(t["bandwidth_bytes_per_s"]),
                              source=t["source"], config_file=t.get("config_file"),
                              topology=t.get("topology"),
                              host_bandwidth_bytes_per_s=float(t["host_bandwidth_bytes_per_s"]),
                              interconnect_bytes_per_s=float(t["interconnect_bytes_per_s"]),
                              host_link_source=t["host_link_source"],
                              interconnect_source=t["interconnect_source"],
                              dcn_bytes_per_s=float(t["dcn_bytes_per_s"]), dcn_source=t["dcn_source"],
                              step_model=t.get("step_model"), network=t.get("network", ""),
                              networks={k: (float(v["dcn_bytes_per_s"]), v["dcn_source"])
                                        for k, v in t.get("networks", {}).items()},
                              price=t.get("price"))
            for t in raw["targets"]}


TARGETS: dict[str, Target] = _load()
TARGET_NAMES = (LOCAL, *TARGETS)


def get_target(name: str, network: str = "") -> Target:
    """The named target's figures (on host network ``network``, "" its default); ``KeyError`` for
    ``local`` or an unknown name, ConfigError for a network it does not know."""
    return TARGETS[name].on_network(network)


def check_network(target: str, network: object, overlap: object = "") -> None:
    """A configuration's ``network``: "" (the target's default) or one of its named target's host
    networks; else a ConfigError that names them. Its ``collective_overlap`` too (``check_overlap``)."""
    check_overlap(target, overlap)
    if network == "":
        return
    if target == LOCAL or not isinstance(network, str):
        raise ConfigError(f"network {_show(network)}: a host network is a named target's (e.g. --target "
                          "h100 --network a3-high); the local backend's is this machine's own.")
    TARGETS[target].on_network(network)


# A TPU run's collectives that run beside its kernels, by its libtpu flags (``collective_overlap``):
# "" (the default) every one, as MaxText's tuned runs launch libtpu (continuation fusion for the
# all-gathers, data-parallel overlap or SparseCore offload for the reductions); "all-gathers" only
# those (a run that passes continuation fusion for all-gathers alone): the reductions as libtpu
# writes them; "none": every collective as written. Each value: the kinds that leave the kernels' way.
COLLECTIVE_OVERLAPS: dict[str, tuple[str, ...] | None] = {"": None, "all-gathers": ("all-gather",),
                                                          "none": ()}


def check_overlap(target: str, overlap: object) -> None:
    """A configuration's ``collective_overlap``: one of ``COLLECTIVE_OVERLAPS``, other than the
    default only for a TPU target (a GPU's collectives run as its compiled schedule lets them)."""
    if overlap == "":
        return
    if overlap not in COLLECTIVE_OVERLAPS:
        raise ConfigError(f"collective_overlap {_show(overlap)}: choose all-gathers or none (or leave "
                          "it out: every collective beside the kernels).")
    if target == LOCAL or TARGETS[target].platform != "tpu":
        raise ConfigError(f"collective_overlap {overlap}: for a TPU target (--target tpu-v6e ...); a "
                          "GPU's collectives run as its compiled schedule lets them.")

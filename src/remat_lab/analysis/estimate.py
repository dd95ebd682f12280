"""A named target's step-time estimate: the largest of its compute, memory, offload and collective times.

``estimate_s = max(compute_s, memory_s, offload_s, collectives_s)``, each from the compiled program
(``analysis/traffic.py`` reads its text) and the target's spec figures (``config/targets.json``):

* **compute**: each product's flops at the rate XLA runs it: its operand dtype and precision read
  in the HLO. A float32 product at DEFAULT precision runs as TF32 on a GPU: JAX's
  ``jax_default_matmul_precision`` defaults to None (the ops keep DEFAULT precision) and XLA's
  GPU emitters allow TF32 for an f32 dot whose precision is DEFAULT when
  ``tsl::tensor_float_32_execution_enabled()`` (OpenXLA ``IsTf32Allowed`` in
  ``xla/service/gpu/fusions/triton/triton_fusion_emitter_legacy_matmul.cc``, the Triton GEMM
  fusions a deviceless compile emits; cuBLAS's in ``xla/service/gpu/matmul_utils.cc`` computes f32
  GEMMs as ``kTF32AsF32``), which is true unless switched off (``static std::atomic<bool>
  tensor_float_32_enabled{true}`` in ``third_party/tsl/tsl/platform/tensor_float_32_utils.cc``;
  XLA has no ``xla_gpu_enable_tf32`` flag). On a TPU, DEFAULT is one bf16 pass of the MXU (the
  deviceless v5e compile's own cycle estimate is the same for an f32 DEFAULT and a bf16 product,
  4x it at HIGHEST). HIGH and HIGHEST are priced at the float32 figure (Triton runs HIGH as IEEE
  f32; cuBLAS would allow TF32 for HIGH); bf16 and f16 products at the bf16 rate. The rest of
  XLA's flop count (element-wise work; none on a deviceless GPU compile, which counts products
  only) has no sourced vector-unit figure here: it is priced at the rate of the program's largest
  product class, and said so.
* **memory**: XLA's bytes accessed (loop bodies scaled) where it has a cost analysis, else the
  bytes counted in the optimized HLO (``traffic.METHOD``), at the target's HBM bandwidth.
* **offload**: bytes to and from host memory (``S(5)``) at the target's host link bandwidth, per
  direction, both directions added (a step sends in its forward pass and fetches in its backward).
* **collectives**: ring-algorithm bytes per device (NCCL's bus-bandwidth factors, nccl-tests
  ``doc/PERFORMANCE.md``: all-reduce 2(n-1)/n of its bytes, all-gather and all-to-all (n-1)/n of
  the result, reduce-scatter (n-1)/n of its input = (n-1) x its result, collective-permute 1) at the
  target's interconnect bandwidth, n the largest replica group of each kind; what crosses slices
  (TPU) or hosts (GPU) at the slower cross-slice figure (``dcn_bytes_per_s``: the data-centre
  network or the network between GPU hosts, per device; ``traffic.HIERARCHY``: a group over S hosts
  of P devices is a ring over P on its bytes within the host and a ring over S on a P-th of them
  across hosts; a multi-slice TPU program's transfers are their own cross-slice part):
  ``collectives_s`` is the sum of the two links' times (``collectives_ici_s``,
  ``collectives_dcn_s``), no overlap between them.

A lower bound: no overlap is assumed beyond taking the largest term, and real steps also pay
kernel launches, latency and imperfect overlap.
"""

from __future__ import annotations

from remat_lab.analysis.traffic import METHOD
from remat_lab.config import Target

BASIS = ("roofline estimate, not a measurement: the largest of compute (each product's flops at the "
         "rate XLA runs its dtype and precision: f32 DEFAULT as TF32 on a GPU, as bf16 on a TPU), "
         "memory (bytes accessed / HBM bandwidth), host offload (bytes to and from host memory / "
         "host link bandwidth) and collectives (ring-algorithm bytes / interconnect bandwidth within a "
         "slice or host, / cross-slice network bandwidth across them), "
         "with the target's spec figures; no overlap assumed beyond that max")
XLA_BYTES = "XLA's cost analysis (bytes accessed), each loop body scaled by its trip count"
HLO_BYTES = "counted in the optimized HLO text: " + METHOD
_HALF = {"bf16", "f16"}
_RING = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
         "all-to-all": lambda n: (n - 1) / n, "reduce-scatter": lambda n: n - 1.0,
         "collective-permute": lambda n: 1.0}
_CONFIG_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def rate_class(target: Target, dtype: str, precision: str) -> str:
    """The ``peak_flops`` key of ``target`` a product of operand ``dtype`` (HLO's: ``f32``,
    ``bf16``) at ``precision`` (``DEFAULT``, ``HIGH``, ``HIGHEST`` or ``alg:dot_<algorithm>``) runs at."""
    gpu = target.platform == "cuda"
    if precision.startswith("alg:"):
        algorithm = precision[4:].lower()
        if "_x" in algorithm:  # several passes (bf16_bf16_f32_x3, tf32_tf32_f32_x3): f32-class
            return "float32"
        if "tf32" in algorithm:
            return "tf32" if gpu and "tf32" in target.peak_flops else "float32"
        return "bfloat16" if "bf16" in algorithm or "f16" in algorithm else "float32"
    if dtype in _HALF or dtype.startswith("f8"):
        return "bfloat16"
    if dtype == "f32" and precision == "DEFAULT":
        if gpu:
            return "tf32" if "tf32" in target.peak_flops else "float32"
        return "bfloat16"
    return "float32"


def _compute(flops: float | None, traffic: dict | None, target: Target, dtype: str) -> tuple:
    """``(seconds, rates, note)``: ``rates`` = ``{class: {"flops", "flops_per_s", "s"}}``."""
    products = (traffic or {}).get("products")
    known: dict[str, float] = {}
    note = ""
    if products is None:  # no program text: every flop as a DEFAULT product of the config's dtype
        key = rate_class(target, _CONFIG_DTYPE.get(dtype, "f32"), "DEFAULT")
        known = {key: flops} if flops else {}
        note = f"products not read: all flops at the {key} rate of the configured dtype"
    else:
        for row in products:
            if row["flops"]:
                key = rate_class(target, row["dtype"], row["precision"])
                known[key] = known.get(key, 0.0) + row["flops"]
    counted = sum(known.values())
    if flops and products is not None and flops > counted * (1 + 1e-9):
        top = max(known, key=known.get) if known else rate_class(target, _CONFIG_DTYPE.get(dtype, "f32"),
                                                                  "DEFAULT")
        known["other"] = flops - counted
        note = (f"{known['other']:.3g} flops outside products (element-wise work): no vector-unit "
                f"figure, priced at the {top} rate")
        rate_of = {"other": target.peak_flops.get(top)}
    else:
        rate_of = {}
    rates = {}
    for key, n in known.items():
        rate = rate_of.get(key, target.peak_flops.get(key))
        rates[key] = {"flops": n, "flops_per_s": rate, "s": n / rate if rate else None}
    if not rates or any(r["s"] is None for r in rates.values()):
        return None, rates, note or "no flop count"
    return sum(r["s"] for r in rates.values()), rates, note


def ring_bytes(kind: str, nbytes: float, n: int) -> float:
    """The bytes a ring of ``n`` devices moves per device for a ``kind`` collective of ``nbytes``."""
    return nbytes * _RING.get(kind, lambda _: 1.0)(n) if n > 1 else 0.0


def _collectives(traffic: dict, target: Target) -> tuple[float | None, dict, dict]:
    """``(seconds, by kind, by link)``: each kind's ring bytes within a slice or host at the
    interconnect figure, across slices or hosts (``dcn_``) at the cross-slice figure."""
    moved = {}
    for kind, c in traffic.get("collectives", {}).items():
        n, dcn_n = max(int(c.get("group") or 1), 1), max(int(c.get("dcn_group") or 1), 1)
        dcn = float(c.get("dcn_bytes") or 0)
        ici = float(c.get("ici_bytes", c["bytes"] - dcn))
        moved[kind] = {"bytes": c["bytes"], "ici_bytes": ici, "group": n, "dcn_bytes": dcn,
                       "dcn_group": dcn_n, "ring_bytes": ring_bytes(kind, ici, n),
                       "dcn_ring_bytes": ring_bytes(kind, dcn, dcn_n)}
    links = {}
    for link, key, rate in (("ici", "ring_bytes", target.interconnect_bytes_per_s),
                            ("dcn", "dcn_ring_bytes", target.dcn_bytes_per_s)):
        total = sum(m[key] for m in moved.values())
        links[link] = {"ring_bytes": total, "bytes_per_s": rate,
                       "s": total / rate if rate else (0.0 if not total else None)}
    if not moved:
        return 0.0, moved, links
    parts = [v["s"] for v in links.values()]
    return (None if None in parts else sum(parts)), moved, links


def estimate_step(flops: float | None, bytes_accessed: float | None, target: Target, dtype: str,
                  traffic: dict | None = None) -> dict:
    """The estimate and every term: ``estimate_s``, ``bound`` (the largest term's name, with what
    is unknown), ``compute_s`` with ``rates``, ``memory_s`` with ``memory_bytes`` and
    ``memory_source``, ``offload_s`` with ``offload_bytes``, ``collectives_s`` (=
    ``collectives_ici_s`` + ``collectives_dcn_s``, each link's ring bytes, figure and time in
    ``collective_links``) with ``collective_bytes`` by kind, the target figures used and
    ``basis``. ``flops`` and ``bytes_accessed``: the step's (``costs.program_flops``);
    ``traffic``: ``traffic.traffic_of`` of its compiled text (None: products, offload and
    collectives unknown)."""
    missing = []
    compute, rates, compute_note = _compute(flops, traffic, target, dtype)
    if compute is None:
        missing.append(f"compute ({compute_note})")
    if bytes_accessed:
        memory_bytes, source = bytes_accessed, XLA_BYTES
    elif traffic is not None:
        memory_bytes, source = traffic["memory_bytes"], HLO_BYTES
    else:
        memory_bytes, source = None, None
        missing.append("memory (no cost analysis and no program text)")
    memory = memory_bytes / target.bandwidth_bytes_per_s if memory_bytes is not None else None
    offload = collective = None
    offload_bytes = moved = links = None
    if traffic is None:
        missing.append("host offload and collectives (no program text)")
    else:
        offload_bytes = {"to_host": traffic["to_host_bytes"], "from_host": traffic["from_host_bytes"]}
        host = sum(offload_bytes.values())
        offload = host / target.host_bandwidth_bytes_per_s if target.host_bandwidth_bytes_per_s else None
        if offload is None and host:
            missing.append("host offload (no host link figure for this target)")
        offload = 0.0 if offload is None and not host else offload
        collective, moved, links = _collectives(traffic, target)
        if collective is None:
            missing.append("collectives (no interconnect or cross-slice figure for this target)")
    terms = {"compute": compute, "memory": memory, "offload": offload, "collectives": collective}
    known = {k: v for k, v in terms.items() if v is not None}
    estimate = max(known.values()) if known else None
    bound = None if estimate is None else max(known, key=known.get)
    if bound is not None and missing:
        bound += f" (of the terms known; unknown: {'; '.join(missing)})"
    return {"estimate_s": estimate, "bound": bound, "compute_s": compute, "memory_s": memory,
            "offload_s": offload, "collectives_s": collective,
            "collectives_ici_s": links and links["ici"]["s"],
            "collectives_dcn_s": links and links["dcn"]["s"], "collective_links": links,
            "rates": rates,
            "compute_note": compute_note or None, "memory_bytes": memory_bytes,
            "memory_source": source, "offload_bytes": offload_bytes, "collective_bytes": moved,
            "peak_flops_per_s": target.peak_flops.get(dtype),
            "bandwidth_bytes_per_s": target.bandwidth_bytes_per_s,
            "host_bandwidth_bytes_per_s": target.host_bandwidth_bytes_per_s,
            "interconnect_bytes_per_s": target.interconnect_bytes_per_s,
            "dcn_bytes_per_s": target.dcn_bytes_per_s, "basis": BASIS}

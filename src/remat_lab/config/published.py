"""MaxText's published runs (``published.json``) as lab configurations, flops and step times; no JAX."""

from __future__ import annotations

import json
from pathlib import Path

from .catalog import NAMES, POLICY_IDS, PRESETS
from .errors import ConfigError
from .mesh_text import MESH_AXES, format_mesh
from .targets import MAX_TARGET_DEVICES, get_target

CATALOGUE: dict = json.loads(Path(__file__).with_name("published.json").read_text())
RUNS: dict[str, dict] = {run["name"]: run for run in CATALOGUE["runs"]}
REPOSITORY = CATALOGUE["maxtext_repository"]

# MaxText's knobs with no effect on what the lab compiles (data, logging, profiling, kernels' fusion).
IGNORED = ("dataset_type", "dataset_path", "enable_checkpointing", "profiler", "use_iota_embed",
           "reuse_example_batch", "gcs_metrics", "skip_first_n_steps_for_profiler", "profiler_steps",
           "gradient_clipping_threshold",
           "sa_use_fused_bwd_kernel", "allow_split_physical_axes", "custom_mesh", "tokenizer_path")
# The knobs translate() reads: the batch, length and stack, attention, the remat plan (the custom
# plan's names are NAMES["llm"] and decoder_layer_input), offload, quantization, a mixture of
# experts' dispatch, and the mesh (ici_* / dcn_* of the lab's axes; any other axis refused).
READ = ("per_device_batch_size", "max_target_length", "scan_layers", "attention", "sa_block_q",
        "sa_block_kv", "sa_block_q_dkv", "sa_block_q_dq", "remat_policy", "decoder_layer_input",
        "optimizer_memory_host_offload", "use_qwix_quantization", "capacity_factor", "megablox",
        "sparse_matmul", "dtype", "weight_dtype", "mu_dtype")
# MaxText's attention kernels as the lab's attention: a blockwise kernel that never holds the
# (seq x seq) scores (splash on TPU, cuDNN's through Transformer Engine on GPUs) is the lab's flash.
ATTENTION = {"flash": "flash", "cudnn_flash_te": "flash", "dot_product": "full", "autoselected": "flash"}
# MaxText's older names of a remat policy: minimal_flash is minimal_with_context (its decoders.py:
# "'minimal_flash' will be deprecated soon, please use 'minimal_with_context' instead")
POLICY_ALIASES = {"minimal_flash": "minimal_with_context"}
# MaxText's libtpu flag sets (its benchmarks/xla_flags_library.py) that run a TPU's collectives
# beside the kernels: continuation fusion for all-gathers; data-parallel overlap, continuation
# fusion or SparseCore offload for the reductions. A run's libtpu_flags -> its collective_overlap.
OVERLAP_ALL_GATHERS = {"CF_FOR_ALL_GATHER", "CF_FOR_ALL_REDUCE_AND_ALL_GATHER",
                       "ENABLE_SPARSECORE_OFFLOADING_FOR_ALL_GATHER",
                       "ENABLE_SPARSECORE_OFFLOADING_FOR_RS_AG_AR"}
OVERLAP_REDUCTIONS = {"DATA_PARALLEL_OVERLAP", "CF_FOR_ALL_REDUCE", "CF_FOR_ALL_REDUCE_AND_ALL_GATHER",
                      "ENABLE_SPARSECORE_OFFLOADING_FOR_ALL_REDUCE",
                      "ENABLE_SPARSECORE_OFFLOADING_FOR_REDUCE_SCATTER",
                      "ENABLE_SPARSECORE_OFFLOADING_FOR_RS_AG_AR"}
# MaxText's splash attention blocks when a run names none (base.yml: sa_block_q, sa_block_kv, ...).
SPLASH_BLOCK = 512
# MaxText's mesh knobs and the lab's axes (``mesh_text.MESH_AXES``, ``DCN_AXES``): ici_* within a
# slice or host, dcn_* across slices or hosts (the data-centre network, or the network between GPU
# hosts), each logical axis ici x dcn.
_AXIS = {"data": "data", "fsdp": "fsdp", "tensor": "tensor"}
# A custom plan's values (MaxText's ``remat_policy: custom``): keep on the device, move to the
# host, or recompute in the backward pass.
_PLAN = ("device", "offload", "remat")


def run_named(name: str) -> dict:
    """The catalogued run ``name``, or a ConfigError listing the names there are."""
    if name not in RUNS:
        raise ConfigError(f"no published run {str(name)[:60]!r}; choose one of: {', '.join(RUNS)}.")
    return RUNS[name]


def source_link(source: dict) -> str:
    """``repository/file@commit#Lline``: where a configuration or a figure is published."""
    return f"{source.get('repository', REPOSITORY)}/{source['file']}@{source['commit'][:7]}#L{source['line']}"


def network_text(doc: dict) -> str | None:
    """A GPU check across hosts: the hosts' network its collectives were priced at and why that one
    (``"a3-high, 12.5 GB/s a GPU (...)"``); None for a TPU or one host (``published --check``'s doc)."""
    net, config = doc.get("network") or {}, doc["config"]
    if not net.get("dcn_bytes_per_s") or "dcn_" not in config["mesh"] \
            or get_target(config["target"]).platform != "cuda":
        return None
    why = net.get("why") or net.get("source")
    return (f"{net.get('name') or 'the ' + config['target'] + ' default'}, "
            f"{net['dcn_bytes_per_s'] / 1e9:g} GB/s a GPU" + (f" ({why})" if why else ""))


def defaults_text(run: dict) -> str | None:
    """The knobs a run's MaxText defaulted otherwise than today's and why (``maxtext_defaults``),
    one sentence; None where it names none."""
    if not run.get("maxtext_defaults"):
        return None
    knobs = ", ".join(f"{k}: {str(v).lower()}" for k, v in run["maxtext_defaults"].items())
    return f"read as {knobs}, its MaxText's default: {run.get('maxtext_defaults_note', '')}"


def figure_text(measured: dict | None) -> str:
    """A run's published figure in words: ``45.46% MFU, 7,207 tokens/s/device``."""
    if not measured:
        return "none published"
    parts = [f"{measured['mfu']:.2%} MFU" if measured.get("mfu") else "",
             f"{measured['tokens_per_s_per_device']:,.0f} tokens/s/device"
             if measured.get("tokens_per_s_per_device") else "",
             f"{measured['tflops_per_s_per_chip']} TFLOP/s/chip"
             if measured.get("tflops_per_s_per_chip") else ""]
    return ", ".join(p for p in parts if p)


def source_url(source: dict) -> str:
    """The web address of a published configuration or figure, at its commit and line."""
    repo = source.get("repository", REPOSITORY)
    return f"https://github.com/{repo}/blob/{source['commit']}/{source['file']}#L{source['line']}"


def _mesh(knobs: dict, devices: int, slices: int | None = None) -> tuple[str, list[str]]:
    """The lab's mesh for MaxText's ``ici_*`` / ``dcn_*`` parallelism knobs (-1: the devices left
    within a slice, or the slices left): ``dcn_*`` becomes the lab's cross-slice axis of the same
    name (each logical axis ici x dcn, the dcn part outermost, as MaxText); ``slices``: the run's
    slices or hosts (None: the dcn knobs' product). MaxText's ``fsdp_transpose`` axis becomes the
    lab's ``fsdp``. The second item: what the lab does not reproduce of them."""
    ici, dcn, notes = {}, {}, []
    fill_ici = fill_dcn = None
    for knob, n in knobs.items():
        axis = knob.split("_", 1)[1].removesuffix("_parallelism") if _mesh_knob(knob) else None
        if axis and n != 1 and axis not in (*MESH_AXES, "fsdp_transpose"):
            raise ConfigError(f"{knob} {n}: the lab's mesh has no {axis} axis yet (its axes: "
                              f"{', '.join(MESH_AXES)}, and fsdp_transpose read as fsdp).")
    if any(knobs.get(f"{link}_fsdp_transpose_parallelism", 1) != 1 for link in ("ici", "dcn")):
        if any(knobs.get(f"{link}_fsdp_parallelism", 1) != 1 for link in ("ici", "dcn")):
            raise ConfigError("fsdp and fsdp_transpose together have no counterpart in the lab's mesh.")
        knobs = {**knobs, **{f"{link}_fsdp_parallelism": knobs[f"{link}_fsdp_transpose_parallelism"]
                             for link in ("ici", "dcn")
                             if f"{link}_fsdp_transpose_parallelism" in knobs}}
        notes.append("fsdp_transpose: MaxText shards each weight's other dimension over it; the "
                     "lab's fsdp axis shards the same bytes a device over the same devices")
    for axis in MESH_AXES:
        ici[axis] = knobs.get(f"ici_{axis}_parallelism", 1)
        dcn[axis] = knobs.get(f"dcn_{axis}_parallelism", 1)
        if ici[axis] == -1:
            fill_ici, ici[axis] = axis, 1
        if dcn[axis] == -1:
            fill_dcn, dcn[axis] = axis, 1
    known = 1
    for n in dcn.values():
        known *= n
    slices = known if slices is None else slices
    if slices % known:
        raise ConfigError(f"the dcn knobs use {known} slices, which do not divide {slices}.")
    if fill_dcn is not None:
        dcn[fill_dcn] *= slices // known
    elif known != slices:
        raise ConfigError(f"the dcn knobs use {known} slices, not the run's {slices}.")
    if devices % slices:
        raise ConfigError(f"{devices} devices cannot be split into {slices} slices.")
    per_slice, used = devices // slices, 1
    for n in ici.values():
        used *= n
    if per_slice % used:
        raise ConfigError(f"the mesh knobs use {used} devices, which do not divide {per_slice}.")
    if fill_ici is not None:
        ici[fill_ici] *= per_slice // used
    elif used != per_slice:
        raise ConfigError(f"the mesh knobs use {used} devices, not the run's {per_slice}"
                          + (" a slice." if slices > 1 else "."))
    return format_mesh({a: ici[a] * dcn[a] for a in MESH_AXES}, dcn), notes


def translate(run: dict) -> tuple[dict, list[str]]:
    """The lab configuration (``RunConfig.from_preset`` keyword arguments, with ``preset``) for a
    published run, and what differs from MaxText's program, one sentence each. Raises ConfigError
    where the lab cannot compile it at all (its model is not a preset, more devices than it compiles)."""
    # the knobs' defaults of the MaxText a run ran where they differ from today's (maxtext_defaults)
    knobs, devices, diff = {**run.get("maxtext_defaults", {}), **run["knobs"]}, run["devices"], []
    preset = run.get("lab_preset", run["model"])
    if preset not in PRESETS:
        raise ConfigError(f"{run['name']}: the lab has no preset {preset!r} yet.")
    unknown = [k for k in knobs if k not in (*READ, *IGNORED, *NAMES["llm"]) and not _mesh_knob(k)]
    if unknown:
        raise ConfigError(f"{run['name']}: MaxText's {unknown[0]!r} is not a knob the lab translates "
                          "or knows to change nothing it compiles.")
    if preset != run["model"]:
        diff.append(run["lab_preset_note"])
    if devices > MAX_TARGET_DEVICES:
        raise ConfigError(f"{run['name']} runs on {devices} chips; the lab compiles for at most "
                          f"{MAX_TARGET_DEVICES}.")
    get_target(run["target"])
    pdb = knobs["per_device_batch_size"]
    mesh, notes = _mesh(knobs, devices, run.get("slices"))
    diff += notes
    fields = {"preset": preset, "seq": knobs["max_target_length"], "batch": int(pdb * devices),
              "step": "train", "loss_chunks": 1, "compile_only": True, "target": run["target"],
              "target_devices": devices, "mesh": mesh,
              "stack": "scan" if knobs.get("scan_layers", True) else "loop"}
    if run.get("network"):  # the machine the run was measured on: its host network (targets.json)
        fields["network"] = run["network"]
    if overlap := collective_overlap(run):
        fields["collective_overlap"] = overlap
    # MaxText's default (base.yml) is autoselected: splash on TPU from 128 tokens (attention_op.py)
    attention = knobs.get("attention", "autoselected")
    if attention not in ATTENTION:
        raise ConfigError(f"{run['name']}: attention {attention!r} has no counterpart in the lab.")
    fields["attention"] = ATTENTION[attention]
    if fields["attention"] == "flash":
        fields["attention_block"] = int(knobs.get("sa_block_q", SPLASH_BLOCK))
        other = {what: knobs.get(knob, SPLASH_BLOCK) for knob, what in (
            ("sa_block_kv", "key/value"), ("sa_block_q_dkv", "the dk/dv pass's query"),
            ("sa_block_q_dq", "the dq pass's query"))}
        if any(block != fields["attention_block"] for block in other.values()):
            diff.append(f"flash blocks: the lab uses one block size ({fields['attention_block']}) in "
                        "every pass; MaxText's " + ", ".join(f"{w} {b}" for w, b in other.items())
                        + f" (base.yml's {SPLASH_BLOCK} where the run names none)")
    policy = knobs.get("remat_policy", "full")
    policy = POLICY_ALIASES.get(policy, policy)
    if policy not in POLICY_IDS:
        raise ConfigError(f"{run['name']}: remat_policy {policy!r} is not one of the lab's policies.")
    fields["policy"] = policy
    if policy == "custom":
        save, offload = [], []
        for name in dict.fromkeys((*NAMES["llm"], "decoder_layer_input")):  # each name once
            where = knobs.get(name)
            if where is None:
                continue
            if where not in _PLAN:
                raise ConfigError(f"{run['name']}: {name}: {where!r}; a custom plan says device, "
                                  "offload or remat.")
            if name not in NAMES["llm"]:
                diff.append(f"{name}: {where} in MaxText; the lab's llm has no checkpoint name "
                            f"{name}, so it is recomputed")
                continue
            (save if where == "device" else offload if where == "offload" else []).append(name)
        fields["save_names"], fields["offload_names"] = tuple(save), tuple(offload)
    if PRESETS[preset].get("experts"):
        diff += _experts(knobs, fields)
    # MaxText's dtypes (base.yml: dtype bfloat16, weight_dtype float32; mu_dtype unset follows
    # weight_dtype, and optax's second moment follows the parameters): the lab's dtype,
    # param_dtype and optimizer_dtype, set where the run names them
    if any(k in knobs for k in ("dtype", "weight_dtype", "mu_dtype")):  # the rest: base.yml's
        fields["dtype"] = knobs.get("dtype", "bfloat16")  # (any one given drops the preset's recipe)
        fields["param_dtype"] = knobs.get("weight_dtype", "float32")
        fields["optimizer_dtype"] = knobs.get("mu_dtype") or fields["param_dtype"]
    if knobs.get("optimizer_memory_host_offload"):
        fields["optimizer_offload"] = True
    if knobs.get("use_qwix_quantization"):
        diff.append("use_qwix_quantization: MaxText trains with int8 matmuls (Qwix); the lab's "
                    "matmuls are in bfloat16, so its activations and flops are those of bfloat16")
    if pdb != int(pdb):
        diff.append(f"per_device_batch_size {pdb}: the lab's batch is {fields['batch']} in all")
    if run.get("maxtext_compile"):
        diff.append(compiler_difference(run["maxtext_compile"]))
    return fields, diff


def collective_overlap(run: dict) -> str:
    """The ``collective_overlap`` a TPU run's libtpu flags give (``libtpu_flags``): "" (every
    collective beside the kernels) where they overlap the all-gathers and the reductions or name
    none, "all-gathers" where only the all-gathers, "none" where neither."""
    names = set((run.get("libtpu_flags") or {}).get("names", ()))
    if not names or not run["target"].startswith("tpu"):
        return ""
    gathers, reductions = bool(names & OVERLAP_ALL_GATHERS), bool(names & OVERLAP_REDUCTIONS)
    return "" if gathers and reductions else "all-gathers" if gathers else "" if reductions else "none"


def overlap_text(run: dict) -> str | None:
    """The sentence for a TPU run's libtpu flags and the collectives they run beside the kernels
    (``collective_overlap``); None where the run names no flags."""
    names = (run.get("libtpu_flags") or {}).get("names")
    if not names or not run["target"].startswith("tpu"):
        return None
    said = {"": "every collective beside the kernels", "all-gathers": "only the all-gathers beside "
            "the kernels, the reductions as libtpu writes them (--collective-overlap all-gathers)",
            "none": "no collective beside the kernels (--collective-overlap none)"}
    return f"launched with libtpu flags {', '.join(names)}: {said[collective_overlap(run)]}"


def _mesh_knob(knob: str) -> bool:
    """``ici_*_parallelism`` / ``dcn_*_parallelism`` (``_mesh`` reads them; an expert axis is refused)."""
    return knob.startswith(("ici_", "dcn_")) and knob.endswith("_parallelism")


def _experts(knobs: dict, fields: dict) -> list[str]:
    """A mixture of experts' knobs into ``fields``, and the differences. ``sparse_matmul`` (MaxText's
    default true): the lab's grouped dispatch (tokens sorted by expert, ``ragged_dot``, dropless);
    false: the dense einsum dispatch at ``capacity_factor`` (MaxText's -1, dropless, is the lab's 0).
    MaxText's sparse path has no capacity, and its megablox kernel is the lab's ragged_dot."""
    factor = float(knobs.get("capacity_factor", -1.0))
    if not knobs.get("sparse_matmul", True):
        fields.update(moe_dispatch="dense", capacity_factor=max(factor, 0.0))
        return []
    fields.update(moe_dispatch="grouped", capacity_factor=0.0)
    diff = []
    if knobs.get("megablox", True):
        diff.append("megablox: MaxText multiplies each expert's tokens with its Pallas megablox "
                    "kernel; the lab with jax.lax.ragged_dot (libtpu's own grouped kernel), the "
                    "same products")
    if factor > 0:
        diff.append(f"capacity_factor {factor:g}: not used by MaxText's sparse_matmul path, which "
                    "is dropless, as the lab's grouped dispatch")
    return diff


def compiler_difference(mt: dict) -> str:
    """The sentence for a run MaxText's own current compile refuses (``maxtext_compile`` of a
    catalogued run, from ``benchmarks/maxtext_reference.py --run NAME``): the difference is the
    compiler the run was measured with, and the bytes MaxText's program needs under today's."""
    flags = (f" ({mt['temp_bytes_with_flags'] / 2 ** 30:.2f} with the run's libtpu flags)"
             if mt.get("temp_bytes_with_flags") else "")
    today = (f"MaxText {mt['maxtext']}'s own compile of this configuration today (JAX {mt['jax']}, "
             f"libtpu {mt['libtpu']}) is refused too, its temporaries "
             f"{mt['temp_bytes'] / 2 ** 30:.2f} GiB a chip{flags}")
    if not mt.get("measured_with"):  # a configuration published without a measured run
        return f"MaxText's own program: {today}; no run of it is published to say what ran"
    return f"the compiler the run was measured with ({mt['measured_with']}): {today}"


def model_flops_per_device(run: dict, *, causal: bool = True) -> float:
    """MaxText's model flops for one training step on one device (``calculate_tflops_training_per_
    device``): 3 x (2 x tokens x the matmul weights, vocabulary projection included; a mixture of
    experts: its router and the k experts a token goes through, as MaxText's dropless count)
    + 3 x causal attention (2 x tokens x seq x heads x head_dim a layer, half of the full square);
    ``causal=False``: the full square, as MaxText counted when its v6e MFU figures were published."""
    p, k = PRESETS[run.get("lab_preset", run["model"])], run["knobs"]
    b, t = k["per_device_batch_size"], k["max_target_length"]
    d, hd, layers = p["width"], p["head_dim"], p["depth"]
    ffn = 2 * b * t * p["mlp_dim"] * d * 2 + 2 * b * t * p["mlp_dim"] * d  # two gated inputs, one out
    if p.get("experts"):  # MaxText's count for a mixture of experts: the router, k routed experts
        f = p.get("expert_mlp_dim") or p["mlp_dim"]  # and the shared ones, each a gated MLP of f
        ffn = 2 * b * t * d * p["experts"] + (p["experts_per_token"] + p.get("shared_experts", 0)) * (
            2 * b * t * f * d * 2 + 2 * b * t * f * d)
    qkv = 2 * b * t * d * (p["heads"] + 2 * p["kv_heads"]) * hd
    proj = 2 * b * t * d * p["heads"] * hd
    attention = 4 * b * t ** 2 * p["heads"] * hd / (2 if causal else 1)
    embed = 2 * b * t * d * p["vocab"]
    return 3 * ((ffn + qkv + proj) * layers + embed) + 3 * attention * layers


def measured_step_s(run: dict) -> dict | None:
    """The measured step time of a published run, from its figure: tokens/s/device (exact: tokens
    per device per step over it), else model TFLOP/s per chip or MFU (MaxText's model flops per
    device over the achieved rate; MFU against the chip's bfloat16 peak). None when none is published."""
    m = run.get("measured")
    if not m:
        return None
    k = run["knobs"]
    if m.get("tokens_per_s_per_device"):
        tokens = k["per_device_batch_size"] * k["max_target_length"]
        return {"step_s": tokens / m["tokens_per_s_per_device"], "from": "tokens_per_s_per_device"}
    flops = model_flops_per_device(run)
    if m.get("tflops_per_s_per_chip"):
        return {"step_s": flops / (m["tflops_per_s_per_chip"] * 1e12), "from": "tflops_per_s_per_chip"}
    peak = get_target(run["target"]).peak_flops["bfloat16"]
    return {"step_s": flops / (m["mfu"] * peak), "from": "mfu"}


def mfu_definition(run: dict) -> dict | None:
    """Which model-flops count a run's published MFU uses: the MFU its tokens/s give under MaxText's
    causal count and under the full square, and the published one (None without both figures)."""
    m = run.get("measured") or {}
    if not (m.get("mfu") and m.get("tokens_per_s_per_device")):
        return None
    step = measured_step_s(run)["step_s"]
    peak = get_target(run["target"]).peak_flops["bfloat16"]
    causal, square = (model_flops_per_device(run, causal=c) / step / peak for c in (True, False))
    matches = "full_square" if abs(square - m["mfu"]) < abs(causal - m["mfu"]) else "causal"
    closest = square if matches == "full_square" else causal
    # agree: within 2 % of each other (tiering.md's tokens/s are "approx"; the v5p's are 1.3 %
    # apart, the 405B's 8.7 %); else the step the MFU alone gives
    return {"published": m["mfu"], "causal": causal, "full_square": square, "matches": matches,
            "agree": abs(closest - m["mfu"]) <= 0.02 * m["mfu"],
            "step_s_from_mfu": step * closest / m["mfu"]}

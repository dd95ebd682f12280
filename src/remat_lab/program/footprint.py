"""A step's bytes whatever its batch, per device, from the configuration alone; the devices that hold them.

The static bytes of a step are its parameters, their gradients (one per parameter, in the
parameters' dtype) and, for step train, AdamW's state: known from the configuration, before any
compile. They come from the abstract leaves ``step`` builds (``jax.eval_shape``: nothing
allocated, no device, no compile) laid out by the mesh's rules (``mesh.param_specs``; the
optimizer state like its parameters, ``mesh.state_specs``), one device's shard each. Over the
per-device budget nothing fits at any batch: ``fit`` then says the fewest devices whose shards
fit the same budget (more fsdp, the other axes kept), what bfloat16 moments would need, and
which targets have the memory at this device count. The advisor answers with it before any batch
search; an out-of-memory error of a preset is translated with it (``backend.xla_error``). A model
loaded in the app's sidebar starts at a batch and seq that fit, or is told why none does
(``starting_shape``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from remat_lab.config import (
    LOCAL,
    ConfigError,
    RunConfig,
    batch_rows,
    estimate_bytes,
    format_mesh,
    human_bytes,
    mesh_dcn,
    mesh_devices,
    parse_mesh,
)
from remat_lab.config.run import MAX_MESH_DEVICES
from remat_lab.config.targets import TARGETS
from remat_lab.program import mesh as sharding
from remat_lab.program.optimizer import optimizer, precision
from remat_lab.program.step import _abstract_parameters, _llm_key


def _shard_elements(shape: tuple, spec: PartitionSpec, sizes: dict[str, int]) -> int:
    """Entries of one device's shard of an array of ``shape`` laid out as ``spec`` over ``sizes``."""
    dims = list(shape)
    for i, entry in enumerate(tuple(spec)):
        for axis in entry if isinstance(entry, tuple) else (entry,):
            if axis is not None:
                dims[i] = -(-dims[i] // sizes.get(axis, 1))
    return math.prod(dims)


def _bytes(tree, specs, sizes: dict[str, int]) -> int:
    is_spec = lambda s: isinstance(s, PartitionSpec)
    arrays = jax.tree_util.tree_leaves(tree)
    layout = jax.tree_util.tree_leaves(specs, is_leaf=is_spec) if specs is not None else None
    return sum(_shard_elements(a.shape, layout[i] if layout else PartitionSpec(), sizes)
               * jnp.dtype(a.dtype).itemsize for i, a in enumerate(arrays))


def static_bytes(config: RunConfig) -> dict:
    """One device's ``parameter_bytes``, ``gradient_bytes`` and ``optimizer_state_bytes`` (0 for
    the gradient step) on ``config``'s mesh, their sum ``static_bytes_per_device``, the
    ``devices`` and the ``precision``; from abstract leaves, nothing compiled."""
    _, treedef, leaves, _ = _abstract_parameters(config.model, config.width, config.depth,
                                                 config.dtype, config.stack, config.heads,
                                                 _llm_key(config))
    leaves = list(leaves)
    state = jax.eval_shape(optimizer(config).init, leaves) if config.step == "train" else None
    sizes = parse_mesh(config.mesh)
    specs = state_specs = None
    if sizes:
        specs = sharding.param_specs(jax.tree_util.tree_unflatten(treedef, leaves), config)
        state_specs = None if state is None else sharding.state_specs(state, leaves, specs)
    params = _bytes(leaves, specs, sizes)
    opt = 0 if state is None else _bytes(state, state_specs, sizes)
    return {"parameter_bytes": params, "gradient_bytes": params, "optimizer_state_bytes": opt,
            "static_bytes_per_device": 2 * params + opt, "devices": mesh_devices(config.mesh),
            "mesh": config.mesh, "precision": precision(config)}


def _with_fsdp(config: RunConfig, fsdp: int) -> RunConfig | None:
    """``config`` on its mesh with fsdp ``fsdp`` (the other axes kept), local and compile-only
    (only its layout is read); None where the shape does not split that way."""
    sizes = {**parse_mesh(config.mesh), "fsdp": fsdp}  # logical sizes: dcn axes folded (local layout)
    rows = batch_rows(sizes)
    try:
        return config.replace(mesh=format_mesh(sizes), batch=rows * config.microbatches,
                              target=LOCAL, target_devices=1, compile_only=True)
    except ConfigError:
        return None


def fewest_devices(config: RunConfig, budget: int, now: int | None = None) -> dict | None:
    """The smallest fsdp (the mesh's other axes kept) whose static bytes per device fit
    ``budget``: ``{"fsdp", "devices", "mesh", "static_bytes_per_device"}``; None when none up to
    the lab's mesh limit does, or the model has no sharding rules (a user block)."""
    if config.model not in sharding.RULES:
        return None
    sizes = parse_mesh(config.mesh)
    fsdp, others = sizes.get("fsdp", 1), mesh_devices(config.mesh) // sizes.get("fsdp", 1)
    now = static_bytes(config)["static_bytes_per_device"] if now is None else now
    # Every llm leaf splits over fsdp: the bytes fall about as 1/fsdp, so start near the answer.
    start = max(fsdp + 1, math.floor(now * fsdp / budget))
    for n in range(start, MAX_MESH_DEVICES // others + 1):
        if config.width % n:
            continue
        wider = _with_fsdp(config, n)
        if wider is None:
            continue
        need = static_bytes(wider)["static_bytes_per_device"]
        if need <= budget:
            try:  # the slices or hosts kept (the layout is read locally, where there are none)
                mesh = format_mesh(parse_mesh(wider.mesh), mesh_dcn(config.mesh))
            except ConfigError:
                mesh = wider.mesh
            return {"fsdp": n, "devices": n * others, "mesh": mesh,
                    "static_bytes_per_device": need}
    return None


def fit(config: RunConfig, budget: int) -> dict:
    """``static_bytes`` against ``budget`` (bytes per device): ``fits``; when they do not, the
    fewest devices that hold them (``min_devices``, ``min_fsdp``, ``min_mesh``; None where no mesh
    up to the lab's limit does), ``bf16_moments`` (the static bytes with the optimizer state in
    bfloat16 and whether they fit; None for the gradient step or moments already bfloat16) and
    ``targets_that_fit`` (targets whose usable memory holds the static bytes at this device count,
    smallest first, this one left out)."""
    now = static_bytes(config)
    need = now["static_bytes_per_device"]
    out = {**now, "budget_bytes": budget, "fits": need <= budget}
    if out["fits"]:
        return out
    fewest = fewest_devices(config, budget, need)
    out.update(min_fsdp=fewest and fewest["fsdp"], min_devices=fewest and fewest["devices"],
               min_mesh=fewest and fewest["mesh"],
               min_devices_bytes=fewest and fewest["static_bytes_per_device"])
    out["bf16_moments"] = None
    if config.step == "train" and config.optimizer_dtype_used != "bfloat16":
        half = static_bytes(config.replace(optimizer_dtype="bfloat16"))["static_bytes_per_device"]
        out["bf16_moments"] = {"static_bytes_per_device": half, "fits": half <= budget}
    roomy = sorted((t for t in TARGETS.values() if t.name != config.target
                    and t.usable_bytes() >= need), key=lambda t: t.usable_bytes())
    out["targets_that_fit"] = [{"target": t.name, "usable_bytes": t.usable_bytes()} for t in roomy]
    return out


def _held(found: dict) -> str:
    return ("the parameters, gradients and optimizer state" if found["optimizer_state_bytes"]
            else "the parameters and gradients")


def no_fit_sentence(found: dict) -> str:
    """``fit``'s answer for a configuration that does not fit at any batch, in one sentence."""
    where = f"on {found['mesh']}" if found["mesh"] else "on one device"
    p = found["precision"]
    kinds = (f"parameters {human_bytes(found['parameter_bytes'])} {p['params']} + gradients "
             f"{human_bytes(found['gradient_bytes'])} {p['params']}"
             + (f" + optimizer state {human_bytes(found['optimizer_state_bytes'])} {p['optimizer']}"
                if found["optimizer_state_bytes"] else ""))
    text = (f"does not fit at any batch: {_held(found)} alone need "
            f"{human_bytes(found['static_bytes_per_device'])} per device {where} ({kinds}), over "
            f"the {human_bytes(found['budget_bytes'])} budget")
    if found.get("min_devices"):
        text += (f"; they fit from {found['min_devices']} devices ({found['min_mesh']}: "
                 f"{human_bytes(found['min_devices_bytes'])} each)")
    half = found.get("bf16_moments")
    if half:
        text += (f"; with bfloat16 moments they need {human_bytes(half['static_bytes_per_device'])}"
                 + (", which fits" if half["fits"] else ", still over"))
    roomy = found.get("targets_that_fit") or []
    if roomy:
        text += (f"; at {found['devices']} device{'s' if found['devices'] > 1 else ''} they fit on "
                 + ", ".join(f"{t['target']} ({human_bytes(t['usable_bytes'])} usable)"
                             for t in roomy[:4]))
    return text


MORE = "more devices (a larger fsdp), a target with more memory, a smaller batch or a shorter seq"


def crowded_sentence(found: dict, batch: int) -> str:
    """``fit``'s answer when the static bytes fit but batch ``batch`` does not beside them."""
    return (f"{_held(found)} take "
            f"{human_bytes(found['static_bytes_per_device'])} of the {human_bytes(found['budget_bytes'])}"
            f" per device; the activations of batch {batch} do not fit beside them: {MORE}, or a "
            "policy that saves less")


def starting_shape(config: RunConfig, budget: int | None, largest_batch: int = 8) -> dict:
    """A batch and seq for a model just loaded (a preset or a file): ``{"batch", "seq",
    "compile_only", "fits", "text"}``. Locally, the longest of its seq halved (down to 128) at which
    a batch of one fits ``budget`` (this server's, ``estimate_bytes``), then the most sequences up to
    ``largest_batch``; where none fits, compile only at batch one and its seq, and why. On a named
    target (nothing allocated) one sequence per batch row at its seq, and whether its parameters,
    gradients and optimizer state fit a device (``fit``)."""
    rows = batch_rows(parse_mesh(config.mesh))
    base = config.replace(microbatches=1, batch=rows, compile_only=False)
    if config.target != LOCAL:
        found = fit(base.replace(compile_only=True), TARGETS[config.target].usable_bytes())
        text = "" if found["fits"] else f"{config.preset or 'This model'} {no_fit_sentence(found)}."
        return {"batch": rows, "seq": config.seq, "compile_only": False, "fits": found["fits"], "text": text}
    if budget is None:
        return {"batch": rows, "seq": config.seq, "compile_only": False, "fits": True, "text": ""}
    def need(batch: int, seq: int) -> int | None:
        try:
            return estimate_bytes(base.replace(batch=batch, seq=seq))
        except ConfigError:  # a seq its loss chunks or attention block do not divide: not offered
            return None

    seqs = [config.seq >> i for i in range(12) if (config.seq >> i) >= min(128, config.seq)]
    for seq in seqs:
        n = need(rows, seq)
        if n is not None and n <= budget:
            batch = rows
            while batch * 2 <= max(largest_batch, rows) and (m := need(batch * 2, seq)) and m <= budget:
                batch *= 2
            short = "" if seq == config.seq else f" (the model's seq {config.seq} does not fit)"
            return {"batch": batch, "seq": seq, "compile_only": False, "fits": True,
                    "text": f"Batch {batch}, seq {seq}: about {human_bytes(need(batch, seq))} of this "
                            f"server's {human_bytes(budget)}{short}."}
    least = need(rows, seqs[-1]) or 0
    return {"batch": rows, "seq": config.seq, "compile_only": True, "fits": False,
            "text": f"{config.preset or 'This model'} cannot run on this server at any batch or seq: "
                    f"batch {rows} at seq {seqs[-1]} needs about {human_bytes(least)}, over its "
                    f"{human_bytes(budget)}. Set to compile only (its memory, nothing run), batch {rows}, "
                    f"seq {config.seq}; or choose a target."}

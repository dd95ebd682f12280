"""Device meshes: a configuration's mesh, its sharding rules and the placement of values on it.

**Rules** (stated in the Guide): ``data`` and ``fsdp`` shard the batch; ``fsdp`` also shards every
parameter along one axis (the model width) and each block gathers its parameters for use, inside
its ``nnx.remat`` (``gathered``), so a policy decides whether the backward pass gathers them again;
``tensor`` shards, Megatron style, the output features of the first projection (``l1``; the
transformer's q/k/v heads, ``wi_0``, ``wi_1``) and the input features of the second (``l2``;
``o_proj``'s heads, ``wo``). The rules are written on the parameters as Flax NNX sharding metadata
(``out_sharding``, what ``nnx.with_partitioning`` sets) and read back with
``nnx.get_partition_spec``; the step is jitted with explicit ``NamedSharding`` in and out.
The llm follows MaxText's logical axes (``embed`` on fsdp; ``vocab``, ``heads``, ``kv_heads`` and
``mlp`` on tensor): the embedding ``(vocab, width)`` and ``lm_head`` ``(width, vocab)``, q/k/v
``(width, heads, head_dim)``, ``o_proj`` ``(heads, head_dim, width)``, the gated MLP as the
transformer's; norms over fsdp; the tokens' batch over data x fsdp; the optimizer state (AdamW's
moments) laid out like its parameters (``state_specs``), the step count replicated.
What the step communicates is read from the compiled program by ``analysis/collectives.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from remat_lab.config import (
    BATCH_AXES,
    MESH_AXES,
    ConfigError,
    RunConfig,
    mesh_devices,
    mesh_parts,
    mesh_slices,
    parse_mesh,
)
from remat_lab.model.moe import ExpertLayout

# Per in-block parameter name: the mesh role of each of its axes (a scan stack adds a leading
# layer axis, never sharded). "fsdp" = where fsdp shards the stored parameter, "tensor" = the
# Megatron split; a tuple shards one axis over both.
RULES: dict[str, dict[str, tuple]] = {
    "mlp": {"l1.kernel": ("fsdp", "tensor"), "l1.bias": (("fsdp", "tensor"),),
            "l2.kernel": ("tensor", "fsdp"), "l2.bias": ("fsdp",)},
    "transformer": {
        "attn_norm.scale": ("fsdp",), "mlp_norm.scale": ("fsdp",),
        "q_proj.kernel": ("fsdp", "tensor", None), "k_proj.kernel": ("fsdp", "tensor", None),
        "v_proj.kernel": ("fsdp", "tensor", None), "o_proj.kernel": ("tensor", None, "fsdp"),
        "wi_0.kernel": ("fsdp", "tensor"), "wi_1.kernel": ("fsdp", "tensor"),
        "wo.kernel": ("tensor", "fsdp")},
}
RULES["seq_mixer"] = RULES["mlp"]
RULES["llm"] = {**RULES["transformer"],
                "embed.embedding": ("tensor", "fsdp"), "lm_head.kernel": ("fsdp", "tensor"),
                "final_norm.scale": ("fsdp",),
                # a mixture of experts (model/moe.py): the router over fsdp; each expert's gated MLP
                # as the dense one's, its width over fsdp alone ("fsdp_no_exp", MaxText's
                # embed_no_exp) and its leading expert axis over expert; shared experts' three
                # projections as wi_0, wi_1, wo
                "moe.gate": ("fsdp", None), "moe.wi_0": ("expert", "fsdp_no_exp", "tensor"),
                "moe.wi_1": ("expert", "fsdp_no_exp", "tensor"),
                "moe.wo": ("expert", "tensor", "fsdp_no_exp"),
                "shared.0.kernel": ("fsdp", "tensor"), "shared.1.kernel": ("fsdp", "tensor"),
                "shared.2.kernel": ("tensor", "fsdp")}

RULES_TEXT = (
    "`data` and `fsdp` shard the batch. `fsdp` shards every parameter along its width axis; each "
    "block gathers its parameters for use inside its remat, so the policy decides whether the "
    "backward pass gathers them again. `tensor` shards the output features of the first projection "
    "(mlp `l1`; transformer q/k/v heads, `wi_0`, `wi_1`) and the input features of the second "
    "(`l2`; `o_proj`'s heads, `wo`), Megatron style. A scan stack's layer axis is never sharded. The "
    "llm as MaxText: its embedding and vocabulary projection split the width over `fsdp` and the "
    "vocabulary over `tensor`. A mixture of experts' experts are split as the dense MLP; `expert` "
    "splits the experts themselves (XLA's partitioner moves the dispatched tokens to them by "
    "all-to-all) and, outside them, the batch and the parameters as `fsdp` does (MaxText's rules). "
    "AdamW's moments are laid out like their parameters.")


# A rule's role -> the mesh axes it shards over: "fsdp" over fsdp and expert (MaxText's ``embed``:
# outside the experts the expert axis shards parameters as fsdp does), "fsdp_no_exp" over fsdp
# alone (an expert's own width), "expert" over expert (the experts themselves, kept for use).
_ROLE_AXES = {"fsdp": ("fsdp", "expert"), "fsdp_no_exp": ("fsdp",), "tensor": ("tensor",),
              "expert": ("expert",)}
_GATHERED = ("fsdp", "fsdp_no_exp")  # gathered for use inside a block's remat


def _axis(role, sizes: dict[str, int], use: bool):
    """A rule's role -> the PartitionSpec entry on this mesh (``use``: fsdp-like roles gathered away)."""
    roles = role if isinstance(role, tuple) else (role,)
    names = tuple(n for r in roles if r is not None and not (use and r in _GATHERED)
                  for n in _ROLE_AXES[r] if n in sizes)
    return None if not names else names[0] if len(names) == 1 else names


def block_spec(model: str, name: str, sizes: dict[str, int], *, use: bool = False) -> PartitionSpec:
    """The spec of block parameter ``name`` (e.g. ``'l1.kernel'``) on a mesh of ``sizes``; with
    ``use`` the layout a block computes with (fsdp gathered, tensor kept)."""
    return PartitionSpec(*(_axis(r, sizes, use) for r in RULES[model][name]))


def _in_block(path: str) -> str:
    """``'blocks.3.l1.kernel'`` / ``'blocks.l1.kernel'`` / ``'l1.kernel'`` -> ``'l1.kernel'``; a
    list's member keeps its index (``'blocks.moe.shared.0.kernel'`` -> ``'shared.0.kernel'``)."""
    parts = path.split(".")
    return ".".join(parts[-3:] if len(parts) > 2 and parts[-2].isdigit() else parts[-2:])


def _path(keys) -> str:
    parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in keys]
    return ".".join(p for p in parts if p not in ("value", ""))


def annotate(state, config: RunConfig):
    """``state`` (an NNX State of Params) with each Variable's ``out_sharding`` metadata set by
    the rules, as ``nnx.with_partitioning`` would have set it at initialisation."""
    sizes = parse_mesh(config.mesh)

    def one(keys, var):
        spec = tuple(block_spec(config.model, _in_block(_path(keys)), sizes))
        lead = (None,) * (len(var.shape) - len(spec))  # a scan stack's layer axis
        return var.replace(out_sharding=lead + spec)

    return jax.tree.map_with_path(one, state, is_leaf=lambda v: isinstance(v, nnx.Variable))


def param_specs(state, config: RunConfig) -> list[PartitionSpec]:
    """Every parameter leaf's spec, in ``jax.tree.leaves(state)`` order, read from NNX metadata."""
    specs = nnx.get_partition_spec(annotate(state, config))
    return jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, PartitionSpec))


def state_specs(state, leaves, specs) -> object:
    """The optimizer state's specs (a tree like ``state``): a leaf under list index ``i`` with
    parameter ``i``'s shape (AdamW's moments) takes its spec; the rest (the count) is replicated."""
    specs = list(specs)

    def one(keys, leaf):
        idx = [k.idx for k in keys if isinstance(k, jax.tree_util.SequenceKey)]
        i = idx[-1] if len(idx) > 1 else -1
        if 0 <= i < len(specs) and tuple(leaf.shape) == tuple(leaves[i].shape):
            return specs[i]
        return PartitionSpec()

    return jax.tree_util.tree_map_with_path(one, state)


def input_spec(config: RunConfig) -> PartitionSpec:
    """The input's batch axis over ``data``, ``fsdp`` and ``expert`` (those present); the rest
    replicated."""
    rows = tuple(a for a in BATCH_AXES if a in parse_mesh(config.mesh))
    lead = None if not rows else rows[0] if len(rows) == 1 else rows
    return PartitionSpec(lead, *(None,) * (len(config.input_shape) - 1))


def build_mesh(mesh: str, devices: list | None = None) -> Mesh:
    """The ``Mesh`` of ``mesh`` (``'fsdp=4'``) over the first devices (of ``devices``, when given:
    a target's compile-only devices); ``ConfigError`` when the devices are too few or the mesh does
    not divide them. A mesh with ``dcn_*`` axes (over several slices or hosts: ``devices`` in
    slice order) is laid out as MaxText lays it (``hybrid``)."""
    sizes = parse_mesh(mesh)
    if devices is not None and mesh_slices(mesh) > 1:
        return Mesh(hybrid(mesh, devices), tuple(sizes))
    if devices is not None:
        return Mesh(np.array(devices[:mesh_devices(mesh)]).reshape(tuple(sizes.values())), tuple(sizes))
    need, have = mesh_devices(mesh), jax.device_count()
    if need > have or have % need:
        hint = ("start with --host-devices N (or REMAT_LAB_HOST_DEVICES=N) to emulate N CPU devices"
                if jax.default_backend() == "cpu" else "choose a mesh that fits the devices")
        what = "needs" if need > have else "does not divide"
        raise ConfigError(f"mesh {mesh} {what} {need} devices; this run has {have} "
                          f"{jax.default_backend()} device{'s' * (have != 1)}: {hint}.")
    devices = np.array(jax.devices()[:need]).reshape(tuple(sizes.values()))
    return Mesh(devices, tuple(sizes))


def hybrid(mesh: str, devices: list) -> np.ndarray:
    """The devices of a mesh over several slices (TPU: each device's ``slice_index``) or hosts
    (GPU: its ``process_index``), shaped as ``parse_mesh(mesh)``: each logical axis is its dcn part
    (outermost: which slice) times its ICI part (within the slice), MaxText's layout, by
    ``jax.experimental.mesh_utils.create_hybrid_device_mesh`` (within a slice, on TPU, the ring
    order of the chips' coordinates)."""
    from jax.experimental import mesh_utils

    from remat_lab.program.targets import granule

    ici, dcn = mesh_parts(mesh)
    ici_shape = tuple(ici.get(a, 1) for a in MESH_AXES)
    dcn_shape = tuple(dcn.get(a, 1) for a in MESH_AXES)
    per_slice, slices = int(np.prod(ici_shape)), int(np.prod(dcn_shape))
    by_slice: dict[int, list] = {}
    for d in devices:
        by_slice.setdefault(granule(d), []).append(d)
    groups = [g[:per_slice] for _, g in sorted(by_slice.items()) if len(g) >= per_slice][:slices]
    if len(groups) < slices:
        raise ConfigError(f"mesh {mesh} needs {slices} slices or hosts of {per_slice} devices; "
                          f"the target's devices make {len(groups)}.")
    chosen = [d for g in groups for d in g]
    tpu = getattr(chosen[0], "platform", "") == "tpu"
    try:
        laid = mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape, chosen,
                                                    process_is_granule=not tpu,
                                                    allow_split_physical_axes=True)
    except (ValueError, NotImplementedError, AssertionError):  # a shape the ring order cannot take
        blocks = np.empty(dcn_shape, dtype=object)
        for i, g in enumerate(groups):
            blocks[np.unravel_index(i, dcn_shape)] = np.array(g).reshape(ici_shape)
        laid = np.block(blocks.tolist())
    return laid.reshape(tuple(parse_mesh(mesh).values()))


def granules(mesh: Mesh | None) -> list[int] | None:
    """Each device's slice or host (``targets.granule``), in the mesh's order: the program's logical
    device ids (a ``NamedSharding``'s device assignment is the mesh's devices, flat)."""
    if mesh is None:
        return None
    from remat_lab.program.targets import granule

    return [granule(d) for d in mesh.devices.flat]


def place(values: list[jax.Array], specs: list[PartitionSpec], mesh: Mesh) -> list[jax.Array]:
    """Global arrays of ``values`` laid out by ``specs``; each process fills only the shards its
    own devices hold (the values are generated from the seed in every process)."""
    out = []
    for value, spec in zip(values, specs):
        host = np.asarray(value)
        out.append(jax.make_array_from_callback(host.shape, NamedSharding(mesh, spec),
                                                lambda idx, host=host: host[idx]))
    return out


def gathered(config: RunConfig, mesh: Mesh) -> Callable[[nnx.Module], nnx.Module]:
    """``block -> a copy of it whose parameters are laid out for use`` (fsdp gathered): called
    inside the block's remat, so the all-gathers belong to the rematerialised computation."""
    sizes = parse_mesh(config.mesh)

    def gather(block: nnx.Module) -> nnx.Module:
        graphdef, state = nnx.split(block)

        def one(keys, value):
            spec = block_spec(config.model, _in_block(_path(keys)), sizes, use=True)
            return jax.lax.with_sharding_constraint(value, NamedSharding(mesh, spec))

        return nnx.merge(graphdef, jax.tree.map_with_path(one, state))

    return gather


def activations(config: RunConfig, mesh: Mesh) -> Callable[[jax.Array], jax.Array]:
    """``x -> x`` constrained to its batch axis over data x fsdp and its last axis over tensor (a
    block's input and output: the width, MaxText's ``activation_embed`` -> ``tensor``; the
    logits: their vocabulary, ``activation_vocab``), as MaxText constrains its activations. Without
    it XLA's propagation may follow the fsdp-sharded embedding and give every device whole batches,
    and every tensor device holds a block's whole input. (XLA 0.12 still all-gathers the whole
    batch's gradient for the embedding's own gradient, a scatter-add into the table:
    tests/test_llm_mesh.py.)"""
    rows, sizes = input_spec(config)[0], parse_mesh(config.mesh)
    tensor = sizes.get("tensor", 1)

    def constrain(x: jax.Array) -> jax.Array:
        last = "tensor" if tensor > 1 and x.shape[-1] % tensor == 0 else None
        spec = PartitionSpec(rows, *(None,) * (x.ndim - 2), last)
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    return constrain


def expert_layout(config: RunConfig, mesh: Mesh) -> ExpertLayout | None:
    """``(x, where) -> x`` for a mixture of experts' dispatched values ``(E, B, C, ...)`` on a mesh
    with an expert axis, as MaxText's dense dispatch lays them out: ``"tokens"``, with the tokens
    they came from (every expert, the batch over data x fsdp x expert: computed where the tokens
    are); ``"experts"``, with their experts (the experts over ``expert``, the batch over data x
    fsdp: MaxText's ``activation_exp``, ``activation_batch_no_exp``). One after the other they are
    an all-to-all over the expert axis, each way. Without them XLA's partitioner gathered the
    experts' weights to the tokens instead (an all-gather of every expert's weights and a
    reduce-scatter of their gradients on each block) and, with only the second, gathered a whole
    batch's combined output (40 GiB a device on Mixtral 8x7B over 256 GPUs). None without an
    expert axis. The grouped dispatch: ``grouped_on_devices``."""
    if config.moe_dispatch == "grouped":
        return grouped_on_devices(config, mesh)
    sizes = parse_mesh(config.mesh)
    if "expert" not in sizes:
        return None
    rows = tuple(a for a in ("data", "fsdp") if a in sizes)
    lead = None if not rows else rows[0] if len(rows) == 1 else rows
    every = input_spec(config)[0]

    def constrain(x: jax.Array, where: str) -> jax.Array:
        spec = (PartitionSpec("expert", lead, *(None,) * (x.ndim - 2)) if where == "experts"
                else PartitionSpec(None, every, *(None,) * (x.ndim - 2)))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    return constrain


def grouped_on_devices(config: RunConfig, mesh: Mesh) -> ExpertLayout | None:
    """``(fn, h, weights, idx, wi_0, wi_1, wo) -> fn(...)`` run on each device's own tokens, as
    MaxText's ``sparse_matmul`` runs in a ``shard_map``: the tokens and their routing split over the
    batch axes (data x fsdp x expert, ``input_spec``), the experts' weights whole on every device
    (gathered as FSDP gathers a dense MLP's; their gradients all-reduced back, whole on every
    device: not yet MaxText's all-to-all of the tokens to their experts' devices). Each device sorts its
    tokens by expert and multiplies them with ``ragged_dot``: no sort or product across devices
    (under XLA's partitioner alone a sort of the whole batch gathers every token). None without a
    batch axis."""
    rows = input_spec(config)[0]
    if rows is None:
        return None
    split, whole = PartitionSpec(rows, None, None), PartitionSpec()

    def run(fn: Callable, *args: jax.Array) -> jax.Array:
        return jax.shard_map(fn, mesh=mesh, in_specs=(split,) * 3 + (whole,) * 3, out_specs=split,
                             check_vma=False)(*args)

    return run


def jit_step(problem, step: Callable) -> Callable:
    """``jax.jit(step)`` with explicit shardings: parameters and gradients by the rules, the
    input by ``input_spec``, the loss replicated."""
    mesh, specs = problem.mesh, problem.specs
    params = [NamedSharding(mesh, s) for s in specs]
    x = NamedSharding(mesh, input_spec(problem.config))
    out = params if problem.config.objective == "grad" else (NamedSharding(mesh, PartitionSpec()), params)
    return jax.jit(step, in_shardings=(params, x), out_shardings=out)


def jit_train(problem, step: Callable) -> Callable:
    """The training step ``(leaves, opt_state, x) -> (loss, leaves, opt_state)`` jitted with
    explicit shardings (parameters and state by the rules, both donated), the loss replicated."""
    mesh = problem.mesh
    named = lambda tree: jax.tree.map(lambda s: NamedSharding(mesh, s), tree,
                                      is_leaf=lambda s: isinstance(s, PartitionSpec))
    params, state = named(list(problem.specs)), named(
        state_specs(problem.opt_state, problem.leaves, problem.specs))
    x = NamedSharding(mesh, input_spec(problem.config))
    if problem.config.optimizer_offload:  # MaxText's optimizer_memory_host_offload
        step, state = offloaded_state(step, state), host_memory(state)
    return jax.jit(step, in_shardings=(params, state, x), donate_argnums=(0, 1),
                   out_shardings=(NamedSharding(mesh, PartitionSpec()), params, state))


def host_memory(shardings):
    """``shardings`` in the host's pinned memory (the same layout over the same devices)."""
    return jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), shardings)


def offloaded_state(step: Callable, device_shardings) -> Callable:
    """The training step with its optimizer state held in pinned host memory between steps: moved
    to the device (``device_shardings``) for the update and back after it, as MaxText does with
    ``optimizer_memory_host_offload``."""
    host = host_memory(device_shardings)

    def offloaded(leaves, opt_state, x):
        loss, leaves, opt_state = step(leaves, jax.device_put(opt_state, device_shardings), x)
        return loss, leaves, jax.device_put(opt_state, host)

    return offloaded


def to_host(tree):
    """Every array of ``tree`` as a whole NumPy array in this process (gathered from all
    processes when the run spans several)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.tree.map(np.asarray, tree)


def shard_shape(leaf: jax.Array) -> tuple[int, ...]:
    """The shape of one device's shard of ``leaf``."""
    return tuple(leaf.sharding.shard_shape(leaf.shape))

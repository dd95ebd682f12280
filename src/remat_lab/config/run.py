"""The frozen configuration of one experiment: its fields, validation, mesh text and parsing.

Everything here runs before JAX allocates anything: a configuration that is malformed or too
large is refused with a ``ConfigError`` (a ``ValueError``) whose message says what is allowed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .catalog import (
    DEFAULT_POLICY,
    DENSE,
    MODELS,
    POLICY_IDS,
    PRESET_FIELDS,
    PRESET_NAMES,
    PRESETS,
    RECIPE,
    STACKS,
    USER_MODEL,
    names_of,
)
from .errors import ConfigError, MemoryBudgetError, UserCodeError  # noqa: F401 (their home: errors.py)
from .mesh_text import (  # noqa: F401 (re-exported: the mesh text's home is mesh_text.py)
    MAX_MESH_DEVICES,
    MESH_AXES,
    _show,
    batch_axes_text,
    batch_rows,
    canonical_mesh,
    format_mesh,
    mesh_devices,
    mesh_slices,
    parse_mesh,
)
from .moe_config import FLOAT_LIMITS, ROUTER_GATINGS, check_expert_axis, check_moe, checked_float  # noqa: F401
from .targets import GPUS_PER_HOST, LOCAL, MAX_TARGET_DEVICES, TARGET_NAMES, TARGETS, check_network
from .userblock import checked_input_shape

DTYPES = ("float32", "bfloat16")
OBJECTIVES = ("value_and_grad", "grad")
STEPS = ("grad", "train")  # the objective's gradient step, or a whole optax.adamw training step
PARAM_DTYPES = ("", *DTYPES)  # "" = the compute dtype
OPTIMIZER_DTYPES = ("", *DTYPES)  # AdamW's two moments; "" = the parameters' dtype
# The llm's attention: "full" materializes the (seq x seq) scores; "chunked" is blockwise with an
# online softmax in plain JAX (memory linear in seq); "flash" the target's fused kernel where it
# compiles (cuDNN on GPUs, Pallas on TPUs), else chunked, said so.
ATTENTIONS = ("full", "chunked", "flash")
BOOL_FIELDS = ("tie_embeddings", "compile_only", "optimizer_offload")
BUDGET_ENV = "REMAT_LAB_MEMORY_BUDGET"

# name -> (lowest, highest) for the integer fields.
LIMITS = {
    "width": (1, 16384),
    "batch": (0, 65536),
    "seq": (1, 4096),
    "heads": (1, 256),
    "depth": (1, 16),
    "vocab": (2, 262144),
    "kv_heads": (0, 256),  # 0 = heads (multi-head attention)
    "head_dim": (0, 1024),  # 0 = width // heads
    "mlp_dim": (0, 131072),  # 0 = 4 * width
    "microbatches": (1, 1024),
    "attention_block": (16, 8192),  # chunked attention's query and key block (tokens)
    "loss_chunks": (1, 1024),  # the vocabulary loss computed over this many sequence chunks
    "repeats": (1, 1000),
    "warmup": (0, 100),
    "seed": (0, 2**31 - 1),
    "target_devices": (1, MAX_TARGET_DEVICES),
    "remat_layers": (0, 128),  # the first N of the depth blocks remat'd, the rest saved whole; 0 = all
    "experts": (0, 256),  # llm: routed experts per block; 0 = the dense gated MLP
    "experts_per_token": (1, 64),  # llm, experts > 0: the router's top k
    "expert_mlp_dim": (0, 131072),  # llm, experts > 0: each expert's hidden size; 0 = mlp_dim
    "shared_experts": (0, 8),  # llm, experts > 0: experts every token also goes through
}
# The llm's own ranges (published shapes: 32 blocks, 8192 tokens and more); the others keep LIMITS.
LLM_LIMITS = {"seq": (1, 32768), "depth": (1, 128)}
CHOICES = {
    "model": MODELS, "stack": STACKS, "dtype": DTYPES, "policy": POLICY_IDS, "objective": OBJECTIVES,
    "target": TARGET_NAMES, "param_dtype": PARAM_DTYPES, "optimizer_dtype": OPTIMIZER_DTYPES,
    "attention": ATTENTIONS, "step": STEPS, "preset": PRESET_NAMES, "router_gating": ROUTER_GATINGS,
}


NAME_FIELDS = ("save_names", "offload_names")  # the custom policy's per-tensor choices


def _names_tuple(field: str, value: object) -> tuple[str, ...]:
    """``value`` (a tuple, list or comma-separated string of names) as a tuple of names."""
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, tuple | list) or not all(isinstance(n, str) for n in value):
        raise ConfigError(f"{field} must be checkpoint names separated by commas, not {_show(value)}.")
    return tuple(n.strip() for n in value if n.strip())


@dataclass(frozen=True)
class RunConfig:
    """One experiment. ``batch = 0`` means the seed's single vector ``x: (width,)`` (mlp only).

    ``seq`` is used by ``seq_mixer`` and ``transformer`` only (``x: (batch, seq, width)``), ``heads``
    by ``transformer`` only (it must divide ``width``). ``save_names``/``offload_names``: policy
    ``custom``'s choice per ``checkpoint_name`` of the model (the rest is recomputed). ``stack``:
    how ``depth`` blocks are run when depth > 1: ``scan`` over layers stacked on a leading axis (the
    default, as production code does) or an unrolled Python ``loop`` (see ``stacks.py``).
    """

    model: str = "mlp"
    width: int = 256
    batch: int = 64
    seq: int = 16
    heads: int = 4
    depth: int = 1
    stack: str = "scan"
    dtype: str = "float32"
    policy: str = DEFAULT_POLICY
    save_names: tuple[str, ...] = ()
    offload_names: tuple[str, ...] = ()
    objective: str = "value_and_grad"
    repeats: int = 20
    warmup: int = 3
    seed: int = 0
    mesh: str = ""  # "" = one device; else e.g. "data=2,tensor=2" (see parse_mesh, program/mesh.py)
    target: str = LOCAL  # "local": the attached backend, run and timed; else compiled for (targets.py)
    target_devices: int = 1  # devices of the target the program is placed on (the mesh's, if any)
    network: str = ""  # a GPU target's host network (targets.json "networks"; "" = its default)
    collective_overlap: str = ""  # a TPU's collectives beside its kernels (COLLECTIVE_OVERLAPS)
    # The decoder LM (model "llm"; other models ignore these): vocabulary, grouped-query attention
    # (kv_heads key/value heads shared by heads // kv_heads query heads each; 0 = heads), head size
    # (0 = width // heads), the gated MLP's hidden size (0 = 4 * width), whether the vocabulary
    # projection is the embedding's transpose.
    vocab: int = 512
    kv_heads: int = 0
    head_dim: int = 0
    mlp_dim: int = 0
    tie_embeddings: bool = False
    param_dtype: str = ""  # the master weights (and, by default, optimizer state); "" = dtype
    optimizer_dtype: str = ""  # AdamW's moments (optax's mu_dtype and the second moment); "" = params'
    attention: str = "full"  # llm: full | chunked | flash (ATTENTIONS)
    attention_block: int = 512  # llm, attention chunked (and flash's fallback): block size, tokens
    loss_chunks: int = 1  # llm: the vocabulary loss over this many sequence chunks (1 = whole)
    step: str = "grad"  # "grad": the objective; "train": value_and_grad + optax.adamw, donated
    microbatches: int = 1  # gradient accumulation over this many microbatches (lax.scan)
    preset: str = ""  # the published shape the llm fields came from (PRESETS), "" = none
    compile_only: bool = False  # abstract parameters, state and input: compiled, never allocated
    model_module: str = ""  # model "user": the factory of the user's block (config/userblock.py)
    input_shape: tuple[int, ...] = ()  # derived for built-in models; the user block's, batch first
    remat_layers: int = 0  # the first N of the depth blocks remat'd, the rest saved whole; 0 = all
    # step train on a named target: AdamW's state kept in pinned host memory between steps and
    # brought to the device for the update (MaxText's optimizer_memory_host_offload)
    optimizer_offload: bool = False
    # A mixture of experts (llm; model/moe.py): each block's MLP replaced by a router over
    # ``experts`` gated MLPs of hidden size expert_mlp_dim (0 = mlp_dim), each token sent to its top
    # experts_per_token, plus shared_experts every token goes through. capacity_factor: an expert
    # takes at most ceil(tokens * k / experts * factor) tokens of a sequence, the rest dropped
    # (MaxText's dense dispatch); 0 = dropless. load_balance_loss_weight: the auxiliary loss's
    # coefficient in the gradient (MaxText's default 0).
    experts: int = 0
    experts_per_token: int = 2
    expert_mlp_dim: int = 0
    shared_experts: int = 0
    capacity_factor: float = 0.0
    router_gating: str = "softmax"
    load_balance_loss_weight: float = 0.0

    @classmethod
    def from_preset(cls, name: str, **overrides) -> RunConfig:
        """The llm of preset ``name`` (``PRESETS``), with ``overrides`` (explicit values win), in
        the ``RECIPE`` dtypes: a dtype field given replaces that field only."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {_show(name)}; choose one of: {', '.join(PRESETS)}.")
        return cls(**{"model": "llm", **preset_fields(name), **RECIPE, **overrides, "preset": name})

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in NAME_FIELDS or f.name in ("mesh", "model_module", "input_shape", "network",
                                                         "collective_overlap") or (
                    f.name == "model" and value == USER_MODEL):
                continue  # checked below, once model, policy and sizes are known
            if f.name in BOOL_FIELDS:
                if not isinstance(value, bool):
                    raise ConfigError(f"{f.name} must be true or false, not {_show(value)}.")
                continue
            if f.name in FLOAT_LIMITS:
                object.__setattr__(self, f.name, checked_float(f.name, value))
                continue
            if f.name in LIMITS:
                lo, hi = (LLM_LIMITS if self.model == "llm" else LIMITS).get(f.name, LIMITS[f.name])
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ConfigError(f"{f.name} must be a whole number from {lo} to {hi}, "
                                      f"not {_show(value)}.")
                if not lo <= value <= hi:
                    raise ConfigError(f"{f.name} must be from {lo} to {hi}; got {_show(value)}.")
            else:
                allowed = CHOICES[f.name]
                if value not in allowed:
                    raise ConfigError(f"unknown {f.name} {_show(value)}; choose one of: "
                                      f"{', '.join(allowed)}.")
        if self.batch == 0 and self.model != "mlp":
            raise ConfigError("batch 0 (a single vector) is only for the mlp model; "
                              f"use a batch of 1 or more for {self.model}.")
        if self.model == "transformer" and self.width % self.heads:
            raise ConfigError(f"width {self.width} is not divisible by heads {self.heads}; the "
                              "transformer splits width into heads of equal size.")
        if self.remat_layers > self.depth:
            raise ConfigError(f"remat_layers {self.remat_layers} is more than the depth {self.depth}; "
                              f"remat from 1 to {self.depth} of the blocks (0 = all of them).")
        self._check_llm()
        check_moe(self)
        self._check_step()
        self._check_names()
        object.__setattr__(self, "input_shape", checked_input_shape(self))
        self._check_mesh()
        self._check_target()

    def _check_llm(self) -> None:
        """The decoder LM's shape: heads split into kv_heads groups, an even head size (rotary
        embedding), two tokens at least (next-token labels); a preset, attention other than full
        and loss_chunks above 1 only for the llm. A seq that attention_block or loss_chunks does
        not divide is padded; more chunks than tokens are one token each (llm.py, attention.py)."""
        if self.preset and self.model != "llm":
            raise ConfigError(f"preset {self.preset} is a decoder LM: use model llm (e.g. "
                              f"RunConfig.from_preset({self.preset!r})), or no preset.")
        if self.model != "llm":
            if (self.attention, self.loss_chunks) != ("full", 1):
                raise ConfigError(f"attention {self.attention} and loss_chunks {self.loss_chunks} are "
                                  "the llm's; other models use attention full and loss_chunks 1.")
            return
        if self.seq < 2:
            raise ConfigError("the llm predicts each next token: it needs seq of 2 or more.")
        if self.heads % self.kv_heads_used:
            raise ConfigError(f"heads {self.heads} is not divisible by kv_heads {self.kv_heads}; "
                              "each key/value head serves an equal group of query heads.")
        if not self.head_dim and self.width % self.heads:
            raise ConfigError(f"width {self.width} is not divisible by heads {self.heads}; set "
                              "head_dim, or a width that heads divides.")
        if self.head_dim_used % 2:
            raise ConfigError(f"head size {self.head_dim_used} is odd; the rotary position "
                              "embedding rotates pairs of features, so it must be even.")

    def _check_step(self) -> None:
        """Training steps and microbatches against the objective and batch (the mesh: ``_check_mesh``)."""
        if self.step == "train" and self.objective != "value_and_grad":
            raise ConfigError("step train computes the loss and its gradients (value_and_grad) "
                              "and updates with adamw; objective grad is for step grad.")
        if self.microbatches > 1 and (self.batch == 0 or self.batch % self.microbatches):
            raise ConfigError(f"batch {self.batch} cannot be split into {self.microbatches} equal "
                              f"microbatches; use a batch that is a multiple of {self.microbatches}.")
        if self.optimizer_offload and (self.step != "train" or self.target == LOCAL):
            raise ConfigError("optimizer_offload keeps AdamW's state in the host's pinned memory: it "
                              "needs step train and a named GPU or TPU target (--target), whose "
                              "host memory the compiler knows.")
        if self.param_dtype and self.param_dtype != self.dtype and self.model not in ("llm",):
            raise ConfigError(f"param_dtype differs from dtype only for the llm; {self.model} keeps "
                              "its parameters in its dtype.")

    def _check_target(self) -> None:
        """A named target holds the mesh's devices (or one); ``local`` uses the attached ones."""
        devices = mesh_devices(self.mesh)
        if self.target == LOCAL and self.target_devices != 1:
            raise ConfigError("target_devices is for a named target (e.g. h100); on the local "
                              "backend the mesh decides the devices.")
        if self.target != LOCAL and self.target_devices != devices:
            raise ConfigError(f"{self.target_devices} {self.target} devices need a mesh over all of "
                              f"them (e.g. fsdp={self.target_devices}); the mesh "
                              f"{self.mesh or '(none)'} uses {devices}.")
        check_network(self.target, self.network, self.collective_overlap)
        slices = mesh_slices(self.mesh)
        if slices > 1 and TARGETS[self.target].platform == "cuda" and devices // slices > GPUS_PER_HOST:
            raise ConfigError(f"mesh {self.mesh} puts {devices // slices} GPUs in each of its {slices} "
                              f"hosts; a {self.target} host has {GPUS_PER_HOST} (NVLink within it): "
                              "move the rest to a dcn_ axis (e.g. dcn_data=4,fsdp=8).")

    def _check_mesh(self) -> None:
        """``mesh``: known axes whose sizes divide what they shard; stored canonically
        (``parse_mesh``), so equal meshes make equal configurations."""
        sizes = parse_mesh(self.mesh)
        object.__setattr__(self, "mesh", canonical_mesh(self.mesh))
        if mesh_slices(self.mesh) > 1 and self.target == LOCAL:
            raise ConfigError(f"mesh {self.mesh} spans slices or hosts (its dcn_* axes), which only "
                              "a named target has (e.g. --target tpu-v6e or h100): the attached "
                              "devices are one slice; on them use the same sizes without dcn_ "
                              "(dcn_data=2,fsdp=4 -> data=2,fsdp=4).")
        rows, axes = batch_rows(sizes), batch_axes_text(sizes)
        if rows > 1 and (self.batch == 0 or self.batch % rows):
            raise ConfigError(f"batch {self.batch} cannot be split over {axes} = {rows} devices; "
                              f"use a batch that is a multiple of {rows}.")
        if rows > 1 and self.microbatches > 1 and (self.batch // self.microbatches) % rows:
            raise ConfigError(f"each of the {self.microbatches} microbatches of batch {self.batch} "
                              f"is split over {axes} = {rows} devices; use a batch that is a "
                              f"multiple of {self.microbatches * rows}.")
        tensor, fsdp, expert = sizes.get("tensor", 1), sizes.get("fsdp", 1), sizes.get("expert", 1)
        check_expert_axis(self, expert)
        if self.model == "llm":
            self._check_llm_mesh(fsdp, tensor, expert)
        elif self.width % (tensor * fsdp):
            raise ConfigError(f"width {self.width} cannot be split over fsdp x tensor = {fsdp * tensor} "
                              f"devices; use a width that is a multiple of {fsdp * tensor}.")
        if self.model == "transformer" and self.heads % tensor:
            raise ConfigError(f"heads {self.heads} cannot be split over tensor = {tensor} devices; "
                              f"use a number of heads that is a multiple of {tensor}.")

    def _check_llm_mesh(self, fsdp: int, tensor: int, expert: int = 1) -> None:
        """The llm split as ``program/mesh.py`` says: width over fsdp (x expert, as fsdp outside the
        experts); heads, kv_heads, mlp, vocab over tensor."""
        t = ("tensor", tensor)
        width = ("fsdp x expert", fsdp * expert) if expert > 1 else ("fsdp", fsdp)
        for name, size, (axis, n) in (("width", self.width, width), ("heads", self.heads, t),
                                      ("kv_heads", self.kv_heads_used, t),
                                      ("mlp_dim", self.mlp_dim_used, t), ("vocab", self.vocab, t)):
            if size % n:
                raise ConfigError(f"{name} {size} cannot be split over {axis} = {n} devices; use "
                                  f"{name} a multiple of {n}, or a smaller {axis} axis.")

    def _check_names(self) -> None:
        """``save_names``/``offload_names``: names of this model, only for policy custom, disjoint;
        stored as tuples in the model's order (so equal choices make equal configurations)."""
        given = {f: _names_tuple(f, getattr(self, f)) for f in NAME_FIELDS}
        if self.policy != "custom":
            if any(given.values()):
                raise ConfigError("save_names and offload_names are only for policy custom; "
                                  f"policy {self.policy} decides by itself.")
            return
        known = (names_of(self.model, self.experts)  # the user's block: the names given
                 or tuple(sorted({n for v in given.values() for n in v})))
        for f, names in given.items():
            unknown = [n for n in names if n not in known]
            if unknown:
                raise ConfigError(f"{f}: {_show(unknown[0])} is not a checkpoint name of "
                                  f"{self.model}; its names: {', '.join(known)}.")
        both = [n for n in known if n in given["save_names"] and n in given["offload_names"]]
        if both:
            raise ConfigError(f"{both[0]} is in both save_names and offload_names; a tensor is "
                              "either saved on the device or offloaded to the host.")
        for f, names in given.items():
            object.__setattr__(self, f, tuple(n for n in known if n in names))

    def replace(self, **changes) -> RunConfig:
        """A copy with ``changes`` applied (validated again). Moving to a policy other than custom
        drops custom's names (a no_remat baseline or a comparison of policies needs no names)."""
        if changes.get("policy", "custom") != "custom":
            changes = {"save_names": (), "offload_names": (), **changes}
        if self.model == USER_MODEL and "batch" in changes and "input_shape" not in changes:
            changes["input_shape"] = (changes["batch"], *self.input_shape[1:])  # its first axis
        return RunConfig(**{**asdict(self), **changes})

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def kv_heads_used(self) -> int:
        """Key/value heads: ``kv_heads``, or ``heads`` when 0."""
        return self.kv_heads or self.heads

    @property
    def head_dim_used(self) -> int:
        """The attention head size: ``head_dim``, or ``width // heads`` when 0."""
        return self.head_dim or self.width // self.heads

    @property
    def mlp_dim_used(self) -> int:
        """The gated MLP's hidden size: ``mlp_dim``, or ``4 * width`` when 0."""
        return self.mlp_dim or 4 * self.width

    @property
    def expert_mlp_dim_used(self) -> int:
        """Each expert's hidden size: ``expert_mlp_dim``, or ``mlp_dim_used`` when 0."""
        return self.expert_mlp_dim or self.mlp_dim_used

    @property
    def param_dtype_used(self) -> str:
        """The parameters' (master weights') dtype: ``param_dtype``, or ``dtype`` when ""."""
        return self.param_dtype or self.dtype

    @property
    def optimizer_dtype_used(self) -> str:
        """AdamW's moments' dtype: ``optimizer_dtype``, or the parameters' when ""."""
        return self.optimizer_dtype or self.param_dtype_used

    @property
    def preset_overrides(self) -> dict:
        """The preset's fields this configuration changes: ``{field: (preset's, this)}``."""
        if not self.preset:
            return {}
        return {k: (v, getattr(self, k)) for k, v in preset_fields(self.preset).items()
                if getattr(self, k) != v}


def preset_fields(name: str) -> dict:
    """The ``RunConfig`` fields preset ``name`` sets (``PRESET_FIELDS``)."""
    preset = {**DENSE, **PRESETS[name]}  # a preset added at run time may leave out the MoE fields
    return {k: preset[k] for k in PRESET_FIELDS}

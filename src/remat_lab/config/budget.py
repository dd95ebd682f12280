"""Memory budgets: the estimate of a configuration's bytes, budget parsing and the guard; human units.

Everything here runs before JAX allocates anything: an estimate over the budget is refused with a
``MemoryBudgetError`` whose message says what to lower.
"""

from __future__ import annotations

import math
import os

from remat_lab.config import limits

from .catalog import RECIPE_NAMES, SEQ_MODELS, USER_MODEL
from .moe_config import moe_activation_bytes
from .run import BUDGET_ENV, ConfigError, MemoryBudgetError, RunConfig
from .targets import LOCAL


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else 4


def llm_parameters(config: RunConfig, active: bool = False) -> int:
    """The llm's parameter count, from its shape (the model's own count: ``tests/test_presets.py``);
    a mixture of experts' router, experts and shared experts in place of the MLP. ``active``: those
    one token uses, ``experts_per_token`` of the experts (the rest as a whole)."""
    w, hd = config.width, config.head_dim_used
    attn = w * hd * (2 * config.heads + 2 * config.kv_heads_used)  # q, o; k, v
    if config.experts:  # the router; each routed and shared expert a gated MLP
        used = (config.experts_per_token if active else config.experts) + config.shared_experts
        mlp = w * config.experts + used * 3 * w * config.expert_mlp_dim_used
    else:
        mlp = 3 * w * config.mlp_dim_used
    block = attn + mlp + 2 * w  # two norm scales
    embed = config.vocab * w * (1 if config.tie_embeddings else 2)
    return config.depth * block + embed + w


def parameter_counts(config: RunConfig) -> dict[str, int]:
    """The llm's parameters from its shape: ``parameters`` (every one) and, for a mixture of
    experts, ``active_parameters`` (those one token uses); ``{}`` for the other models."""
    if config.model != "llm":
        return {}
    out = {"parameters": llm_parameters(config)}
    if config.experts:
        out["active_parameters"] = llm_parameters(config, active=True)
    return out


def human_count(n: float) -> str:
    """``8190726144`` -> ``'8.19 B'``, ``124439808`` -> ``'124.44 M'`` (parameters)."""
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def parameters_text(config: RunConfig) -> str:
    """The count in words: ``'8.19 B parameters'``; a mixture of experts' with its active ones,
    ``'30.53 B parameters, 3.35 B active (8 of 128 experts a token)'``; ``""`` for other models."""
    counts = parameter_counts(config)
    if not counts:
        return ""
    text = f"{human_count(counts['parameters'])} parameters"
    if "active_parameters" in counts:
        shared = f" and {config.shared_experts} shared" if config.shared_experts else ""
        text += (f", {human_count(counts['active_parameters'])} active ({config.experts_per_token} of "
                 f"{config.experts} experts{shared} a token)")
    return text


def llm_model_flops(config: RunConfig, causal: bool = True) -> float:
    """One training step's model flops as MaxText counts a decoder (``calculate_tflops_training_per_
    device``): 3 x (2 x tokens x the matrix weights one token uses: the attention projections, the
    MLP's, or a mixture of experts' router, k routed and the shared experts; the vocabulary
    projection) + 3 x attention (4 x tokens x seq x heads x head_dim a layer, halved when causal).
    The dispatch and combine products, and the capacity's empty slots, are not model flops."""
    tokens, w, hd = config.batch * config.seq, config.width, config.head_dim_used
    proj = w * hd * (2 * config.heads + 2 * config.kv_heads_used)
    if config.experts:
        mlp = w * config.experts + (config.experts_per_token + config.shared_experts) * 3 * w * (
            config.expert_mlp_dim_used)
    else:
        mlp = 3 * w * config.mlp_dim_used
    matmul = 2 * tokens * ((proj + mlp) * config.depth + w * config.vocab)
    attention = 4 * tokens * config.seq * config.heads * hd / (2 if causal else 1) * config.depth
    return 3 * (matmul + attention)


def mfu_model_flops(config: RunConfig, no_remat_flops: float | None, causal: bool = True
                    ) -> float | None:
    """MFU's numerator, one device's: for the llm MaxText's model flops (``llm_model_flops`` over
    the mesh's devices: the field's definition; ``causal=False``: attention the full square, as
    MaxText's published runs count), for other models no_remat's program's flops. The
    llm's no_remat program computes more (cuDNN's backward recomputes q k^T, a chunked loss runs
    each chunk's forward again: ``tests/test_flops_truth.py``): hardware work, not the model's."""
    if config.model != "llm":
        return no_remat_flops
    from .mesh_text import mesh_devices

    return llm_model_flops(config, causal) / mesh_devices(config.mesh)


def mfu_flops(config: RunConfig, no_remat_flops: float | None) -> dict:
    """Both MFU numerators as ``analysis.predict.rates`` takes them: ``model_flops`` (attention
    causal) and ``model_flops_full_attention`` (the full square; the llm only: no other model
    counts attention apart)."""
    full = mfu_model_flops(config, no_remat_flops, causal=False) if config.model == "llm" else None
    return {"model_flops": mfu_model_flops(config, no_remat_flops),
            "model_flops_full_attention": full}


def mfu_text(timing: dict) -> str | None:
    """The predicted MFU on both counts of attention, each named (a compile-only run's ``timing``),
    and where a published check's gives it the published MFU beside the figure on its own
    definition; None without a predicted MFU (or none on the full square: not the llm)."""
    if not (timing.get("predicted_mfu") and timing.get("predicted_mfu_full_attention")):
        return None
    text = (f"predicted {timing['predicted_mfu']:.2%} (attention causal, as MaxText counts today), "
            f"{timing['predicted_mfu_full_attention']:.2%} (attention the full square, as its "
            "published runs count)")
    if timing.get("published_mfu") and timing.get("predicted_mfu_as_published"):
        counted = ("the full square" if timing["published_mfu_definition"] ==
                   "predicted_mfu_full_attention" else "causal")
        text += (f"; published {timing['published_mfu']:.2%} (attention {counted}: its own count) "
                 f"against the predicted {timing['predicted_mfu_as_published']:.2%}")
    return text


def optimizer_state_bytes(config: RunConfig) -> int:
    """adamw's state for ``step="train"``: two moments per parameter in the optimizer's dtype
    (``optimizer_dtype_used``: the parameters' unless given; 0 for the gradient step)."""
    return 0 if config.step != "train" else 2 * _parameter_count(config) * _itemsize(
        config.optimizer_dtype_used)


def _parameter_count(config: RunConfig) -> int:
    if config.model == "llm":
        return llm_parameters(config)
    w, d = config.width, config.depth
    if config.model == "transformer":
        return d * (16 * w * w + 2 * w)
    return d * 2 * (w * w + w)


# What each policy keeps of an llm block for the backward, beside its input: ``None`` everything
# (no remat); "dots" every projection and attention's two batched products; the projections for
# dots_with_no_batch_dims (the llm's are its only unbatched products); a MaxText recipe's device
# names (``RECIPE_NAMES``; those it offloads stay on the host); nothing for the rest.
_PROJECTIONS = ("query_proj", "key_proj", "value_proj", "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
_SAVED = {
    "no_remat": None, "everything_saveable": None, "dots_saveable": "dots",
    "dots_with_no_batch_dims_saveable": _PROJECTIONS,
    **{pid: names for pid, names in RECIPE_NAMES.items() if not pid.endswith("_offloaded")},
}
# XLA's temporaries beside what the estimate names (the largest ratio of compiled peak to the named
# bytes over the llm presets on XLA CPU; tests/test_config.py holds the estimate within 1.5x).
_LLM_MARGIN = 1.05


def _name_elements(config: RunConfig) -> dict[str, int]:
    """Elements per token of each llm checkpoint name in one block."""
    hd, m = config.head_dim_used, config.mlp_dim_used
    q, kv = config.heads * hd, config.kv_heads_used * hd
    return {"query_proj": q, "key_proj": kv, "value_proj": kv, "context": q, "out_proj": config.width,
            "mlpwi_0": m, "mlpwi_1": m, "mlpwo": config.width}


def _llm_bytes(config: RunConfig) -> int:
    """The llm's estimate: parameters, their gradients and adamw's state (and the accumulated
    gradients with microbatches); what the policy keeps of each block between the forward and the
    backward (``_SAVED``: its names, or every activation without remat), one block's activations at
    once in the backward (the projections, the attention scores (full: (B, H, N, N); chunked or
    flash: (B, H, N, block)) and the MLP or the experts: ``moe_activation_bytes``, of one
    microbatch), and the logits (one of ``loss_chunks`` slices of the sequence) in the dtype with
    their float32 log-softmax and gradient; times a margin for XLA's temporaries. Within 1.5x of the
    compiled peak for the presets on XLA CPU (``tests/test_config.py``)."""
    item, pitem = _itemsize(config.dtype), _itemsize(config.param_dtype_used)
    n = _parameter_count(config)
    b = config.batch // config.microbatches
    rows = b * config.seq
    fixed = 2 * n * pitem + optimizer_state_bytes(config) + (n * 4 if config.microbatches > 1 else 0)
    w, hd = config.width, config.head_dim_used
    block = rows * (12 * w + 2 * (config.heads + config.kv_heads_used) * hd) * item
    mlp = rows * 4 * config.mlp_dim_used * item
    block += moe_activation_bytes(config, rows, item) if config.experts else mlp
    keys = config.seq if config.attention == "full" else min(config.attention_block, config.seq)
    scores = 3 * b * config.heads * config.seq * keys * 4
    block += scores
    policy = config.policy
    saved_names = tuple(config.save_names) if policy == "custom" else _SAVED.get(policy, ())
    if saved_names is None:  # no remat: every block's activations stay for the backward
        kept, block = block, 0
    else:
        names = _name_elements(config)
        if saved_names == "dots":
            saved_names, extra = _PROJECTIONS, scores // 3 + rows * names["context"] * item
        else:
            extra = 0
        kept = rows * (w + sum(names.get(nm, 0) for nm in saved_names)) * item + extra
    logits = b * -(-config.seq // config.loss_chunks) * config.vocab * (2 * item + 8)
    if config.experts:  # a mixture of experts: every block's values and twice for XLA's temporaries
        return 2 * (fixed + n * item + config.depth * (block or kept) + logits) + (1 << 20)  # and a copy
    return int(_LLM_MARGIN * (fixed + config.depth * kept + block + logits)) + (1 << 20)


def estimate_bytes(config: RunConfig) -> int:
    """An upper estimate of the device bytes the step needs, computed without JAX.

    Parameters, their gradients and a copy for the reference run; per block the activations the
    forward and backward can hold at once (for seq_mixer also the (B, N, N) scores, for the
    transformer the (B, H, N, N) scores and the 4x wide MLP), all with a factor of 2 for XLA's
    temporaries. Checked against compiled figures in the tests. A ``compile_only`` configuration,
    or one for a named target, allocates nothing of its size: 1 MiB (the compile's own memory is
    ``COMPILE_WORKSPACE``), so the server's host-RAM budget never refuses it.
    """
    if config.compile_only or config.target != LOCAL:  # a named target's program is never allocated
        return 1 << 20
    if config.model == "llm":
        return _llm_bytes(config)
    item = _itemsize(config.dtype)
    w = config.width
    rows = max(config.batch, 1) * (config.seq if config.model in SEQ_MODELS else 1)
    if config.model == USER_MODEL:  # the user's block is unknown before it is built: sized as the mlp
        w, rows = config.input_shape[-1], math.prod(config.input_shape[:-1])
    if config.model == "transformer":
        # q, k, v, o: 4 w^2; wi_0, wi_1, wo: 12 w^2; two norm scales.
        params = config.depth * (16 * w * w + 2 * w) * item
        act = 48 * rows * w * item  # norms, projections, residual sums, the 4w MLP, cotangents
        act += 6 * max(config.batch, 1) * config.heads * config.seq * config.seq * 4  # scores
        return 2 * (3 * params + config.depth * act + rows * w * 4) + (1 << 20)
    params = config.depth * 2 * (w * w + w) * item
    act = 8 * rows * w * item  # dot outputs, relu outputs and masks, cotangents
    if config.model == "seq_mixer":
        act += 4 * max(config.batch, 1) * config.seq * config.seq * 4  # scores, softmax, grads
        act += 4 * rows * w * item
    f32_acc = rows * w * 4  # the float32 loss accumulation of the output
    return 2 * (3 * params + config.depth * act + f32_acc) + optimizer_state_bytes(config) + (1 << 20)


def estimate_process_bytes(config: RunConfig, on_device: bool = False) -> int:
    """An upper estimate of how much a worker process grows while running ``config``.

    ``on_device`` (an attached GPU or TPU holds the step): the host holds what the gradient check
    brings back (the step's gradients, the reference's and the parameters, each at most float32)
    and XLA's compile workspace; the device's memory is the compile's to answer.

    ``estimate_bytes`` (the device program) is one part; the process also holds the gradient
    check's reference program (its parameters, gradients and activations: about the step's size
    again), the no_remat witness compile, host copies of the parameters and gradients, the program
    texts, and XLA's compile workspace (a fixed allowance). Checked against measured peak RSS by
    ``tests/load/memory_model.py`` (docs/limits.md).
    """
    if on_device and not (config.compile_only or config.target != LOCAL):
        return int(PROCESS_FACTOR * 3 * 4 * _parameter_count(config)) + COMPILE_WORKSPACE
    return int(PROCESS_FACTOR * estimate_bytes(config)) + COMPILE_WORKSPACE


# Measured growth was at most 1.66x the device estimate (the default configuration, whose device
# estimate is small) plus ~10 MiB, over 13 configurations; 1.25x + 64 MiB stays at least 1.2x above
# every measurement (docs/limits.md), where 2x + 48 MiB refused width-2048 models that use
# a third of it.
PROCESS_FACTOR = 1.25
COMPILE_WORKSPACE = 64 << 20


def _system_memory_bytes() -> int:
    """Physical memory, or the cgroup limit (v1 or v2, nested) when a container sets a lower one."""
    return limits.memory_limit()


def parse_bytes(text: str) -> int:
    """``'512M'``, ``'2G'``, ``'1.5GiB'`` or a plain number of bytes."""
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    try:
        text = str(text)
    except ValueError:  # an int too long to print (sys.get_int_max_str_digits)
        raise ConfigError("memory budget is a number with too many digits; write a size under 1 EiB "
                          "(e.g. 512M, 2G, 80G).") from None
    s = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = s[-1] if s and s[-1] in units else ""
    number = s[: len(s) - len(unit)].strip()
    try:
        value = float(number)
    except ValueError:
        raise ConfigError(f"memory budget {str(text)[:40]!r} is not a size; write e.g. 512M, 2G "
                          "or a number of bytes.") from None
    if value != value or value <= 0:
        raise ConfigError(f"memory budget must be a positive size; got {str(text)[:40]!r}.")
    if value * units[unit] >= 2**60:
        raise ConfigError(f"memory budget {str(text)[:40]!r} is larger than any machine's memory; "
                          "write a size under 1 EiB (e.g. 512M, 2G, 80G).")
    if value * units[unit] < 1:
        raise ConfigError(f"memory budget {str(text)[:40]!r} is less than one byte.")
    return int(value * units[unit])


def budget_text(n: int) -> str:
    """``n`` bytes as a budget to type, in the largest unit it reaches: whole where that unit
    divides it (``16G``, ``400K``), else rounded down to two decimals, so that ``parse_bytes``
    reads back at most ``n`` (``11.77G``, never ``12341832K``)."""
    unit, scale = next(((u, s) for u, s in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10))
                        if n >= s), ("", 1))
    return f"{n // scale}{unit}" if n % scale == 0 else f"{int(n * 100 / scale) / 100:g}{unit}"


def default_budget_bytes(device_limit: int | None = None) -> int:
    """The memory a run may use: on an accelerator the device's whole limit (the compile's memory
    analysis answers it: ``check_compiled``), else half the system's (the estimate guards it)."""
    return device_limit or _system_memory_bytes() // 2


def resolve_budget(explicit: str | int | None = None, device_limit: int | None = None) -> int:
    """The budget in bytes: explicit value, else ``$REMAT_LAB_MEMORY_BUDGET``, else the default."""
    if explicit is not None:
        return explicit if isinstance(explicit, int) else parse_bytes(explicit)
    if os.environ.get(BUDGET_ENV):
        return parse_bytes(os.environ[BUDGET_ENV])
    return default_budget_bytes(device_limit)


def check_budget(config: RunConfig, budget: int) -> int:
    """Refuse ``config`` when its estimate exceeds ``budget``; returns the estimate."""
    need = estimate_bytes(config)
    if need > budget:
        raise MemoryBudgetError(
            f"this configuration needs about {human_bytes(need)}, over the memory budget of "
            f"{human_bytes(budget)}; lower width, batch, seq or depth (or raise the budget with "
            f"--memory-budget or {BUDGET_ENV}).")
    return need


def check_compiled(config: RunConfig, memory: dict | None, budget: int) -> None:
    """On an accelerator: refuse ``config`` when its compiled program's peak (XLA's memory analysis,
    ``memory``) exceeds ``budget``; nothing has run yet."""
    peak = (memory or {}).get("peak_bytes")
    if peak and peak > budget:
        raise MemoryBudgetError(
            f"this configuration's compiled program needs {human_bytes(peak)} (XLA's memory "
            f"analysis), over the memory budget of {human_bytes(budget)}; lower width, batch, seq "
            f"or depth, or choose a policy that saves less (or raise the budget with "
            f"--memory-budget or {BUDGET_ENV}).")


def human_seconds(s: float) -> str:
    """``8.2e-05`` -> ``'82.0 µs'``; ``0.0123`` -> ``'12.30 ms'``; ``2.5`` -> ``'2.50 s'``."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def human_flops(n: float) -> str:
    """A flop count in the largest SI unit it reaches, four significant digits: ``202600`` ->
    ``'202.6 kFLOP'``, ``3.4e12`` -> ``'3.4 TFLOP'`` (never ``'0.0002026 GFLOP'``)."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6),
                        ("kFLOP", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} FLOP"


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def sig(x: float | None, digits: int = 3) -> str:
    """``x`` to ``digits`` significant figures with thousands separators; ``""`` for none/NaN."""
    if x is None or isinstance(x, bool) or not isinstance(x, int | float) or math.isnan(x):
        return ""
    if x == 0 or math.isinf(x):
        return f"{x:g}"
    v = float(f"{x:.{digits}g}")
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    return f"{v:,.{decimals}f}"


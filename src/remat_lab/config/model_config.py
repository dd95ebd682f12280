"""A published model's config (a Hugging Face ``config.json`` or a MaxText model YAML) as the llm's fields.

Every key of the file is accounted for, never silently dropped. Each is one of:

- **modelled**: it fills a ``RunConfig`` field (``hidden_size``/``base_emb_dim`` -> width, layers ->
  depth, query and key/value heads, ``head_dim``, the gated MLP's size, the vocabulary, tied
  embeddings, the experts, their top k and size (``moe_config``); ``max_position_embeddings`` or
  ``max_target_length`` -> the default seq);
- **a difference**: the lab does not reproduce it, but it changes no shape, memory or FLOPs the lab
  reports (or, for biases, norms and an activation, a negligible share, said with its size): the
  rotary base and rope scaling (frequencies only), the MLP's activation (elementwise), Qwen 2's q/k/v
  biases, Qwen 3's per-head q/k norm, Gemma's embedding scale and norm offset, MaxText's sharding
  rules (``config/hf_notes.py`` writes a Hugging Face file's). Gemma 2's soft-capping, alternating
  window and extra norms, and GPT-2 as a Llama-style stand-in, are read as their presets are: each
  said, with the memory the lab does not count. ``ModelConfig.differences`` lists them, and the CLI
  and the app show them;
- **unused**: metadata with no bearing on the step (token ids, ``torch_dtype``, ``use_cache``, the
  norm's epsilon, ...), listed in one difference line;
- **refused**: a ``ConfigError`` naming every such key and why: dense and expert layers mixed, a
  sliding attention window shorter than the context, logit or attention soft-capping, dropout, extra
  norms, a non-gated MLP (outside Gemma 2's and GPT-2's files), a family the lab has no block for
  (``model_type``/``decoder_block``), and any key this module does not know (it cannot say that key
  leaves the step unchanged).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .catalog import DENSE, RECIPE
from .errors import ConfigError
from .hf_notes import LAB_ROPE_BASE, gemma2_differences, gpt2_differences, hf_differences
from .hf_notes import show_value as _value
from .mesh_text import _show
from .moe_config import HF_MOE_FIELDS, MOE_FAMILIES, MOE_UNUSED, MT_MOE_FIELDS, dense_if_single
from .run import LIMITS, LLM_LIMITS, RunConfig

MAX_BYTES = 256 * 1024  # a config file is a few KiB; anything larger is not one
SEQ_CAP = 8192  # the default seq when the file's context is longer (give --seq for more)
LOSS_CHUNK_LOGITS = 2**27  # presets.json's rule: 8 loss chunks where seq x vocab passes this

# Hugging Face: the modelled keys (-> RunConfig field) and the families whose block the llm is.
HF_FIELDS = {"hidden_size": "width", "num_hidden_layers": "depth", "num_attention_heads": "heads",
             "num_key_value_heads": "kv_heads", "head_dim": "head_dim", "intermediate_size": "mlp_dim",
             "vocab_size": "vocab", **HF_MOE_FIELDS}
HF_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
HF_TIED = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False, "gemma": True, "gemma2": True,
           **MOE_FAMILIES}
HF_UNUSED = {"architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype", "dtype",
             "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range",
             "rms_norm_eps", "pretraining_tp", "max_window_layers", "use_sliding_window", "tokenizer_class",
             "attn_implementation", "cache_implementation", "rope_traditional"} | MOE_UNUSED
# GPT-2 (the gpt2-small preset's file): its keys, read as the lab's Llama-style stand-in.
GPT2_FIELDS = {"n_embd": "width", "n_layer": "depth", "n_head": "heads", "vocab_size": "vocab"}
GPT2_UNUSED = {"architectures", "transformers_version", "_name_or_path", "torch_dtype", "bos_token_id",
               "eos_token_id", "pad_token_id", "initializer_range", "layer_norm_epsilon", "use_cache",
               "n_ctx", "summary_activation", "summary_first_dropout", "summary_proj_to_labels",
               "summary_type", "summary_use_proj", "task_specific_params", "scale_attn_weights",
               "reorder_and_upcast_attn", "scale_attn_by_inverse_layer_idx", "tokenizer_class"}
# MaxText: the modelled keys, and base.yml's values for those a model YAML leaves out (MaxText's own
# defaults, src/maxtext/configs/base.yml at e591f30cbbf217ed67ef71263ec0538239f9c3b8).
MT_FIELDS = {"base_emb_dim": "width", "base_num_decoder_layers": "depth", "base_num_query_heads": "heads",
             "base_num_kv_heads": "kv_heads", "head_dim": "head_dim", "base_mlp_dim": "mlp_dim",
             "vocab_size": "vocab", **MT_MOE_FIELDS}
MT_DEFAULTS = {"base_emb_dim": 2048, "base_num_decoder_layers": 16, "base_num_query_heads": 16,
               "base_num_kv_heads": 16, "head_dim": 128, "base_mlp_dim": 7168, "vocab_size": 32000}
MT_BLOCKS = ("llama2", "mistral", "qwen2", "gemma", "mixtral")
MT_UNUSED = {"model_name", "normalization_layer_epsilon", "tokenizer_type", "tokenizer_path",
             "enable_dropout", "rope_type", "rope_use_scale", "normalize_embedding_logits"}
OFF = (None, False, 0, 0.0, -1, "")  # values that switch a feature off (MaxText uses -1 and 0)
RUN_SETTINGS = ("per_device_batch_size", "remat_policy", "dtype", "weight_dtype", "attention",
                "scan_layers", "num_vocab_tiling", "steps", "optimizer_memory_host_offload")

# Keys refused when on (not in OFF): why the lab cannot model them. Both formats share the table.
REFUSED = {
    **dict.fromkeys(("n_routed_experts", "n_shared_experts", "first_k_dense_replace", "shared_experts",
                     "decoder_sparse_step", "mlp_only_layers", "moe_layer_freq", "interleave_moe_layer_step"),
                    "dense and expert layers mixed, or DeepSeek's experts: each block has the same MLP"),
    **dict.fromkeys(("attn_logit_softcapping", "final_logit_softcapping", "attn_logits_soft_cap",
                     "final_logits_soft_cap"),
                    "soft-capping (tanh) of scores or logits: not in the lab's attention or loss, and "
                    "what its backward keeps is memory the lab would not count"),
    **dict.fromkeys(("attention_dropout", "hidden_dropout", "dropout_rate", "resid_pdrop", "embd_pdrop"),
                    "dropout: its masks are memory the lab would not count"),
    **dict.fromkeys(("use_post_attn_norm", "use_post_ffw_norm", "use_qk_norm"),
                    "an extra norm in each block: its activations are memory the lab would not count"),
    **dict.fromkeys(("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "qk_nope_head_dim"),
                    "latent (MLA) attention: not the lab's grouped-query attention"),
    "sliding_window_size": "sliding-window attention: the lab's attention is causal over the whole sequence",
    "layer_types": "layers of different kinds: every block of the lab is the same",
    "global_parameter_scale": "MaxText's scaling of every size: give the scaled sizes instead",
    "use_mrope": "multimodal rotary sections (M-RoPE): not the lab's rotary embedding",
}


@dataclass(frozen=True)
class ModelConfig:
    """A config file read: what it is, the llm fields it fills and what the lab does not reproduce."""

    source: str  # "a Hugging Face config.json (model_type llama)", "a MaxText model YAML (...)"
    fields: dict  # RunConfig fields: width, depth, heads, kv_heads, head_dim, mlp_dim, vocab, ...
    differences: tuple[str, ...] = field(default=())  # one sentence each
    seq_note: str = ""  # how the default seq was chosen, when the file's context was not used as is

    def notes(self, seq_given: bool = False) -> tuple[str, ...]:
        """What to tell the user: the seq's choice (unless they gave a seq) and the differences."""
        return (*([self.seq_note] if self.seq_note and not seq_given else []), *self.differences)

    def config(self, **overrides) -> RunConfig:
        """The llm of this file with ``overrides`` (explicit values win), in the ``RECIPE`` dtypes:
        a dtype field given replaces that field only (as ``RunConfig.from_preset``)."""
        return RunConfig(**{"model": "llm", **self.fields, **RECIPE, **overrides})


def load_model_config(path: str | Path) -> ModelConfig:
    """The file at ``path`` read (``parse_model_config``); a file that cannot be read is a ConfigError."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_BYTES:
            raise ConfigError(f"{_show(str(p))} is {p.stat().st_size:,} bytes; a model config file is "
                              f"at most {MAX_BYTES:,}.")
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read the model config {_show(str(p))}: "
                          f"{getattr(err, 'strerror', None) or err}.") from None
    return parse_model_config(text, p.name)


def parse_model_config(text: str, name: str = "the model config") -> ModelConfig:
    """``text`` (JSON or YAML; nothing in it is executed) as a ``ModelConfig``, or a ConfigError
    naming every key the lab cannot model."""
    if len(text.encode("utf-8", "replace")) > MAX_BYTES:
        raise ConfigError(f"{_show(name)} is over {MAX_BYTES:,} bytes; a model config file is smaller.")
    data = _load(text, name)
    if data.get("model_type") == "gpt2":
        return _gpt2(data, name)
    if any(k in data for k in ("hidden_size", "num_hidden_layers", "model_type")):
        return _hugging_face(data, name)
    if any(str(k).startswith("base_") for k in data) or "decoder_block" in data:
        return _maxtext(data, name)
    raise ConfigError(f"{_show(name)} is neither a Hugging Face config.json (hidden_size, "
                      "num_hidden_layers, ...) nor a MaxText model YAML (base_emb_dim, "
                      "base_num_decoder_layers, ...).")


def _load(text: str, name: str) -> dict:
    """The file's top-level mapping: JSON when it starts with ``{``, else YAML (``safe_load``)."""
    try:
        data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{_show(name)} is not valid JSON: {err.msg} (line {err.lineno}).") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{_show(name)} is not valid YAML: "
                          f"{getattr(err, 'problem', None) or 'cannot be parsed'}{where}.") from None
    except RecursionError:
        raise ConfigError(f"{_show(name)} is nested too deeply to be a model config.") from None
    except ValueError as err:  # e.g. a number of more digits than Python converts
        raise ConfigError(f"{_show(name)} cannot be read: {_show(str(err), 80)}.") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{_show(name)} must be a mapping of keys to values (a JSON object, YAML "
                          "keys), not a single value or a list.")
    return {str(k): v for k, v in data.items()}


def _integer(data: dict, key: str, target: str, llm_field: str) -> int:
    value = data[key]
    lo, hi = LLM_LIMITS.get(llm_field, LIMITS[llm_field])
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{target}: {key} must be a positive whole number, not {_value(value)}.")
    if not lo <= value <= hi:
        raise ConfigError(f"{target}: {key} {value:,} is outside what the lab models for {llm_field} "
                          f"({lo:,} to {hi:,}).")
    return value


class _Reading:
    """One file being read: its modelled fields, differences, unused keys and refusals."""

    def __init__(self, data: dict, name: str, fields: dict[str, str]):
        self.data, self.name, self.fields = data, name, fields
        self.out: dict = {}  # the RunConfig fields read
        self.differences, self.unused, self.unknown = [], [], []  # sentences; keys; keys
        self.refused: dict[str, list[str]] = {}  # why -> the keys (with their values) refused for it
        self.done: set[str] = set()  # the keys accounted for

    def take(self, key: str) -> bool:
        """Whether ``key`` is in the file; it counts as accounted for from now on."""
        self.done.add(key)
        return key in self.data

    def refuse(self, key: str, why: str) -> None:
        self.refused.setdefault(why, []).append(f"{key} {_value(self.data[key])}")

    def shape(self, defaults: dict | None = None) -> None:
        """The modelled integer keys into their fields (``defaults`` for a missing one, said so)."""
        for key, target in self.fields.items():
            if self.take(key) and self.data[key] not in (None, -1):  # MaxText's -1: not set
                self.out[target] = _integer(self.data, key, self.name, target)
            elif defaults is not None and key in defaults:
                self.out[target] = defaults[key]
                self.differences.append(f"{key} not in the file: MaxText's default {defaults[key]}")

    def rest(self, unused: set[str], run_settings: tuple[str, ...] = ()) -> None:
        """The keys not yet accounted for: unused metadata, refused ones (when on), unknown ones."""
        for key in self.data:
            if key in self.done:
                continue
            value = self.data[key]
            if key in unused:
                self.unused.append(key)
            elif key in REFUSED:
                if value in OFF or value == [] or (key == "decoder_sparse_step" and value == 1) or (
                        key == "global_parameter_scale" and value == 1):
                    self.unused.append(key)
                else:
                    self.refuse(key, REFUSED[key])
            elif key in run_settings:
                self.refuse(key, "a run setting, not the model's shape: give it as a flag or field")
            else:
                self.unknown.append(key)

    def finish(self, source: str, seq: int, seq_note: str) -> ModelConfig:
        problems = [f"{', '.join(keys)} ({why})" for why, keys in self.refused.items()]
        if self.unknown:
            problems.append(f"{', '.join(_show(k) for k in self.unknown[:8])}"
                            f"{' and more' if len(self.unknown) > 8 else ''} (not keys the lab knows, "
                            "so it cannot say they leave shapes, memory and FLOPs unchanged; remove "
                            "them if they do)")
        if problems:
            raise ConfigError(f"{self.name}: the lab cannot model " + "; ".join(problems) + ".")
        out = {**DENSE, **dense_if_single(self.out)}  # a dense model: the MoE fields at rest
        if out["width"] % out["heads"] and "head_dim" not in out:
            raise ConfigError(f"{self.name}: the width {out['width']} is not divisible by the "
                              f"{out['heads']} heads and no head_dim is given.")
        out.setdefault("head_dim", out["width"] // out["heads"])
        out.setdefault("kv_heads", out["heads"])
        out["seq"] = seq
        out["loss_chunks"] = 8 if seq * out["vocab"] > LOSS_CHUNK_LOGITS else 1
        try:  # heads in equal key/value groups, an even head size: said with the file's name
            RunConfig(model="llm", batch=1, **out)
        except ConfigError as err:
            raise ConfigError(f"{self.name}: {err}") from None
        notes = list(self.differences)
        if self.unused:
            notes.append("not used (no effect on shapes, memory or FLOPs): " + ", ".join(self.unused))
        return ModelConfig(source, dict(out), tuple(notes), seq_note)


def _hugging_face(data: dict, name: str) -> ModelConfig:
    r = _Reading(data, name, HF_FIELDS)
    family = data.get("model_type")
    r.take("model_type")
    if family is not None and family not in HF_TIED:
        r.refuse("model_type", f"the lab's block is Llama-style: it reads {', '.join(HF_TIED)}")
        family = "llama"  # the rest is read as a Llama-style file, so every refusal is said at once
    missing = [k for k in HF_REQUIRED if data.get(k) is None]
    if missing:
        raise ConfigError(f"{name}: a Hugging Face config.json needs {', '.join(missing)}.")
    r.shape()
    if r.take("tie_word_embeddings"):
        tie = data["tie_word_embeddings"]
        if not isinstance(tie, bool):
            raise ConfigError(f"{name}: tie_word_embeddings must be true or false, not {_value(tie)}.")
    elif family is None:
        raise ConfigError(f"{name}: without model_type, give tie_word_embeddings (true or false).")
    else:
        tie = HF_TIED[family]
    r.out["tie_embeddings"] = tie
    if family is None:
        r.differences.append("no model_type: read as a Llama-style decoder")
    for key, why in hf_differences(data, family).items():
        r.take(key)
        if why:
            r.differences.append(why)
        elif key in data:  # off, or the lab's own value
            r.unused.append(key)
    if family == "gemma2":  # its soft-capping, window and extra norms: said as the preset says them
        for key, why in gemma2_differences(data).items():
            r.take(key)
            r.differences += [why] if why else []
    _hf_window(r)
    if r.take("layer_types"):  # newer files list each layer's attention: all full, or refused
        kinds = data["layer_types"]
        if isinstance(kinds, list) and set(kinds) <= {"full_attention"}:
            r.unused.append("layer_types")
        else:
            r.refuse("layer_types", REFUSED["layer_types"])
    context = data.get("max_position_embeddings") if r.take("max_position_embeddings") else None
    seq, note = _seq(context, "max_position_embeddings")
    r.rest(HF_UNUSED)
    return r.finish(f"a Hugging Face config.json (model_type {family or 'not given'})", seq, note)


def _gpt2(data: dict, name: str) -> ModelConfig:
    """GPT-2's file (``n_embd``, ``n_layer``, ...) as the gpt2-small preset reads it: the lab's
    Llama-style stand-in, every difference said (``hf_notes.gpt2_differences``)."""
    r = _Reading(data, name, GPT2_FIELDS)
    r.take("model_type")
    missing = [k for k in GPT2_FIELDS if data.get(k) is None]
    if missing:
        raise ConfigError(f"{name}: a GPT-2 config.json needs {', '.join(missing)}.")
    r.shape()
    inner = data.get("n_inner") if r.take("n_inner") else None
    inner = 4 * r.out["width"] if inner is None else _integer(data, "n_inner", name, "mlp_dim")
    r.out.update(mlp_dim=2 * inner // 3, kv_heads=r.out["heads"], tie_embeddings=True)
    for key, why in gpt2_differences(data, inner, 2 * inner // 3).items():
        r.take(key)
        r.differences += [why] if why else []
    context = data.get("n_positions") if r.take("n_positions") else None
    seq, note = _seq(context, "n_positions")
    r.rest(GPT2_UNUSED)
    return r.finish("a Hugging Face config.json (model_type gpt2, as the lab's Llama-style stand-in)",
                    seq, note)


def _hf_window(r: _Reading) -> None:
    """``sliding_window``: refused when it applies (on, and shorter than the context)."""
    if "sliding_window" in r.done or not r.take("sliding_window"):
        return
    window, data = r.data["sliding_window"], r.data
    context = data.get("max_position_embeddings")
    if window is None or data.get("use_sliding_window") is False:
        r.unused.append("sliding_window")
    elif isinstance(context, int) and isinstance(window, int) and window >= context:
        r.differences.append(f"sliding_window {window:,}: no effect (it covers the whole context, "
                             f"{context:,})")
    else:
        r.refuse("sliding_window", "sliding-window attention: the lab's attention is causal over the "
                                   "whole sequence, so past the window its FLOPs and memory differ; set "
                                   "it to null to model full causal attention, exact up to the window")


def _maxtext(data: dict, name: str) -> ModelConfig:
    r = _Reading(data, name, MT_FIELDS)
    block = data.get("decoder_block", "llama2")
    r.take("decoder_block")
    if block not in MT_BLOCKS:
        r.refuse("decoder_block", f"the lab's block is Llama-style: it reads {', '.join(MT_BLOCKS)}")
    r.shape(MT_DEFAULTS)
    tie = data.get("logits_via_embedding", False) if r.take("logits_via_embedding") else False
    if not isinstance(tie, bool):
        raise ConfigError(f"{name}: logits_via_embedding must be true or false, not {_value(tie)}.")
    r.out["tie_embeddings"] = tie
    if r.take("mlp_activations"):
        acts = data["mlp_activations"]
        if not (isinstance(acts, list) and len(acts) == 2 and acts[1] == "linear"):
            r.refuse("mlp_activations", "the lab's MLP is gated: two activations, the second linear")
        elif acts[0] != "silu":
            r.differences.append(f"mlp_activations {acts[0]!s:.20}: the gated MLP's activation is "
                                 "SiLU here (elementwise; the same shapes)")
    if r.take("rope_max_timescale") and data["rope_max_timescale"] != LAB_ROPE_BASE:
        r.differences.append(f"rope_max_timescale {_value(data['rope_max_timescale'])}: the lab's "
                             f"rotary base is {LAB_ROPE_BASE} (frequencies only)")
    if r.take("logical_axis_rules"):
        r.differences.append("logical_axis_rules: the lab shards by its own rules (MaxText's axes, "
                             "program/mesh.py)")
    w, q, kv, hd, layers = (r.out[k] for k in ("width", "heads", "kv_heads", "head_dim", "depth"))
    for key, count in (("attention_bias", layers * hd * (q + 2 * kv)),
                       ("mlp_bias", layers * (2 * r.out["mlp_dim"] + w))):
        if r.take(key) and data[key]:
            r.differences.append(f"{key} true: no biases here ({count:,} parameters; elementwise adds)")
    if block == "gemma":
        r.differences.append("Gemma's sqrt(width) embedding scale and (1 + scale) norm offset not "
                             "modelled (elementwise)")
    context = data.get("max_target_length") if r.take("max_target_length") else None
    seq, note = _seq(context, "max_target_length") if context is not None else (
        2048, "seq 2048: MaxText's default max_target_length (give --seq)")
    r.rest(MT_UNUSED, RUN_SETTINGS)  # enable_dropout is unused: dropout_rate (refused when on) decides
    return r.finish(f"a MaxText model YAML (decoder_block {block})", seq, note)


def _seq(context: object, key: str) -> tuple[int, str]:
    """The default seq from the file's context length (at most ``SEQ_CAP``) and a note when capped."""
    if context is None:
        return SEQ_CAP, f"seq {SEQ_CAP}: the file gives no {key} (give --seq)"
    if isinstance(context, bool) or not isinstance(context, int) or context < 2:
        raise ConfigError(f"{key} must be a whole number of tokens (2 or more), not {_value(context)}.")
    if context <= SEQ_CAP:
        return context, ""
    return SEQ_CAP, (f"seq {SEQ_CAP} of the {context:,} tokens {key} allows (give --seq, up to "
                     f"{LLM_LIMITS['seq'][1]:,})")

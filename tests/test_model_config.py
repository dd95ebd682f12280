"""--model-config: a Hugging Face config.json or a MaxText model YAML read into the llm's fields;
the new presets reproduced from their published configs; unmodellable keys refused by name; the
CLI's error path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from remat_lab.config import PRESET_FIELDS, PRESETS, ConfigError, RunConfig, llm_parameters
from remat_lab.config.catalog import DENSE
from remat_lab.config.model_config import (
    LOSS_CHUNK_LOGITS,
    MAX_BYTES,
    load_model_config,
    parse_model_config,
)

FIXTURES = Path(__file__).parent / "fixtures" / "model_configs"
NEW_PRESETS = ("llama2-7b", "llama2-70b", "llama3.1-8b", "llama3.1-70b", "llama3.1-405b")
SHAPE = ("width", "depth", "heads", "kv_heads", "head_dim", "mlp_dim", "vocab", "tie_embeddings")


def _llama(hidden, inter, layers, heads, kv, vocab, context, **more) -> dict:
    """The keys of Meta's published Llama config.json files (Llama-2-*-hf, Llama-3.1-*), as on the
    model cards; written out here, not fetched."""
    return {"architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
            "hidden_act": "silu", "hidden_size": hidden, "initializer_range": 0.02,
            "intermediate_size": inter, "max_position_embeddings": context, "model_type": "llama",
            "num_attention_heads": heads, "num_hidden_layers": layers, "num_key_value_heads": kv,
            "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
            "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.31.0",
            "use_cache": True, "vocab_size": vocab, **more}


LLAMA31 = {"attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False, "rope_theta": 500000.0,
           "torch_dtype": "bfloat16", "bos_token_id": 128000, "eos_token_id": 128001,
           "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
HF = {
    "llama2-7b": _llama(4096, 11008, 32, 32, 32, 32000, 4096),
    "llama2-70b": _llama(8192, 28672, 80, 64, 8, 32000, 4096),
    "llama3.1-8b": _llama(4096, 14336, 32, 32, 8, 128256, 131072, **LLAMA31),
    "llama3.1-70b": _llama(8192, 28672, 80, 64, 8, 128256, 131072, **LLAMA31),
    "llama3.1-405b": _llama(16384, 53248, 126, 128, 8, 128256, 131072, **LLAMA31),
}


def _file(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_each_new_preset_is_its_published_configs(name):
    """The MaxText model YAML (copied from MaxText at the preset's commit) and the Hugging Face
    config.json both give the preset's shape, and that shape has the published parameter count
    within 0.5 % (exactly, for these dense Llamas: every parameter is modelled)."""
    preset = PRESETS[name]
    assert Path(preset["maxtext"].split()[1]).name == f"{name}.yml"
    maxtext = load_model_config(FIXTURES / f"maxtext-{name}.yml")
    hf = parse_model_config(json.dumps(HF[name]), "config.json")
    for read in (maxtext, hf):
        assert {k: read.fields[k] for k in SHAPE} == {k: preset[k] for k in SHAPE}, read.source
        cfg = read.config(seq=16, batch=1)
        assert abs(llm_parameters(cfg) - preset["parameters"]) <= 0.005 * preset["parameters"]
        assert llm_parameters(cfg) == preset["parameters"]
    assert hf.fields["seq"] == preset["seq"]  # 4096 (Llama 2), or 8192 of the 131072 allowed
    assert hf.fields["loss_chunks"] == preset["loss_chunks"]


def test_every_preset_follows_the_loss_chunk_rule():
    """presets.json's rule (8 slices where seq x vocab passes 2^27, else 1) is the file reader's."""
    for name, p in PRESETS.items():
        assert p["loss_chunks"] == (8 if p["seq"] * p["vocab"] > LOSS_CHUNK_LOGITS else 1), name


def test_what_the_lab_does_not_reproduce_is_listed():
    read = parse_model_config(json.dumps(HF["llama3.1-8b"]), "config.json")
    text = " | ".join(read.notes())
    assert "rope_theta 500000.0" in text and "rope_scaling 'llama3'" in text
    assert "seq 8192 of the 131,072 tokens max_position_embeddings allows" in text
    for key in ("bos_token_id", "torch_dtype", "rms_norm_eps", "attention_dropout", "attention_bias"):
        assert key in text, key  # off, or metadata: said, not dropped
    assert read.notes(seq_given=True)[0].startswith("rope_theta")  # the seq note only when not given
    assert read.source == "a Hugging Face config.json (model_type llama)"


def test_a_config_fills_the_fields_and_explicit_values_win():
    read = parse_model_config(json.dumps(HF["llama2-70b"]), "config.json")
    cfg = read.config(depth=2, seq=64)
    assert (cfg.model, cfg.width, cfg.depth, cfg.kv_heads, cfg.seq, cfg.preset) == ("llm", 8192, 2, 8, 64, "")
    assert (cfg.dtype, cfg.param_dtype) == ("bfloat16", "float32")  # the recipe, as a preset's
    assert read.config(dtype="float32").param_dtype == "float32"  # a dtype given: that field only


def test_yaml_and_defaults_gemma_and_qwen():
    """MaxText's base.yml defaults fill a missing key (said so); head_dim from hidden/heads; Gemma is
    tied by default; Qwen 2's biases are a listed difference with their count."""
    read = parse_model_config("base_emb_dim: 256\nbase_num_query_heads: 4\nbase_num_kv_heads: 2\n"
                              "base_num_decoder_layers: 2\nbase_mlp_dim: 512\nvocab_size: 1000\n"
                              "max_target_length: 128\n", "tiny.yml")
    assert read.fields == {"width": 256, "heads": 4, "kv_heads": 2, "depth": 2, "mlp_dim": 512,
                           "vocab": 1000, "head_dim": 128, "tie_embeddings": False, "seq": 128,
                           "loss_chunks": 1, **DENSE}
    assert "head_dim not in the file: MaxText's default 128" in read.differences
    gemma = parse_model_config(json.dumps({"model_type": "gemma", "hidden_size": 256,
                                           "num_hidden_layers": 2, "num_attention_heads": 4,
                                           "intermediate_size": 512, "vocab_size": 1000,
                                           "hidden_act": "gelu_pytorch_tanh"}))
    assert gemma.fields["tie_embeddings"] is True and gemma.fields["head_dim"] == 64
    assert any("SiLU here" in d for d in gemma.differences)
    qwen = parse_model_config(json.dumps({"model_type": "qwen2", "hidden_size": 3584,
                                          "num_hidden_layers": 28, "num_attention_heads": 28,
                                          "num_key_value_heads": 4, "intermediate_size": 18944,
                                          "vocab_size": 152064, "sliding_window": 131072,
                                          "use_sliding_window": False, "max_window_layers": 28,
                                          "tie_word_embeddings": False}))
    assert {k: qwen.fields[k] for k in SHAPE} == {k: PRESETS["qwen2.5-7b"][k] for k in SHAPE}
    assert any("(129,024 parameters" in d for d in qwen.differences)  # = the preset's 28 x 4608


def test_other_published_families_read_whole():
    """The keys of Mistral 7B v0.3's, Gemma 2B's and Qwen 2.5 7B's config.json (written out here):
    each read without a refusal, its shape the lab's."""
    common = {"attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02,
              "torch_dtype": "bfloat16", "transformers_version": "4.42.0", "use_cache": True}
    mistral = {**common, "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
               "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
               "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
               "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
               "tie_word_embeddings": False, "vocab_size": 32768}
    gemma = {**common, "architectures": ["GemmaForCausalLM"], "attention_bias": False, "head_dim": 256,
             "hidden_act": "gelu", "hidden_size": 2048, "intermediate_size": 16384,
             "max_position_embeddings": 8192, "model_type": "gemma", "num_attention_heads": 8,
             "num_hidden_layers": 18, "num_key_value_heads": 1, "pad_token_id": 0, "rms_norm_eps": 1e-06,
             "rope_scaling": None, "rope_theta": 10000.0, "vocab_size": 256000}
    qwen = {**common, "architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 3584,
            "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
            "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28,
            "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
            "sliding_window": 131072, "tie_word_embeddings": False, "use_mrope": False,
            "use_sliding_window": False, "vocab_size": 152064}
    m, g, q = (parse_model_config(json.dumps(c)) for c in (mistral, gemma, qwen))
    assert (m.fields["vocab"], m.fields["seq"], m.fields["head_dim"]) == (32768, 8192, 128)
    # Gemma 2B: tied by default, one key/value head; 2,506,172,416 parameters, its published count
    assert g.fields["tie_embeddings"] is True and llm_parameters(g.config()) == 2_506_172_416
    assert {k: q.fields[k] for k in SHAPE} == {k: PRESETS["qwen2.5-7b"][k] for k in SHAPE}
    assert llm_parameters(q.config()) == PRESETS["qwen2.5-7b"]["parameters"] - 28 * (3584 + 2 * 512)


@pytest.mark.parametrize(("extra", "named"), [
    ({"n_routed_experts": 64, "first_k_dense_replace": 3}, "n_routed_experts 64, first_k_dense_replace 3"),
    ({"sliding_window": 4096, "max_position_embeddings": 32768}, "sliding_window 4096"),
    ({"final_logit_softcapping": 30.0}, "final_logit_softcapping 30.0"),
    ({"attention_dropout": 0.1}, "attention_dropout 0.1"),
    ({"my_new_knob": 3}, "'my_new_knob'"),
    ({"model_type": "deepseek_v3"}, "model_type 'deepseek_v3'"),
    ({"layer_types": ["sliding_attention", "full_attention"]}, "layer_types (a list of 2)"),
])
def test_unmodellable_keys_are_refused_by_name(extra, named):
    with pytest.raises(ConfigError, match="config.json: the lab cannot model") as err:
        parse_model_config(json.dumps({**HF["llama2-7b"], **extra}), "config.json")
    assert named in str(err.value)


def test_every_refusal_is_said_at_once_and_off_values_pass():
    with pytest.raises(ConfigError) as err:
        parse_model_config("base_emb_dim: 512\ndecoder_block: gemma2\nfinal_logits_soft_cap: 30.0\n"
                           "sliding_window_size: 4096\nuse_post_attn_norm: true\nper_device_batch_size: 4\n")
    message = str(err.value)
    for key in ("decoder_block 'gemma2'", "final_logits_soft_cap 30.0", "sliding_window_size 4096",
                "use_post_attn_norm True", "per_device_batch_size 4 (a run setting"):
        assert key in message, key
    off = parse_model_config("base_emb_dim: 512\nnum_experts: 1\nsliding_window_size: 0\n"
                             "base_moe_mlp_dim: -1\nuse_qk_norm: false\nglobal_parameter_scale: 1\n")
    assert off.fields["experts"] == 0 and "expert_mlp_dim" not in off.differences[-1]  # 1 expert: dense
    # Mistral v0.1's window shorter than its context is refused; one that covers it is a difference.
    wide = parse_model_config(json.dumps({**HF["llama2-7b"], "sliding_window": 4096}).replace(
        '"model_type": "llama"', '"model_type": "mistral"'))
    assert any("sliding_window 4,096: no effect" in d for d in wide.differences)


@pytest.mark.parametrize(("text", "said"), [
    ("[1, 2]", "must be a mapping"),
    ("{not json", "is not valid JSON"),
    ("a: [1, 2\n", "is not valid YAML"),
    ("width: 4096\n", "neither a Hugging Face config.json"),
    ('{"hidden_size": 4096}', "needs num_hidden_layers"),
    ('{"model_type": "llama", "hidden_size": "4096", "num_hidden_layers": 2, "num_attention_heads": 4,'
     ' "intermediate_size": 8, "vocab_size": 10}', "hidden_size must be a positive whole number"),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2000, "num_attention_heads": 4,'
     ' "intermediate_size": 8, "vocab_size": 10}', "num_hidden_layers 2,000 is outside"),
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,'
     ' "num_key_value_heads": 3, "intermediate_size": 8, "vocab_size": 10}', "not divisible by kv_heads"),
    ("!!python/object/apply:os.system ['true']", "is not valid YAML"),  # safe_load: nothing runs
    ('{"hidden_size": ' + "9" * 5000 + "}", "cannot be read"),
])
def test_bad_files_are_clear_errors(text, said):
    with pytest.raises(ConfigError) as err:
        parse_model_config(text, "f")
    assert said in str(err.value)


def test_file_size_and_reading(tmp_path):
    with pytest.raises(ConfigError, match="at most"):
        load_model_config(_file(tmp_path, "big.json", " " * (MAX_BYTES + 1)))
    with pytest.raises(ConfigError, match="cannot read the model config"):
        load_model_config(tmp_path / "missing.json")
    p = _file(tmp_path, "bad.bin", "")
    p.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="cannot read the model config"):
        load_model_config(p)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "remat_lab", *args], capture_output=True, text=True,
                          timeout=120)


def test_cli_reads_the_file_and_flags_win(tmp_path):
    from remat_lab.cli import build_parser
    from remat_lab.cli.common import config_from

    p = _file(tmp_path, "config.json", json.dumps(HF["llama3.1-405b"]))
    args = build_parser().parse_args(["run", "--model-config", str(p), "--depth", "2", "--seq", "64",
                                      "--compile-only"])
    cfg = config_from(args)
    assert (cfg.width, cfg.depth, cfg.heads, cfg.kv_heads, cfg.mlp_dim, cfg.seq) == (
        16384, 2, 128, 8, 53248, 64)
    preset = RunConfig.from_preset("llama3.1-405b", depth=2, seq=64)
    assert {k: getattr(cfg, k) for k in (*PRESET_FIELDS, "dtype", "param_dtype", "optimizer_dtype")} == {
        k: getattr(preset, k) for k in (*PRESET_FIELDS, "dtype", "param_dtype", "optimizer_dtype")}
    assert cfg.preset == "" and cfg.compile_only
    for cmd in ("advise", "synthesize", "compare"):
        assert build_parser().parse_args([cmd, "--model-config", str(p)]).model_config == str(p)


def test_cli_refuses_a_bad_file_with_its_message(tmp_path):
    mixtral = _file(tmp_path, "mixtral.yml", (FIXTURES / "maxtext-llama2-7b.yml").read_text()
                    + "first_k_dense_replace: 1\n")
    done = _cli("run", "--model-config", str(mixtral), "--compile-only")
    assert done.returncode == 2, done.stderr
    assert "mixtral.yml: the lab cannot model first_k_dense_replace 1 (dense and expert layers" in done.stderr
    assert "Traceback" not in done.stderr
    both = _cli("run", "--model-config", str(mixtral), "--preset", "llama2-7b")
    assert both.returncode == 2 and "--preset and --model-config both" in both.stderr


def test_preset_fields_are_what_a_file_fills():
    read = load_model_config(FIXTURES / "maxtext-llama2-7b.yml")
    assert set(read.fields) == set(PRESET_FIELDS)


@pytest.mark.parametrize(("text", "preset"), [
    ({"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
      "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "num_local_experts": 8,
      "num_experts_per_tok": 2,
      "router_aux_loss_coef": 0.02, "output_router_logits": False, "rope_theta": 1e6,
      "max_position_embeddings": 32768}, "mixtral-8x7b"),
    ({"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
      "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "vocab_size": 151936,
      "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": True,
      "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 40960}, "qwen3-30b-a3b"),
])
def test_a_mixture_of_experts_config_reads_as_its_preset(text, preset):
    """Mixtral's num_local_experts, Qwen3-MoE's num_experts and moe_intermediate_size fill the experts'
    fields; the whole shape is the preset's (seq and loss chunks are the preset's choice)."""
    read = parse_model_config(json.dumps(text), "config.json")
    cfg, want = read.config(seq=16, batch=1), RunConfig.from_preset(preset, seq=16, batch=1)
    assert cfg.replace(loss_chunks=1, expert_mlp_dim=0) == want.replace(loss_chunks=1, expert_mlp_dim=0,
                                                                        preset="")
    assert cfg.expert_mlp_dim_used == want.expert_mlp_dim_used and cfg.experts > 0
    assert "router_aux_loss_coef" in read.differences[-1] or "norm_topk_prob" in read.differences[-1]


QWEN3_8B = {  # Qwen/Qwen3-8B's config.json, its published values
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}


def test_qwen3_8b_imports_with_its_published_count_and_no_contradicting_note():
    """Dense Qwen 3 is read (issue 65): 8.19 B parameters within 0.5 % (the per-head q/k norm's 9,216
    apart), head_dim from the file, and no note about biases the file says it does not have."""
    read = parse_model_config(json.dumps(QWEN3_8B), "config.json")
    assert read.source == "a Hugging Face config.json (model_type qwen3)"
    n = llm_parameters(read.config())
    assert abs(n - 8.19e9) <= 0.005 * 8.19e9 and n == PRESETS["qwen3-8b"]["parameters"] - 36 * 2 * 128
    assert read.fields["head_dim"] == 128 and read.fields["tie_embeddings"] is False
    assert {k: read.fields[k] for k in SHAPE} == {k: PRESETS["qwen3-8b"][k] for k in SHAPE}
    notes = " ".join(read.notes())
    assert "bias" not in notes.replace("attention_bias,", "")  # attention_bias false: listed as not used
    assert "attention_bias" in next(n for n in read.notes() if n.startswith("not used"))
    assert ("Qwen 3's per-head RMSNorm of queries and keys (q_norm, k_norm) not modelled (36 x 2 x 128"
            in notes)
    # the same file said to be Qwen 2 keeps attention_bias false: no q/k/v bias note either
    as_qwen2 = parse_model_config(json.dumps({**QWEN3_8B, "model_type": "qwen2"}), "config.json")
    assert not any("bias" in d for d in as_qwen2.differences if not d.startswith("not used"))
    # a biased file is said with its count; Qwen 3's mixture of experts has the q/k norm note too
    biased = parse_model_config(json.dumps({**QWEN3_8B, "attention_bias": True}), "config.json")
    assert any(d.startswith("attention_bias true: no biases here (") for d in biased.differences)
    moe = parse_model_config(json.dumps({**QWEN3_8B, "model_type": "qwen3_moe", "num_experts": 128,
                                         "num_experts_per_tok": 8, "moe_intermediate_size": 768}))
    assert any("per-head RMSNorm" in d for d in moe.differences)
    assert ("intermediate_size 12288 (a dense layer's) is not used: every layer is a mixture of experts of "
            "moe_intermediate_size 768") in moe.differences
    unnormed = parse_model_config(json.dumps({**QWEN3_8B, "model_type": "qwen3_moe", "num_experts": 4,
                                              "num_experts_per_tok": 2, "norm_topk_prob": False}))
    assert any(d.startswith("norm_topk_prob false: the lab renormalises") for d in unnormed.differences)


GEMMA2_2B = {  # google/gemma-2-2b's config.json
    "architectures": ["Gemma2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attn_logit_softcapping": 50.0, "bos_token_id": 2, "cache_implementation": "hybrid", "eos_token_id": 1,
    "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2304, "initializer_range": 0.02,
    "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
    "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096,
    "torch_dtype": "float32", "transformers_version": "4.42.4", "use_cache": True, "vocab_size": 256000}
GPT2 = {  # openai-community/gpt2's config.json
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
    "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
    "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
    "summary_use_proj": True, "vocab_size": 50257,
    "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}}


def test_every_preset_family_is_read():
    """Each Hugging Face family a preset names reads a file of that shape; Gemma 2's and GPT-2's
    published files as their presets read them, every difference said (issue 65)."""
    for family in ("llama", "mistral", "qwen2", "qwen3", "gemma2", "mixtral", "qwen3_moe"):
        read = parse_model_config(json.dumps({"model_type": family, "hidden_size": 256,
                                              "num_hidden_layers": 2, "num_attention_heads": 4,
                                              "intermediate_size": 512, "vocab_size": 1000}))
        assert read.source.endswith(f"(model_type {family})")
    gemma = parse_model_config(json.dumps(GEMMA2_2B), "config.json")
    assert {k: gemma.fields[k] for k in SHAPE} == {k: PRESETS["gemma2-2b"][k] for k in SHAPE}
    assert PRESETS["gemma2-2b"]["parameters"] - llm_parameters(gemma.config()) == 26 * 2 * 2304
    said = " ".join(gemma.differences)
    for words in ("attn_logit_softcapping 50.0, final_logit_softcapping 30.0: no soft-capping here",
                  "sliding_window 4,096 on every other layer", "post-attention and post-MLP norms"):
        assert words in said
    gpt2 = parse_model_config(json.dumps(GPT2), "config.json")
    assert {k: gpt2.fields[k] for k in SHAPE} == {k: PRESETS["gpt2-small"][k] for k in SHAPE}
    assert gpt2.fields["seq"] == 1024 and gpt2.differences[0].startswith("a Llama-style stand-in, not GPT-2")
    assert any(d.startswith("attn_pdrop 0.1, embd_pdrop 0.1, resid_pdrop 0.1: no dropout here")
               for d in gpt2.differences)
    # a llama file's soft-capping and dropout are still refused (tests above): only these families'
    with pytest.raises(ConfigError, match="soft-capping"):
        parse_model_config(json.dumps({**GEMMA2_2B, "model_type": "gemma"}))

"""MaxText's published runs: the catalogue's figures, their translation into lab configurations, MaxText's
model flops by hand, and a check compiled end to end on a small stand-in run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from remat_lab.config import ConfigError, RunConfig, get_target, parse_mesh
from remat_lab.config import published as pub
from remat_lab.config.catalog import PRESETS
from remat_lab.studies.experiment import run_experiment

GIB = 2 ** 30


def test_every_run_names_its_source_and_figure():
    """Each run's configuration and figure point at a file, a full commit and a line; the figures
    are the ones MaxText's tables print (a typo here is a wrong verdict later)."""
    assert len(pub.RUNS) >= 12
    for run in pub.RUNS.values():
        for src in [run["source"]] + ([run["measured"]["source"]] if run.get("measured") else []):
            assert len(src["commit"]) == 40 and src["line"] > 0 and src["file"]
    m = {n: r["measured"] for n, r in pub.RUNS.items()}
    assert m["llama3.1-8b-v6e-256"]["mfu"] == 0.4546
    assert m["llama3.1-8b-v6e-256"]["tokens_per_s_per_device"] == 7207
    assert m["llama3.1-70b-v6e-256"]["tokens_per_s_per_device"] == 960
    l2 = m["llama2-70b-v6e-256"]
    assert (l2["mfu"], l2["tokens_per_s_per_device"]) == (0.438, 900)
    assert [m[f"llama2-7b-a3-{h}"]["tflops_per_s_per_chip"] for h in
            ("1host", "2hosts", "4hosts", "8hosts", "16hosts")] == [492, 422, 407, 409, 375]
    assert m["llama3-8b-v6e-256"] is None


def test_llama3_8b_translates_to_the_issue_command():
    """MaxText's llama3-8b-8192 (per-device batch 8, full, flash, fsdp over all 256 chips) is the
    lab run the issue compiled: batch 2048, mesh fsdp=256, whole-vocabulary loss, train step."""
    fields, diff = pub.translate(pub.RUNS["llama3-8b-v6e-256"])
    assert fields == {"preset": "llama3-8b", "seq": 8192, "batch": 2048, "step": "train", "loss_chunks": 1,
                      "compile_only": True, "target": "tpu-v6e", "target_devices": 256, "mesh": "fsdp=256",
                      "stack": "scan", "attention": "flash", "attention_block": 1024, "policy": "full"}
    # its other splash blocks are base.yml's 512, which the lab's one block size does not follow
    assert diff == ["flash blocks: the lab uses one block size (1024) in every pass; MaxText's key/value "
                    "512, the dk/dv pass's query 512, the dq pass's query 512 (base.yml's 512 where the "
                    "run names none)"]


def test_mixtral_translates_with_its_capacity_and_maxtexts_moe_flops():
    """MaxText's mixtral_8x7b_dropped (dense einsum dispatch, capacity factor 1.25, five names
    offloaded, fsdp over 256 chips): the lab's MoE with the same capacity, and MaxText's model flops
    (the router and the 2 experts a token goes through) give the published 35.23 % MFU from its
    published 3,899 tokens/s/device (under the full-square attention count MaxText then used)."""
    run = pub.RUNS["mixtral-8x7b-v6e-256"]
    fields, diff = pub.translate(run)
    assert (fields["preset"], fields["batch"], fields["mesh"], fields["capacity_factor"]) == \
        ("mixtral-8x7b", 12 * 256, "fsdp=256", 1.25)
    assert fields["offload_names"] == ("decoder_layer_input", "query_proj", "key_proj", "value_proj",
                                       "out_proj")
    assert not any("sparse_matmul" in d for d in diff)
    mfu = pub.mfu_definition(run)
    # within the rounding of both figures: 3,899 +- 0.5 (1.3e-4 of it) and 35.23 % +- 0.005 %
    assert mfu["matches"] == "full_square" and mfu["full_square"] == pytest.approx(0.3523, abs=1e-4)
    # by hand: 32 layers of (router + 2 gated experts + attention projections) + the vocabulary
    b, t, d, f = 12, 4096, 4096, 14336
    layer = 2 * b * t * d * 8 + 2 * 3 * 2 * b * t * f * d + 2 * b * t * d * (32 + 16) * 128 \
        + 2 * b * t * d * 32 * 128
    flops = 3 * (32 * layer + 2 * b * t * d * 32000) + 3 * 32 * 4 * b * t * t * 32 * 128 / 2
    assert pub.model_flops_per_device(run) == pytest.approx(flops, rel=1e-12)
    # MaxText's default sparse path and a capacity of -1 (dropless) are named, not hidden
    sparse = {**run, "knobs": {**run["knobs"], "sparse_matmul": True, "capacity_factor": -1.0}}
    fields, diff = pub.translate(sparse)
    assert fields["capacity_factor"] == 0.0
    assert any(d.startswith("sparse_matmul: MaxText multiplies each expert's tokens alone") and
               "dropless" in d for d in diff)


def test_maxtexts_expert_parallelism_is_the_labs_expert_axis():
    """mixtral_8x22b_dropped: ici_expert_parallelism 4 with ici_fsdp_parallelism 64 on 256 chips is
    the lab's fsdp=64,expert=4; its weight_dtype bfloat16 the lab's parameters and (MaxText's
    mu_dtype unset follows it) AdamW's moments; its published 36.2 % MFU from its 1,326
    tokens/s/device (rounding: 0.05 % of MFU, 1,326 +- 0.5)."""
    run = pub.RUNS["mixtral-8x22b-v6e-256"]
    fields, _ = pub.translate(run)
    assert (fields["mesh"], fields["param_dtype"], fields["optimizer_dtype"], fields["dtype"]) == (
        "fsdp=64,expert=4", "bfloat16", "bfloat16", "bfloat16")
    assert RunConfig.from_preset(fields.pop("preset"), **fields).mesh == "fsdp=64,expert=4"
    mfu = pub.mfu_definition(run)
    assert mfu["matches"] == "full_square" and mfu["full_square"] == pytest.approx(0.362, abs=8e-4)
    dense = pub.translate(pub.RUNS["mixtral-8x7b-v6e-256"])[0]  # names no dtype: the lab's defaults
    assert not {"param_dtype", "optimizer_dtype", "dtype"} & set(dense)


@pytest.mark.parametrize("knobs, words", [
    ({"ici_sequence_parallelism": 2}, "ici_sequence_parallelism 2: the lab's mesh has no sequence axis"),
    ({"use_random_routing": True}, "'use_random_routing' is not a knob the lab translates"),
])
def test_knobs_the_lab_cannot_follow_are_refused_by_name(knobs, words):
    run = pub.RUNS["mixtral-8x7b-v6e-256"]
    with pytest.raises(ConfigError, match=words):
        pub.translate({**run, "knobs": {**run["knobs"], **knobs}})


def test_a_run_naming_no_attention_gets_maxtexts_default_kernel():
    """MaxText's base.yml says ``attention: autoselected``, which attention_op.py runs as splash
    (flash) on TPU unless decoding, on a CPU, or under 128 tokens; its default blocks are 512."""
    run = pub.RUNS["llama2-70b-v5p-512"]
    assert "attention" not in run["knobs"] and run["knobs"]["max_target_length"] >= 128
    fields, _ = pub.translate(run)
    assert (fields["attention"], fields["attention_block"]) == ("flash", 512)
    named = pub.translate({**run, "knobs": {**run["knobs"], "attention": "dot_product"}})[0]
    assert named["attention"] == "full"


def test_mesh_knobs_fill_and_cross_slices():
    """-1 takes the devices left in a slice (ici) or the slices left (dcn); a dcn knob becomes the
    lab's dcn axis (no longer folded into the ICI axis, so no difference is named), and its logical
    axis is ici x dcn; knobs that do not divide the chips or the slices are refused."""
    fill = pub._mesh({"ici_fsdp_parallelism": -1, "ici_tensor_parallelism": 4}, 64)
    assert fill == ("fsdp=16,tensor=4", [])
    mesh, notes = pub._mesh({"ici_fsdp_parallelism": 8, "dcn_data_parallelism": 2}, 16)
    assert mesh == "dcn_data=2,fsdp=8" and notes == []
    assert parse_mesh(mesh) == {"data": 2, "fsdp": 8}
    # MaxText's 405B on 2 x v6e-256: ici_fsdp -1 fills a slice's 256 chips, dcn_fsdp 2
    mesh, _ = pub._mesh({"ici_fsdp_parallelism": -1, "dcn_fsdp_parallelism": 2}, 512, 2)
    assert mesh == "dcn_fsdp=2,fsdp=256" and parse_mesh(mesh) == {"fsdp": 512}
    assert pub._mesh({"dcn_data_parallelism": -1, "ici_fsdp_parallelism": 8}, 32, 4)[0] == \
        "dcn_data=4,fsdp=8"
    with pytest.raises(ConfigError, match="do not divide"):
        pub._mesh({"ici_fsdp_parallelism": 3}, 16)
    with pytest.raises(ConfigError, match="slices"):
        pub._mesh({"ici_fsdp_parallelism": 8, "dcn_data_parallelism": 2}, 16, 4)
    fields, diff = pub.translate(pub.RUNS["llama2-7b-a3-2hosts"])
    assert fields["mesh"] == "dcn_data=2,fsdp=8" and not any("dcn" in d for d in diff)
    # MaxText's fsdp_transpose (its v6e Llama 2 70B) shards as the lab's fsdp, said so
    mesh, notes = pub._mesh({"ici_fsdp_parallelism": 1, "ici_fsdp_transpose_parallelism": -1}, 256)
    assert mesh == "fsdp=256" and len(notes) == 1 and "fsdp_transpose" in notes[0]
    with pytest.raises(ConfigError, match="fsdp_transpose"):
        pub._mesh({"ici_fsdp_parallelism": 2, "ici_fsdp_transpose_parallelism": -1}, 256)


def test_a_run_maxtexts_own_compile_refuses_names_the_compiler_with_its_bytes():
    """tpu-recipes' runs measured on an older MaxText and JAX that MaxText 0.2.5 itself no longer fits
    on their chips (benchmarks/maxtext_reference.py --run NAME) name that difference with MaxText's
    bytes; where the lab's check of the run is stored, it is refused too, its temporaries no more
    than 3 % over MaxText's own (the lab's program is not what holds more than the measured run's)."""
    from pathlib import Path

    stored = Path(__file__).parents[1] / "benchmarks" / "published_checks"
    named = [n for n, r in pub.RUNS.items() if r.get("maxtext_compile")]
    assert {"llama3.1-8b-v6e-8", "llama3.1-8b-v6e-64", "mistral-7b-v6e-8",
            "mixtral-8x7b-v6e-256", "llama3-70b-v6e-256"} <= set(named)
    for name in named:
        mt = pub.RUNS[name]["maxtext_compile"]
        _, diff = pub.translate(pub.RUNS[name])
        ours = [d for d in diff if d.startswith(("the compiler the run was", "MaxText's own program"))]
        assert ours == [pub.compiler_difference(mt)]
        assert f"{mt['temp_bytes'] / 2 ** 30:.2f} GiB" in ours[0] and "refused too" in ours[0]
        # a measured run names the compiler it ran with; a configuration never run says so
        assert (mt["measured_with"] or "no run of it is published") in ours[0]
        # over what the chip gives a program (libtpu's refusal rounds to 0.01 GiB: Mixtral's 32.00)
        assert mt["fits"] is False and mt["temp_bytes"] > get_target(pub.RUNS[name]["target"]).usable_bytes()
        if (stored / f"{name}.json").exists():
            doc = json.loads((stored / f"{name}.json").read_text())
            assert doc["fits"] is False and doc["refused"], name
            assert doc["temp_bytes"] <= 1.03 * mt["temp_bytes"], name


def test_custom_plans_map_names_and_name_what_the_lab_lacks():
    """MaxText's name -> device/offload/remat map becomes save/offload names; a name the lab's llm
    does not have is a difference (never silently dropped); an unknown value is refused."""
    run = {**pub.RUNS["llama3-8b-v6e-256"], "name": "x"}
    run["knobs"] = {**run["knobs"], "remat_policy": "custom", "query_proj": "offload", "mlpwo": "device",
                    "context": "remat", "decoder_layer_input": "offload"}
    fields, diff = pub.translate(run)
    assert fields["offload_names"] == ("decoder_layer_input", "query_proj")  # the llm's name order
    assert fields["save_names"] == ("mlpwo",)
    assert not any("decoder_layer_input" in d for d in diff)  # the lab has the name: no difference
    run["knobs"]["mlpwo"] = "keep"
    with pytest.raises(ConfigError, match="device, offload or remat"):
        pub.translate(run)


def test_model_flops_are_six_per_parameter_per_token_plus_attention():
    """MaxText's model flops by another road: 6 x (the published parameter count less the embedding
    table and the norms) x tokens + 3 x the causal attention products (2 x 2 x tokens x seq / 2 x heads x
    head_dim a layer). llama3-8b: 8,030,261,248 parameters on the model card."""
    p = PRESETS["llama3-8b"]
    run = {**pub.RUNS["llama3-8b-v6e-256"]}
    b, t = 8, 8192
    norms = p["width"] * (2 * p["depth"] + 1)
    matmul = p["parameters"] - p["vocab"] * p["width"] - norms
    attention = 3 * 4 * b * t * t * p["heads"] * p["head_dim"] / 2 * p["depth"]
    by_hand = 6 * matmul * b * t + attention
    assert pub.model_flops_per_device(run) == pytest.approx(by_hand, rel=1e-12)
    square = pub.model_flops_per_device(run, causal=False)
    assert square - pub.model_flops_per_device(run) == pytest.approx(attention, rel=1e-12)


def test_the_measured_step_time_follows_the_figure():
    """tokens/s/device: tokens a device a step over it, exactly; TFLOP/s/chip: MaxText's model flops
    over it; MFU: over the bfloat16 peak."""
    run = pub.RUNS["llama3-8b-v6e-256"]
    assert pub.measured_step_s(run) is None
    tok = {**run, "measured": {"tokens_per_s_per_device": 4096}}
    assert pub.measured_step_s(tok) == {"step_s": 8 * 8192 / 4096, "from": "tokens_per_s_per_device"}
    tf = {**run, "measured": {"tflops_per_s_per_chip": 500}}
    assert pub.measured_step_s(tf)["step_s"] == pytest.approx(pub.model_flops_per_device(run) / 500e12)
    mfu = {**run, "measured": {"mfu": 0.5}}
    peak = get_target("tpu-v6e").peak_flops["bfloat16"]
    assert pub.measured_step_s(mfu)["step_s"] == pytest.approx(pub.model_flops_per_device(run) / (0.5 * peak))


def test_published_v6e_mfu_counts_attention_as_the_full_square():
    """The v6e figures' MFU and tokens/s agree only if attention is counted as the full (seq x seq)
    square, as MaxText counted when they were published (its code now halves it: causal)."""
    # Llama 2 70B's "approx" 900 tokens/s gives 43.58 %; the recipe's log, 905, gives the 43.8 %
    for name, tol in (("llama3.1-8b-v6e-256", 0.001), ("llama3.1-70b-v6e-256", 0.001),
                      ("llama2-70b-v6e-256", 0.003)):
        if pub.RUNS[name]["model"] not in PRESETS:
            pytest.skip("the Llama 3.1 presets are not in this checkout")
        d = pub.mfu_definition(pub.RUNS[name])
        assert d["matches"] == "full_square" and d["full_square"] == pytest.approx(d["published"], abs=tol)
        assert d["causal"] < d["published"] - 0.01


def test_the_cli_lists_runs_and_refuses_an_unknown_name():
    """``published --json`` without JAX; an unknown ``--check`` name exits 2 naming the runs."""
    out = subprocess.run([sys.executable, "-m", "remat_lab", "published", "--json"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    runs = json.loads(out.stdout)["runs"]
    assert {r["name"] for r in runs} == set(pub.RUNS) and all("@" in r["source"] for r in runs)
    bad = subprocess.run([sys.executable, "-m", "remat_lab", "published", "--check", "gpt-5"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "llama3-8b-v6e-256" in bad.stderr and "Traceback" not in bad.stderr


# seq 64: libtpu's compile of the tiny decoder takes about half as long as at 256 (2 cores)
TINY = {"width": 128, "depth": 2, "heads": 4, "kv_heads": 2, "head_dim": 32, "mlp_dim": 256, "vocab": 512,
        "seq": 64, "tie_embeddings": False, "loss_chunks": 1, "parameters": 0}


@pytest.fixture
def tiny_run(monkeypatch):
    """A stand-in published run of a tiny decoder on 4 v5e chips (fsdp), with a tokens/s figure."""
    from remat_lab.config import run as run_module

    monkeypatch.setitem(PRESETS, "tiny-test", TINY)
    monkeypatch.setitem(run_module.CHOICES, "preset", (*run_module.CHOICES["preset"], "tiny-test"))
    run = {"name": "tiny-v5e-4", "title": "tiny", "model": "tiny-test", "target": "tpu-v5e", "devices": 4,
           "slices": 1, "knobs": {"per_device_batch_size": 2, "ici_fsdp_parallelism": -1,
                                  "max_target_length": 64, "remat_policy": "full",
                                  "attention": "dot_product"},
           "source": {"file": "f", "commit": "0" * 40, "line": 1},
           "measured": {"tokens_per_s_per_device": 100000,
                        "source": {"file": "f", "commit": "0" * 40, "line": 1}}}
    monkeypatch.setitem(pub.RUNS, run["name"], run)
    return run


def test_a_check_compiles_the_run_and_sets_it_beside_the_record(tiny_run, monkeypatch):
    """The check's figures are the lab's own compile of the same configuration: fits against the
    chip's HBM, the compiled program's flops and the estimate over the measured step time. The
    program's flops pass MaxText's model flops (full remat computes the forward twice) but stay under
    1.8x (at most 4/3 of the products, the attention scores as the full square: 2 x 4/3 of causal).
    The lab's run document is the one the check compiled (recorded as it returns), not a second
    compile of the same configuration."""
    from remat_lab.studies import published as study

    runs = []

    def recorded(config, **kwargs):
        runs.append((config, run_experiment(config, **kwargs)))
        return runs[-1][1]

    monkeypatch.setattr(study, "run_experiment", recorded)
    doc = study.check("tiny-v5e-4")
    config, _ = study.config_for("tiny-v5e-4")
    assert config.mesh == "fsdp=4" and config.batch == 8 and config.attention == "full"
    [(compiled, same)] = runs  # one compile, of exactly this configuration
    assert compiled == config
    assert doc["fits"] is True and doc["peak_bytes"] == same["memory"]["peak_bytes"] <= doc["hbm_bytes"]
    assert doc["program_flops"] == same["flops"]
    assert 1.0 < doc["program_over_source_flops"] < 1.8
    assert doc["measured_step_s"] == pytest.approx(2 * 64 / 100000)
    estimate = same["timing"]["estimate_s"]
    assert doc["estimate_over_measured"] == pytest.approx(estimate / doc["measured_step_s"])


def test_a_run_over_two_slices_prices_its_cross_slice_collectives(tiny_run):
    """MaxText's dcn_fsdp over 2 slices of 2 v5e chips: the lab's mesh is dcn_fsdp=2,fsdp=2 (no
    difference named), and the check's estimate has collectives across the slices at the v5e's
    data-centre-network figure, apart from those within a slice."""
    from remat_lab.studies import published as study

    tiny_run.update(slices=2, knobs={**tiny_run["knobs"], "dcn_fsdp_parallelism": 2})
    doc = study.check("tiny-v5e-4")
    assert doc["config"]["mesh"] == "dcn_fsdp=2,fsdp=2" and not any("dcn" in d for d in doc["differences"])
    terms = doc["estimate_terms"]
    assert terms["collectives_dcn_s"] > 0
    assert terms["dcn_bytes_per_s"] == get_target("tpu-v5e").dcn_bytes_per_s
    assert terms["collectives_s"] == pytest.approx(terms["collectives_ici_s"] + terms["collectives_dcn_s"])


def test_a_run_over_the_chip_is_refused_with_the_bytes_it_needs(tiny_run):
    """libtpu refuses a program over the v5e's 16 GiB: the check says does not fit, with the bytes
    libtpu says the program needs (more than the chip has), not an error."""
    from remat_lab.studies import published as study

    tiny_run["knobs"] = {**tiny_run["knobs"], "per_device_batch_size": 64, "max_target_length": 8192}
    PRESETS["tiny-test"] = {**TINY, "vocab": 32768}
    doc = study.check("tiny-v5e-4")
    assert doc["fits"] is False and doc["refused"] and doc["temp_bytes"] > doc["hbm_bytes"]
    assert doc["refused_memory"] == "hbm" and doc["host_bytes_needed"] is None
    # eight times the chip: not compiled past HBM (libtpu would not finish it), and the check says so
    assert doc["predicted_s"] is None
    assert doc["prediction_basis"].startswith("none: its temporaries are over 2 times the chip's HBM")


def test_a_witness_over_the_chip_leaves_the_run_standing():
    """On a target, no_remat's program (the witness) over the chip while the policy's fits: the run
    answers with its own memory and flops, and says what was left out and why. An MLP (12 blocks of
    4096, 65,536 rows, bfloat16) on a v5e: no_remat needs 21.5 GiB of temporaries, full's program
    peaks at 10.6 GiB."""
    cfg = RunConfig(model="mlp", width=4096, depth=12, batch=65536, dtype="bfloat16", policy="full",
                    target="tpu-v5e")
    doc = run_experiment(cfg, timing=False)
    assert doc["memory"]["peak_bytes"] < get_target("tpu-v5e").memory_bytes
    assert doc["baseline"]["flops"] is None and "does not fit" in doc["baseline"]["left_out"]
    assert doc["notes"][0] == doc["baseline"]["left_out"] and doc["flops"] > 0


def test_figures_in_words_and_the_page_lists_the_catalogue():
    """The figure as the CLI and the page print it; the page opens on a linked run with the whole
    catalogue, the lab's command and no compile until asked; a link to no run is said."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    assert pub.figure_text({"mfu": 0.4546, "tokens_per_s_per_device": 7207}) == \
        "45.46% MFU, 7,207 tokens/s/device"
    assert pub.figure_text({"tflops_per_s_per_chip": 492}) == "492 TFLOP/s/chip"
    assert pub.figure_text(None) == "none published"
    page = str(Path(__file__).resolve().parents[1] / "pages" / "published.py")
    at = AppTest.from_file(page, default_timeout=120)
    at.query_params["run"] = "llama3-8b-v6e-256"
    at.run()
    assert not at.exception, at.exception
    assert len(at.dataframe[0].value) == len(pub.RUNS)
    assert at.selectbox(key="published_run").value == "llama3-8b-v6e-256"
    assert "--check llama3-8b-v6e-256" in at.code[0].value and "--mesh fsdp=256" in at.code[0].value
    assert not at.metric  # nothing compiled before the click
    bad = AppTest.from_file(page, default_timeout=120)
    bad.query_params["run"] = "gpt-5"
    bad.run()
    assert not bad.exception and any("no published run" in w.value for w in bad.warning)


def _page_with_stored_check(name: str):
    """``(doc, AppTest)``: the Published page on run ``name`` with its stored check as the session
    keeps a finished one (benchmarks/published_checks/NAME.json), run once without an exception."""
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    root = Path(__file__).resolve().parents[1]
    doc = json.loads((root / "benchmarks" / "published_checks" / f"{name}.json").read_text())
    at = AppTest.from_file(str(root / "pages" / "published.py"), default_timeout=60)
    at.query_params["run"] = name
    at.session_state["_published_docs"] = {name: doc}
    at.run()
    assert not at.exception, at.exception
    return doc, at


def test_the_page_shows_a_checks_prediction_with_the_collectives_its_schedule_leaves():
    """A finished check (the stored two-host A3 document, as the session keeps it): measured,
    predicted and bound side by side, and how much of the collectives the schedule does not hide."""
    doc, at = _page_with_stored_check("llama2-7b-a3-2hosts")
    step = next(m for m in at.metric if m.label == "Step time: measured")
    assert f"predicted {doc['predicted_s']:.3f} s ({doc['predicted_over_measured']:.2f}×)" in step.delta
    exposed = doc["prediction"]["exposed_collectives_s"]
    assert 0 < exposed < doc["prediction"]["scheduled_collectives_s"]
    assert any(f"{exposed:.3f} s not hidden behind kernels" in c.value for c in at.caption)
    # the network its collectives across hosts were priced at, and why that one
    assert any("The hosts' network: a3-high, 12.5 GB/s a GPU" in c.value and "h100-80gb-8" in c.value
               for c in at.caption)


def test_the_docs_error_over_the_published_runs_is_the_stored_checks():
    """docs/published.md's summary of the prediction's error (range, median, worst, how many outside
    20 %) is recomputed here from the stored checks (benchmarks/published_checks/), leaving out the
    runs a rate was fitted to (named in the TPU step models' sources), apart from the generator
    that writes it (benchmarks/doc_tables.py)."""
    import statistics
    from pathlib import Path

    from remat_lab.config import TARGETS

    root = Path(__file__).resolve().parents[1]
    fitted = {n for n in pub.RUNS if any(n in str((t.step_model or {}).get("source", ""))
                                          for t in TARGETS.values() if t.platform == "tpu")}
    assert fitted == {"llama3.1-8b-v6e-256", "llama2-70b-v5p-512"}
    ratios = {}
    for path in sorted((root / "benchmarks" / "published_checks").glob("*.json")):
        doc = json.loads(path.read_text())
        if doc.get("predicted_s") and doc.get("measured_step_s"):
            assert doc["bound_s"] < doc["measured_step_s"], doc["name"]  # a bound stays a bound
            if doc["name"] not in fitted:
                ratios[doc["name"]] = doc["predicted_s"] / doc["measured_step_s"]
    off = sorted(abs(1 - r) for r in ratios.values())
    outside = sorted(n for n, r in ratios.items() if abs(1 - r) > 0.2)
    words = {10: "ten", 11: "eleven", 12: "twelve", 13: "thirteen", 14: "fourteen", 15: "fifteen",
             16: "sixteen", 17: "seventeen", 18: "eighteen", 19: "nineteen", 0: "none", 1: "one",
             2: "two", 3: "three"}
    text = " ".join((root / "docs" / "published.md").read_text().split())
    summary = text[text.index("**The model's error over the published runs**"):][:900]
    assert f"over the {words[len(ratios)]} with a measured step" in summary
    assert f"{min(ratios.values()):.2f}× to {max(ratios.values()):.2f}× the measured step" in summary
    assert f"{statistics.median(off) * 100:.1f} % off at the median" in summary
    assert f"{off[-1] * 100:.0f} % at worst" in summary
    verb = "is" if len(outside) <= 1 else "are"
    assert f"{words[len(outside)]} of the {words[len(ratios)]} {verb} outside 20 %" in summary
    assert outside == []
    bounded = len(ratios) + len(fitted)  # every stored check with a measured step, fitted ones too
    assert f"The bound is under the measured step on all {words[bounded]}." in text


def test_a_run_whose_mfu_and_tokens_disagree_says_so_with_the_mfus_step():
    """The 405B's two published figures are 9 % apart (38.55 % MFU; 123 tokens/s/device give 35.18 %
    under the full-square count it is closest to): its step is the tokens/s's (8192 / 123 s), the
    MFU's is given beside it; the gold runs' figures agree within their rounding."""
    d = pub.mfu_definition(pub.RUNS["llama3.1-405b-v6e-256x2"])
    assert not d["agree"] and d["matches"] == "full_square"
    assert d["step_s_from_mfu"] == pytest.approx(8192 / 123 * d["full_square"] / 0.3855, rel=1e-12)
    assert 60.5 < d["step_s_from_mfu"] < 61.0
    both = {n: d for n in pub.RUNS if (d := pub.mfu_definition(pub.RUNS[n]))}
    assert {n for n, d in both.items() if not d["agree"]} == {"llama3.1-405b-v6e-256x2"}


def test_the_page_says_when_a_runs_mfu_and_tokens_disagree():
    _, at = _page_with_stored_check("llama3.1-405b-v6e-256x2")
    said = [c.value for c in at.caption if "MFU (38.55%)" in c.value]
    assert len(said) == 1 and "disagree" in said[0] and "60.77 s" in said[0]


def test_the_docs_tpu_schedule_diagnosis_is_the_stored_walk():
    """docs/published.md's figures for the TPU runs with their collectives as libtpu writes them are the
    stored output of benchmarks/tpu_step_model.py schedule; as written, every run but the 405B is
    over its measured step (why the model keeps the collectives beside the kernels)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    lines = (root / "benchmarks" / "tpu_step_model" / "schedule-2026-12-07.jsonl").read_text().splitlines()
    rows = {r["name"]: r for r in map(json.loads, lines[1:])}
    text = " ".join((root / "docs" / "published.md").read_text().split())
    for name, r in rows.items():
        assert r["as_written_s"] >= r["all_gathers_beside_s"] >= r["kernels_s"] - 1e-9, name
        assert f"{r['as_written_over_measured']:.3f}×" in text, name
        assert (r["as_written_over_measured"] > 1) == (name != "llama3.1-405b-v6e-256x2"), name
    assert f"{rows['llama3.1-405b-v6e-256x2']['all_gathers_beside_over_measured']:.3f}×" in text


def test_a_run_naming_only_its_weight_dtype_computes_in_maxtexts_bfloat16():
    """Naming one dtype knob drops the preset's recipe, so the others come from MaxText's base.yml
    (dtype bfloat16, weight_dtype float32, mu_dtype following the weights), not the lab's float32
    default: gpu-recipes' Mixtral names weight_dtype alone, and computed in float32 before."""
    run = {**pub.RUNS["mixtral-8x7b-a3ultra-256"], "name": "x"}
    fields, _ = pub.translate(run)
    assert (fields["dtype"], fields["param_dtype"], fields["optimizer_dtype"]) == ("bfloat16",) * 3
    run["knobs"] = {k: v for k, v in run["knobs"].items() if k != "weight_dtype"} | {"mu_dtype": "bfloat16"}
    fields, _ = pub.translate(run)
    assert (fields["dtype"], fields["param_dtype"], fields["optimizer_dtype"]) == \
        ("bfloat16", "float32", "bfloat16")


def test_a_run_reads_the_defaults_of_the_maxtext_it_ran_and_says_so():
    """gpu-recipes' Mixtral ran NVIDIA's jax:maxtext-2025-01-10 image, whose MaxText predates
    ``sparse_matmul`` (today's default true): read as false, its program is the dense dispatch the
    lab compiles, no difference; without the catalogue's ``maxtext_defaults`` it would be named one.
    The CLI's check and the Published page both say which default was read and why."""
    from remat_lab.cli.published import format_check

    run = pub.RUNS["mixtral-8x7b-a3ultra-256"]
    assert run["maxtext_defaults"] == {"sparse_matmul": False}
    assert pub.translate(run)[1] == []
    today = {k: v for k, v in run.items() if not k.startswith("maxtext_defaults")}
    assert any(d.startswith("sparse_matmul:") for d in pub.translate(today)[1])
    assert pub.defaults_text(today) is None
    said = pub.defaults_text(run)
    assert said.startswith("read as sparse_matmul: false, its MaxText's default: ") and "2025-01-10" in said
    doc, at = _page_with_stored_check("mixtral-8x7b-a3ultra-256")
    assert doc["differences"] == [] and doc["maxtext_defaults"]["knobs"] == {"sparse_matmul": False}
    assert f"defaults:      {said}" in format_check({**doc, "run_command": ""})
    assert any(c.value.startswith("MaxText's defaults then: read as sparse") for c in at.caption)


def test_a_tpu_runs_libtpu_flags_say_which_collectives_ran_beside_its_kernels():
    """Every measured v6e and v5p run names the libtpu flag sets its MaxText configuration launches
    with. All pass continuation fusion for all-gathers; every one but the 405B's also overlaps or
    offloads its reductions (data-parallel overlap, SparseCore offload), so only the 405B's
    reductions are priced as libtpu writes them (collective_overlap all-gathers). A run naming
    neither kind would be none; one naming no flags keeps the default. The CLI's check and the
    Published page say which flags and what they overlap."""
    from remat_lab.cli.published import format_check

    measured = [n for n, r in pub.RUNS.items() if r["target"] in ("tpu-v6e", "tpu-v5p")
                and pub.measured_step_s(r) and r["source"].get("repository") is None]
    assert measured and all(pub.RUNS[n].get("libtpu_flags") for n in measured), measured
    overlaps = {n: pub.collective_overlap(pub.RUNS[n]) for n in measured}
    assert {n for n, o in overlaps.items() if o} == {"llama3.1-405b-v6e-256x2"}
    assert overlaps["llama3.1-405b-v6e-256x2"] == "all-gathers"
    fields, _ = pub.translate(pub.RUNS["llama3.1-405b-v6e-256x2"])
    assert fields["collective_overlap"] == "all-gathers"
    bare = {**pub.RUNS["llama3.1-405b-v6e-256x2"], "libtpu_flags": {"names": ["HOST_OFFLOAD_FLAGS"]}}
    assert pub.collective_overlap(bare) == "none"
    assert pub.collective_overlap({**bare, "libtpu_flags": None}) == ""
    assert pub.collective_overlap(pub.RUNS["llama2-7b-a3-1host"]) == ""  # a GPU: its schedule
    said = pub.overlap_text(pub.RUNS["llama3.1-405b-v6e-256x2"])
    assert said.startswith("launched with libtpu flags DENSE_VMEM_LIMIT_FLAG, CF_FOR_ALL_GATHER")
    assert "only the all-gathers beside the kernels" in said
    assert "every collective beside" in pub.overlap_text(pub.RUNS["llama3.1-8b-v6e-256"])
    assert pub.overlap_text(pub.RUNS["llama2-7b-a3-1host"]) is None
    doc, at = _page_with_stored_check("llama3.1-405b-v6e-256x2")
    assert f"collectives:   {said}" in format_check({**doc, "run_command": ""})
    assert any(c.value.startswith("Collectives: launched with libtpu flags") for c in at.caption)


REFUSED = ("llama3.1-8b-v6e-8", "llama3.1-8b-v6e-64", "mistral-7b-v6e-8", "mixtral-8x7b-v6e-256")


def test_a_run_libtpu_refuses_for_hbm_is_predicted_from_the_program_it_finishes_past_hbm():
    """Four catalogued runs were measured with older JAX and libtpu, whose programs fit; today's
    libtpu refuses the lab's program and MaxText's own alike. Their stored checks still predict
    the step, from the program libtpu writes when told to finish (xla_tpu_no_crash_on_oom), within
    issue 47's 20 % of the measured step and the bound under it; the CLI and the page say where the
    prediction comes from."""
    from remat_lab.cli.published import format_check
    from remat_lab.studies import published as study

    root = Path(__file__).resolve().parents[1] / "benchmarks" / "published_checks"
    for name in REFUSED:
        doc = json.loads((root / f"{name}.json").read_text())
        assert not doc["fits"] and doc["refused"], name
        assert doc["prediction_basis"].startswith(study.PAST_HBM), name
        assert 0.8 <= doc["predicted_over_measured"] <= 1.2, (name, doc["predicted_over_measured"])
        assert doc["bound_s"] < doc["measured_step_s"], name
        assert "from the program libtpu finishes past HBM" in format_check({**doc, "run_command": ""})
    _, at = _page_with_stored_check(REFUSED[0])  # the page says it once, for one of them
    assert any("told to finish anyway" in c.value for c in at.caption)


def test_the_network_sentence_is_the_clis_and_the_pages_and_only_across_gpu_hosts():
    from remat_lab.cli.published import format_check

    for name, said in (("llama2-7b-a3-16hosts", "a3-high, 12.5 GB/s a GPU (MaxText's README"),
                       ("llama3.1-70b-a3ultra-256", "the h200 default, 50 GB/s a GPU (Google Cloud A3 Ultra"),
                       ("llama2-7b-a3-1host", None), ("llama3.1-405b-v6e-256x2", None)):
        doc, at = _page_with_stored_check(name)
        text = pub.network_text(doc)
        shown = [c.value for c in at.caption if c.value.startswith("The hosts' network")]
        cli = format_check({**doc, "run_command": ""})
        if said is None:  # one host, or a TPU's slices: no hosts' network to name
            assert text is None and not shown and "network:" not in cli, name
        else:
            assert text.startswith(said), (name, text)
            assert len(shown) == 1 and said.split(" (")[0] in shown[0], shown
            assert f"network:       {text}" in cli

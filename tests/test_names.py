"""Checkpoint names: every model's tags, the custom policy's configuration (validation, CLI flags,
URL values, the app's editor) and what the policies decide on a name equation."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import pytest

from remat_lab.analysis.dissect import dissect
from remat_lab.cli import build_parser, main
from remat_lab.config import ConfigError, RunConfig, coerce_config
from remat_lab.model.models import MODELS, names_of
from remat_lab.model.policies import POLICIES, build_policy, policy_code
from remat_lab.program.step import build_problem

ROOT = Path(__file__).resolve().parents[1]
CUSTOM = dict(model="transformer", width=64, heads=4, seq=16, batch=2, depth=2, stack="loop",
              policy="custom")


def test_every_model_has_its_names():
    assert names_of("mlp") == ("l1", "l2")
    assert names_of("seq_mixer") == ("l1", "scores", "mix", "l2")
    assert names_of("transformer") == ("query_proj", "key_proj", "value_proj", "context",
                                       "out_proj", "mlpwi_0", "mlpwi_1", "mlpwo")
    for model in MODELS:  # the tags in the traced model are exactly names_of(model)
        cfg = RunConfig(model=model, width=16, heads=2, seq=4, batch=2, policy="no_remat")
        problem = build_problem(cfg)
        text = str(jax.make_jaxpr(problem.loss)(*problem.args))
        tagged = {n for n in names_of(model) if f"name[name={n}]" in text or f"name={n}" in text}
        assert tagged == set(names_of(model)), (model, text[:400])


def test_custom_choices_are_validated_and_canonical():
    cfg = RunConfig(**CUSTOM, save_names=["mlpwo", "query_proj"], offload_names=("context",))
    assert cfg.save_names == ("query_proj", "mlpwo")  # the model's order, a tuple
    assert cfg == RunConfig(**CUSTOM, save_names=("query_proj", "mlpwo"), offload_names=("context",))
    hash(cfg)
    assert json.loads(json.dumps(cfg.as_dict()))["save_names"] == ["query_proj", "mlpwo"]
    with pytest.raises(ConfigError, match="'qkv_proj' is not a checkpoint name of transformer; its "
                                          "names: query_proj, key_proj, value_proj, context"):
        RunConfig(**CUSTOM, save_names=("qkv_proj",))
    with pytest.raises(ConfigError, match="context is in both save_names and offload_names"):
        RunConfig(**CUSTOM, save_names=("context",), offload_names=("context",))
    with pytest.raises(ConfigError, match="only for policy custom"):
        RunConfig(**{**CUSTOM, "policy": "save_qkv_proj"}, save_names=("query_proj",))
    with pytest.raises(ConfigError, match="its names: l1, l2"):
        RunConfig(model="mlp", policy="custom", offload_names=("query_proj",))


def test_cli_flags_and_url_values_restore_the_same_choices():
    argv = ["run", "--model", "transformer", "--width", "64", "--heads", "4", "--seq", "16",
            "--batch", "2", "--depth", "2", "--stack", "loop", "--policy", "custom",
            "--save-names", "key_proj,query_proj", "--offload-names", " mlpwi_0 , mlpwi_1"]
    from remat_lab.cli import _config_from

    from_cli = _config_from(build_parser().parse_args(argv))
    url = {k: str(v) for k, v in CUSTOM.items()} | {"save_names": "query_proj,key_proj",
                                                    "offload_names": "mlpwi_0,mlpwi_1"}
    from_url = coerce_config(url)
    assert from_cli == from_url
    assert from_url.save_names == ("query_proj", "key_proj")
    assert from_url.offload_names == ("mlpwi_0", "mlpwi_1")
    assert coerce_config({**url, "save_names": "", "offload_names": ""}).save_names == ()


def test_cli_refuses_an_unknown_name_with_the_list(capsys):
    code = main(["explain", "--model", "mlp", "--policy", "custom", "--save-names", "l3"])
    assert code == 2
    assert "'l3' is not a checkpoint name of mlp; its names: l1, l2" in capsys.readouterr().err


def test_cli_policies_lists_a_models_names_and_the_recipes(capsys):
    assert main(["policies", "--model", "seq_mixer"]) == 0
    out = capsys.readouterr().out
    assert "Checkpoint names of seq_mixer: l1, scores, mix, l2" in out
    assert "MaxText recipes:" in out and "save_qkv_proj" in out and "custom" in out
    assert "in seq_mixer: saves -; offloads -; not in seq_mixer:" in out


def test_policies_decide_on_the_name_equation():
    from jax._src.ad_checkpoint import name_p  # the primitive checkpoint_name binds

    aval = jax.ShapeDtypeStruct((2, 2), "float32")  # name policies read only the name

    custom = build_policy(RunConfig(**CUSTOM, save_names=("context",), offload_names=("mlpwo",)))
    assert custom(name_p, aval, name="context") is not False
    assert "Offloadable" in type(custom(name_p, aval, name="mlpwo")).__name__
    qkv = build_policy(RunConfig(policy="save_qkv_proj"))
    assert qkv(name_p, aval, name="key_proj") and not qkv(name_p, aval, name="context")
    assert POLICIES["full"].build() is None and POLICIES["full"].remat
    code = policy_code(RunConfig(**CUSTOM, save_names=("context",)))
    assert 'names_which_can_be_saved=["context"]' in code and "names_which_can_be_offloaded=[]" in code


@pytest.mark.parametrize("model,save,offload", [("mlp", ("l1",), ("l2",)),
                                                ("seq_mixer", ("scores",), ("mix",))])
def test_custom_on_the_small_models_keeps_the_chosen_names(model, save, offload):
    cfg = RunConfig(model=model, width=16, batch=2, seq=4, policy="custom", save_names=save,
                    offload_names=offload)
    d = dissect(build_problem(cfg), "")
    kinds = {r["name"]: r["memory_kind"] for r in d.residuals if r["name"]}
    assert kinds.get(save[0]) == "device"
    assert set(kinds) <= {*save, *offload}
    rows = {r["name"]: r for r in d.dots if r["name"]}
    assert rows[save[0]]["name_verdict"] == "save"
    assert rows[offload[0]]["name_verdict"] == "offload"


def test_recipes_name_what_a_small_model_lacks():
    d = dissect(build_problem(RunConfig(model="mlp", width=16, batch=2, policy="minimal")), "")
    assert not any(r["name"] for r in d.residuals)
    assert any("none of its names apply" in n for n in d.notes)


# --- the app's sidebar -------------------------------------------------------------------------

def _app(**params):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "pages" / "guide.py"), default_timeout=120)
    for key, value in params.items():
        at.query_params[key] = value
    return at


def test_app_url_restores_the_custom_editor():
    params = {"model": "transformer", "width": "64", "heads": "8", "seq": "16", "batch": "2",
              "policy": "custom", "save_names": "query_proj,context", "offload_names": "mlpwi_0"}
    at = _app(**params).run()
    assert not at.exception and not at.warning, [w.value for w in at.warning]
    assert at.select_slider(key="heads").value == 8
    state = {n: at.session_state[f"custom_{n}"] for n in names_of("transformer")}
    assert state["query_proj"] == state["context"] == "save"
    assert state["mlpwi_0"] == "offload" and state["key_proj"] == "recompute"
    assert {k: at.query_params[k] for k in params} == params


def test_app_offers_heads_only_for_the_transformer_and_groups_policies():
    at = _app(model="mlp", width="64").run()
    assert not at.exception
    assert not [s for s in at.select_slider if s.key == "heads"]
    assert "heads" not in at.query_params and "save_names" not in at.query_params
    labels = at.selectbox(key="policy").options
    assert any(o.startswith("JAX policies") for o in labels)
    assert any(o.startswith("MaxText recipes") for o in labels)
    assert any(o.startswith("Custom") for o in labels)


def test_app_warns_about_an_unknown_name_in_the_url():
    at = _app(model="mlp", policy="custom", save_names="l1,bogus").run()
    assert not at.exception
    assert any("`save_names`" in w.value and "its names: l1, l2" in w.value for w in at.warning)

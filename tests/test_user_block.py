"""The user's own NNX block (``--model-module``): dissected like a built-in, its names offered to custom,
its errors shown as the user's, refused in public mode and never taken from a URL."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from streamlit.testing.v1 import AppTest

from remat_lab.cli import main
from remat_lab.config import ConfigError, RunConfig
from remat_lab.config.errors import UserCodeError
from remat_lab.model import user_block
from remat_lab.model.models import block_names
from remat_lab.present.reproduce import cli_command, reproduce_code
from remat_lab.program.step import build_problem, jit_step
from remat_lab.store import results

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = "tests/fixtures/user_block.py"
FILE = str((ROOT / FIXTURE).resolve())
SHAPE = (2, 8, 64)  # the fixture's block is 64 features wide


def user(factory: str = "make_block", **kw) -> RunConfig:
    fields = {"model": "user", "model_module": f"{FILE}:{factory}", "input_shape": SHAPE,
              "batch": SHAPE[0], "depth": 2, "repeats": 1, "warmup": 0, **kw}
    return RunConfig(**fields)


def _jaxpr_names() -> list[str]:
    """The fixture's checkpoint names read independently: its one block traced by plain jax."""
    from tests.fixtures.user_block import make_block  # noqa: PLC0415

    block = make_block(nnx.Rngs(0))
    text = str(jax.make_jaxpr(lambda x: block(x))(jnp.zeros(SHAPE)))
    return [line.split("name=")[1].split("]")[0].strip() for line in text.splitlines() if " name[" in line]


def test_the_fixtures_names_are_found_and_reach_custom():
    cfg = user()
    assert list(block_names(cfg)) == _jaxpr_names() == ["up_proj", "act", "down_proj"]
    ok = user(policy="custom", save_names="down_proj,up_proj", offload_names=("act",))
    assert ok.save_names == ("down_proj", "up_proj")  # sorted: equal choices, equal configurations
    build_problem(ok)  # accepted by the build
    with pytest.raises(ConfigError, match="'nope' is not a checkpoint name of your block.*"
                                          "its names: up_proj, act, down_proj"):
        build_problem(user(policy="custom", save_names=("nope",)))


def test_the_fixture_dissects_and_saves_exactly_the_chosen_name(run):
    doc = run(user(policy="custom", save_names=("up_proj",)))
    per_layer = math.prod(SHAPE[:-1]) * 2 * SHAPE[-1] * 4  # up_proj's output, float32, one layer
    assert doc["totals"]["residual_bytes_by_name"] == {"up_proj": 2 * per_layer}  # depth 2, scanned
    named = [r for r in doc["residuals"] if r.get("name")]
    assert [r["name"] for r in named] == ["up_proj"] and named[0]["bytes"] == 2 * per_layer
    assert named[0]["layer"] == "up_proj"  # the block's own tag, not "other"
    # Its two products carry its tags (read independently from its jaxpr): each is attributed to
    # its tag, never to "other".
    assert [d["layer"] for d in doc["dots"]] == [n for n in _jaxpr_names() if n.endswith("_proj")]
    assert doc["totals"]["residual_bytes_by_layer"]["up_proj"] == 2 * per_layer
    assert doc["gradient_check"]["ok"] is True  # against the same block without remat
    assert doc["gradient_check"]["independent"] is False
    assert doc["model"]["parameters"] == 2 * 2 * (64 * 128)  # two blocks of up and down kernels
    assert doc["memory_timeline"] and doc["dots"] and doc["memory"]["peak_bytes"] > 0
    assert doc["config"]["input_shape"] == SHAPE and doc["config"]["model_module"].endswith(":make_block")
    nothing = run(user(policy="nothing_saveable"))
    assert not nothing["totals"].get("residual_bytes_by_name")


def test_the_gradients_are_the_fixtures_own(run):
    """No reference exists for a user block, but the lab's step must still be the block's gradient:
    against jax.grad of the fixture's block called directly (remat changes no value)."""
    cfg = user(depth=1, policy="nothing_saveable")
    problem = build_problem(cfg)
    loss, grads = jit_step(problem)(*problem.args)
    graphdef, state = nnx.split(user_block.build_user_stack(cfg.model_module, 1, "scan", seed=0,
                                                            dtype=jnp.float32))
    ref = jax.value_and_grad(lambda s: jnp.sum(nnx.merge(graphdef, s)(problem.x)))(state)
    tol = 10 * float(jnp.finfo(jnp.float32).eps) * math.prod(SHAPE)
    np.testing.assert_allclose(float(loss), float(ref[0]), rtol=tol)
    for g, r in zip(grads, jax.tree_util.tree_leaves(ref[1])):
        r = np.asarray(r)
        np.testing.assert_allclose(np.asarray(g), r, rtol=tol, atol=tol * float(np.abs(r).max()))


@pytest.mark.parametrize("factory, match", [
    ("make_raising", "your block raised ValueError: the fixture's factory fails on purpose"),
    ("make_wrong_width", "your block raised TypeError"),
])
def test_an_error_in_the_users_code_is_shown_as_theirs(factory, match):
    with pytest.raises(UserCodeError, match=match) as info:
        build_problem(user(factory))
    text = str(info.value)
    theirs = text.split("--- your traceback")[1]
    assert FILE in theirs and (f"in {factory}" in theirs or "in __call__" in theirs)
    assert "remat_lab" not in theirs.replace(FILE, "")  # frames from their file only


def test_a_factory_that_returns_no_module_is_refused():
    with pytest.raises(UserCodeError, match="returned a int, not an nnx.Module"):
        build_problem(user("make_not_module"))


def test_a_missing_file_or_attribute_is_a_clear_message():
    with pytest.raises(ConfigError, match="there is no file 'no/such.py'"):
        build_problem(user().replace(model_module="no/such.py:make_block"))
    with pytest.raises(ConfigError, match="has no function 'nope'; it defines: .*make_block"):
        build_problem(user("nope"))
    with pytest.raises(ConfigError, match="no module named 'no_such_pkg.blocks'"):
        build_problem(user().replace(model_module="no_such_pkg.blocks:make_block"))
    with pytest.raises(ConfigError, match="is not module:factory"):
        user().replace(model_module="rm -rf /")


def test_the_configuration_round_trips_and_keeps_batch_and_shape_together():
    cfg = user()
    raw = json.loads(json.dumps(cfg.as_dict()))
    assert RunConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}) == cfg
    assert RunConfig(**raw).input_shape == cfg.input_shape  # a JSON list is read as the shape
    assert cfg.replace(batch=6).input_shape == (6, *SHAPE[1:])  # the advisor's probes
    with pytest.raises(ConfigError, match="first axis is the batch"):
        RunConfig(**{**cfg.as_dict(), "batch": 3})
    with pytest.raises(ConfigError, match="one device"):
        cfg.replace(mesh="data=2")
    assert RunConfig().input_shape == (RunConfig().batch, RunConfig().width)  # built-ins: derived
    with pytest.raises(ConfigError, match="no code snippet for your own block"):
        reproduce_code(cfg)
    assert f"--model-module {FILE}:make_block --input-shape 2,8,64" in cli_command(cfg)


def test_a_results_file_reads_the_fields_back_without_loading_the_module(tmp_path):
    doc = {"schema": 1, "config": {**user().replace(model_module="never/loaded.py:f").as_dict()},
           "environment": {"backend": "cpu", "device_kind": "cpu", "device_count": 1, "jax": "0"}}
    assert results.classify(json.loads(json.dumps(doc))) == "run"
    bad = {**doc, "config": {**doc["config"], "input_shape": "4,16"}}
    with pytest.raises(results.Invalid, match="input_shape must be a list"):
        results.classify(bad)


def test_public_mode_refuses_it(monkeypatch):
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "1")
    with pytest.raises(ConfigError, match="refused in public mode"):
        build_problem(user())


def test_a_public_servers_worker_refuses_it_even_with_the_switch_unset(monkeypatch):
    """The app is public unless REMAT_LAB_PUBLIC says 0 (store.history.public_mode): its worker
    refuses a user block that reached it some other way than the (hidden) sidebar input."""
    from remat_lab.serve.in_worker import execute

    monkeypatch.delenv("REMAT_LAB_PUBLIC", raising=False)
    with pytest.raises(ConfigError, match="only on a private instance of the app, never on this public"):
        execute("run", {"config": user().as_dict()}, lambda stage: None)


def test_the_cli_shows_their_error_with_exit_status_2(capsys):
    status = main(["run", "--model-module", f"{FIXTURE}:make_raising", "--input-shape", "2,8,64",
                   "--json"])
    err = capsys.readouterr().err
    assert status == 2 and "your block raised ValueError" in err and "Traceback" not in err
    status = main(["run", "--model-module", f"{FIXTURE}:make_block", "--input-shape", "2,8,64",
                   "--policy", "custom", "--save-names", "nope"])
    assert status == 2 and "its names: up_proj, act, down_proj" in capsys.readouterr().err


def _sidebar_script():
    import streamlit as st

    from pages import _sidebar

    cfg = _sidebar.controls()
    st.write(f"MODEL={cfg.model}")


def test_a_url_cannot_set_it_and_a_public_server_does_not_offer_it(monkeypatch):
    at = AppTest.from_function(_sidebar_script, default_timeout=60)
    at.query_params.update({"model": "user", "model_module": f"{FIXTURE}:make_block",
                            "input_shape": "2,8,64"})
    at.run()
    assert not at.exception
    warned = " ".join(w.value for w in at.warning)
    assert "`model_module` is your own block" in warned and "model user is your own block" in warned
    assert "MODEL=user" not in " ".join(m.value for m in at.markdown)
    assert at.session_state["user_module"] == ""
    assert "Your block (local only)" in [t.label for t in at.sidebar.text_input]  # private: offered
    monkeypatch.setenv("REMAT_LAB_PUBLIC", "1")
    public = AppTest.from_function(_sidebar_script, default_timeout=60).run()
    assert not public.exception
    assert "Your block (local only)" not in [t.label for t in public.sidebar.text_input]


def test_the_sidebar_uses_a_typed_block_and_offers_its_names():
    at = AppTest.from_function(_sidebar_script, default_timeout=120)
    at.session_state["user_module"] = f"{FIXTURE}:make_block"
    at.session_state["user_shape"] = "2,8,64"
    at.session_state["policy"] = "custom"
    at.run()
    assert not at.exception and not at.error
    assert "MODEL=user" in " ".join(m.value for m in at.markdown)
    assert all(f"custom_{n}" in at.session_state for n in ("up_proj", "act", "down_proj"))
    at.session_state["user_module"] = f"{FIXTURE}:make_raising"
    at.run()
    assert "your block raised ValueError" in " ".join(e.value for e in at.error)
    assert any(FILE in c.value for c in at.code)  # their traceback, in a block of its own


def _shape_script():
    import streamlit as st

    from pages import _sidebar

    cfg = _sidebar.controls()
    st.write(f"MODEL={cfg.model} SHAPE={','.join(map(str, cfg.input_shape))} BATCH={cfg.batch}")


def test_the_sidebar_fills_in_the_module_s_example_input_shape():
    at = AppTest.from_function(_shape_script, default_timeout=120)
    at.session_state["user_module"] = f"{FIXTURE}:make_block"  # example_input_shape = (4, 16, 64)
    at.run()
    assert not at.exception and not at.error
    box = next(t for t in at.sidebar.text_input if t.key == "user_shape")
    assert box.value == "4,16,64"  # shown in the box, as the CLI would use it
    assert "MODEL=user SHAPE=4,16,64 BATCH=4" in " ".join(m.value for m in at.markdown)
    box.set_value("2,16,64").run()  # a shape of the user's own is kept
    assert not at.exception and not at.error
    assert "MODEL=user SHAPE=2,16,64 BATCH=2" in " ".join(m.value for m in at.markdown)
    box.set_value("").run()  # emptied: the module's own again
    assert next(t for t in at.sidebar.text_input if t.key == "user_shape").value == "4,16,64"


def test_a_wrong_input_shape_is_said_as_such_with_both_shapes():
    """A block that takes its example shape, given another: the shape is wrong, not the user's code."""
    with pytest.raises(ConfigError, match=r"does not take an input of shape \(2, 8, 32\): its module's "
                                          r"example_input_shape is \(4, 16, 64\)"):
        build_problem(user(input_shape=(2, 8, 32), batch=2))
    at = AppTest.from_function(_shape_script, default_timeout=120)
    at.session_state["user_module"] = f"{FIXTURE}:make_block"
    at.session_state["user_shape"] = "2,8,32"
    at.run()
    said = " ".join(e.value for e in at.error)
    assert "does not take an input of shape (2, 8, 32)" in said and "(4, 16, 64)" in said, said
    assert "your block raised" not in said  # not blamed on their code


# ---------------------------------------------------------------- swept: batches x policies


def test_a_sweep_of_the_block_takes_each_batch_as_its_inputs_first_axis():
    from remat_lab.studies import sweep

    grid = sweep.build_grid(user(), width=[8, 16], seq=[4, 8], batch=[2, 4],
                            policy=["no_remat", "nothing_saveable"])
    assert len(grid) == 4  # width and seq are not the block's sizes: no duplicate runs
    for c in grid:
        cfg = RunConfig(**c)  # valid: the batch and the input's first axis agree
        assert cfg.input_shape == (c["batch"], *SHAPE[1:]) and cfg.model_module == user().model_module


def test_the_cli_sweeps_the_block_and_its_peaks_are_single_runs_peaks(tmp_path, capsys, run):
    out = tmp_path / "rows.jsonl"
    status = main(["sweep", "--model-module", f"{FIXTURE}:make_block", "--input-shape", "2,8,64",
                   "--batches", "2,4", "--policies", "no_remat,nothing_saveable", "--depths", "2",
                   "--repeats", "2", "--warmup", "0", "--out", str(out)])
    assert status == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["config"]["batch"], r["config"]["policy"]) for r in rows) == [
        (2, "no_remat"), (2, "nothing_saveable"), (4, "no_remat"), (4, "nothing_saveable")]
    for r in rows:
        c = r["config"]
        assert tuple(c["input_shape"]) == (c["batch"], 8, 64) and "error" not in r
        assert r["step_time_s"]["ci_low"] <= r["step_time_s"]["median"] <= r["step_time_s"]["ci_high"]
        # The same configuration run alone (``run``), its compiled peak: the same number.
        alone = run(user(policy=c["policy"], batch=c["batch"], input_shape=(c["batch"], 8, 64),
                         repeats=2, warmup=0))
        assert r["memory"]["peak_bytes"] == alone["memory"]["peak_bytes"]
    assert "user 4x8x64 nothing_saveable: median" in capsys.readouterr().err
    status = main(["sweep", "--model-module", f"{FIXTURE}:make_block", "--widths", "64,128"])
    assert status == 2 and "--widths cannot be swept with --model-module" in capsys.readouterr().err


def test_the_sweep_page_offers_batches_of_a_typed_block():
    at = AppTest.from_file(str(ROOT / "pages" / "sweep.py"), default_timeout=300)
    at.session_state["user_module"] = f"{FIXTURE}:make_block"
    at.session_state["user_shape"] = "2,8,64"
    at.query_params.update(depth="2", repeats="2")
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert not [m for m in at.multiselect if m.key == "sweep_widths"]  # no widths for a block
    assert any("Your block: its input 2×8×64 sets its sizes" in c.value for c in at.caption)
    at.multiselect(key="sweep_batches").set_value([2, 4])
    at.multiselect(key="sweep_policies").set_value(["no_remat"])
    at.button(key="sweep_run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    rows = list(at.session_state["sweep_docs"].values())
    assert sorted(tuple(r["config"]["input_shape"]) for r in rows) == [(2, 8, 64), (4, 8, 64)]
    assert all(r["config"]["model"] == "user" and r["step_time_s"]["median"] > 0 for r in rows)
    titles = [json.dumps(json.loads(c.proto.spec).get("layout", {}).get("title", {}))
              for c in at.get("plotly_chart")]
    assert any("vs batch" in t for t in titles) and not any("vs width" in t for t in titles), titles


def test_the_cli_batch_of_a_user_block_is_its_input_shapes_first_axis():
    """``--batch`` with ``--model-module``: the module's example input at that batch; beside an
    ``--input-shape`` whose first axis differs it is refused with a sentence (it was dropped: a
    'batch 67' run compiled the input shape's batch 1)."""
    from remat_lab.cli import _config_from, build_parser

    def parse(*flags):
        argv = ["run", "--model-module", f"{FILE}:make_block", *flags]
        return _config_from(build_parser().parse_args(argv))
    assert parse("--batch", "5").input_shape[0] == 5 == parse("--batch", "5").batch
    assert parse("--input-shape", "3,8,64", "--batch", "3").batch == 3
    with pytest.raises(ConfigError, match="differs from --input-shape's first axis"):
        parse("--input-shape", "1,8,64", "--batch", "67")

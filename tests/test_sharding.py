"""Meshes: validation, and in a subprocess with 4 emulated CPU devices, gradients and collectives.

The multi-device cases run in one subprocess (``XLA_FLAGS=--xla_force_host_platform_device_count=4``
must be set before JAX starts), which prints one JSON document the tests read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remat_lab.cli import main
from remat_lab.config import ConfigError, RunConfig, mesh_devices, parse_mesh

SRC = str(Path(__file__).resolve().parents[1] / "src")
SMALL = dict(model="mlp", width=32, batch=8, depth=2, stack="scan", repeats=1, warmup=0)

# --- validation (no devices needed) ------------------------------------------------------------


def test_mesh_is_parsed_to_a_canonical_string():
    assert RunConfig(**SMALL, mesh=" tensor=2, data=2 ").mesh == "data=2,tensor=2"
    assert RunConfig(**SMALL, mesh="data=1").mesh == ""  # one device: the single-device path
    assert parse_mesh("fsdp=4,data=1") == {"fsdp": 4}
    assert mesh_devices("data=2,fsdp=2") == 4 and mesh_devices("") == 1


@pytest.mark.parametrize("mesh, words", [
    ("pipeline=2", "unknown mesh axis 'pipeline'"),
    ("data", "needs a whole number"),
    ("data=two", "needs a whole number"),
    ("data=0", "needs a whole number"),
    ("data=2,data=2", "given twice"),
    ("data=3", "batch 8 cannot be split over data x fsdp = 3"),
    ("fsdp=64", "batch 8 cannot be split"),
    ("tensor=3", "width 32 cannot be split over fsdp x tensor = 3"),
    ("data=4096,tensor=2", "at most 4096"),
])
def test_bad_meshes_are_refused_with_a_sentence(mesh, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(")):
        RunConfig(**SMALL, mesh=mesh)


def test_mesh_must_divide_heads_and_needs_a_batch():
    with pytest.raises(ConfigError, match="heads 2 cannot be split over tensor = 4"):
        RunConfig(model="transformer", width=32, heads=2, batch=2, mesh="tensor=4")
    with pytest.raises(ConfigError, match="batch 0 cannot be split"):
        RunConfig(model="mlp", width=32, batch=0, mesh="data=2")


@pytest.mark.parametrize("flags, words", [
    (["--mesh", "data=3"], "batch 8 cannot be split"),
    (["--mesh", "sequence=2"], "unknown mesh axis"),
    (["--mesh", "expert=2"], "0 experts cannot be split over expert = 2"),
    (["--mesh", "data=8"], "mesh data=8 needs 8 devices; this run has 1 cpu device"),
    (["--host-devices", "0"], "host devices must be a whole number from 1 to 512"),
    (["--coordinator", "127.0.0.1:1"], "needs all of --coordinator"),
    (["--coordinator", "no port", "--num-processes", "2", "--process-id", "0"], "HOST:PORT"),
])
def test_cli_refuses_bad_meshes_and_devices_in_one_line(flags, words, capsys):
    argv = ["run", "--width", "32", "--batch", "8", "--no-cache", "--repeats", "1", *flags]
    try:
        status = main(argv)
    except SystemExit as stop:  # argparse's own refusals
        status = stop.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


HLO = """HloModule m

%body (p: f32[8,4]) -> f32[8,4] {
  %p = f32[8,4]{1,0} parameter(0)
  ROOT %ar = f32[8,4]{1,0} all-reduce(%p), to_apply=%add, metadata={op_name="f/transpose(jvp(l2))/dot"}
}

ENTRY %main (p: f32[8,4]) -> f32[32,4] {
  %p = f32[8,4]{1,0} parameter(0)
  %w = f32[8,4]{1,0} while(%p), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %ags = (f32[8,4]{1,0}, f32[32,4]{1,0}) all-gather-start(%p), metadata={op_name="f/rematted_computation/ag"}
  %agd = f32[32,4]{1,0} all-gather-done(%ags)
  %ar2 = (f32[8,4]{1,0}, f32[4]{0}) all-reduce(%p, %p), to_apply=%add
  ROOT %cp = (f32[8,4]{1,0}, f32[8,4]{1,0}, u32[], u32[]) collective-permute-start(%p), pairs={{0,1}}
}
"""


def test_collectives_are_counted_by_phase_with_loop_runs_and_result_bytes():
    from remat_lab.analysis.collectives import collectives, totals

    c = collectives(HLO)
    none = {"dcn_count": 0, "dcn_bytes": 0}  # one slice or host: nothing crosses the slower link
    assert c["all-reduce"]["backward"] == {"count": 3, "bytes": 3 * 128, **none}  # a loop runs 3 times
    assert c["all-reduce"]["forward"] == {"count": 1, "bytes": 144, **none}  # a combined tuple sums
    assert c["all-gather"]["recomputed"] == {"count": 1, "bytes": 512, **none}  # the gathered result
    assert c["collective-permute"]["forward"] == {"count": 1, "bytes": 128, **none}
    assert totals(c) == {"all-gather": 1, "reduce-scatter": 0, "all-reduce": 4, "all-to-all": 0,
                         "collective-permute": 1}


WITNESS = """HloModule w, is_scheduled=true

ENTRY %main (p: f32[8,4]) -> (f32[32,4], f32[16,4]) {
  %p = f32[8,4]{1,0} parameter(0)
  %ag = f32[32,4]{1,0} all-gather(%p), dimensions={0}, metadata={op_name="f/jvp()/ag"}
  %n = f32[8,4]{1,0} negate(%p), metadata={op_name="f/transpose(jvp())/neg"}
  %bg = f32[16,4]{1,0} all-gather(%n), dimensions={0}, metadata={op_name="f/transpose(jvp())/bg"}
  ROOT %t = (f32[32,4]{1,0}, f32[16,4]{1,0}) tuple(%ag, %bg)
}
"""
# Backward gathers with no twin in the witness (other operands) and no rematted_computation name,
# as XLA 0.12 partitions a remat'd scanned block: one of a size the witness gathers as often (bg),
# one of a size it gathers less often (ag2).
REGATHER = WITNESS.replace("%bg = f32[16,4]{1,0} all-gather(%n)", (
    '%m = f32[8,4]{1,0} abs(%n), metadata={op_name="f/transpose(jvp())/abs"}\n'
    '  %ag2 = f32[32,4]{1,0} all-gather(%n), dimensions={0}, '
    'metadata={op_name="f/transpose(jvp())/remat2"}\n'
    "  %bg = f32[16,4]{1,0} all-gather(%m)"))


def test_a_backward_gather_beyond_no_remat_s_count_is_recomputed_without_a_twin():
    from remat_lab.analysis.collectives import rows

    assert {r["name"]: r["phase"] for r in rows(REGATHER, WITNESS)} == {
        "ag": "forward", "ag2": "recomputed", "bg": "backward"}
    assert {r["name"]: r["phase"] for r in rows(REGATHER)} == {  # no witness: the passes alone
        "ag": "forward", "ag2": "backward", "bg": "backward"}
    assert {r["name"]: r["phase"] for r in rows(WITNESS, WITNESS)} == {"ag": "forward", "bg": "backward"}


# --- four emulated devices ------------------------------------------------------------------------

SCRIPT = r"""
import json, sys
import numpy as np
import jax
from remat_lab.config import RunConfig
from remat_lab.studies.experiment import run_experiment
from remat_lab.program.step import build_problem, jit_step

assert jax.device_count() == 4, jax.devices()
base = dict(model="mlp", width=32, batch=8, depth=2, stack="scan", repeats=1, warmup=0)
CASES = [("data=4", "no_remat"), ("data=4", "nothing_saveable"),
         ("fsdp=4", "no_remat"), ("fsdp=4", "nothing_saveable"), ("fsdp=4", "dots_saveable"),
         ("fsdp=4", "everything_saveable"),
         ("data=2,tensor=2", "nothing_saveable"), ("data=2,tensor=2", "dots_saveable")]
EXTRA = [dict(model="transformer", width=32, heads=4, batch=2, seq=4, depth=2, mesh="fsdp=2,tensor=2",
              policy="nothing_saveable", repeats=1, warmup=0),
         dict(base, dtype="bfloat16", mesh="data=2,tensor=2", policy="dots_with_no_batch_dims_saveable")]


def grads_of(cfg):
    p = build_problem(cfg)
    out = jit_step(p)(*p.args)
    return [np.asarray(g, dtype=np.float64) for g in out[1]], float(out[0])


ref_grads, ref_loss = grads_of(RunConfig(**base, policy="no_remat"))
rows = []
for mesh, policy in CASES:
    cfg = RunConfig(**base, mesh=mesh, policy=policy)
    r = run_experiment(cfg, timing=False)
    grads, loss = grads_of(cfg)
    diff = max(float(np.max(np.abs(g - b)) / max(float(np.max(np.abs(b))), 1e-30))
               for g, b in zip(grads, ref_grads))
    rows.append({"mesh": mesh, "policy": policy, "sharding": r["sharding"],
                 "grad_ok": r["gradient_check"]["ok"], "failures": r["gradient_check"]["failures"],
                 "rel_diff_vs_single_device": diff, "loss": loss, "ref_loss": ref_loss,
                 "dots": [[d["recomputed"], d["recomputed_in_compiled"], d["note"]] for d in r["dots"]],
                 "notes": r["notes"]})
for kw in EXTRA:
    r = run_experiment(RunConfig(**kw), timing=False)
    rows.append({"mesh": kw["mesh"], "policy": kw["policy"], "model": kw["model"],
                 "dtype": kw.get("dtype", "float32"), "sharding": r["sharding"],
                 "grad_ok": r["gradient_check"]["ok"], "failures": r["gradient_check"]["failures"]})
print(json.dumps(rows))
"""


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    """The rows of SCRIPT run with 4 emulated CPU devices (one subprocess for the module)."""
    env = {**os.environ, "PYTHONPATH": SRC,
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4",
           "REMAT_LAB_CACHE_DIR": str(tmp_path_factory.mktemp("jaxcache"))}
    env.pop("REMAT_LAB_HOST_DEVICES", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return {(r["mesh"], r["policy"], r.get("model", "mlp")): r for r in rows}


def _count(row, kind, phase=None):
    cells = row["sharding"]["collectives"][kind]
    return sum(c["count"] for p, c in cells.items() if phase in (None, p))


def test_sharded_gradients_equal_the_single_device_baseline(four_devices):
    for key, row in four_devices.items():
        assert row["grad_ok"], (key, row["failures"])
        if "rel_diff_vs_single_device" in row:  # float32: a few ulps of the leaf's largest entry
            assert row["rel_diff_vs_single_device"] < 1e-5, key
            assert row["loss"] == pytest.approx(row["ref_loss"], rel=1e-6), key


def test_fsdp_keeps_a_quarter_of_the_parameters_per_device(four_devices):
    sh = four_devices[("fsdp=4", "nothing_saveable", "mlp")]["sharding"]
    assert sh["devices"] == 4 and sh["mesh"] == {"fsdp": 4}
    assert sh["param_bytes_per_device"] * 4 == sh["param_bytes_total"]
    assert sh["per_device"]["peak_bytes"] > 0
    data = four_devices[("data=4", "nothing_saveable", "mlp")]["sharding"]
    assert data["param_bytes_per_device"] == data["param_bytes_total"]  # replicated


def test_data_parallel_reduces_gradients_and_gathers_nothing(four_devices):
    for policy in ("no_remat", "nothing_saveable"):
        row = four_devices[("data=4", policy, "mlp")]
        # XLA CPU reduces the gradients with all-reduce (it emits no reduce-scatter; measured).
        assert _count(row, "all-reduce", "backward") + _count(row, "reduce-scatter", "backward") > 0
        assert _count(row, "all-gather") == 0


def test_fsdp_gathers_and_nothing_saveable_gathers_again_in_the_backward(four_devices):
    """Measured on XLA CPU (mlp, scan, depth 2): each block gathers its 4 parameters in the forward
    (2 layers x 4 = 8 all-gathers per step). nothing_saveable and dots_saveable both gather them
    again in the backward (+8 against no_remat): the input cotangents need the gathered kernels, and
    a dot policy saves the products, not the kernels. everything_saveable keeps the gathered
    kernels as residuals (no_remat's memory) and gathers nothing again."""
    rows = {p: four_devices[("fsdp=4", p, "mlp")] for p in
            ("no_remat", "nothing_saveable", "dots_saveable", "everything_saveable")}
    for row in rows.values():
        assert _count(row, "all-gather", "forward") == 8
    assert _count(rows["no_remat"], "all-gather") == 8
    for policy in ("nothing_saveable", "dots_saveable"):
        assert _count(rows[policy], "all-gather", "recomputed") == 8, policy
        assert rows[policy]["sharding"]["vs_no_remat"]["all-gather"] == 8, policy
    assert _count(rows["everything_saveable"], "all-gather", "recomputed") == 0
    assert rows["everything_saveable"]["sharding"]["vs_no_remat"]["all-gather"] == 0
    nothing, everything = (rows[p]["sharding"]["per_device"]["temp_bytes"]
                           for p in ("nothing_saveable", "everything_saveable"))
    assert nothing < everything  # the re-gather buys per-device memory


def test_on_a_mesh_dots_are_not_matched_to_per_device_products_by_size(four_devices):
    """The compiled program is one device's: its products are shards of the jaxpr's, so no row is
    said to be (or not be) recomputed in it; the note gives the program's total instead."""
    row = four_devices[("fsdp=4", "nothing_saveable", "mlp")]
    recomputed = [d for d in row["dots"] if d[0]]
    assert recomputed and all(d[1] is None and "per-device shards" in d[2] for d in recomputed)
    assert any("On the device mesh (fsdp=4)" in n and "more than no_remat" in n for n in row["notes"])


def test_tensor_parallel_recomputation_brings_its_all_reduce_back(four_devices):
    """Megatron: l2's row-parallel product ends in an all-reduce; nothing_saveable recomputes l2
    and with it the all-reduce (one per layer), dots_saveable saves the reduced product."""
    nothing = four_devices[("data=2,tensor=2", "nothing_saveable", "mlp")]
    dots = four_devices[("data=2,tensor=2", "dots_saveable", "mlp")]
    assert _count(nothing, "all-reduce", "recomputed") == 2
    assert nothing["sharding"]["vs_no_remat"]["all-reduce"] == 2
    assert _count(dots, "all-reduce", "recomputed") == 0
    assert dots["sharding"]["vs_no_remat"]["all-reduce"] == 0


def test_transformer_and_bfloat16_on_a_mesh(four_devices):
    tr = four_devices[("fsdp=2,tensor=2", "nothing_saveable", "transformer")]
    assert tr["sharding"]["mesh"] == {"fsdp": 2, "tensor": 2}
    assert _count(tr, "all-gather", "recomputed") > 0
    assert tr["sharding"]["param_specs"]["blocks.q_proj.kernel"] == "P(None, 'fsdp', 'tensor', None)"
    bf = four_devices[("data=2,tensor=2", "dots_with_no_batch_dims_saveable", "mlp")]
    assert bf["grad_ok"], bf["failures"]


APP_SCRIPT = r"""
import json, sys
from streamlit.testing.v1 import AppTest

at = AppTest.from_file(sys.argv[1], default_timeout=240)
for key, value in {"width": "32", "batch": "8", "depth": "2", "repeats": "3", "mesh": "fsdp=4"}.items():
    at.query_params[key] = value
at.run()
frames = [df.value for df in at.dataframe if "collective" in df.value.columns]
print(json.dumps({
    "exception": [str(e.value) for e in at.exception], "errors": [e.value for e in at.error],
    "mesh": {a: at.sidebar.selectbox(key=f"mesh_{a}").value for a in ("data", "fsdp", "tensor")},
    "metrics": {m.label: m.value for m in at.metric},
    "collectives": frames[0]["collective"].tolist() if frames else None}))
"""


def test_the_app_shows_mesh_controls_and_per_device_numbers_with_emulated_devices(tmp_path):
    """``REMAT_LAB_HOST_DEVICES=4``: app.py applies it at start; the sidebar offers the mesh, the
    URL's mesh is read, and Explore shows per-device memory and the collectives."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(root)]), "REMAT_LAB_HOST_DEVICES": "4",
           "REMAT_LAB_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", APP_SCRIPT, str(root / "app.py")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert not seen["exception"] and not seen["errors"], seen
    assert seen["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
    assert seen["metrics"]["Parameters per device"] == "4.1 KiB"  # 2 x 2 x (32 x 32 + 32) x 4 B / 4
    assert seen["collectives"] and "all-gather" in seen["collectives"]

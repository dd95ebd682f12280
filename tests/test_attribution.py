"""Memory attribution: buffers at the peak named after the value live there, a policy diff, by kind."""

from __future__ import annotations

import jax
import pytest

from remat_lab.analysis.by_kind import METHOD_TIMELINE
from remat_lab.analysis.collectives import collectives
from remat_lab.analysis.peak_diff import peak_diff
from remat_lab.analysis.timeline import memory_timeline
from remat_lab.config import RunConfig
from remat_lab.model.models import names_of
from remat_lab.present.palette import kind_colors
from remat_lab.present.peak_diff import peak_diff_frame, versus_no_remat
from remat_lab.program.step import build_problem, make_step


def timeline(config: RunConfig, witness: str | None = None) -> dict:
    problem = build_problem(config)
    lowered = jax.jit(make_step(problem)).trace(*problem.args).lower()
    return memory_timeline(lowered, depth=config.depth, names=names_of(config.model), paths=problem.paths,
                           witness=witness)


@pytest.fixture(scope="module")
def scan_docs() -> dict:
    base = RunConfig(width=64, batch=8, depth=3, stack="scan")
    problem = build_problem(base.replace(policy="no_remat"))
    witness = jax.jit(make_step(problem)).trace(*problem.args).lower().compile().as_text()
    return {p: timeline(base.replace(policy=p), witness) for p in ("no_remat", "nothing_saveable")}


def test_stacked_saved_activations_under_scan_are_named_for_all_layers(scan_docs):
    """no_remat under scan keeps each dot's output for every layer in one stacked buffer: at the
    peak it is named with its checkpoint name and "all layers", its shape the layers' stack."""
    at = scan_docs["no_remat"]["at_peak"]
    stacked = [b for b in at if b["kind"] == "temp" and "all layers" in b["layer"]]
    named = {b["name"] for b in stacked if b["name"]}
    assert named == {"l1", "l2"}
    for b in stacked:
        assert b["shape"][0] == 3  # one slot per layer
        if b["name"]:  # the value it was computed from is the tagged layer's product
            assert f"/{b['name']}/" in b["source_op_name"]
    # The gradients of the stacked kernels: named after the loop body's update, not the copy that
    # first held the slot; their layer from the product that computes them.
    outputs = [b for b in at if b["phase"] == "output" and len(b["shape"] or []) == 3]
    assert outputs and all(not b["instruction"].startswith("copy") for b in outputs)
    assert {b["layer"] for b in outputs} == {"l1 (all layers)", "l2 (all layers)"}


def test_other_is_only_what_has_no_source(scan_docs):
    for doc in scan_docs.values():
        for b in doc["at_peak"]:
            if b["layer"] == "other":
                assert b["name"] is None and not any(f"/{s}/" in b["source_op_name"] for s in ("l1", "l2"))


def test_policy_diff_sums_to_each_sides_peak_buffers(scan_docs):
    a, b = scan_docs["no_remat"], scan_docs["nothing_saveable"]
    rows = peak_diff(a, b)
    assert sum(r["bytes_a"] for r in rows) == a["peak_live_bytes"]
    assert sum(r["bytes_b"] for r in rows) == b["peak_live_bytes"]
    assert sum(r["buffers_a"] for r in rows) == len(a["at_peak"])
    assert all(r["difference"] == r["bytes_b"] - r["bytes_a"] for r in rows)
    assert sum(r["difference"] for r in rows) == b["peak_live_bytes"] - a["peak_live_bytes"] < 0
    frame = peak_diff_frame(a, b)
    assert int(frame["bytes_a"].sum()) == a["peak_live_bytes"] and len(frame) == len(rows)
    assert peak_diff_frame(a, None).empty
    same = peak_diff(a, a)
    assert all(r["difference"] == 0 for r in same)


def test_memory_by_kind_from_the_timeline_sums_to_the_peak(run):
    result = run(RunConfig(width=64, batch=8, depth=2, stack="loop", objective="grad"))
    kinds, mem = result["memory"]["by_kind"], result["memory"]
    assert kinds["method"] == METHOD_TIMELINE
    assert sum(v for k, v in kinds.items() if k != "method") == mem["peak_bytes"]
    assert kinds["parameters"] == result["model"]["parameter_bytes"]
    assert kinds["gradients"] == result["model"]["parameter_bytes"]  # objective grad: the outputs
    assert kinds["activations"] > 0 and kinds["optimizer_state"] == 0


def test_versus_no_remat_names_the_peak_and_flops_differences():
    doc = {"memory": {"peak_bytes": 3 << 20}, "flops": 4e9,
           "baseline": {"peak_bytes": (5 << 19), "flops": 3e9}}
    out = versus_no_remat(doc)
    assert out["peak"] == "+512.0 KiB peak vs no_remat" and out["flops"] == "+33.3 % flops vs no_remat"
    doc["flops"] = 3e9 * 1.0001  # a small difference is not written as +0 %
    assert versus_no_remat(doc)["flops"] == "+0.0100 % flops vs no_remat"
    assert versus_no_remat({"memory": {}, "baseline": None}) == {"peak": None, "flops": None}


def test_residual_kinds_never_share_a_colour():
    colors = kind_colors(["argument", "dot_general", "layer input", "literal", "tanh", "mul", "max"])
    assert len(set(colors.values())) == len(colors)


HLO = ("HloModule m\n"
       "ENTRY %main (p: f32[8,4]) -> f32[32,4] {\n"
       "  %p = f32[8,4]{1,0} parameter(0)\n"
       "  %ag = f32[32,4]{1,0} all-gather(%p), dimensions={0}, "
       'metadata={op_name="f/transpose(jvp())/rematted_computation/ag"}\n'
       '  ROOT %n = f32[32,4]{1,0} negate(%ag), metadata={op_name="f/transpose(jvp())/neg"}\n'
       "}\n")
EXTRA = HLO.replace("  ROOT %n", "  %ag2 = f32[32,4]{1,0} all-gather(%p), dimensions={0}, "
                    'metadata={op_name="f/ag"}\n  %s = f32[32,4]{1,0} add(%ag, %ag2)\n  ROOT %n')


def test_collectives_phases_come_from_the_witness():
    assert collectives(HLO)["all-gather"]["recomputed"]["count"] == 1  # by op_name alone
    same = collectives(HLO, witness=HLO)["all-gather"]
    assert same["recomputed"]["count"] == 0 and same["backward"]["count"] == 1
    more = collectives(EXTRA, witness=HLO)["all-gather"]  # one gather more than the witness
    assert more["recomputed"]["count"] == 1 and more["backward"]["count"] == 1

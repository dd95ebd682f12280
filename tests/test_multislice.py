"""Meshes over several slices or hosts (MaxText's ``dcn_*`` axes): the text, the device layout, and
the cross-slice collectives priced at the slower link; compile-only, tiny programs."""

from __future__ import annotations

import re

import numpy as np
import pytest

from remat_lab.config import (
    ConfigError,
    RunConfig,
    canonical_mesh,
    format_mesh,
    get_target,
    mesh_dcn,
    mesh_devices,
    mesh_parts,
    mesh_slices,
    parse_mesh,
)

TINY = dict(model="mlp", width=64, depth=2, stack="scan", batch=8, compile_only=True)


# --- the text ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, canonical, logical, dcn", [
    ("fsdp=4,dcn_data=2", "dcn_data=2,fsdp=4", {"data": 2, "fsdp": 4}, {"data": 2}),
    ("dcn_fsdp=2,fsdp=4", "dcn_fsdp=2,fsdp=4", {"fsdp": 8}, {"fsdp": 2}),
    ("tensor=2, dcn_fsdp=2 ,data=2,dcn_data=1", "dcn_fsdp=2,data=2,tensor=2",
     {"data": 2, "fsdp": 2, "tensor": 2}, {"fsdp": 2}),
    ("dcn_data=4", "dcn_data=4", {"data": 4}, {"data": 4}),
    ("data=2,tensor=2", "data=2,tensor=2", {"data": 2, "tensor": 2}, {}),
])
def test_dcn_axes_parse_to_logical_sizes_and_format_back(text, canonical, logical, dcn):
    """Each logical axis is ici x dcn (MaxText); the canonical text puts the dcn axes first and
    parses back to itself."""
    assert canonical_mesh(text) == canonical
    assert parse_mesh(text) == logical and mesh_dcn(text) == dcn
    assert format_mesh(parse_mesh(canonical), mesh_dcn(canonical)) == canonical
    assert canonical_mesh(canonical) == canonical
    ici, cross = mesh_parts(canonical)
    assert mesh_devices(canonical) == int(np.prod([*ici.values(), *cross.values()]))
    assert mesh_slices(canonical) == int(np.prod(list(dcn.values()) or [1]))


@pytest.mark.parametrize("kwargs, words", [
    (dict(mesh="dcn_data=2,fsdp=4"), "spans slices or hosts .* only a named target"),
    (dict(mesh="dcn_pipeline=2"), "unknown mesh axis 'dcn_pipeline'.*dcn_data, dcn_fsdp, dcn_tensor"),
    (dict(mesh="dcn_data=two"), "dcn_data needs a whole number"),
    (dict(mesh="dcn_data=2,dcn_data=2", target="h100", target_devices=4), "given twice"),
    (dict(mesh="dcn_data=2,fsdp=16", target="h100", target_devices=32, batch=32),
     "16 GPUs in each of its 2 hosts; a h100 host has 8"),
    (dict(mesh="dcn_data=2,fsdp=4", target="h100", target_devices=4), "need a mesh over all of them"),
])
def test_bad_dcn_meshes_are_refused_with_a_sentence(kwargs, words):
    """The attached devices are one slice: a dcn axis there is refused (not emulated)."""
    with pytest.raises(ConfigError, match=words):
        RunConfig(**{**TINY, **kwargs})


def test_a_dcn_part_must_divide_its_axis():
    with pytest.raises(ConfigError, match="fsdp of 6 devices cannot span dcn_fsdp=4"):
        format_mesh({"fsdp": 6}, {"fsdp": 4})
    assert RunConfig(**TINY, mesh="fsdp=4,dcn_data=2", target="h100", target_devices=8).mesh == \
        "dcn_data=2,fsdp=4"


# --- compiled for 2 hosts of H100 and 2 slices of v5e --------------------------------------------


def _compiled(config: RunConfig):
    from remat_lab.program.analysis_compile import compile_for_analysis
    from remat_lab.program.step import jit_step, problem_for
    from remat_lab.program.tracing import trace_and_lower

    problem = problem_for(config)
    _, lowered = trace_and_lower(jit_step(problem), *problem.args)
    return problem, compile_for_analysis(lowered).as_text()


CASES = {"h100": ("dcn_data=2,fsdp=4", (1, 4, 1), (2, 1, 1)),
         "tpu-v5e": ("dcn_fsdp=2,fsdp=4", (1, 4, 1), (1, 2, 1))}


@pytest.fixture(scope="module", params=list(CASES))
def compiled(request):
    target = request.param
    mesh = CASES[target][0]
    config = RunConfig(**TINY, mesh=mesh, target=target, target_devices=8)
    problem, text = _compiled(config)
    return target, config, problem, text


def test_the_mesh_is_laid_out_as_maxtext_lays_it(compiled):
    """The devices in mesh order are create_hybrid_device_mesh's, and (independently of it) the
    slice or host of each mesh position is its dcn coordinate: the ici part varies fastest."""
    from jax.experimental import mesh_utils

    from remat_lab.program.targets import target_devices

    target, config, problem, _ = compiled
    _, ici, dcn = CASES[target]
    devices = target_devices(target, 8, None, 2)
    tpu = target.startswith("tpu")
    want = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=not tpu,
                                                allow_split_physical_axes=True)
    got = problem.mesh.devices
    assert got.shape == tuple(parse_mesh(config.mesh).values())
    assert [d.id for d in got.flat] == [d.id for d in want.flat]
    slice_of = (lambda d: d.slice_index) if tpu else (lambda d: d.process_index)
    assert sorted({slice_of(d) for d in devices}) == [0, 1]
    ici_sizes, dcn_sizes = mesh_parts(config.mesh)
    names = problem.mesh.axis_names
    dcn_shape = [dcn_sizes.get(a, 1) for a in names]
    for index in np.ndindex(got.shape):
        coord = [i // ici_sizes.get(a, 1) for a, i in zip(names, index)]
        assert slice_of(got[index]) == np.ravel_multi_index(coord, dcn_shape)


def test_collectives_across_slices_are_found_and_priced_at_the_dcn_figure(compiled):
    """Crossing is read from the program: on GPUs a collective whose replica groups hold devices of
    both hosts (checked here against the hosts written out by hand, logical id // 4), on a
    multi-slice TPU libtpu's cross-slice transfers (recv to the megascale runtime, counted in the
    text by hand); each link's time is its ring bytes over its own figure (on GPUs the crossing
    collective's cross-host share is a quarter of its bytes: 2 hosts of 4, hierarchically)."""
    from remat_lab.analysis import collectives, hlotext
    from remat_lab.analysis.estimate import estimate_step
    from remat_lab.analysis.traffic import traffic_of
    from remat_lab.program.mesh import granules

    target, config, problem, text = compiled
    spec = get_target(target)
    assert granules(problem.mesh) == [0] * 4 + [1] * 4
    rows = collectives.rows(text, granules=granules(problem.mesh))
    dcn = [r for r in rows if r["link"] == "dcn"]
    assert dcn, "a data or fsdp axis across the slices must communicate across them"
    if target == "h100":
        host = [i // 4 for i in range(8)]
        lines = {ins.name: ins.rest for _, ins in hlotext.instructions(text)}
        for r in rows:
            groups = hlotext.replica_groups(lines[r["name"]], 8)
            spans = any(len({host[i] for i in g}) > 1 for g in groups)
            assert spans == (r["link"] == "dcn"), r
    else:
        megascale = len(re.findall(r" recv\(.*_xla_megascale_transfer_type", text))
        assert megascale == len(dcn) and all(r["group"] == 2 for r in dcn)
        assert all(r["group"] <= 4 for r in rows if r["link"] == "ici")  # within a 4-chip slice
    ring = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
            "reduce-scatter": lambda n: n - 1.0, "all-to-all": lambda n: (n - 1) / n,
            "collective-permute": lambda n: 1.0}
    # hierarchical: a group over S hosts of P devices sends a P-th of its bytes across, in a ring of S
    largest = {}
    for r in dcn:
        largest[r["kind"]] = max(largest.get(r["kind"], 1), r["spans"])
    share = {"h100": 4, "tpu-v5e": 1}[target]  # P: 4 GPUs a host; a TPU transfer is its own share
    assert all(r["spans"] == 2 and r["group"] == 2 * share for r in dcn)
    by_hand = sum(r["runs"] * r["bytes"] / share * ring[r["kind"]](largest[r["kind"]]) for r in dcn)
    est = estimate_step(None, None, spec, "float32", traffic_of(text, granules(problem.mesh)))
    assert est["collectives_dcn_s"] == pytest.approx(by_hand / spec.dcn_bytes_per_s, rel=1e-9)
    assert est["collective_links"]["dcn"]["bytes_per_s"] == spec.dcn_bytes_per_s
    assert est["collectives_s"] == pytest.approx(est["collectives_ici_s"] + est["collectives_dcn_s"])
    assert spec.dcn_bytes_per_s < spec.interconnect_bytes_per_s and spec.dcn_source


def test_one_slice_has_no_cross_slice_traffic():
    """The same logical mesh in one slice (fsdp=8 on 8 v5e chips): nothing is priced at the dcn."""
    from remat_lab.analysis.estimate import estimate_step
    from remat_lab.analysis.traffic import traffic_of
    from remat_lab.program.mesh import granules

    problem, text = _compiled(RunConfig(**TINY, mesh="fsdp=8", target="tpu-v5e", target_devices=8))
    est = estimate_step(None, None, get_target("tpu-v5e"), "float32",
                        traffic_of(text, granules(problem.mesh)))
    assert est["collectives_dcn_s"] == 0 and est["collectives_ici_s"] > 0
    assert "_xla_megascale" not in text


def test_a_run_reports_both_links():
    """``run --json``'s estimate and collectives table carry the split."""
    from remat_lab.studies.experiment import run_experiment

    result = run_experiment(RunConfig(**TINY, mesh="dcn_data=2,fsdp=4", target="h100", target_devices=8))
    est = result["timing"]["estimate"]
    assert est["collectives_dcn_s"] > 0 and est["dcn_bytes_per_s"] == 25e9
    table = result["sharding"]["collectives"]
    assert sum(c["dcn_bytes"] for phases in table.values() for c in phases.values()) > 0
    assert result["sharding"]["mesh_text"] == "dcn_data=2,fsdp=4" and result["sharding"]["slices"] == 2

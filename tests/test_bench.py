"""The benchmark pieces on tiny sizes: structure and sanity only, never timing targets."""

from __future__ import annotations

import json
import math

import pytest

from remat_lab.analysis import roofline
from remat_lab.config import RunConfig
from remat_lab.model.policies import POLICIES
from remat_lab.studies import bench

TINY = RunConfig(width=16, batch=2, repeats=2, warmup=1)
TINY_TRANSFORMER = RunConfig(model="transformer", width=16, seq=4, heads=2, depth=2, batch=1, repeats=2)


@pytest.fixture(scope="module", autouse=True)
def calibration_dir(tmp_path_factory):
    """The roofline calibration (``bench.machine``) goes to a temporary cache directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REMAT_LAB_CACHE_DIR", str(tmp_path_factory.mktemp("calibration")))
        roofline.clear_cache()
        yield
    roofline.clear_cache()


# The latency, the sweep and the two advices are computed once here and read by two tests each:
# their own tests and ``run_all`` (test_report_document_and_table), which asks for them by name.
ADVISE_BENCH = RunConfig(width=16, batch=4, depth=2, repeats=2, warmup=1)
TF_POLICIES = ("no_remat", "nothing_saveable")
# The transformer's budget a few examples over its batch-independent bytes (XLA 0.12 CPU: 110,412 B at
# batch 1, then 26 KiB more per example for no_remat, 12 KiB for nothing_saveable): its batch searches
# end at 2 and 5 in 6 compiles an advice, not 13 as in 1 MiB (batches 36 and 74), and the timed
# advice times small programs. Only the structure is checked, never the batches themselves.
TF_BUDGET = 144 << 10


@pytest.fixture(scope="module")
def advised():
    """``bench.advise_bench`` on a tiny scanned mlp, 1 MiB."""
    return bench.advise_bench(ADVISE_BENCH, 1 << 20, probes=2, policies=2)


@pytest.fixture(scope="module")
def advised_transformer():
    """``bench.advise_transformer`` on the tiny transformer in 144 KiB, both advices (timed for 1 s)."""
    return bench.advise_transformer(TINY_TRANSFORMER, TF_BUDGET, TF_POLICIES,
                                    cache=bench.temporary_cache_dir, time_budget_s=1.0)


@pytest.fixture(scope="module")
def latencies(tmp_path_factory):
    """``bench.latency`` of a tiny configuration, cold in a cache folder of its own, then warm."""
    with bench.temporary_cache_dir(str(tmp_path_factory.mktemp("latency_cache"))):
        return bench.latency(RunConfig(width=24, batch=3, repeats=2, warmup=1), warm_repeats=2)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """``bench.sweep_pair`` over width 8, batches 1 and 2, two policies, in a cache folder of its own."""
    path = tmp_path_factory.mktemp("sweep_cache")
    return path, bench.sweep_pair((8,), (1, 2), ["no_remat", "nothing_saveable"], repeats=1, warmup=0,
                                  cache_dir=str(path))


def _positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_fidelity_and_overhead_ratios_are_positive_and_finite():
    fid = bench.fidelity(TINY, rounds=2, repeats=3)
    assert _positive(fid["ratio"]) and _positive(fid["engine_median_s"])
    assert _positive(fid["bare_median_s"])
    ovh = bench.overhead(TINY, rounds=2, repeats=3)
    assert set(ovh["per_call_s"]) == {"engine", "bare_compiled", "jax_jit_state", "nnx_jit_module"}
    assert all(_positive(v) for v in ovh["per_call_s"].values())
    assert _positive(ovh["ratio"]) and _positive(ovh["vs_nnx_jit_module"])


def test_interleave_rotates_order_and_pools_samples():
    calls = []

    def make(name):
        def fn():
            calls.append(name)
            return [1.0]
        return fn

    got = bench.interleave({"a": make("a"), "b": make("b")}, rounds=2)
    assert calls == ["a", "b", "b", "a"]
    assert [len(v) for v in got.values()] == [2, 2]


def test_latency_cold_is_slower_than_warm(latencies):
    lat = latencies
    assert lat["cold_s"] > lat["warm_s"] > 0
    assert _positive(lat["dissect_overhead_ratio"])
    assert lat["cold"]["core_s"] > 0 and "compiling" in lat["cold"]["stages_s"]
    assert lat["policy_change"]["total_s"] > 0


def test_sweep_pair_reports_speedup(swept):
    tmp_path, sw = swept
    assert sw["first"]["configs"] == sw["second"]["configs"] == 4
    assert _positive(sw["speedup"]) and _positive(sw["first"]["s_per_config"])
    assert 0 < sw["first"]["compile_share"] < 1
    assert any(tmp_path.iterdir())  # the persistent cache was written


def test_temporary_cache_dir_restores_the_previous_one():
    import jax

    before = jax.config.jax_compilation_cache_dir
    with bench.temporary_cache_dir() as path:
        assert jax.config.jax_compilation_cache_dir == path
    assert jax.config.jax_compilation_cache_dir == before


def test_machine_and_peak():
    m = bench.machine()
    assert m["cores"] >= 1 and m["jax"] and m["cpu_model"]
    assert 1 <= m["physical_cores"] <= (m["cpu_count"] or m["physical_cores"])
    assert m["peak_source"] in {"calibrated", "spec"}
    assert m["peak_flops"] is None or _positive(m["peak_flops"])
    if m["peak_source"] == "calibrated":
        assert _positive(m["peak_flops"]) and _positive(m["bandwidth_bytes_per_s"])
        assert m["peak_note"].startswith("calibrated") and m["calibrated_at"]


def test_report_document_and_table(monkeypatch, latencies, swept, advised, advised_transformer):
    # run_all on tiny sizes: patch the configurations; the latency, the sweep and the two advices
    # it asks for are the tiny ones the tests here check (computed once, in the fixtures), the rest
    # of the code path is run_all's own.
    default = RunConfig(width=16, batch=4, repeats=2, warmup=1)
    monkeypatch.setattr(bench, "DEFAULT", default)
    monkeypatch.setattr(bench, "SMALL", RunConfig(width=8, batch=2, repeats=2, warmup=1))
    asked = []

    def latency(config, **kwargs):
        asked.append(("latency", config))
        return latencies

    def sweep_pair(widths, batches, policies, **kwargs):
        asked.append(("sweep", list(policies), kwargs.get("cache_dir")))
        return swept[1]

    def advise_transformer(cache=None, timed=True):
        asked.append(("advise_transformer", cache, timed))
        return advised_transformer if timed else {k: v for k, v in advised_transformer.items()
                                                  if k != "timed"}

    monkeypatch.setattr(bench, "latency", latency)
    monkeypatch.setattr(bench, "sweep_pair", sweep_pair)
    monkeypatch.setattr(bench, "advise_bench", lambda: asked.append(("advise",)) or advised)
    monkeypatch.setattr(bench, "advise_transformer", advise_transformer)
    doc = json.loads(json.dumps(bench._jsonable(bench.run_all(quick=True))))
    # every policy swept from an empty cache; the transformer advice from empty caches, untimed
    assert asked == [("latency", default.replace(repeats=20, warmup=3)),
                     ("sweep", list(POLICIES), None), ("advise",),
                     ("advise_transformer", bench.temporary_cache_dir, False)], asked
    keys = {"fidelity_ratio_default", "fidelity_ratio_small", "overhead_ratio", "warm_latency_s",
            "cold_latency_s", "dissect_overhead_ratio", "sweep_s_per_config", "cache_speedup",
            "achieved_flops_fraction", "timeline_overhead_ratio", "machine", "advise_s",
            "advise_no_time_s", "probe_s", "advise_transformer_s", "advise_transformer_no_time_s"}
    assert keys <= set(doc)
    for key in keys - {"machine", "achieved_flops_fraction", "timeline_overhead_ratio",
                       "advise_transformer_s"}:
        assert _positive(doc[key]), key
    assert doc["advise_transformer_s"] is None  # --quick leaves the timed transformer advice out
    assert math.isfinite(doc["timeline_overhead_ratio"])  # a difference of two medians: may be < 0
    assert doc["cold_latency_s"] > doc["warm_latency_s"]
    assert doc["achieved_flops_fraction"] is None or 0 < doc["achieved_flops_fraction"] <= 1
    assert doc["peak_source"] in {"calibrated", "spec"}
    roof = doc["roofline"]
    assert roof["achieved_fraction"] == doc["achieved_flops_fraction"]
    assert roof["fraction_of_attainable"] is None or 0 < roof["fraction_of_attainable"] <= 1
    assert roof["flops"] == doc["details"]["fidelity_default"]["flops"]
    text = bench.format_report(doc)
    for key in keys - {"machine"}:
        assert key in text
    assert f"peak ({doc['peak_source']})" in text
    assert "PASS" in text or "MISS" in text


@pytest.mark.parametrize("key", list(bench.TARGETS))
def test_verdicts(key):
    target, verdict = bench.verdict(key, 1.0)
    assert verdict in {"PASS", "MISS", "report"}


def test_timeline_overhead_is_measured_uncached():
    out = bench.timeline_overhead(RunConfig(width=32, batch=4), rounds=2)
    assert _positive(out["compile_s"]) and _positive(out["compile_dumped_and_timeline_s"])
    assert out["ratio"] == out["compile_dumped_and_timeline_s"] / out["compile_s"] - 1
    assert out["cache_hit_ratio"] == out["uncached_copy_and_timeline_s"] / out["compile_s"] > 0


def test_latency_goes_through_the_apps_own_cached_wrapper():
    """The latency figures time the Explore page's real st.cache_data wrapper, not the fallback."""
    from remat_lab.studies.bench import _app_runner

    _run, clear, description, stages = _app_runner()
    assert description == "pages/_running.run_config (st.cache_data, bare mode)", description
    assert "compiling" in stages
    clear()


def test_advise_bench_structure(advised):
    out = advised
    for key in ("no_time", "timed"):
        assert _positive(out[key]["s"]) and out[key]["compiles"] >= 2
        assert out[key]["max_batch"]["nothing_saveable"] >= out[key]["max_batch"]["no_remat"] > 0
    assert _positive(out["probe_s"]) and len(out["probe_samples_s"]) == 2
    assert {"advise_s", "advise_no_time_s", "probe_s"} <= set(bench.TARGETS)


def test_advise_transformer_structure(advised_transformer):
    """The transformer advice's figures, on a tiny transformer: both advices timed, every policy
    sized, the timed one timing each policy that fits."""
    from remat_lab.studies.bench_advise import ADVISE_TRANSFORMER, ALL_POLICIES

    assert (ADVISE_TRANSFORMER.model, ADVISE_TRANSFORMER.width, ADVISE_TRANSFORMER.seq,
            ADVISE_TRANSFORMER.heads, ADVISE_TRANSFORMER.depth) == ("transformer", 512, 256, 8, 8)
    assert "custom" not in ALL_POLICIES and len(ALL_POLICIES) >= 17
    out = advised_transformer
    for key in ("no_time", "timed"):
        assert _positive(out[key]["s"]) and set(out[key]["max_batch"]) == set(TF_POLICIES)
    assert out["no_time"]["timed"] == 0 and out["timed"]["timed"] >= 1
    t = out["timed"]  # the target's terms, each reported
    assert t["time_budget_s"] == 1.0
    assert t["bound_s"] == pytest.approx(t["compile_only_s"] + t["time_budget_s"] + t["one_step_each_s"])
    assert t["compile_only_s"] == out["no_time"]["s"] and 0 < t["timing_s"] and t["one_step_each_s"] > 0
    doc = {"details": {"advise_transformer": out}}
    assert bench.verdict("advise_transformer_s", t["bound_s"] * 0.99, doc)[1] == "PASS"
    assert bench.verdict("advise_transformer_s", t["bound_s"] * 1.01, doc)[1] == "MISS"
    assert {"advise_transformer_s", "advise_transformer_no_time_s"} <= set(bench.TARGETS)

"""Result dict -> DataFrame helpers (pandas only)."""

import pandas as pd
import pytest

from remat_lab.present import tables


def _result(policy="dots_with_no_batch_dims_saveable", median=1e-3, peak=3 << 20, width=64, batch=8):
    return {
        "config": {"policy": policy, "model": "mlp", "width": width, "batch": batch, "seq": 16,
                   "depth": 1, "dtype": "float32", "objective": "value_and_grad"},
        "compile": {"lower_s": 0.1, "compile_s": 0.2},
        "step_time_s": {"median": median, "p25": median * 0.9, "p75": median * 1.1,
                        "samples": [median * 0.9, median, median * 1.1]},
        "memory": {"argument_bytes": 1 << 20, "output_bytes": 1 << 20, "temp_bytes": 1 << 20,
                   "alias_bytes": 0, "generated_code_bytes": 0, "peak_bytes": peak},
        "totals": {"residual_bytes": 2048, "dots_saved": 2, "dots_recomputed": 0,
                   "recompute_flops": 0},
        "gradient_check": {"ok": True},
        "dots": [{"index": 0, "layer": "l1", "lhs_shape": [8, 64], "rhs_shape": [64, 64],
                  "out_shape": [8, 64], "has_batch_dims": False, "policy_verdict": "save",
                  "saved": True, "offloaded": False, "recomputed": False,
                  "recomputed_in_compiled": False, "flops": 1, "out_bytes": 2048, "note": ""}],
        "residuals": [
            {"index": 0, "shape": [64], "dtype": "float32", "bytes": 256, "memory_kind": "device",
             "kind": "argument", "layer": "l1", "source": "argument l1.bias"},
            {"index": 1, "shape": [8, 64], "dtype": "float32", "bytes": 2048,
             "memory_kind": "device", "kind": "dot_general", "layer": "l1", "source": "dot"},
            {"index": 2, "shape": [8, 64], "dtype": "float32", "bytes": 2048,
             "memory_kind": "device", "kind": "dot_general", "layer": "l2", "source": "dot"}],
    }


def test_dots_frame_shapes_and_booleans():
    df = tables.dots_frame(_result())
    assert list(df.columns) == tables.DOT_COLUMNS
    assert df.loc[0, "lhs_shape"] == "(8, 64)"
    assert bool(df.loc[0, "saved"]) is True


def test_empty_inputs_give_empty_frames_with_columns():
    assert tables.dots_frame(None).empty
    assert list(tables.residuals_frame({}).columns) == tables.RESIDUAL_COLUMNS
    assert tables.samples_frame(None).empty
    assert tables.memory_frame([]).empty
    assert tables.summary_frame([]).columns.tolist() == tables.SUMMARY_COLUMNS
    assert tables.relative_frame(pd.DataFrame(), "median_ms").empty
    assert tables.pareto_mask(pd.DataFrame(), "a", "b").empty


def test_residual_layer_kind_sums_bytes():
    df = tables.residual_layer_kind_frame(_result())
    l1 = df[(df["layer"] == "l1")].set_index("kind")["bytes"]
    assert l1["argument"] == 256 and l1["dot_general"] == 2048
    assert df["bytes"].sum() == 256 + 2048 + 2048
    assert tables.residuals_frame(_result()).loc[0, "shape"] == "(64,)"


def test_samples_and_memory_in_ms_and_mib():
    s = tables.samples_frame(_result(median=2e-3))
    assert s["ms"].tolist() == pytest.approx([1.8, 2.0, 2.2])
    m = tables.memory_frame([_result(peak=3 << 20)])
    assert m.loc[0, "peak_mib"] == pytest.approx(3.0)
    assert m.loc[0, "argument"] == pytest.approx(1.0)


def test_summary_and_relative_to_no_remat():
    rows = [_result("no_remat", 1e-3, 4 << 20), _result("nothing_saveable", 2e-3, 2 << 20)]
    df = tables.summary_frame(rows)
    assert df["median_ms"].tolist() == pytest.approx([1.0, 2.0])
    rel = tables.relative_frame(df, "median_ms").set_index("policy")["ratio"]
    assert rel["no_remat"] == pytest.approx(1.0) and rel["nothing_saveable"] == pytest.approx(2.0)
    assert tables.relative_frame(df[df.policy != "no_remat"], "median_ms").empty


def test_pareto_mask_drops_dominated_points():
    df = pd.DataFrame({"t": [1.0, 2.0, 3.0, 1.5], "m": [3.0, 1.0, 3.5, 2.0]})
    assert tables.pareto_mask(df, "t", "m").tolist() == [True, True, False, True]


def test_matching_lines_regex_and_bad_regex():
    text = "a dot_general b\nc add d\ne rematted_computation dot_general\n"
    assert len(tables.matching_lines(text, "dot_general")) == 2
    assert tables.matching_lines(text, "rematted_computation|add") == text.splitlines()[1:]
    assert tables.matching_lines(text, "dot_general[") == []  # plain text, not a regex
    assert tables.matching_lines(text, "(a+)+$") == []  # no regex, so no catastrophic backtracking
    assert tables.matching_lines("", "x") == []


def test_relative_frame_marks_differences_within_the_timing_noise():
    base = _result("no_remat", 1e-3, 4 << 20)  # p25..p75 = 0.9..1.1 ms
    close = _result("dots_saveable", 1.03e-3, 4 << 20)  # +3 %: the spreads overlap
    far = _result("nothing_saveable", 2e-3, (4 << 20) - 4096)  # 1.8..2.2 ms; 4 KiB less memory
    df = tables.summary_frame([base, close, far])
    t = tables.relative_frame(df, "median_ms").set_index("policy")
    assert t.loc["dots_saveable", "ratio"] == pytest.approx(1.03)
    assert t["within_noise"].to_dict() == {"no_remat": True, "dots_saveable": True,
                                           "nothing_saveable": False}
    m = tables.relative_frame(df, "peak_bytes").set_index("policy")  # deterministic: equal or not
    assert m["within_noise"].to_dict() == {"no_remat": True, "dots_saveable": True,
                                           "nothing_saveable": False}


def test_summary_row_compiled_recomputation_before_the_jaxpr_figures():
    r = _result("nothing_saveable")
    r["totals"]["recompute_flops"] = 3e9
    row = tables.summary_row(r)  # an engine result without the compiled comparison
    assert row["compiled_recomputed_products"] is None and row["compiled_recomputed_gflop"] is None
    r["hlo"] = {"dot_count": 7, "excess_dots_vs_no_remat": 2, "excess_flops_vs_no_remat": 5e8}
    row = tables.summary_row(r)
    assert row["compiled_recomputed_products"] == 2
    assert row["compiled_recomputed_gflop"] == pytest.approx(0.5)
    assert row["recompute_gflop"] == pytest.approx(3.0)
    cols = tables.SUMMARY_COLUMNS
    assert cols.index("compiled_recomputed_products") < cols.index("dots_recomputed")
    # the keys the Compare page reads stay
    assert {"policy", "median_ms", "peak_mib", "peak_bytes", "dots_recomputed",
            "recompute_flops", "grad_ok"} <= set(row)


def test_units_are_binary_in_frames_and_csv_headers():
    df = tables.summary_frame([_result("no_remat"), _result("nothing_saveable")])
    frames = [df, tables.memory_frame([_result()]), tables.residual_layer_kind_frame(_result()),
              tables.dots_frame(_result()), tables.residuals_frame(_result())]
    csv_header = tables.export_frame(df).to_csv(index=False).splitlines()[0].split(",")
    assert "peak_MiB" in csv_header and "peak_bytes" in csv_header and "peak_mib" not in csv_header
    for name in [*csv_header, *(c for f in frames for c in f.columns)]:
        low = str(name).lower()
        for decimal in ("mb", "kb", "gb"):
            assert not (low.endswith(decimal) or f"_{decimal}_" in low or f"({decimal})" in low), name


def _timeline(policy="nothing_saveable", n=100, peak=60):
    """A ``run_experiment`` document with a synthetic ``memory_timeline`` of the engine's shape."""
    forward = [[i, 4096.0 * min(i, peak) if i <= peak else 4096.0 * (n - i)] for i in range(0, n, 2)]
    params = [[0, 1024.0]]  # parameters live from the start: one point holds until the end
    at_peak = [
        {"bytes": 1024, "shape": [16, 16], "dtype": "float32", "kind": "parameter", "phase": "parameter",
         "layer": "blocks", "name": "w1", "instruction": "p0", "op_name": ""},
        {"bytes": 4096 * peak, "shape": [peak, 1024], "dtype": "float32", "kind": "temp",
         "phase": "forward", "layer": "blocks_0", "name": "relu", "instruction": "fusion.3",
         "op_name": "jit(step)/relu"},
    ]
    return {"config": {"policy": policy}, "memory_timeline": {
        "source": "xla live-range dump", "instructions": n,
        "points": [[i, b + 1024.0] for i, b in forward],
        "by_phase": {"forward": forward, "parameter": params, "recomputed": [[0, 0.0]]},
        "peak_index": peak, "peak_live_bytes": 4096 * peak + 1024, "at_peak": at_peak, "note": "values"}}


def test_timeline_frame_stacks_every_phase_at_every_index():
    df = tables.timeline_frame(_timeline())
    assert list(df.columns) == ["index", "phase", "bytes"]
    assert df["phase"].unique().tolist() == ["parameter", "forward"]  # canonical order, not the dict's
    per_phase = df.groupby("phase")["index"].apply(list)
    assert per_phase["parameter"] == per_phase["forward"] == list(range(0, 100, 2))
    assert (df.loc[df["phase"] == "parameter", "bytes"] == 1024).all()  # held from index 0 on
    total = df.groupby("index")["bytes"].sum()
    assert total.idxmax() == 60 and total.max() == 4096 * 60 + 1024


def test_timeline_frame_thins_long_programs_and_keeps_the_peak():
    n = 10_001
    doc = {"memory_timeline": {"instructions": n, "points": [], "by_phase": {
        "forward": [[i, 100.0 if i == 7 else 1.0] for i in range(n)]}}}
    df = tables.timeline_frame(doc)
    assert len(df) <= tables.MAX_POINTS
    assert 7 in df["index"].tolist() and df["bytes"].max() == 100  # the peak, though off the even grid
    assert df["index"].min() == 0 and df["index"].max() == n - 1


@pytest.mark.parametrize("doc", [{}, {"memory_timeline": None},
                                 {"memory_timeline": {"source": None, "reason": "no dump"}}])
def test_timeline_frames_without_a_timeline_are_empty(doc):
    assert tables.timeline_frame(doc).empty
    assert tables.at_peak_frame(doc).empty and "size" in tables.at_peak_frame(doc)
    assert tables.timeline_overlay_frame([doc]).empty
    assert tables.peak_holdings_frame([doc]).empty


def test_at_peak_frame_largest_first_in_binary_units():
    df = tables.at_peak_frame(_timeline())
    assert df.columns.tolist() == tables.AT_PEAK_COLUMNS
    assert df["bytes"].tolist() == [4096 * 60, 1024]
    assert df["size"].tolist() == ["240.0 KiB", "1.0 KiB"]
    assert df["shape"].tolist() == ["(60, 1024)", "(16, 16)"]
    assert df["op_name"].tolist() == ["jit(step)/relu", ""]
    doc = _timeline()
    doc["memory_timeline"]["at_peak"][0]["name"] = None  # the engine names no tensor here
    assert tables.at_peak_frame(doc)["name"].tolist() == ["relu", ""]
    groups = tables.at_peak_groups(df, ["phase"])
    assert groups[["phase", "buffers", "bytes"]].values.tolist() == [["forward", 1, 4096 * 60],
                                                                    ["parameter", 1, 1024]]


def test_overlay_and_holdings_one_entry_per_policy():
    docs = [_timeline("no_remat", n=200, peak=150), _timeline("nothing_saveable", n=100, peak=60)]
    over = tables.timeline_overlay_frame(docs)
    assert over["policy"].unique().tolist() == ["no_remat", "nothing_saveable"]
    assert over["fraction"].between(0, 1).all()
    assert over["label"].unique().tolist() == ["no_remat", "nothing_saveable"]
    same = tables.timeline_overlay_frame([*docs, _timeline("dots_saveable", n=100, peak=60)])
    assert same["label"].unique().tolist() == ["no_remat", "nothing_saveable (= dots_saveable)"]
    assert over.groupby("policy")["fraction"].max().round(2).tolist() == [0.99, 0.98]
    held = tables.peak_holdings_frame(docs).set_index("policy")
    assert held.loc["no_remat", "peak_live_bytes"] == 4096 * 150 + 1024
    assert held.loc["nothing_saveable", "peak_at"] == 0.6
    assert held.loc["nothing_saveable", "forward_bytes"] == 4096 * 60
    assert held.loc["nothing_saveable", "recomputed_bytes"] == 0
    assert held.loc["nothing_saveable", "largest"] == ("240.0 KiB forward (blocks_0 relu); "
                                                       "1.0 KiB parameter (blocks w1)")


def test_advice_frames_from_a_document():
    doc = {"rows": [
        {"policy": "no_remat", "max_batch": 10, "peak_bytes": 1 << 20, "next_batch": 11,
         "next_peak_bytes": (1 << 20) + 5,
         "probes": [{"batch": 1, "peak_bytes": 100, "fits": True},
                    {"batch": 10, "peak_bytes": 1 << 20, "fits": True},
                    {"batch": 11, "peak_bytes": (1 << 20) + 5, "fits": False}],
         "step_time_s": 0.002, "step_time_ci_s": [0.001, 0.003], "examples_per_s": 5000.0,
         "examples_per_s_ci": [3333.0, 10000.0], "model_flops": 1e6, "hardware_flops": 1e6,
         "mfu": 0.5, "hfu": 0.5, "recompute_overhead": 0.0, "not_timed": None, "reason": "r"},
        {"policy": "nothing_saveable", "max_batch": 0, "peak_bytes": None, "next_batch": 1,
         "next_peak_bytes": 200, "probes": [{"batch": 1, "peak_bytes": 200, "fits": False}],
         "step_time_s": None, "step_time_ci_s": None, "examples_per_s": None,
         "examples_per_s_ci": None, "model_flops": None, "hardware_flops": None, "mfu": None,
         "hfu": None, "recompute_overhead": None, "not_timed": None, "reason": "does not fit batch 1"},
    ]}
    frame = tables.advice_frame(doc)
    assert list(frame.columns) == tables.ADVICE_COLUMNS and len(frame) == 2
    first = frame.iloc[0]
    assert first["peak_mib"] == 1.0 and first["probes"] == 3 and first["step_time_ms"] == 2.0
    assert (first["examples_per_s_low"], first["examples_per_s_high"]) == (3333.0, 10000.0)
    assert frame.iloc[1]["note"] == "does not fit batch 1"
    probes = tables.advice_probes_frame(doc)
    assert list(probes.columns) == tables.PROBE_COLUMNS and len(probes) == 4
    assert probes["answer"].tolist() == [False, True, False, False]
    assert probes["fits"].tolist() == [True, True, False, False]
    assert tables.advice_frame(None).empty and tables.advice_probes_frame({}).empty

"""The Streamlit app with AppTest: every page, the URL mirror and the engine's results on screen.

Pages run one by one (``AppTest.from_file("pages/x.py")``) with small configurations.
"""

import json
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from remat_lab.model.policies import DEFAULT_POLICY, POLICIES  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"width": "64", "batch": "8", "depth": "1", "repeats": "3"}


def _app(page: str, **params) -> AppTest:
    at = AppTest.from_file(str(ROOT / page), default_timeout=120)
    for key, value in params.items():
        at.query_params[key] = value
    return at


def _frame(at: AppTest, column: str):
    """The first st.dataframe whose data has ``column``."""
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with a {column!r} column")


@pytest.mark.parametrize("page", ["app.py", "pages/explore.py", "pages/compare.py",
                                  "pages/sweep.py", "pages/advisor.py", "pages/1_inspect.py",
                                  "pages/guide.py"])
def test_every_page_runs(page):
    at = _app(page, **SMALL).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.sidebar.title[0].value == "Remat Lab"
    assert any("Environment: backend" in c.value for c in at.caption)


def test_explore_saves_then_recomputes_both_dots():
    at = _app("pages/explore.py", width="256", batch="64", depth="1", repeats="3").run()
    assert not at.exception
    assert at.selectbox(key="policy").value == DEFAULT_POLICY
    dots = _frame(at, "policy_verdict")
    assert len(dots) == 2
    assert dots["saved"].tolist() == [True, True]
    assert dots["recomputed"].tolist() == [False, False]
    labels = [m.label for m in at.metric]
    assert labels == ["Median step time", "Peak memory", "Activation residuals", "Compiled products",
                      "Saved / recomputed", "Gradient check", "Compile time", "FLOPs per step",
                      "Achieved FLOP/s"]
    metric = {m.label: m.value for m in at.metric}
    assert metric["Saved / recomputed"] == "2 / 0" and metric["Gradient check"] == "ok"
    assert metric["Compiled products"] == "5"  # 2 forward + 3 backward dots, nothing recomputed
    assert all(len(str(v)) <= 9 for v in metric.values()), metric  # fits a card at 1024 px
    sizes = _frame(at, "policy_verdict")["output"].tolist()  # binary units, not "65.5kB"
    assert sizes == ["64.0 KiB", "64.0 KiB"]
    assert _frame(at, "source")["size"].str.fullmatch(r"[\d.]+ (B|KiB|MiB|GiB)").all()  # residuals
    assert any("@nnx.remat(policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)"
               in c.value for c in at.code)
    assert any(c.value.startswith("python -m remat_lab run --model mlp --width 256 --batch 64")
               for c in at.code)

    at.selectbox(key="policy").set_value("nothing_saveable").run()
    assert not at.exception
    dots = _frame(at, "policy_verdict")
    assert dots["saved"].tolist() == [False, False]
    assert dots["recomputed"].tolist() == [True, True]
    metric = {m.label: m.value for m in at.metric}
    assert metric["Compiled products"] == "7"  # the two recomputed dots survive in the compiled program
    assert dots["recomputed_in_compiled"].tolist() == ["yes", "yes"]
    assert any(c.value.startswith("2 more than no_remat") for c in at.caption)
    assert at.query_params["policy"] == "nothing_saveable"


def test_slider_change_reruns_and_syncs_width_entry():
    at = _app("pages/explore.py", **SMALL).run()
    at.select_slider(key="width").set_value(32).run()
    assert not at.exception
    assert at.number_input(key="width_exact").value == 32
    at.segmented_control(key="explore_dot_view").set_value("shapes").run()  # the operands' view
    assert _frame(at, "lhs")["lhs"].tolist()[0] == "(8, 32)"
    at.number_input(key="width_exact").set_value(40).run()
    assert at.select_slider(key="width").value == 40
    assert at.query_params["width"] == "40"


def test_compare_one_row_per_policy():
    at = _app("pages/compare.py", **SMALL).run()
    assert not at.exception
    table = _frame(at, "grad_ok")
    # mlp: JAX's policies by default (MaxText's recipes name transformer tensors).
    assert table["policy"].tolist() == [p for p, e in POLICIES.items() if e.group == "jax"]
    assert table["grad_ok"].all()
    assert (table["ci_low_ms"] <= table["median_ms"]).all()
    assert (table["median_ms"] <= table["ci_high_ms"]).all()
    verdict = next(i.value for i in at.info if "Pareto front" in i.value)
    winners = table.loc[table["fastest"], "policy"].tolist()
    if winners:
        assert verdict.startswith(f"Fastest: **{winners[0]}**")
    else:
        assert verdict.startswith("No winner")
    # At this size the two dots policies compile to one program: shown as such, never ranked.
    same = dict(zip(table["policy"], table["same_program_as"]))
    assert same["dots_with_no_batch_dims_saveable"] == "dots_saveable"
    flags = table.set_index("policy")[["fastest", "pareto"]]
    assert flags.loc["dots_saveable"].tolist() == flags.loc["dots_with_no_batch_dims_saveable"].tolist()
    assert "dots_saveable = dots_with_no_batch_dims_saveable" in verdict
    assert "excess_dots_vs_no_remat" in table and "peak" in table and table["peak"].str.endswith("KiB").all()
    assert any("Ringed points are the Pareto front" in c.value for c in at.caption)
    at.multiselect(key="compare_policies").set_value(["no_remat", "nothing_saveable"]).run()
    assert _frame(at, "grad_ok")["policy"].tolist() == ["no_remat", "nothing_saveable"]


def test_compare_over_budget_shows_one_error_a_web_user_can_act_on(monkeypatch):
    monkeypatch.setenv("REMAT_LAB_MEMORY_BUDGET", "1K")
    at = _app("pages/compare.py", **SMALL).run()
    assert not at.exception
    assert len(at.error) == 1  # one red box in the whole app (the sidebar's flag, or the page's)
    text = at.error[0].value
    assert "width" in text and "depth" in text
    assert "--memory-budget" not in text and "REMAT_LAB_MEMORY_BUDGET" not in text
    assert not at.dataframe


def test_sweep_two_widths_two_batches_two_policies(monkeypatch):
    """Every row timed by its cell's interleaved timing only: its configuration runs untimed first
    (as the CLI's sweep), never timed twice."""
    from pages import _running
    from remat_lab.studies import experiment

    timing_flags = []
    real = experiment.run_experiment
    monkeypatch.setattr(experiment, "run_experiment",
                        lambda cfg, **kw: timing_flags.append(kw.get("timing", True)) or real(cfg, **kw))
    _running._cached_untimed.clear()
    at = _app("pages/sweep.py", repeats="3").run()
    assert not _has_frame(at, "median_ms")
    at.multiselect(key="sweep_widths").set_value([8, 16])
    at.multiselect(key="sweep_batches").set_value([1, 4])
    at.multiselect(key="sweep_policies").set_value(["no_remat", "nothing_saveable"])
    at.button(key="sweep_run").click().run()
    assert not at.exception
    rows = _frame(at, "median_ms")
    assert len(rows) == 8
    assert sorted(set(zip(rows["width"], rows["batch"]))) == [(8, 1), (8, 4), (16, 1), (16, 4)]
    assert (rows["median_ms"] > 0).all()
    assert {"compiled_recomputed_products", "compiled_recomputed_gflop"} <= set(rows.columns)
    assert len(at.get("plotly_chart")) == 6  # 4 line charts, 2 heatmaps
    assert timing_flags == [False] * 8  # untimed runs; the 4 cells timed them (rows' median_ms)


def _has_frame(at, column):
    return any(column in df.value.columns for df in at.dataframe)


def test_inspect_shows_dot_lines_without_timing(monkeypatch):
    from pages import _running
    from remat_lab.studies import experiment

    calls = []
    real = experiment.run_experiment
    monkeypatch.setattr(experiment, "run_experiment",
                        lambda cfg, **kw: calls.append(kw.get("timing")) or real(cfg, **kw))
    _running._cached_programs.clear()
    at = _app("pages/1_inspect.py", width="32", batch="4", depth="2", repeats="3",
              policy="nothing_saveable").run()
    assert not at.exception
    assert calls == [False]  # reading programs neither times nor waits for the timing lock
    codes = [c.value for c in at.code]
    assert any("dot_general" in c and "rematted_computation" in c for c in codes)
    assert len(at.tabs) == 4


def test_url_restores_every_control():
    params = {"model": "seq_mixer", "width": "48", "batch": "2", "seq": "8", "depth": "2",
              "dtype": "bfloat16", "policy": "nothing_saveable", "objective": "grad", "repeats": "3"}
    at = _app("pages/guide.py", **params).run()
    assert not at.exception and not at.warning
    assert at.radio(key="model").value == "seq_mixer"
    assert at.select_slider(key="width").value == 48
    assert at.number_input(key="width_exact").value == 48
    assert at.select_slider(key="batch").value == 2
    assert at.select_slider(key="seq").value == 8
    assert at.slider(key="depth").value == 2
    assert at.radio(key="dtype").value == "bfloat16"
    assert at.selectbox(key="policy").value == "nothing_saveable"
    assert at.radio(key="objective").value == "grad"
    assert at.number_input(key="repeats").value == 3
    assert {k: at.query_params[k] for k in params} == params


@pytest.mark.parametrize("key,value,widget,default", [
    ("width", "-3", "select_slider", 256), ("width", "abc", "select_slider", 256),
    ("policy", "rm -rf", "selectbox", DEFAULT_POLICY), ("batch", "10**12", "select_slider", 128),
    ("batch", str(10 ** 12), "select_slider", 128), ("model", "__import__('os')", "radio", "mlp"),
])
def test_bad_url_values_warn_and_fall_back(key, value, widget, default):
    at = _app("pages/guide.py", **{key: value, "depth": "3"}).run()
    assert not at.exception
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1 and f"`{key}`" in warnings[0] and "Allowed" in warnings[0]
    assert getattr(at, widget)(key=key).value == default
    assert at.slider(key="depth").value == 3  # the valid parameter is kept
    assert at.query_params[key] == str(default)


def test_batch_zero_with_seq_mixer_is_refused():
    at = _app("pages/guide.py", model="seq_mixer", batch="0").run()
    assert not at.exception
    assert any("`batch`" in w.value for w in at.warning)
    assert at.select_slider(key="batch").value == 128  # the app's default


def test_over_budget_is_flagged_in_the_sidebar_before_any_button(monkeypatch):
    monkeypatch.setenv("REMAT_LAB_MEMORY_BUDGET", "4M")  # width 256, batch 64 needs about 5 MiB
    for page in ("pages/explore.py", "pages/1_inspect.py", "pages/guide.py"):
        at = _app(page, width="256", batch="64", repeats="3").run()
        assert not at.exception
        flags = [e.value for e in at.sidebar.error]
        assert len(flags) == 1 and len(at.error) == 1, (page, [e.value for e in at.error])
        assert "Estimated" in flags[0] and "over the memory budget of 4.0 MiB" in flags[0], flags
        assert "lower width, batch or depth" in flags[0]  # seq only for seq_mixer
        assert "--memory-budget" not in flags[0] and "REMAT_LAB" not in flags[0]  # web advice only
        assert not at.button and not at.metric, page  # no "Run" button, nothing run
    mixer = _app("pages/guide.py", model="seq_mixer", width="256", batch="64", seq="64").run()
    assert "lower width, batch, seq or depth" in mixer.sidebar.error[0].value
    at.select_slider(key="width").set_value(16).run()  # back under the budget: the flag goes
    assert not at.error and any("Estimated memory need" in c.value for c in at.sidebar.caption)


def test_sweep_leaves_out_configurations_over_the_budget(monkeypatch):
    monkeypatch.setenv("REMAT_LAB_MEMORY_BUDGET", "64M")
    at = _app("pages/sweep.py", repeats="3").run()
    at.multiselect(key="sweep_widths").set_value([8, 4096])
    at.multiselect(key="sweep_batches").set_value([1])
    at.multiselect(key="sweep_policies").set_value(["no_remat"]).run()
    assert not at.exception and not at.error
    left_out = [w.value for w in at.warning]
    assert len(left_out) == 1 and "width 4096 × batch 1" in left_out[0], left_out
    assert "over the memory budget of 64.0 MiB" in left_out[0]
    assert at.button(key="sweep_run").label == "Run sweep (1 run)"
    at.button(key="sweep_run").click().run()
    assert not at.exception and not at.error
    assert _frame(at, "median_ms")["width"].tolist() == [8]


def test_over_budget_is_an_error_not_a_traceback(monkeypatch):
    monkeypatch.setenv("REMAT_LAB_MEMORY_BUDGET", "1K")
    at = _app("pages/explore.py", width="24", batch="8", depth="1", repeats="3").run()
    assert not at.exception
    assert len(at.error) == 1 and "memory budget" in at.error[0].value
    assert not at.metric


SYNTHETIC_TIMELINE = {  # the engine's memory_timeline shape, small
    "source": "synthetic", "instructions": 40,
    "points": [[i, float(1024 + 4096 * min(i, 40 - i))] for i in range(0, 40, 4)],
    "by_phase": {"parameter": [[0, 1024.0]],
                 "forward": [[i, float(4096 * min(i, 40 - i))] for i in range(0, 40, 4)]},
    "peak_index": 20, "peak_live_bytes": 1024 + 4096 * 20,
    "at_peak": [{"bytes": 1024, "shape": [16, 16], "dtype": "float32", "kind": "parameter",
                 "phase": "parameter", "layer": "blocks", "name": "w", "instruction": "p.1", "op_name": ""},
                {"bytes": 4096 * 20, "shape": [80, 256], "dtype": "float32", "kind": "temp",
                 "phase": "forward", "layer": "blocks_0", "name": "relu", "instruction": "fusion.2",
                 "op_name": "jit(step)/relu"}],
    "note": "The live-range peak counts values; XLA's memory analysis counts allocations."}


@pytest.mark.parametrize("timeline", [SYNTHETIC_TIMELINE, None, {"source": None, "reason": "no dump."}])
def test_explore_shows_memory_over_the_program(monkeypatch, timeline):
    from pages import _running
    from remat_lab.studies import experiment

    real = experiment.run_experiment
    monkeypatch.setattr(experiment, "run_experiment",
                        lambda cfg, **kw: {**real(cfg, **kw), "memory_timeline": timeline})
    _running._cached_run.clear()
    at = _app("pages/explore.py", width="24", batch="4", depth="2", repeats="3").run()
    _running._cached_run.clear()  # the synthetic timeline must not serve other tests
    assert not at.exception, at.exception
    assert "Memory over the program" in [h.value for h in at.subheader]
    captions = [c.value for c in at.caption]
    if timeline is not SYNTHETIC_TIMELINE:
        assert any(c.startswith("No memory timeline for this run") for c in captions)
        assert not _has_frame(at, "op_name")
        return
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    stacked = [f for f in specs if any(t.get("stackgroup") == "live" for t in f["data"])]
    assert len(stacked) == 1 and [t["name"] for t in stacked[0]["data"]] == ["parameter", "forward"]
    buffers = _frame(at, "op_name")
    assert buffers["size"].tolist() == ["80.0 KiB", "1.0 KiB"]  # largest first, binary units
    assert buffers["name"].tolist() == ["relu", "w"]
    assert timeline["note"] in captions
    at.segmented_control(key="explore_peak_group").set_value("by phase").run()
    assert _frame(at, "buffers")["phase"].tolist() == ["forward", "parameter"]


def test_compare_overlays_the_policies_timelines(monkeypatch):
    from remat_lab.studies import compare

    real = compare.compare_policies

    def with_timelines(cfg, policies, **kw):
        out = real(cfg, policies, **kw)
        return {**out, "timelines": {p: {**SYNTHETIC_TIMELINE, "peak_live_bytes": 1024 + 4096 * 20 * (i + 1)}
                                     for i, p in enumerate(out["timelines"])}}

    monkeypatch.setattr(compare, "compare_policies", with_timelines)
    at = _app("pages/compare.py", width="20", batch="2", depth="2", repeats="3")
    at.session_state["compare_policies"] = ["no_remat", "nothing_saveable"]
    at.run()
    assert not at.exception, at.exception
    held = _frame(at, "largest")
    assert held["policy"].tolist() == ["no_remat", "nothing_saveable"]
    assert held["peak_live_bytes"].tolist() == ["81.0 KiB", "161.0 KiB"]
    assert "recomputed_bytes" not in held  # zero for every policy: left out
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    overlay = next(f for f in specs if f["layout"]["title"]["text"] == "Memory over the program, per policy")
    # The two synthetic timelines are equal: one line, named after both.
    assert [t["name"] for t in overlay["data"] if t["mode"] == "lines"] == ["no_remat (= nothing_saveable)"]


def test_the_guides_timeline_lessons_hold(run):
    """The Guide's "Memory over the program" examples, on the engine's timelines of the default stack."""
    from pages import _sidebar
    from remat_lab.present import tables

    policies = ["no_remat", "nothing_saveable", "dots_with_no_batch_dims_saveable"]
    held = {stack: tables.peak_holdings_frame(
        [run(_sidebar.DEFAULT.replace(stack=stack, policy=p)) for p in policies]).set_index("policy")
        for stack in ("scan", "loop")}
    scan, loop = held["scan"], held["loop"]
    if scan.empty:
        pytest.skip("this backend gives no memory timeline")
    # Scan: the peak is in the backward pass, and the forward band there is the policy's doing.
    assert (scan["peak_at"] > 0.5).all() and (scan["backward_bytes"] > 0).all()
    forward = scan["forward_bytes"]
    assert forward["nothing_saveable"] < forward["no_remat"] < forward["dots_with_no_batch_dims_saveable"]
    assert scan.loc["nothing_saveable", "recomputed_bytes"] > 0 == scan.loc["no_remat", "recomputed_bytes"]
    # Loop: every policy peaks at the very end, with the same live bytes (parameters and gradients
    # fill it; the forward bands left there differ by at most a quarter MiB).
    assert (loop["peak_at"] > 0.9).all()
    assert loop["peak_live_bytes"].nunique() == 1 and loop["forward_bytes"].max() <= 1 << 18


def test_explore_shows_the_engines_timeline():
    at = _app("pages/explore.py", width="64", batch="8", depth="2", repeats="3",
              policy="nothing_saveable").run()
    assert not at.exception, at.exception
    if any(c.value.startswith("No memory timeline") for c in at.caption):
        pytest.skip("this backend gives no memory timeline")
    buffers = _frame(at, "op_name")
    assert buffers["bytes"].is_monotonic_decreasing and len(buffers) > 1
    peak = next(json.loads(c.proto.spec) for c in at.get("plotly_chart")
                if "live bytes by phase" in json.loads(c.proto.spec)["layout"]["title"]["text"])
    label = next(a["text"] for a in peak["layout"]["annotations"] if a["text"].startswith("peak "))
    assert label == f"peak {buffers['bytes'].sum() / (1 << 20):.2f} MiB" + label[label.index(" at "):]

"""Targets in the app: the sidebar's Target and its URL value, Explore compiled for an H100, the
across-targets study, its ranking lesson and its chart."""

import json
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from remat_lab.config import RunConfig  # noqa: E402
from remat_lab.present import charts, tables  # noqa: E402
from remat_lab.present.palette import policy_color  # noqa: E402
from remat_lab.present.target_charts import ranking_lesson, ranking_text, target_label  # noqa: E402
from remat_lab.studies.across_targets import compare_across_targets  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = {"width": "64", "batch": "8", "depth": "1", "repeats": "3"}


def _app(page: str, timeout: int = 180, **params) -> AppTest:
    at = AppTest.from_file(str(ROOT / page), default_timeout=timeout)
    for key, value in params.items():
        at.query_params[key] = value
    return at


def _texts(at: AppTest) -> str:
    parts = [*at.caption, *at.info, *at.markdown, *at.warning, *at.success, *at.code]
    return "\n".join(str(p.value) for p in parts)


def test_explore_on_h100_names_it_measures_nothing_and_labels_the_estimate():
    at = _app("pages/explore.py", target="h100", **TINY).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key="target").value == "h100"
    assert at.query_params["target"] == "h100"
    text = _texts(at)
    assert "Compiled for H100" in text and "NVIDIA H100" in text
    metric = {m.label: m.value for m in at.metric}
    assert "Median step time" not in metric and "Achieved FLOP/s" not in metric
    assert metric["Measured step time"] == "none"
    assert "not measured: compiled for H100 without the device" in text
    assert metric["Predicted step time"] not in ("", "n/a", "none")  # the H100 has measured rates
    assert "predicted, not measured" in text and "roofline bound" in text
    assert metric["Gradient check"] == "not run" and "not run: compiled for h100" in text
    assert metric["Peak memory"] != "n/a"
    assert any("python -m remat_lab run" in c.value and "--target h100" in c.value for c in at.code)
    assert any("policy_verdict" in df.value.columns for df in at.dataframe)  # the per-dot table
    assert at.button(key="explore_on_local") and at.button(key="explore_on_tpu-v5e")


def test_explore_offers_a_gpu_target_one_click_away():
    at = _app("pages/explore.py", **TINY).run()
    assert not at.exception
    assert at.query_params["target"] == "local"  # local, as every other setting: written out
    assert any(m.label == "Median step time" for m in at.metric)
    at.button(key="explore_on_h100").click().run()
    assert not at.exception
    assert at.selectbox(key="target").value == "h100"
    assert at.query_params["target"] == "h100"
    assert {m.label: m.value for m in at.metric}["Measured step time"] == "none"


def test_a_bad_target_in_the_url_warns_and_runs_locally():
    at = _app("pages/guide.py", target="h1000", **TINY).run()
    assert not at.exception
    warnings = [w.value for w in at.warning]
    assert any("URL parameter `target`" in w and "h1000" in w and "`local`" in w for w in warnings)
    assert at.selectbox(key="target").value == "local"
    assert at.query_params["target"] == "local"


def test_the_sidebar_labels_targets_with_their_memory():
    assert target_label("local").startswith("local")
    assert target_label("h100") == "H100 (79 GiB, compile only)"
    assert target_label("tpu-v5e") == "TPU v5e (16 GiB, compile only)"


def test_across_targets_gives_one_row_per_pair_with_run_experiments_peaks(run):
    cfg = RunConfig(width=64, batch=8, depth=2, dtype="bfloat16", repeats=1, warmup=0)
    policies = ["no_remat", "nothing_saveable"]
    doc = compare_across_targets(cfg, policies, ["h100", "local"])
    assert doc["schema"] == 1 and doc["kind"] == "across_targets" and not doc["failed"]
    json.dumps(doc)  # JSON-ready
    assert [(r["target"], r["policy"]) for r in doc["rows"]] == [
        ("h100", "no_remat"), ("h100", "nothing_saveable"), ("local", "no_remat"),
        ("local", "nothing_saveable")]
    for r in doc["rows"]:
        target_devices = {"target": r["target"]}
        want = run(cfg.replace(policy=r["policy"], **target_devices))["memory"]["peak_bytes"]
        assert r["peak_bytes"] == want
    assert doc["rows"][0]["platform"] == "cuda" and doc["rows"][0]["estimate_s"] > 0
    assert doc["rows"][2]["estimate_s"] is None  # local: compiled, not estimated, not timed
    assert set(doc["rankings"]) == {"h100", "local"}
    frame = tables.across_targets_frame(doc)
    assert len(frame) == 4 and frame["peak_mib"].gt(0).all()


def _peaks(rows: list[tuple[str, str, int]]) -> pd.DataFrame:
    return pd.DataFrame([{"target": t, "policy": p, "peak_bytes": b} for t, p, b in rows])


def test_the_lesson_appears_only_when_the_ranking_changes():
    mib = 1 << 20
    changes = _peaks([("local", "no_remat", 12 * mib), ("local", "nothing_saveable", 10 * mib),
                      ("h100", "no_remat", 9 * mib), ("h100", "nothing_saveable", 11 * mib)])
    lesson = ranking_lesson(changes)
    assert lesson and "changes between targets" in lesson
    assert "nothing_saveable needs less than no_remat on local (10.0 vs 12.0 MiB)" in lesson
    assert "more on H100 (11.0 vs 9.0 MiB)" in lesson
    same = _peaks([("local", "no_remat", 12 * mib), ("local", "nothing_saveable", 10 * mib),
                   ("h100", "no_remat", 20 * mib), ("h100", "nothing_saveable", 5 * mib)])
    assert ranking_lesson(same) is None
    tie = _peaks([("local", "a", 100 * mib), ("local", "b", 100 * mib + 1),  # within 1 %: no ranking
                  ("h100", "a", 100 * mib + 1), ("h100", "b", 100 * mib)])
    assert ranking_lesson(tie) is None
    assert ranking_text(tie) == "local: a ≈ b; H100: b ≈ a"
    assert ranking_lesson(_peaks([])) is None


def test_the_targets_chart_groups_policies_and_handles_no_data():
    empty = charts.make_targets_peak_figure(tables.across_targets_frame(None))
    assert len(empty.data) == 0 and empty.layout.annotations[0].text == "no data yet"
    frame = tables.across_targets_frame({"rows": [
        {"target": t, "policy": p, "peak_bytes": b << 20} for t, p, b in
        [("local", "no_remat", 12), ("local", "nothing_saveable", 10), ("tpu-v5e", "no_remat", 9),
         ("tpu-v5e", "nothing_saveable", 11)]]})
    fig = charts.make_targets_peak_figure(frame)
    assert [t.name for t in fig.data] == ["no_remat", "nothing_saveable"]
    assert fig.data[1].marker.color == policy_color("nothing_saveable")
    assert list(fig.data[0].x) == ["local", "TPU v5e"] and list(fig.data[0].y) == [12, 9]
    assert "MiB" in fig.layout.yaxis.title.text and fig.layout.barmode == "group"
    assert fig.layout.legend.y < 0  # under the plot, not over the bars


def test_the_targets_page_compiles_and_shows_the_lesson_or_the_same_ranking():
    at = _app("pages/targets.py", **TINY).run()
    assert not at.exception, at.exception
    at.multiselect(key="targets_chosen").set_value(["local", "h100"])
    at.multiselect(key="targets_policies").set_value(["no_remat", "nothing_saveable"]).run()
    at.button(key="targets_run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    table = next(df.value for df in at.dataframe if "peak_mib" in df.value.columns)
    assert len(table) == 4 and set(table["target"]) == {"local", "h100"}
    said = [w.value for w in at.warning] + [s.value for s in at.success]
    assert any("changes between targets" in s or "No policy overtakes another" in s for s in said)


def test_the_advisor_sizes_an_llm_per_device_on_a_target_mesh():
    """The headline question in one screen, at toy size: an llm's training recipe (bf16 compute, fp32
    master weights and moments) on 8 TPU v5e chips (fsdp=8) from a link, the mesh offered on a
    target although this machine has one device; per policy the largest per-device batch, tokens
    per step, and a stacked bar of what fills one device."""
    at = _app("pages/advisor.py", timeout=600, model="llm", vocab="256", width="64", heads="4", kv_heads="2",
              mlp_dim="128", seq="16", depth="2", batch="8", target="tpu-v5e", mesh="fsdp=8",
              step="train", dtype="bfloat16", param_dtype="float32", optimizer_dtype="float32",
              budget="4.7M", policies="nothing_saveable").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="mesh_fsdp").value == 8 and at.query_params["mesh"] == "fsdp=8"
    at.button(key="advisor_run").click().run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    doc = at.session_state["_advisor_doc"][1]
    assert [r["policy"] for r in doc["rows"]] == ["nothing_saveable"]
    for r in doc["rows"]:
        assert r["devices"] == 8 and r["max_batch"] == 8 * r["per_device_batch"] > 0, r["reason"]
        assert r["tokens_per_step"] == r["max_batch"] * 16
        kinds = {k: v for k, v in r["by_kind"].items() if k != "method"}
        assert sum(kinds.values()) == r["peak_bytes"] <= doc["budget_bytes"]
    charts_drawn = [c for c in at.get("plotly_chart")]
    assert any("Memory by kind" in json.dumps(json.loads(c.proto.spec).get("layout", {}).get("title", {}))
               for c in charts_drawn)


def test_a_published_model_on_a_target_mesh_is_never_refused_by_this_server_s_memory():
    from remat_lab.config import check_budget, estimate_bytes

    cfg = RunConfig.from_preset("llama3-8b", target="tpu-v5e", target_devices=4, mesh="fsdp=4",
                                batch=4, seq=8192)
    assert estimate_bytes(cfg) == 1 << 20  # nothing of its size is allocated here
    check_budget(cfg, 64 << 20)  # a 64 MiB server budget refuses nothing
    local = cfg.replace(target="local", target_devices=1, mesh="")
    assert estimate_bytes(local) > 100 << 30  # the same model run here would need far more
    at = _app("pages/explore.py", target="tpu-v5e", preset="llama3-8b", mesh="fsdp=4").run()
    assert not at.exception, at.exception
    shown = _texts(at) + "\n".join(str(e.value) for e in at.error)
    assert "cannot run here" not in shown and "memory budget" not in shown
    assert "Estimated memory need" not in shown and "nothing is allocated here" in shown


def test_the_targets_page_restores_its_selections_from_its_link_and_writes_them_back():
    at = _app("pages/targets.py", targets="h100,tpu-v5e", policies="no_remat,nothing_saveable", **TINY).run()
    assert not at.exception and not at.error
    assert at.multiselect(key="targets_chosen").value == ["h100", "tpu-v5e"]
    assert at.multiselect(key="targets_policies").value == ["no_remat", "nothing_saveable"]
    assert at.query_params["targets"] == "h100,tpu-v5e"
    fresh = _app("pages/targets.py", **TINY).run()  # no link: what users rent, not this machine
    assert "local" not in fresh.multiselect(key="targets_chosen").value
    bad = _app("pages/targets.py", targets="h100,gpu9000", **TINY).run()
    assert any("URL parameter `targets`" in w.value and "gpu9000" in w.value for w in bad.warning)


def test_explore_takes_a_mesh_over_two_hosts_from_the_link():
    """A link with MaxText's dcn axes opens on them: the sidebar's dcn selectors, the mesh in the
    URL as given (canonical), the run over 2 hosts x 4 H100 and its cross-host collectives."""
    at = _app("pages/explore.py", target="h100", mesh="fsdp=4,dcn_data=2", **TINY).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert at.selectbox(key="mesh_dcn_data").value == 2 and at.selectbox(key="mesh_fsdp").value == 4
    assert at.query_params["mesh"] == "dcn_data=2,fsdp=4"
    text = _texts(at)
    assert "dcn_data=2,fsdp=4" in text and "--mesh dcn_data=2,fsdp=4" in text
    frames = [df.value for df in at.dataframe if "collective" in df.value.columns]
    assert frames and "across slices or hosts (bytes)" in frames[0].columns

"""The advisor's timing guard, stop rules, decision summary, number formats and stated peak (issue 24)."""

import json
from pathlib import Path

import pytest

from remat_lab.cli import main
from remat_lab.config import RunConfig, estimate_bytes
from remat_lab.present import advisor_tables
from remat_lab.studies import advisor
from remat_lab.studies.advisor import timing as advisor_timing
from remat_lab.studies.advisor.decision import decide, ms, sig

SMALL = RunConfig(model="mlp", width=64, depth=4, stack="scan", batch=1, repeats=3, warmup=1)


def test_the_guard_uses_the_compiled_peak_not_the_width_estimate():
    """Compiled peak + overhead fits the server budget while the width estimate is over it: timed."""
    cfg = RunConfig(model="mlp", width=128, depth=2, stack="scan", batch=1, repeats=3, warmup=1)
    server = 140 << 20
    doc = advisor.advise(cfg, 48 << 20, policies=["no_remat"], server_budget=server, time_budget_s=1.0)
    (row,) = doc["rows"]
    at = cfg.replace(batch=row["max_batch"])
    assert estimate_bytes(at) > server  # the old, width-based guard would have refused it
    need = row["peak_bytes"] + advisor_timing.PROCESS_OVERHEAD
    assert need <= doc["timing"]["timed_set_bytes"] <= server
    assert doc["timed"] and row["not_timed"] is None and row["step_time_s"] > 0
    # the budget (1 s, compiles included) is kept: at least one round, MIN_ROUNDS when they are cheap
    assert row["rounds"] == doc["rounds"] >= 1
    assert doc["stopped_because"] in ("time budget", "one program", "max rounds")
    # Below the compiled need, the row says why with the numbers.
    under = advisor.advise(cfg, 48 << 20, policies=["no_remat"], server_budget=need - (1 << 20),
                           time_budget_s=1.0)
    (r,) = under["rows"]
    assert not under["timed"] and r["step_time_s"] is None
    assert r["not_timed"].startswith("not timed: compiled peak") and "MiB" in r["not_timed"]
    assert under["decision"]["basis"] == "batch only"


def _rows(peaks_args: dict[str, tuple[int, int]]) -> list[dict]:
    return [{"policy": p, "max_batch": 8, "peak_bytes": peak, "fingerprint": p, "not_timed": None}
            for p, (peak, _) in peaks_args.items()]


def test_the_plan_counts_every_timed_policys_arguments(monkeypatch):
    """Interleaved executables keep their arguments alive together: the set must fit as a whole."""
    mib = 1 << 20
    sizes = {"no_remat": (100 * mib, 40 * mib), "nothing_saveable": (60 * mib, 40 * mib),
             "dots_saveable": (80 * mib, 40 * mib)}
    monkeypatch.setattr(advisor_timing, "args_bytes", lambda cfg: sizes[cfg.policy][1])
    configs = {p: SMALL.replace(policy=p) for p in sizes}
    rows = _rows(sizes)
    allow = 40 * mib + 40 * mib + 60 * mib + advisor_timing.PROCESS_OVERHEAD  # two fit, not three
    chosen, same, used = advisor_timing.plan(rows, configs, allow, "test")
    assert chosen == ["nothing_saveable", "dots_saveable"] and same == {} and used == allow - 20 * mib
    (left,) = [r for r in rows if r["not_timed"]]
    assert left["policy"] == "no_remat" and "80.0 MiB of the other timed policies" in left["not_timed"]


def test_a_stop_keeps_the_finished_rounds(monkeypatch):
    monkeypatch.setattr(advisor_timing, "stated_peak", lambda dtype: {
        "peak_flops_per_s": 1e12, "peak_kind": "calibrated", "peak_source": "test"})
    calls = []
    def stop():
        calls.append(1)
        return len(calls) > 3  # after the compiles' checks and one round
    doc = advisor.advise(SMALL, 1 << 20, policies=["no_remat", "nothing_saveable"],
                         time_budget_s=30.0, should_stop=stop)
    assert doc["stopped_because"] == "stopped" and doc["timed"] and doc["rounds"] == 1
    assert all(r["rounds"] == 1 and r["examples_per_s"] > 0 for r in doc["rows"])
    assert "stopped on request" in doc["decision"]["why"]


def test_the_time_budget_keeps_the_compiles_for_timing():
    """A budget spent by the first compile for timing compiles no other program: the others say so,
    and the one compiled is warmed up by one call and timed (the budget plus one step of each)."""
    policies = ["no_remat", "nothing_saveable"]
    doc = advisor.advise(SMALL, 1 << 20, policies=policies, time_budget_s=1e-3)
    timed = [r for r in doc["rows"] if r["step_time_s"] is not None]
    untimed = [r for r in doc["rows"] if r["step_time_s"] is None]
    assert len(timed) == 1 and len(untimed) == 1 and doc["timed"]
    assert untimed[0]["not_timed"] == ("not timed: the time budget (0.001 s) was spent compiling 1 of "
                                       "the 2 programs before it for timing")
    assert timed[0]["rounds"] == doc["rounds"] == 1 and doc["stopped_because"] == "time budget"
    # a policy sharing the untimed program (everything_saveable compiles to no_remat's) says the same
    three = advisor.advise(SMALL, 1 << 20, policies=[*policies, "everything_saveable"], time_budget_s=1e-3)
    rows = {r["policy"]: r for r in three["rows"]}
    assert rows["no_remat"]["step_time_s"] is None and rows["everything_saveable"]["step_time_s"] is None
    assert rows["everything_saveable"]["not_timed"] == rows["no_remat"]["not_timed"] != None  # noqa: E711
    assert doc["timing"]["warmed_up"] is False  # the one round carried the first call
    roomy = advisor.advise(SMALL, 1 << 20, policies=policies, time_budget_s=30.0)
    assert all(r["step_time_s"] is not None for r in roomy["rows"])  # room for both: both timed
    assert roomy["timing"]["warmed_up"] is True  # its first round dropped as the warm-up


def test_rounds_stop_when_the_intervals_separate():
    batches = {"a": 10, "b": 10}
    apart = {"a": [1.0, 1.01, 0.99, 1.0, 1.0], "b": [2.0, 2.02, 1.98, 2.0, 2.0]}
    close = {"a": [1.0, 1.5, 0.9, 1.2, 1.0], "b": [1.1, 1.4, 0.95, 1.0, 1.3]}
    assert advisor_timing.separated(apart, batches, seed=0)
    assert not advisor_timing.separated(close, batches, seed=0)
    assert not advisor_timing.separated({"a": apart["a"]}, batches, seed=0)


@pytest.mark.parametrize("x,text", [(14878.651, "14,900"), (0.6, "0.600"), (0.64, "0.640"),
                                    (1234.5, "1,230"), (12.345, "12.3"), (0.0012345, "0.00123"),
                                    (None, ""), (float("nan"), ""), (0, "0")])
def test_numbers_to_three_significant_figures(x, text):
    assert sig(x) == text


def test_the_shown_table_has_no_none_and_blank_empty_cells():
    assert ms(14.878651) == "14,900 ms" and ms(None) == ""
    doc = {"budget_bytes": 1 << 20, "rows": [
        {"policy": "no_remat", "max_batch": 3, "peak_bytes": 1000, "next_batch": 4,
         "next_peak_bytes": (1 << 20) + 10, "probes": [{}], "step_time_s": 14.878651,
         "examples_per_s": 0.6, "examples_per_s_ci": [0.55, 0.64], "mfu": 0.1234, "hfu": 1.5,
         "recompute_overhead": 0.0, "rounds": 5, "not_timed": None, "rate_error": "calibration error: x"},
        {"policy": "nothing_saveable", "max_batch": 0, "peak_bytes": None, "next_batch": 1,
         "next_peak_bytes": None, "probes": [], "step_time_s": None, "examples_per_s": None,
         "examples_per_s_ci": None, "mfu": None, "hfu": None, "recompute_overhead": None,
         "not_timed": None, "reason": "does not fit batch 1"}]}
    shown = advisor_tables.advice_display_frame(doc)
    first, second = shown.iloc[0], shown.iloc[1]
    assert first["step time"] == "14,900 ms" and first["examples/s"] == "0.600"
    assert first["95 % interval"] == "0.550–0.640" and first["MFU"] == "12.3 %"
    assert first["HFU"] == "150 %" and "calibration error" in first["note"]  # not capped at 100 %
    assert second["step time"] == "" and second["MFU"] == "" and second["rounds"] == ""
    assert not any("None" in str(v) or "nan" in str(v) for v in shown.to_numpy().ravel())


def _row(policy, batch, peak, rate=None, ci=None, same=None):
    return {"policy": policy, "max_batch": batch, "peak_bytes": peak, "examples_per_s": rate,
            "examples_per_s_ci": ci, "same_program_as": same, "not_timed": None}


def test_the_decision_names_the_pick_the_runner_up_and_the_headroom():
    doc = {"budget_bytes": 1000, "timed": True, "recommended": "a", "rounds": 7,
           "stopped_because": "separated", "reason": "r", "rows": [
               _row("a", 10, 900, 50.0, [48.0, 52.0]), _row("b", 12, 990, 40.0, [39.0, 41.0]),
               _row("c", 10, 900, 50.0, [48.0, 52.0], same="a")]}
    d = decide(doc, ["offload shows nothing on CPU"])
    assert (d["pick"], d["basis"], d["batch"], d["headroom_bytes"]) == ("a", "measured", 10, 100)
    assert d["headroom_fraction"] == pytest.approx(0.1) and d["examples_per_s_ci"] == [48.0, 52.0]
    assert d["runner_up"]["policy"] == "b" and d["separated"] is True  # c is a's own program
    assert "48.0–52.0" in d["why"] and "the intervals separate" in d["why"]
    assert d["cannot_show"] == ["offload shows nothing on CPU"]
    doc["rows"][1].update(examples_per_s=49.0, examples_per_s_ci=[47.0, 50.0])
    assert decide(doc, [])["separated"] is False and "near-tie" in decide(doc, [])["why"]
    none = decide({**doc, "recommended": None}, [])
    assert none["pick"] is None and none["runner_up"] is None


def test_an_mfu_over_one_is_a_calibration_error_not_capped(monkeypatch):
    monkeypatch.setattr(advisor_timing, "stated_peak", lambda dtype: {
        "peak_flops_per_s": 1e9, "peak_kind": "calibrated", "peak_source": "test"})
    rows = [{"policy": "p", "step_time_s": 0.5, "model_flops": 1e9, "hardware_flops": 2e9},
            {"policy": "q", "step_time_s": 1.0, "model_flops": 1e8, "hardware_flops": 1e8}]
    peak = advisor_timing.flop_rates(rows)
    assert peak["peak_kind"] == "calibrated"
    assert rows[0]["mfu"] == pytest.approx(2.0) and rows[0]["hfu"] == pytest.approx(4.0)
    assert rows[0]["rate_error"].startswith("calibration error")
    assert rows[1]["mfu"] == pytest.approx(0.1) and rows[1]["rate_error"] is None


def test_cli_puts_the_decision_first(capsys):
    assert main(["advise", "--width", "64", "--depth", "4", "--budget", "1M", "--no-time",
                 "--policies", "no_remat,nothing_saveable"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Decision: nothing_saveable (not timed: by batch alone)")
    assert "None" not in out
    assert main(["advise", "--width", "64", "--depth", "4", "--budget", "1M", "--no-time", "--json",
                 "--policies", "no_remat"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc)[:3] == ["schema", "kind", "decision"] and doc["decision"]["pick"] == "no_remat"
    with pytest.raises(SystemExit) as bad:  # argparse refuses it before anything runs
        main(["advise", "--time-budget", "0", "--no-time"])
    assert bad.value.code == 2
    assert "--time-budget must be" in capsys.readouterr().err


def test_the_advisor_page_shows_the_decision_first_and_a_stop():
    """AppTest (the pool runs in-process): a timed click shows the decision, the text table with
    blank cells and the Stop control; the answer stays when another control changes."""
    from streamlit.testing.v1 import AppTest

    page = Path(__file__).resolve().parents[1] / "pages" / "advisor.py"
    at = AppTest.from_file(str(page), default_timeout=300)
    at.query_params.update({"width": "32", "depth": "1", "budget": "256K",
                            "policies": "no_remat,nothing_saveable", "timed": "1"})
    at.run()
    at.button(key="advisor_run").click().run()
    assert not at.exception, at.exception
    assert len(at.success) == 1  # one answer: the recommendation with the decision's why
    d = at.session_state["_advisor_doc"][1]["decision"]
    text = at.success[0].value
    assert text.startswith("**Recommended: ") and d["pick"] in text and "under the" in text
    assert at.button(key="advisor_stop") is not None
    shown = [d.value for d in at.dataframe if list(d.value.columns) == advisor_tables.DISPLAY_COLUMNS]
    assert shown, [list(d.value.columns) for d in at.dataframe]
    assert not shown[0].astype(str).isin(["None", "nan"]).any().any()
    at.select_slider(key="advisor_time_budget").set_value(10).run()  # another question: not run
    assert not at.exception, at.exception and not at.success

"""The advice in the user's terms: a search's own limit said as a lower bound, ties to headroom."""

from __future__ import annotations

from remat_lab.config import RunConfig
from remat_lab.present.advisor_tables import advice_display_frame
from remat_lab.studies import advisor
from remat_lab.studies.advisor_search import largest_batch


def _curve(per_example: int, base: int):
    return lambda cfg: {"peak_bytes": base + per_example * cfg.batch, "cached": False}


def test_a_search_that_reaches_its_own_limit_says_so_and_is_not_a_fit_at_the_budget():
    cfg = RunConfig(model="mlp", width=64, batch=1)
    roomy = largest_batch(cfg, budget=1 << 40, max_batch=64, measure=_curve(10, 100))
    assert roomy["max_batch"] == 64 and roomy["next_batch"] is None
    assert roomy["limited_by"] == "search_limit" and "≥ 64" in roomy["reason"]
    tight = largest_batch(cfg, budget=100 + 10 * 20, max_batch=64, measure=_curve(10, 100))
    assert tight["max_batch"] == 20 and tight["limited_by"] == "budget"
    shown = advice_display_frame({"budget_bytes": 1 << 40, "rows": [
        {"policy": "a", **roomy}, {"policy": "b", **tight}]})
    assert list(shown["largest batch"]) == ["≥ 64 (the search's limit)", "20"]


def test_equal_batches_untimed_recommend_the_smallest_peak():
    rows = [{"policy": "everything_saveable", "max_batch": 64, "peak_bytes": 900},
            {"policy": "no_remat", "max_batch": 64, "peak_bytes": 700},
            {"policy": "nothing_saveable", "max_batch": 32, "peak_bytes": 100}]
    best, ties, _ = advisor._recommend(rows, timed=False)
    assert best == "no_remat" and set(ties) == {"no_remat", "everything_saveable"}


def test_equal_estimates_on_a_target_recommend_the_smallest_peak():
    rows = [{"policy": "everything_saveable", "max_batch": 64, "peak_bytes": 900,
             "examples_per_s_estimate": 1000.0},
            {"policy": "no_remat", "max_batch": 64, "peak_bytes": 700, "examples_per_s_estimate": 1000.0}]
    best, _, _ = advisor._recommend_by_estimate(rows, "tpu-v5e")
    assert best == "no_remat"

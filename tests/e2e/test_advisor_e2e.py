"""End-to-end: the Advisor page in headless Chromium (issue #14)."""

from __future__ import annotations

import re

import pytest
from streamlit_driver import assert_no_error, assert_no_exception, grid_rows, open_app, rerun_after

pytestmark = pytest.mark.e2e

MODEL = {"width": "64", "depth": "4", "stack": "scan", "repeats": "3"}


def _budget(page, text: str) -> None:
    box = page.get_by_role("textbox", name="Device memory budget")
    rerun_after(page, lambda: (box.fill(text), box.press("Enter")))


def test_advisor_shows_the_recommendation_chart_and_table(page, server, shots):
    open_app(page, server, "advisor", **MODEL)
    _budget(page, "2M")
    rerun_after(page, lambda: page.get_by_role("button", name="Find the largest batches").click())
    assert_no_error(page)
    answer = page.get_by_test_id("stAlertContentSuccess")
    assert answer.count() == 1 and re.search(r"Recommended: \w+\.", answer.inner_text()), \
        answer.all_inner_texts()
    charts = page.get_by_test_id("stPlotlyChart")
    for title in ("Compiled peak memory vs batch", "Examples per second"):
        chart = charts.filter(has=page.locator("text.gtitle", has_text=title))
        chart.first.locator("svg.main-svg g.trace path").first.wait_for(state="attached", timeout=30_000)
    rows = grid_rows(page, "largest batch")
    assert len(rows) == 7 and all(int(r["largest batch"]) > 0 for r in rows), rows
    by = {r["policy"]: int(r["largest batch"]) for r in rows}
    assert by["nothing_saveable"] >= by["no_remat"]  # under scan, saving less fits more
    code = page.get_by_test_id("stCode").last.inner_text()
    assert "python -m remat_lab advise" in code and "--budget 2M" in code and "--width 64" in code
    shots(page, "advisor")


def test_advisor_refuses_a_bad_budget_as_text(page, server):
    open_app(page, server, "advisor", **MODEL)
    _budget(page, "[12XB](https://evil.example)")
    assert_no_exception(page)
    error = page.get_by_test_id("stAlertContentError")
    assert error.count() == 1 and "Budget not understood" in error.inner_text()
    assert page.locator('a[href^="https://evil.example"]').count() == 0  # shown as text, not a link
    assert page.get_by_role("button", name="Find the largest batches").count() == 0

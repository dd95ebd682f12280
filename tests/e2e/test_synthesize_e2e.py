"""End-to-end: the Synthesize page drawn from its link in headless Chromium (issue #34)."""

from __future__ import annotations

import re

import pytest
from streamlit_driver import assert_no_error, grid_rows, open_app, rerun_after

pytestmark = pytest.mark.e2e

# the 2-name mlp, two scanned layers: a few seconds of compiles
LINK = {"model": "mlp", "width": "64", "depth": "2", "stack": "scan", "budget": "400K", "goal": "max-batch",
        "policies": "nothing_saveable,dots_saveable"}


def test_the_plan_page_from_its_link(page, server, shots):
    open_app(page, server, "synthesize", **LINK)
    box = page.get_by_role("textbox", name="Device memory budget")
    assert box.input_value() == "400K"  # the link's budget restored
    # a score of compiles: seconds idle, minutes on a loaded 2-core machine
    rerun_after(page, lambda: page.get_by_role("button", name="Synthesize the plan").click(),
                timeout=600_000)
    assert_no_error(page)
    answer = page.get_by_test_id("stAlertContentSuccess")
    assert answer.count() == 1 and re.search(r"Answer: .+ batch \d+", answer.inner_text()), \
        answer.all_inner_texts()
    rows = grid_rows(page, "choice")
    assert {r["checkpoint name"] for r in rows} == {"l1", "l2"}
    assert all(r["choice"] in ("save", "recompute") for r in rows)  # CPU: no offload
    chart = page.get_by_test_id("stPlotlyChart").filter(
        has=page.locator("text.gtitle", has_text="Every plan compiled"))
    chart.first.locator("svg.main-svg g.trace").first.wait_for(state="attached", timeout=30_000)
    codes = " ".join(page.get_by_test_id("stCode").all_inner_texts())
    assert "save_and_offload_only_these_names" in codes and "remat_policy: 'custom'" in codes
    assert "python -m remat_lab synthesize" in codes and "--budget 409600" in codes
    assert "budget=400K" in page.url and "goal=max-batch" in page.url and "policies=" in page.url
    shots(page, "synthesize")

"""End-to-end at 1024 px: each page restored from a link in a fresh browser, and every chart legible.

A link carries a page's own state (Compare's and the Advisor's ``policies=``, Sweep's ``widths=``,
``batches=`` and ``policies=``, the Advisor's ``budget=`` and ``timed=``, History's filters); each
is opened in a new browser context (no session, no cookies) and the widgets must show it. Then every
Plotly chart on the page is measured by its SVG's bounding boxes: the legend box apart from the plot
area and the title, the title whole inside the figure, tick labels apart from each other.

One server, small configurations (width 64, depth 2). Skipped loudly without Playwright or Chromium.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect
from streamlit_driver import BOX_JS, arm, assert_no_error, assert_no_exception, expect_run, url, wait_idle

from remat_lab.model.policies import POLICIES

pytestmark = pytest.mark.e2e

VIEWPORT = {"width": 1024, "height": 900}
MODEL = {"width": "64", "batch": "8", "depth": "2", "stack": "scan", "repeats": "3"}
TWO = "no_remat,nothing_saveable"
TOL_PX = 1.0  # boxes may touch; antialiased text edges round to a pixel
SLOW_MS = 420_000  # a run on a loaded 2-core machine (CI shares it with other jobs)

# Every drawn Plotly chart on the page: its title and each problem found in its boxes.
_CHART_BOXES_JS = "(tol) => {\n" + BOX_JS + """
  const out = [];
  document.querySelectorAll('[data-testid="stPlotlyChart"]').forEach((chart, i) => {
    const svg = chart.querySelector('svg.main-svg');
    const fig = box(svg), frame = box(chart);
    if (!fig || !frame) return;  // not drawn (a closed tab or expander)
    const titleEl = chart.querySelector('text.gtitle');
    const name = (titleEl && titleEl.textContent.trim()) || `chart ${i + 1}`;
    const problems = [];
    const plots = [...chart.querySelectorAll('.draglayer .nsewdrag')].map(box).filter(Boolean);
    const legendEl = chart.querySelector('g.legend');
    const legend = legendEl && box(legendEl.querySelector('rect.bg') || legendEl);
    const title = box(titleEl);
    if (legend) {
      const say = (what) => problems.push(`legend ${fmt(legend)} ${what}`);
      plots.forEach((p) => { if (overlap(legend, p)) say(`overlaps the plot area ${fmt(p)}`); });
      if (title && overlap(legend, title)) say(`overlaps the title ${fmt(title)}`);
      if (!inside(legend, fig)) say(`is cut by the figure ${fmt(fig)}`);
    }
    if (title && !(inside(title, fig) && inside(title, frame)))
      problems.push(`title ${fmt(title)} is cut: figure ${fmt(fig)}`);
    const groups = chart.querySelectorAll('g.xaxislayer-above, g.yaxislayer-above, g.colorbar');
    groups.forEach((g) => {
      const labels = [...g.querySelectorAll('g[class*="tick"] text')]
        .filter((t) => t.textContent.trim() && getComputedStyle(t).opacity !== '0')
        .map((t) => [t.textContent.trim(), box(t)]).filter(([, r]) => r);
      for (let a = 0; a < labels.length; a++)
        for (let b = a + 1; b < labels.length; b++)
          if (overlap(labels[a][1], labels[b][1]))
            problems.push(`tick labels '${labels[a][0]}' and '${labels[b][0]}' overlap `
                          + `(${g.getAttribute('class')})`);
    });
    out.push({name, width: Math.round(fig.width), problems});
  });
  return out;
}"""


@pytest.fixture
def fresh(new_page):
    """``fresh()``: a page 1024 px wide in a new browser context (nothing kept from another)."""
    return lambda: new_page(VIEWPORT, fresh=True)


def charts_legible(page, at_least: int) -> list[str]:
    """Every drawn chart's boxes checked (at least ``at_least`` charts); their names."""
    page.locator('[data-testid="stPlotlyChart"] svg.main-svg').nth(at_least - 1).wait_for(timeout=60_000)
    page.wait_for_timeout(500)  # Plotly lays the legend and ticks out after the first paint
    found = page.evaluate(_CHART_BOXES_JS, TOL_PX)
    assert len(found) >= at_least, found
    bad = [f"{c['name']} ({c['width']} px): {p}" for c in found for p in c["problems"]]
    assert not bad, "charts not legible at 1024 px:\n" + "\n".join(bad)
    return [c["name"] for c in found]


def open_link(page, server: str, path: str = "", **params) -> None:
    """Load a link to a page and wait for its first run (a cold run may take minutes here)."""
    expect_run(page)
    page.goto(url(server, path, **params), wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stApp"]', timeout=SLOW_MS)
    wait_idle(page, SLOW_MS)
    page.get_by_test_id("stSidebar").get_by_text("Remat Lab", exact=True).wait_for(timeout=30_000)
    assert_no_exception(page)


def click_and_wait(page, name: str) -> None:
    arm(page)  # the next idle is after this run
    page.get_by_test_id("stMain").get_by_role("button", name=name).click()
    wait_idle(page, SLOW_MS)


def expect_chips(page, label: str, wanted: list[str]) -> None:
    """The main area's multiselect ``label`` shows exactly ``wanted`` (its chips' labels, in order)."""
    box = page.get_by_test_id("stMain").get_by_test_id("stMultiSelect").filter(
        has=page.get_by_test_id("stWidgetLabel").get_by_text(label, exact=True))
    tags = box.locator(".react-aria-ComboBox span[data-tag]")
    expect(tags).to_have_count(len(wanted), timeout=30_000)
    assert tags.evaluate_all("els => els.map(e => e.getAttribute('aria-label'))") == wanted


def labels(ids: str) -> list[str]:
    """The policy picker's labels of comma-separated policy ids."""
    return [POLICIES[p].label for p in ids.split(",")]


def test_explore_charts_are_legible(fresh, server, shots):
    page = fresh()
    open_link(page, server, **MODEL)
    assert_no_error(page)
    names = charts_legible(page, 3)
    assert any("memory" in n.lower() for n in names), names
    shots(page, "explore-1024")


def test_compare_restores_its_policies_from_the_link(fresh, server, shots):
    page = fresh()
    open_link(page, server, "compare", **MODEL, policies=TWO)
    expect_chips(page, "Policies", labels(TWO))
    if page.get_by_text("run only when you click").count():
        click_and_wait(page, "Run comparison")
    assert_no_error(page)
    assert f"policies={TWO.replace(',', '%2C')}" in page.url or f"policies={TWO}" in page.url, page.url
    charts_legible(page, 4)
    shots(page, "compare-1024")


def test_sweep_restores_its_grid_from_the_link(fresh, server, shots):
    page = fresh()
    open_link(page, server, "sweep", **MODEL, widths="48,32", batches="4", policies=TWO)
    expect_chips(page, "Widths", ["32", "48"])
    expect_chips(page, "Batches", ["4"])
    expect_chips(page, "Policies", labels(TWO))
    click_and_wait(page, "Run sweep (4 runs)")
    assert_no_error(page)
    charts_legible(page, 2)
    shots(page, "sweep-1024")


def test_advisor_restores_budget_timing_and_policies_from_the_link(fresh, server, shots):
    page = fresh()
    open_link(page, server, "advisor", **MODEL, budget="3M", timed="0", policies=TWO)
    expect(page.get_by_role("textbox", name="Device memory budget")).to_have_value("3M", timeout=30_000)
    expect_chips(page, "Policies", labels(TWO))
    timed = page.get_by_role("switch", name="Time each policy at its largest batch (examples/s, MFU, HFU)")
    expect(timed).not_to_be_checked(timeout=30_000)
    click_and_wait(page, "Find the largest batches")
    assert_no_error(page)
    charts_legible(page, 1)
    shots(page, "advisor-1024")


def test_history_restores_its_filters_from_the_link(fresh, server, shots):
    open_link(fresh(), server, **MODEL, policy="nothing_saveable")  # a run of that policy recorded
    page = fresh()
    open_link(page, server, "history", models="mlp", policies="nothing_saveable")
    expect_chips(page, "Model", ["mlp"])
    expect_chips(page, "Policy", ["nothing_saveable"])
    expect_chips(page, "Backend", [])
    assert not page.get_by_test_id("stAlertContentWarning").filter(has_text="URL parameter").count()
    if page.locator('[data-testid="stPlotlyChart"]').count():
        charts_legible(page, 1)
    shots(page, "history-1024")

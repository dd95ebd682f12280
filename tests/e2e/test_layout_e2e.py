"""End-to-end: Explore and Compare legible at 1024 and 1440 px, measured by the drawn boxes.

At a 1024 px window the sidebar leaves about 560 px of page: the charts must stack there (side by side
only where there is room), their legends outside the plot and clear of its text (the peak's value,
annotations), every axis title and tick label whole inside the chart, and no table wider than its
frame (glide-data-grid scrolls sideways when its columns are: ``scrollWidth > clientWidth`` of its
scroller). One small configuration (width 64, depth 2). Skipped loudly without Playwright or Chromium.
"""

from __future__ import annotations

import pytest
from streamlit_driver import BOX_JS, assert_no_error, open_app, rerun_after

pytestmark = pytest.mark.e2e

SMALL = {"width": "64", "batch": "8", "depth": "2", "stack": "scan", "repeats": "3"}
THREE = "no_remat,nothing_saveable,dots_with_no_batch_dims_saveable"
WIDTHS = [1024, 1440]
MIN_CHART_PX = 340  # narrower and ticks, titles and legends crowd (the 180 px charts)
TOL_PX = 1.0

# Every drawn chart's and table's problems, in words.
_LAYOUT_JS = "(tol) => {\n" + BOX_JS + """
  const texts = (root, sel) => [...root.querySelectorAll(sel)]
    .filter((t) => t.textContent.trim() && getComputedStyle(t).opacity !== '0'
                   && getComputedStyle(t).display !== 'none')
    .map((t) => [t.textContent.trim(), box(t)]).filter(([, r]) => r);
  const charts = [], tables = [];
  document.querySelectorAll('[data-testid="stPlotlyChart"]').forEach((chart, i) => {
    const fig = box(chart.querySelector('svg.main-svg')), frame = box(chart);
    if (!fig || !frame) return;  // not drawn
    const titleEl = chart.querySelector('text.gtitle');
    const name = (titleEl && titleEl.textContent.trim()) || `chart ${i + 1}`;
    const problems = [];
    const plots = [...chart.querySelectorAll('.draglayer .nsewdrag')].map(box).filter(Boolean);
    const legendEl = chart.querySelector('g.legend');
    const legend = legendEl && box(legendEl.querySelector('rect.bg') || legendEl);
    // text the plot area carries: annotations, a trace's text (the peak's value), bar labels
    const marks = texts(chart, 'g.annotation text, g.textpoint text, text.bartext');
    const whole = texts(chart, 'text.gtitle, text.xtitle, text.ytitle, g.xaxislayer-above text, '
                               + 'g.yaxislayer-above text, g.annotation text');
    if (legend) {
      const say = (what) => problems.push(`legend ${fmt(legend)} ${what}`);
      plots.forEach((p) => { if (overlap(legend, p)) say(`on the plot ${fmt(p)}`); });
      [...marks, ...whole].forEach(([t, r]) => { if (overlap(legend, r)) say(`covers '${t}'`); });
      if (!inside(legend, fig)) problems.push(`legend ${fmt(legend)} cut by the figure ${fmt(fig)}`);
    }
    whole.forEach(([t, r]) => {
      if (!(inside(r, fig) && inside(r, frame))) problems.push(`'${t}' ${fmt(r)} cut: figure ${fmt(fig)}`);
    });
    chart.querySelectorAll('g.xaxislayer-above, g.yaxislayer-above').forEach((g) => {
      const labels = texts(g, 'g[class*="tick"] text');
      for (let a = 0; a < labels.length; a++)
        for (let b = a + 1; b < labels.length; b++)
          if (overlap(labels[a][1], labels[b][1]))
            problems.push(`tick labels '${labels[a][0]}' and '${labels[b][0]}' overlap`);
    });
    charts.push({name, width: px(frame.width), problems});
  });
  document.querySelectorAll('[data-testid="stDataFrame"]').forEach((grid, i) => {
    const scroller = grid.querySelector('.dvn-scroller');
    if (!scroller || !box(grid)) return;
    const heads = [...grid.querySelectorAll('thead th')].map((th) => th.innerText.trim());
    tables.push({name: heads.slice(0, 3).join(', ') || `table ${i + 1}`,
                 scroll: scroller.scrollWidth, client: scroller.clientWidth});
  });
  return {charts, tables};
}"""


def check_layout(page, at_least: int, width: int) -> list[str]:
    """Every drawn chart (``at_least`` of them) and table legible; the charts' names."""
    page.locator('[data-testid="stPlotlyChart"] svg.main-svg').nth(at_least - 1).wait_for(timeout=60_000)
    page.get_by_test_id("stDataFrame").first.locator(".dvn-scroller").wait_for(timeout=30_000)
    page.wait_for_timeout(600)  # Plotly lays out the legend and the ticks after the first paint
    found = page.evaluate(_LAYOUT_JS, TOL_PX)
    charts, tables = found["charts"], found["tables"]
    assert len(charts) >= at_least and tables, found
    bad = [f"{c['name']} ({c['width']} px): {p}" for c in charts for p in c["problems"]]
    bad += [f"{c['name']}: {c['width']} px wide, cramped" for c in charts if c["width"] < MIN_CHART_PX]
    bad += [f"table [{t['name']} ...] scrolls sideways: {t['scroll']} px in {t['client']} px"
            for t in tables if t["scroll"] > t["client"] + TOL_PX]
    assert not bad, f"not legible at {width} px:\n" + "\n".join(bad)
    return [c["name"] for c in charts]


@pytest.mark.parametrize("width", WIDTHS)
def test_explore_charts_and_tables_fit(new_page, server, shots, width):
    page = new_page({"width": width, "height": 900})
    open_app(page, server, **SMALL)
    assert_no_error(page)
    names = check_layout(page, 4, width)
    titles = {n.split("\u200b")[0] for n in names}  # a title, then its subtitle after a zero-width space
    assert {"Step time", "Compiled memory", "Residuals"} <= titles, names
    main = page.get_by_test_id("stMain")
    if width < 1200:  # in the narrow window the other views fit too: the dots' shapes (the widest of
        # theirs), the buffers' sources, the residuals grouped (columns sized by their content)
        for view, nth in (("shapes", 0), ("sources", 0), ("by layer and name", -1)):
            rerun_after(page, main.get_by_role("radio", name=view, exact=True).nth(nth).click)
        check_layout(page, 4, width)
    shots(page, f"explore-layout-{width}")


@pytest.mark.parametrize("width", WIDTHS)
def test_compare_charts_and_tables_fit(new_page, server, shots, width):
    page = new_page({"width": width, "height": 900})
    open_app(page, server, "compare", **SMALL, policies=THREE)
    button = page.get_by_test_id("stMain").get_by_role("button", name="Run comparison")
    if page.get_by_text("run only when you click").count():
        rerun_after(page, button.click)
    assert_no_error(page)
    names = check_layout(page, 4, width)
    assert {"Step time per policy", "Compiled memory", "Step time vs peak memory"} <= {
        n.split("\u200b")[0] for n in names}, names
    shots(page, f"compare-layout-{width}")

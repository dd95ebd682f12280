"""End-to-end: the real Streamlit server driven by headless Chromium (issue #5).

Skipped (loudly, see the ``-ra`` summary) when Playwright or Chromium is missing.
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest
from streamlit_driver import (
    PAGES,
    SMALL,
    assert_no_error,
    assert_no_exception,
    assert_no_page_not_found,
    choose,
    expect_run,
    grid_rows,
    metrics,
    number_value,
    open_app,
    radio_value,
    rerun_after,
    selectbox_value,
    sidebar_widget,
    slider_value,
    url,
    wait_idle,
)

pytestmark = pytest.mark.e2e

DOTS = "Saved / recomputed"


def test_home_page_shows_metrics_charts_and_per_dot_table(page, server, shots):
    open_app(page, server, **SMALL)
    assert_no_error(page)
    cards = metrics(page)
    for label in ("Median step time", "Peak memory", "Activation residuals", DOTS, "Gradient check"):
        assert label in cards, f"metric card {label!r} missing; cards: {cards}"
    assert re.fullmatch(r"[\d.]+ (µs|ms|s)", cards["Median step time"]), cards
    assert cards["Gradient check"] == "ok", cards
    assert re.fullmatch(r"\d+ / \d+", cards[DOTS]), cards

    charts = page.get_by_test_id("stPlotlyChart")
    assert charts.count() >= 2
    for title in ("Step time", "memory"):  # rendered Plotly SVG, not just an empty container
        chart = charts.filter(has=page.locator("svg.main-svg")).filter(
            has=page.locator("text.gtitle", has_text=re.compile(title, re.I)))
        assert chart.count() >= 1, f"no rendered Plotly chart titled like {title!r}"
        # at least one drawn trace (box, bar, scatter point) inside the chart's SVG
        chart.first.locator("svg.main-svg g.trace path").first.wait_for(state="attached", timeout=30_000)

    rows = grid_rows(page, "compiled")
    assert [r["layer"] for r in rows] == ["l1", "l2"], rows
    assert all(r["saved"] == "true" and r["recomputed"] == "false" for r in rows), rows
    shots(page, "explore")


def test_width_slider_and_policy_change_rerun_the_page(page, server):
    open_app(page, server, **SMALL)
    assert slider_value(page, "Width D (features)") == "64"
    assert metrics(page)[DOTS] == "2 / 0"
    thumb = sidebar_widget(page, "stSlider", "Width D (features)").get_by_role("slider")
    rerun_after(page, lambda: (thumb.focus(), page.keyboard.press("ArrowRight")))
    assert slider_value(page, "Width D (features)") == "128"
    assert number_value(page, "…or type any width") == "128"
    status = page.get_by_test_id("stExpander").first.inner_text()
    assert "x:(8x128)" in status, status  # the run used the new width
    assert "width=128" in page.url

    rerun_after(page, lambda: choose(page, "Checkpoint policy", "JAX policies › nothing_saveable"))
    assert_no_error(page)
    assert selectbox_value(page, "Checkpoint policy") == "JAX policies › nothing_saveable"
    assert metrics(page)[DOTS] == "0 / 2"
    rows = grid_rows(page, "compiled")
    assert [r["layer"] for r in rows] == ["l1", "l2"], rows
    assert all(r["saved"] == "false" and r["recomputed"] == "true" for r in rows), rows
    assert "policy=nothing_saveable" in page.url


def test_shared_url_sets_the_controls(page, server):
    open_app(page, server, width="128", batch="16", depth="2", dtype="bfloat16",
             policy="nothing_saveable", objective="grad", repeats="3")
    assert_no_error(page)
    assert slider_value(page, "Width D (features)") == "128"
    assert number_value(page, "…or type any width") == "128"
    assert slider_value(page, "Batch B") == "16"
    assert slider_value(page, "Depth (remat'd blocks)") == "2"
    assert radio_value(page, "Model") == "mlp"
    assert radio_value(page, "dtype") == "bfloat16"
    assert radio_value(page, "Objective") == "grad"
    assert selectbox_value(page, "Checkpoint policy") == "JAX policies › nothing_saveable"
    assert number_value(page, "Timed repeats") == "3"
    assert metrics(page)[DOTS] == "0 / 4"  # depth 2 x (l1, l2), all recomputed
    status = page.get_by_test_id("stExpander").first.inner_text()
    assert "bfloat16" in status and "nothing_saveable" in status and "grad" in status, status


def test_every_page_in_the_navigation_renders(page, server, shots):
    open_app(page, server, **SMALL)
    links = page.get_by_test_id("stTopNavLink")
    titles = [t.strip() for t in links.all_inner_texts()]
    for title in PAGES:
        assert any(t.endswith(title) for t in titles), f"navigation lacks {title!r}: {titles}"
    # Explore (the start page) last, so every click switches the page and so causes a run.
    for title, path in [*list(PAGES.items())[1:], next(iter(PAGES.items()))]:
        link = links.filter(has_text=title).first
        if link.evaluate("e => e.closest('[inert]') !== null"):  # past the bar's width: its menu
            page.get_by_text(re.compile(r"^\d+ more$")).first.click()
            link = page.get_by_test_id("stTopNavDropdownLink").filter(has_text=title).first
        rerun_after(page, link.click)
        page.wait_for_url(re.compile(rf"/({path}|)(\?|$)" if path == "explore" else rf"/{path}(\?|$)"))
        assert_no_exception(page)
        heading = page.get_by_test_id("stMain").get_by_role("heading", level=2).first
        heading.wait_for(timeout=30_000)
        assert title in heading.inner_text(), f"page {title!r} shows heading {heading.inner_text()!r}"
        # the sidebar configuration survives the page switch
        assert slider_value(page, "Width D (features)") == "64"
        if path not in ("explore", "sweep", "compare"):  # those are taken with results, below
            shots(page, path)


def test_default_configuration_shows_policies_differ_in_memory(page, server, shots):
    """The app opens on a scanned 8-block mlp where Compare shows a real spread of peak memory."""
    open_app(page, server)  # no parameters: the app's default configuration
    assert_no_error(page)
    assert slider_value(page, "Depth (remat'd blocks)") == "8"
    assert radio_value(page, "Stack") == "scan"
    cards = metrics(page)
    assert cards["Gradient check"] == "ok" and cards[DOTS] == "16 / 0", cards
    shots(page, "explore")
    open_app(page, server, "compare", width="256", batch="128", depth="8")
    button = page.get_by_test_id("stMain").get_by_role("button", name="Run comparison")
    if button.count():  # seven timed policies: the page waits for a click
        rerun_after(page, button.click)
    assert_no_error(page)
    body = page.get_by_test_id("stMain").inner_text()
    # named in the summary either way: beside a ranked front, or in the Pareto reason when the
    # time intervals overlap (then no front is drawn on time, and memory alone names the smallest)
    assert "smallest peak" in body.lower() and "compiles to the same peak" not in body, body[-2000:]
    shots(page, "compare")


def _heading(page) -> str:
    heading = page.get_by_test_id("stMain").get_by_role("heading", level=2).first
    heading.wait_for(timeout=30_000)
    return heading.inner_text()


def test_every_page_has_its_own_address(page, server):
    """``/explore``, ``/compare``, ... open their page (the start page is also at ``/``). One
    browser page loads each address in turn, as a pasted link: a new Streamlit session each time."""
    for title, path in PAGES.items():
        open_app(page, server, path, width="64", batch="8", repeats="3", depth="2")
        assert_no_page_not_found(page)
        assert title in _heading(page), path
        assert slider_value(page, "Depth (remat'd blocks)") == "2", path  # the link's settings are kept
        assert "depth=2" in page.url, path
        if path == "explore":  # shown at "/", the navigation marks Explore as the current page
            assert urlparse(page.url).path in ("", "/"), page.url
            assert metrics(page)[DOTS] == "4 / 0"


def test_bad_url_parameter_warns_instead_of_a_traceback(page, server):
    open_app(page, server, width="abc", batch="8", repeats="3")
    warning = page.get_by_test_id("stAlertContentWarning").filter(has_text="width")
    warning.first.wait_for(timeout=30_000)
    text = warning.first.inner_text()
    assert "abc" in text and "not valid" in text, text
    assert "Traceback" not in page.get_by_test_id("stMain").inner_text()
    assert_no_error(page)
    assert slider_value(page, "Width D (features)") == "256"  # the default width
    assert "Median step time" in metrics(page)  # and the app still runs


def test_two_sessions_run_different_configurations_at_once(new_page, server):
    configs = [dict(width="32", batch="4", depth="1", policy="nothing_saveable", repeats="3"),
               dict(width="96", batch="2", depth="1", policy="dots_saveable", repeats="3")]
    pages = [new_page(), new_page()]
    # Start both loads before waiting for either, so the two sessions run on the server together.
    for p, cfg in zip(pages, configs):
        expect_run(p)
        p.goto(url(server, "", **cfg), wait_until="commit")
    for p in pages:
        wait_idle(p)
    for p, cfg in zip(pages, configs):
        assert_no_error(p)
        assert slider_value(p, "Width D (features)") == cfg["width"]
        status = p.get_by_test_id("stExpander").first.inner_text()
        assert "Done" in status and cfg["policy"] in status, status
        assert f"x:({cfg['batch']}x{cfg['width']})" in status, status
        rows = grid_rows(p, "compiled")
        assert [r["layer"] for r in rows] == ["l1", "l2"], rows
    assert metrics(pages[0])[DOTS] == "0 / 2"
    assert metrics(pages[1])[DOTS] == "2 / 0"


def test_over_budget_is_flagged_in_the_sidebar_before_any_click(page, server, shots):
    """A configuration too large for this server is refused up front: no Run button to click."""
    open_app(page, server, "explore", width="16384", batch="65536", depth="16")
    flag = page.get_by_test_id("stSidebar").get_by_test_id("stAlertContentError")
    assert flag.count() == 1, flag.all_inner_texts()
    text = flag.inner_text()
    assert re.search(r"Estimated [\d.]+ GiB, over the memory budget of [\d.]+ (MiB|GiB)", text), text
    assert "lower width, batch or depth" in text and "--" not in text, text
    main = page.get_by_test_id("stMain")
    assert main.get_by_role("button").count() == 0, main.get_by_role("button").all_inner_texts()
    assert main.get_by_test_id("stAlertContentError").count() == 0  # flagged once, in the sidebar
    assert not metrics(page, wait=False)
    shots(page, "over-budget")
    # the Sweep page leaves such configurations out before its button, too
    expect_run(page)
    page.get_by_test_id("stTopNavLink").filter(has_text="Sweep").first.click()
    page.wait_for_url(re.compile(r"/sweep(\?|$)"))
    wait_idle(page)
    assert_no_exception(page)
    assert page.get_by_test_id("stSidebar").get_by_test_id("stAlertContentError").count() == 1


def test_explore_metrics_fit_at_1024_px(page, server, shots):
    page.set_viewport_size({"width": 1024, "height": 800})
    open_app(page, server, **SMALL)
    page.get_by_test_id("stMetricValue").nth(8).wait_for(timeout=30_000)  # lazily drawn cards
    assert len(metrics(page)) == 9
    cut = page.evaluate("""() => [...document.querySelectorAll(
        '[data-testid="stMetricValue"], [data-testid="stMetricLabel"]')]
        .filter(el => [el, ...el.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1))
        .map(el => el.innerText)""")
    assert not cut, f"metric text cut off at 1024 px: {cut}"
    shots(page, "explore-1024")


def test_sweep_heatmaps_are_annotated_and_readable(page, server, shots):
    open_app(page, server, "sweep", width="64", batch="8", repeats="3")
    main = page.get_by_test_id("stMain")

    def pick(label: str, values: list[str]) -> None:
        box = main.get_by_test_id("stMultiSelect").filter(
            has=page.get_by_test_id("stWidgetLabel").get_by_text(label, exact=True))
        field = box.locator("input")
        rerun_after(page, box.get_by_role("button", name="Clear all").click)
        for value in values:
            rerun_after(page, lambda v=value: (field.click(), page.keyboard.type(v),
                                               page.get_by_role("option", name=v, exact=True).click()))
        page.keyboard.press("Escape")

    pick("Widths", ["8", "16"])
    pick("Batches", ["1"])
    # the default policies: no_remat, nothing_saveable, dots_with_no_batch_dims_saveable
    button = main.get_by_role("button", name=re.compile(r"Run sweep \(6 runs\)"))
    rerun_after(page, button.click, timeout=300_000)
    assert_no_error(page)
    heat = page.get_by_test_id("stPlotlyChart").filter(
        has=page.locator("text.gtitle", has_text="Step time relative to no_remat"))
    heat.first.locator("g.annotation").first.wait_for(state="attached", timeout=30_000)
    labels = heat.first.locator("g.annotation").evaluate_all("els => els.map(e => e.textContent)")
    # each cell: its ratio, and "within noise" under it where its interval overlaps no_remat's
    assert len(labels) == 6 and all(re.fullmatch(r"\d+\.\d\dx\s*(within noise)?", t.strip())
                                    for t in labels), labels
    box = heat.first.bounding_box()
    assert box and box["height"] >= 230, box  # rows of a readable height, not squeezed
    main.get_by_role("heading", name="Relative to no_remat").evaluate(
        "e => e.scrollIntoView({block: 'start'})")
    shots(page, "sweep")

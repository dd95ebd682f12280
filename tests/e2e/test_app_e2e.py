"""End-to-end: the real Streamlit server driven by headless Chromium (issue #5).

Skipped (loudly, see the ``-ra`` summary) when Playwright or Chromium is missing.
"""

from __future__ import annotations

import re

import pytest
from streamlit_driver import (
    PAGES,
    SMALL,
    assert_no_error,
    assert_no_exception,
    choose,
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

DOTS = "Dots saved / recomputed"


def test_home_page_shows_metrics_charts_and_per_dot_table(page, server, shots):
    open_app(page, server, **SMALL)
    assert_no_error(page)
    cards = metrics(page)
    for label in ("Median step time", "Peak memory", "Residual bytes", DOTS, "Gradient check"):
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

    rows = grid_rows(page, "recomputed in HLO")
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
    rows = grid_rows(page, "recomputed in HLO")
    assert rows and all(r["lhs_shape"] == "(8, 128)" for r in rows), rows
    assert "width=128" in page.url

    rerun_after(page, lambda: choose(page, "Checkpoint policy", "nothing_saveable"))
    assert_no_error(page)
    assert selectbox_value(page, "Checkpoint policy") == "nothing_saveable"
    assert metrics(page)[DOTS] == "0 / 2"
    rows = grid_rows(page, "recomputed in HLO")
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
    assert selectbox_value(page, "Checkpoint policy") == "nothing_saveable"
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
        rerun_after(page, link.click)
        page.wait_for_url(re.compile(rf"/({path}|)(\?|$)" if path == "explore" else rf"/{path}(\?|$)"))
        assert_no_exception(page)
        heading = page.get_by_test_id("stMain").get_by_role("heading", level=2).first
        heading.wait_for(timeout=30_000)
        assert title in heading.inner_text(), f"page {title!r} shows heading {heading.inner_text()!r}"
        # the sidebar configuration survives the page switch
        assert slider_value(page, "Width D (features)") == "64"
        if path != "explore":
            shots(page, path)


def test_shared_link_to_a_page_on_a_fresh_server_gets_the_app(page, fresh_server):
    """A server's first request naming a page must not fall into the legacy ``pages/`` mode."""
    open_app(page, fresh_server, "compare", width="64", batch="8", repeats="3")
    links = page.get_by_test_id("stTopNavLink")
    links.first.wait_for(timeout=30_000)
    titles = [t.strip() for t in links.all_inner_texts()]
    assert any(t.endswith("Compare policies") for t in titles), titles
    assert page.get_by_test_id("stSidebarNav").count() == 0  # no list of files from pages/
    heading = page.get_by_test_id("stMain").get_by_role("heading", level=2).first
    heading.wait_for(timeout=30_000)
    assert "Compare policies" in heading.inner_text()
    assert slider_value(page, "Width D (features)") == "64"
    assert_no_exception(page)


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
    configs = [dict(width="32", batch="4", policy="nothing_saveable", repeats="3"),
               dict(width="96", batch="2", policy="dots_saveable", repeats="3")]
    pages = [new_page(), new_page()]
    # Start both loads before waiting for either, so the two sessions run on the server together.
    for p, cfg in zip(pages, configs):
        p.goto(url(server, "", **cfg), wait_until="commit")
    for p in pages:
        wait_idle(p)
    for p, cfg in zip(pages, configs):
        assert_no_error(p)
        assert slider_value(p, "Width D (features)") == cfg["width"]
        status = p.get_by_test_id("stExpander").first.inner_text()
        assert "Done" in status and cfg["policy"] in status, status
        rows = grid_rows(p, "recomputed in HLO")
        assert rows and all(r["lhs_shape"] == f"({cfg['batch']}, {cfg['width']})" for r in rows), rows
    assert metrics(pages[0])[DOTS] == "0 / 2"
    assert metrics(pages[1])[DOTS] == "2 / 0"

"""End-to-end: a sweep made by the CLI, uploaded to Open results and listed on History (issue #16).

One server for the module, its run history in a temporary ``REMAT_LAB_HOME`` that the CLI sweep
also writes. Skipped (loudly) when Playwright or Chromium is missing, like the other browser tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, compile_cache, start_server
from streamlit_driver import INIT_JS, assert_no_error, assert_no_exception, open_app, rerun_after, wait_idle

pytestmark = pytest.mark.e2e

SWEEP = ["--widths", "8,16", "--batches", "2,4", "--policies", "no_remat,nothing_saveable",
         "--repeats", "2", "--warmup", "0"]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict:
    """A CLI sweep file (8 rows; recorded in a fresh history) and the home it was recorded in."""
    tmp = tmp_path_factory.mktemp("results_e2e")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "REMAT_LAB_HOME": str(tmp / "home"),
           "REMAT_LAB_CACHE_DIR": str(compile_cache(lambda: tmp / "cache"))}
    done = subprocess.run([sys.executable, "-m", "remat_lab", "sweep", *SWEEP, "--out", str(tmp / "r.jsonl")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return {"tmp": tmp, "sweep": tmp / "r.jsonl", "home": tmp / "home"}


@pytest.fixture(scope="module")
def lab(made, artifacts, browser):
    """A server whose history is ``made``'s (the CLI's runs), listening on localhost (local mode)."""
    saved = os.environ.get("REMAT_LAB_HOME")
    os.environ["REMAT_LAB_HOME"] = str(made["home"])
    try:
        cache = compile_cache(lambda: made["tmp"] / "cache")
        with start_server(artifacts / "results-server.log", cache) as url:
            # First the router (a tiny Explore run): a fresh server's first deep link can still land in
            # Streamlit's legacy pages mode (issue #11 item 5, fixed apart from these tests).
            ctx = browser.new_context()
            ctx.add_init_script(INIT_JS)
            open_app(ctx.new_page(), url, width="8", batch="2", depth="1", repeats="2")
            ctx.close()
            yield url
    finally:
        if saved is None:
            os.environ.pop("REMAT_LAB_HOME", None)
        else:
            os.environ["REMAT_LAB_HOME"] = saved


def _upload(page, *paths) -> None:
    """Each file in turn (the page takes one at a time): read, then an empty uploader again."""
    for path in paths:
        field = page.get_by_test_id("stFileUploader").locator("input[type=file]")
        rerun_after(page, lambda: field.set_input_files(str(path)))  # noqa: B023 - called at once
        page.get_by_test_id("stFileUploader").get_by_text(path.name).wait_for(state="detached")
        wait_idle(page)


def _chart_titles(page) -> list[str]:
    page.get_by_test_id("stPlotlyChart").first.locator("text.gtitle").first.wait_for(timeout=30_000)
    return page.locator('[data-testid="stPlotlyChart"] text.gtitle').all_text_contents()


def test_uploaded_cli_sweep_shows_the_sweep_charts_and_its_machine(page, lab, made, shots):
    assert len(made["sweep"].read_text().splitlines()) == 8
    open_app(page, lab, "results")
    _upload(page, made["sweep"])
    assert_no_error(page)
    main = page.get_by_test_id("stMain")
    main.get_by_text("Sweep: 8 configurations").wait_for()
    assert main.get_by_text("Measured on CPU × 1, jax").count() == 1  # which machine, in words
    titles = _chart_titles(page)
    for title in ("step time (ms) vs width", "peak memory (MiB) vs batch", "Step time relative to no_remat"):
        assert any(title in t for t in titles), titles
    page.locator('[data-testid="stPlotlyChart"] g.trace').first.wait_for(state="attached")
    shots(page, "results")


def test_bad_files_are_refused_with_messages_and_no_traceback(page, lab, made, tmp_path, shots):
    rows = made["sweep"].read_text().splitlines()
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(b"\x00\x01 definitely not json")
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(rows[:2]) + "\n" + rows[2][: len(rows[2]) // 2])
    wrong = tmp_path / "wrong.json"
    doc = json.loads(rows[0])
    doc["config"]["width"], doc["step_time_s"]["median"] = "wide", "fast"
    wrong.write_text(json.dumps(doc))
    open_app(page, lab, "results")
    _upload(page, garbage, cut, wrong)
    assert_no_exception(page)
    text = page.get_by_test_id("stMain").inner_text()
    assert "garbage.json: nothing could be read" in text and "not a text file" in text, text
    assert "cut.jsonl: 1 part left out; 2 shown below" in text and "line 3: cut off" in text, text
    assert "wrong.json: nothing could be read" in text and "median must be a number, not text" in text, text
    assert "Sweep: 2 configurations" in text  # the whole rows of the cut file are still shown
    page.get_by_test_id("stAlertContentError").first.scroll_into_view_if_needed()
    shots(page, "results-refused")

    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(50 * 2**20)
    open_app(page, lab, "results")
    field = page.get_by_test_id("stFileUploader").locator("input[type=file]")
    field.set_input_files(str(big))
    uploader = page.get_by_test_id("stFileUploader")
    uploader.get_by_text("big.jsonl").wait_for(timeout=30_000)
    page.wait_for_timeout(500)
    assert_no_exception(page)
    said = uploader.inner_text() + page.get_by_test_id("stMain").inner_text()
    assert "20" in said and ("MB or smaller" in said or "over the 20 MiB limit" in said), said


def test_history_lists_the_cli_runs_and_compares_picked_ones(page, lab, shots):
    open_app(page, lab, "history")
    assert_no_error(page)
    main = page.get_by_test_id("stMain")
    # The CLI sweep's 8 runs and the warm-up Explore run of the ``lab`` fixture, which the app
    # recorded itself (source "app").
    main.get_by_text("9 runs shown").wait_for()
    grid = main.get_by_test_id("stDataFrame").first
    box = grid.bounding_box()
    for row in (1, 2):  # the row-selection column, first and second data rows (35 px rows)
        rerun_after(page, lambda r=row: page.mouse.click(box["x"] + 15, box["y"] + 35 * r + 17))
    assert_no_error(page)
    main.get_by_text("Picked runs").wait_for()
    titles = _chart_titles(page)
    assert any("Step time per policy" in t for t in titles), titles
    assert main.get_by_role("button", name="Delete 2 runs").count() == 1  # local: deleting is offered
    shots(page, "history")

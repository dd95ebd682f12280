"""End-to-end, as a public link would be used: cold-start deep links, hostile URL values, a lost worker."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from streamlit_driver import (
    assert_no_exception,
    assert_no_page_not_found,
    expect_run,
    metrics,
    open_app,
    rerun_after,
    slider_value,
    url,
    wait_idle,
)

pytestmark = pytest.mark.e2e

DEEP_LINKS = [("compare", "Compare policies"), ("sweep", "Sweep"), ("inspect", "Inspect"),
              ("guide", "Guide"), ("explore", "Explore"), ("", "Explore")]


def test_six_simultaneous_deep_links_on_a_fresh_server_all_get_the_router(new_page, fresh_server, shots):
    """A server's first requests naming pages must not fall into the legacy ``pages/`` mode (nor
    deadlock), and the hidden ``/explore`` address keeps the link's settings. Compare runs two
    policies (its quick default would time seven; the router, not the comparison, is tested here)."""
    pages = [new_page() for _ in DEEP_LINKS]
    for p, (path, _) in zip(pages, DEEP_LINKS):  # all six first requests at once
        extra = {"policies": "no_remat,nothing_saveable"} if path == "compare" else {}
        expect_run(p)
        p.goto(url(fresh_server, path, width="64", batch="8", repeats="3", **extra), wait_until="commit")
    for p, (path, title) in zip(pages, DEEP_LINKS):
        wait_idle(p)
        links = p.get_by_test_id("stTopNavLink")
        links.first.wait_for(timeout=60_000)
        titles = [t.strip() for t in links.all_inner_texts()]
        assert any(t.endswith("Compare policies") for t in titles), (path, titles)
        assert p.get_by_test_id("stSidebarNav").count() == 0, path  # no file list from pages/
        heading = p.get_by_test_id("stMain").get_by_role("heading", level=2).first
        heading.wait_for(timeout=30_000)
        assert title in heading.inner_text(), (path, heading.inner_text())
        assert_no_exception(p)
        assert "DeadlockError" not in p.locator("body").inner_text()
        assert_no_page_not_found(p)
        if path == "explore":
            assert slider_value(p, "Width D (features)") == "64"
    shots(pages[1], "cold-start-sweep")


def test_hostile_url_values_render_as_text(page, server, shots):
    open_app(page, server, "guide", width="[click me](https://evil.example)",
             batch="![x](https://evil.example/x.png)", seq="<b>bold</b>", depth="``x``")
    warnings = page.get_by_test_id("stAlertContentWarning")
    assert warnings.count() == 4, warnings.all_inner_texts()
    text = " ".join(warnings.all_inner_texts())
    assert "[click me](https://evil.example)" in text and "<b>bold</b>" in text, text
    assert page.locator('a[href*="evil.example"]').count() == 0
    assert page.locator('img[src*="evil.example"]').count() == 0
    assert page.locator("[data-testid=stAlertContentWarning] b").count() == 0
    shots(page, "hostile-url")


def _worker_pids(port: int) -> list[int]:
    """The worker processes (children) of the Streamlit server listening on ``port``."""
    procs = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().split(b"\0")
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            procs[int(d.name)] = (cmd, ppid)
    servers = {pid for pid, (cmd, _) in procs.items() if b"streamlit" in b" ".join(cmd)
               and str(port).encode() in cmd}
    return [pid for pid, (cmd, ppid) in procs.items() if ppid in servers
            and any(b"spawn_main" in c for c in cmd)]  # not the resource tracker


def test_a_killed_worker_costs_only_its_run(page, server, shots):
    port = urlparse(server).port
    # ~10 s of timing (1000 repeats of a width-512 step): time to kill the worker mid-run.
    open_app(page, server, width="512", batch="256", depth="1", repeats="1000")
    button = page.get_by_role("button", name="Run this configuration")
    button.click()
    page.get_by_text("Timing the compiled step").first.wait_for(timeout=120_000)
    pids = _worker_pids(port)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    wait_idle(page)
    error = page.get_by_test_id("stAlertContentError").first
    error.wait_for(timeout=30_000)
    said = error.inner_text()  # killed by the test, not by the out-of-memory killer: said so
    assert "stopped from outside the app (SIGKILL" in said or "cannot tell which" in said, said
    assert_no_exception(page)
    shots(page, "worker-lost")
    started = time.monotonic()
    rerun_after(page, lambda: page.goto(url(server, "", width="48", batch="4", repeats="3")))
    assert metrics(page)["Gradient check"] == "ok"
    assert time.monotonic() - started < 60
    assert _worker_pids(port) and _worker_pids(port) != pids

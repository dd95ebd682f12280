"""End-to-end: live progress on the Advisor page: elapsed time, policies sized of planned, a partial table."""

from __future__ import annotations

import pytest
from streamlit_driver import arm, assert_no_error, open_app, wait_idle

pytestmark = pytest.mark.e2e

# Small, and a shape no other browser test sizes (its probes are not in the server's caches yet).
MODEL = {"width": "72", "depth": "2", "stack": "scan", "repeats": "3", "budget": "3M", "timed": "0",
         "policies": "no_remat,nothing_saveable"}

# While the script runs: the live bar's text and the partial table (its header cells), read at once.
_LIVE_JS = """() => {
  const root = document.querySelector('[data-testid="stApp"]');
  if (!root || root.dataset.testScriptState !== 'running') return null;
  const bar = [...document.querySelectorAll('[data-testid="stProgress"]')].map(e => e.innerText)
      .find(t => t.includes('elapsed') && t.includes('policies sized'));
  const table = [...document.querySelectorAll('[data-testid="stDataFrame"]')].find(
      f => [...f.querySelectorAll('thead th')].some(th => th.innerText.trim() === 'largest batch'));
  const caption = [...document.querySelectorAll('[data-testid="stCaptionContainer"]')].map(e => e.innerText)
      .find(t => t.startsWith('Policies sized so far'));
  return bar && table && caption ? {bar, caption} : null;
}"""


def test_the_advisor_shows_elapsed_time_and_the_policies_sized_so_far_while_it_runs(page, server, shots):
    open_app(page, server, "advisor", **MODEL)
    arm(page)
    page.get_by_role("button", name="Find the largest batches").click()
    live = page.wait_for_function(_LIVE_JS, timeout=60_000, polling="raf").json_value()
    shots(page, "advisor-progress")
    assert "s elapsed" in live["bar"] and "of 2 policies sized" in live["bar"], live
    assert any(w in live["bar"] for w in ("left", "about to finish", "past the estimate")), live
    k = int(live["caption"].split("(")[1].split(")")[0])  # the rows sized when it was read
    assert 1 <= k <= 2 and f"{k} of 2 policies sized" in live["bar"], live
    wait_idle(page)
    assert_no_error(page)
    assert page.get_by_test_id("stProgress").count() == 0  # done: the answer replaces the live parts
    assert page.get_by_test_id("stAlertContentSuccess").count() == 1

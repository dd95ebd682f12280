"""Driving the Remat Lab app in a Playwright page: waiting for Streamlit runs, reading widgets and tables.

Streamlit marks its root element (``data-testid="stApp"``) with ``data-test-script-state``
(``initial``, ``running``, ``rerunRequested``, ``notRunning``, ...) and
``data-test-connection-state`` (``CONNECTED``, ...). We wait on those, never on sleeps.
"""

from __future__ import annotations

import re
import time
from urllib.parse import urlencode

RUN_TIMEOUT_MS = 120_000
# Small and fast: every scenario's configuration (URL params) stays at width <= 256, repeats 3.
SMALL = {"width": "64", "batch": "8", "depth": "1", "repeats": "3"}
PAGES = {"Explore": "explore", "Compare policies": "compare", "Sweep": "sweep", "Advisor": "advisor",
         "History": "history", "Open results": "results", "Inspect": "inspect", "Guide": "guide"}

_RUNS = "_remat_runs"  # a watched page's count of finished script runs (``watch_runs``)
QUIET_MS = 400  # after the run: the DOM unchanged this long (lazy element chunks, Plotly, grids)

# Set up on every document (add_init_script): the time of the last DOM change and whether the root
# went through a run since ``arm``.
INIT_JS = """(() => {
  window.__rematLastChange = Date.now();
  window.__rematSawRun = true;
  const watch = () => {
    new MutationObserver(() => {
      window.__rematLastChange = Date.now();
      const root = document.querySelector('[data-testid="stApp"]');
      const s = root && root.dataset.testScriptState;
      if (s === 'running' || s === 'rerunRequested') window.__rematSawRun = true;
    }).observe(document.documentElement, {attributes: true, childList: true, subtree: true,
                                          characterData: true});
  };
  if (document.documentElement) watch(); else document.addEventListener('DOMContentLoaded', watch);
  // No CSS animation runs (spinners, skeletons, the running indicator): a headless Chromium would
  // otherwise draw them frame by frame in software for as long as a script runs; nothing waits on them.
  document.addEventListener('DOMContentLoaded', () => {
    const still = document.createElement('style');
    still.textContent = '*, *::before, *::after { animation: none !important; }';
    document.head.appendChild(still);
  });
})();"""

_IDLE_JS = """([quietMs, needRun]) => {
  const root = document.querySelector('[data-testid="stApp"]');
  return !!root && root.dataset.testConnectionState === 'CONNECTED'
      && root.dataset.testScriptState === 'notRunning' && (!needRun || window.__rematSawRun === true)
      && !document.querySelector('[data-stale="true"]')
      && Date.now() - window.__rematLastChange >= quietMs;
}"""

_ARM_JS = "() => { window.__rematSawRun = false; }"

_TABLE_JS = """(grid) => {
  const heads = [...grid.querySelectorAll('thead th')].map(th => th.innerText.trim());
  return [...grid.querySelectorAll('tbody tr')].map(tr => {
    const row = {};
    [...tr.querySelectorAll('td')].forEach((td, i) => { row[heads[i]] = td.innerText.trim(); });
    return row;
  });
}"""


def url(server: str, page: str = "", **params) -> str:
    query = urlencode(params)
    return f"{server}/{page}" + (f"?{query}" if query else "")


def watch_runs(page) -> None:
    """Count the script runs the server reports finished (``script_finished`` on the page's websocket).

    The DOM alone can miss a rerun: a busy browser may render a short run's ``running`` and
    ``notRunning`` in one frame, and ``data-test-script-state`` then never changes. On a watched
    page ``arm`` and ``wait_idle`` wait for the server's own word that the rerun finished."""
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    runs = {"finished": 0}
    page.__dict__[_RUNS] = runs
    early = ForwardMsg.FINISHED_EARLY_FOR_RERUN  # cut short by the next run: not the end of it

    def on_frame(payload) -> None:
        if not isinstance(payload, bytes) or len(payload) > 512:  # deltas are larger; this one is tiny
            return
        msg = ForwardMsg()
        try:
            msg.ParseFromString(payload)
        except Exception:  # noqa: BLE001 - not a ForwardMsg: not ours to count
            return
        if msg.WhichOneof("type") == "script_finished" and msg.script_finished != early:
            runs["finished"] += 1

    page.on("websocket", lambda ws: ws.on("framereceived", on_frame))


def wait_idle(page, timeout: int = RUN_TIMEOUT_MS) -> None:
    """Wait until the app is connected, its script run (the one caused after ``arm``, if armed) has
    finished, no element is stale and the DOM has settled (``notRunning`` comes before lazily loaded
    elements are drawn). The page must have ``INIT_JS`` as an init script (the ``page`` fixture);
    on a page given to ``watch_runs`` the armed rerun is known finished from the server."""
    deadline = time.monotonic() + timeout / 1000
    runs = page.__dict__.get(_RUNS)
    armed = runs.pop("armed", None) if runs else None
    if armed is not None:
        while runs["finished"] <= armed:
            if time.monotonic() > deadline:
                raise AssertionError(f"no script run finished within {timeout / 1000:.0f} s of the action")
            page.wait_for_timeout(50)  # lets Playwright deliver the websocket's frames
    left = max(1, int((deadline - time.monotonic()) * 1000))
    page.wait_for_function(_IDLE_JS, arg=[QUIET_MS, armed is None], timeout=left, polling=100)


def expect_run(page) -> None:
    """On a watched page: the next ``wait_idle`` waits until the server has finished a script run
    after this call (before loading a page: its first run)."""
    if (runs := page.__dict__.get(_RUNS)) is not None:
        runs["armed"] = runs["finished"]


def arm(page) -> None:
    """Call before an interaction: the next ``wait_idle`` then waits for the rerun it causes."""
    page.evaluate(_ARM_JS)
    expect_run(page)


def rerun_after(page, action, timeout: int = RUN_TIMEOUT_MS) -> None:
    arm(page)
    action()
    wait_idle(page, timeout)


def assert_no_page_not_found(page) -> None:
    """Streamlit answers an unknown URL path with a blocking "Page not found" dialog."""
    assert page.get_by_role("dialog").count() == 0, page.get_by_role("dialog").all_inner_texts()
    assert "Page not found" not in page.locator("body").inner_text()


def open_app(page, server: str, path: str = "", **params) -> None:
    """Load a page of the app, wait for its first run, check it is ours and shows no exception."""
    expect_run(page)  # this load's run, not a lull before it
    page.goto(url(server, path, **params), wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stApp"]', timeout=RUN_TIMEOUT_MS)
    wait_idle(page)
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text("Remat Lab", exact=True).wait_for(timeout=30_000)  # our app, not another one
    assert_no_exception(page)


def assert_no_exception(page) -> None:
    exceptions = page.get_by_test_id("stException")
    if exceptions.count():
        raise AssertionError("the page shows an exception:\n" + "\n---\n".join(exceptions.all_inner_texts()))


def assert_no_error(page) -> None:
    assert_no_exception(page)
    errors = page.get_by_test_id("stAlertContentError")
    if errors.count():
        raise AssertionError("the page shows an error box:\n" + "\n---\n".join(errors.all_inner_texts()))


def metrics(page, wait: bool = True) -> dict[str, str]:
    """The st.metric cards as {label: value}.

    Streamlit draws metric cards from a lazily loaded chunk, after a skeleton: with ``wait`` (for a
    page that shows cards) wait for the first card's value first.
    """
    if wait:
        page.get_by_test_id("stMetricValue").first.wait_for(timeout=30_000)
    out = {}
    for card in page.get_by_test_id("stMetric").all():
        label = card.get_by_test_id("stMetricLabel").inner_text().strip()
        out[label] = card.get_by_test_id("stMetricValue").inner_text().strip()
    return out


def grid_rows(page, column: str) -> list[dict[str, str]]:
    """Rows of the st.dataframe that has ``column``, read from glide-data-grid's accessibility table
    (the cells themselves are drawn on a canvas)."""
    frame = page.get_by_test_id("stDataFrame").filter(
        has=page.locator("thead th", has_text=re.compile(rf"^\s*{re.escape(column)}\s*$")))
    grid = frame.locator('table[role="grid"]').first
    grid.wait_for(state="attached", timeout=30_000)
    return grid.evaluate(_TABLE_JS)


def sidebar_widget(page, testid: str, label: str):
    return page.get_by_test_id("stSidebar").get_by_test_id(testid).filter(
        has=page.get_by_test_id("stWidgetLabel").get_by_text(label, exact=True))


def slider_value(page, label: str) -> str:
    return sidebar_widget(page, "stSlider", label).get_by_test_id("stSliderThumbValue").inner_text().strip()


def number_value(page, label: str) -> str:
    return sidebar_widget(page, "stNumberInput", label).locator("input").input_value()


def selectbox_value(page, label: str) -> str:
    return sidebar_widget(page, "stSelectbox", label).locator("input").input_value().strip()


def radio_value(page, label: str) -> str:
    radio = sidebar_widget(page, "stRadio", label)
    return radio.locator("label").filter(has=page.locator("input:checked")).inner_text().strip()


def choose(page, label: str, option: str) -> None:
    """Pick ``option`` in the sidebar selectbox ``label`` (by typing, then the listbox option)."""
    box = sidebar_widget(page, "stSelectbox", label)
    box.click()
    page.keyboard.type(option)
    page.get_by_role("option", name=option, exact=True).click()


# A page script's box helpers (``tol``: the pixels two boxes may share): a drawn element's box or
# null, two boxes overlapping, one inside another, a box in words. The layout checks start with it.
BOX_JS = """  const box = (el) => { const r = el && el.getBoundingClientRect();
                        return r && r.width > 0 && r.height > 0 ? r : null; };
  const overlap = (a, b) => Math.min(a.right, b.right) - Math.max(a.left, b.left) > tol
                         && Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > tol;
  const inside = (a, b) => a.left >= b.left - tol && a.right <= b.right + tol
                        && a.top >= b.top - tol && a.bottom <= b.bottom + tol;
  const px = Math.round;
  const fmt = (r) => `[${px(r.left)},${px(r.top)} ${px(r.width)}x${px(r.height)}]`;
"""

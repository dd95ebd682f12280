"""Fixtures for the real-browser tests: one Streamlit server per session, Debian's Chromium through
Playwright (one shared browser context; a fresh one where a test asks), screenshots, and the server
log on failure.

Environment:
  REMAT_LAB_CHROMIUM      the browser binary (default Debian's /usr/bin/chromium-headless-shell, the
                          same renderer without the browser around it, about a quarter less CPU
                          per page; else /usr/bin/chromium, else ``chromium`` on PATH)
  REMAT_LAB_E2E_ARTIFACTS where screenshots and the server log go (default test-artifacts/e2e)
  REMAT_LAB_SCREENSHOTS   also write the page screenshots here (the docs' own images, docs/img/, are
                          taken at 1440 px wide: docs/ARCHITECTURE.md, How to test)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from streamlit_driver import INIT_JS, watch_runs

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 900}
SERVER_START_S = 90
_LOG_KEY = pytest.StashKey[Path]()
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # localhost, never a proxy


def _skip(reason: str):
    """Skip loudly: the reason shows in the ``-ra`` summary and on stderr."""
    sys.stderr.write(f"\n*** E2E BROWSER TESTS SKIPPED: {reason}\n")
    pytest.skip(f"E2E BROWSER TESTS SKIPPED: {reason}")


def _chromium() -> str | None:
    wanted = os.environ.get("REMAT_LAB_CHROMIUM")
    for candidate in ([wanted] if wanted else [
            "/usr/bin/chromium-headless-shell", "/usr/bin/chromium", "chromium", "chromium-browser"]):
        path = candidate if os.path.isabs(candidate) else shutil.which(candidate)
        if path and os.access(path, os.X_OK):
            return path
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = 80) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"(no server log: {err})"


@pytest.fixture(scope="session")
def artifacts() -> Path:
    path = Path(os.environ.get("REMAT_LAB_E2E_ARTIFACTS", ROOT / "test-artifacts" / "e2e"))
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("FAILED-*.png"):  # from an earlier session
        old.unlink()
    return path


@pytest.fixture(scope="session")
def shots(artifacts):
    """``shots(page, name)``: a viewport PNG into the artifacts (and REMAT_LAB_SCREENSHOTS) dir."""
    extra = os.environ.get("REMAT_LAB_SCREENSHOTS")
    extra_dir = (ROOT / extra) if extra and not os.path.isabs(extra) else (Path(extra) if extra else None)
    if extra_dir:
        extra_dir.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        page.mouse.move(0, 0)  # no hover tooltips in the picture
        out = artifacts / f"{name}.png"
        page.screenshot(path=str(out), full_page=False, animations="disabled")
        if extra_dir:
            shutil.copyfile(out, extra_dir / f"{name}.png")
        return out

    return take


def compile_cache(fallback) -> Path:
    """The run's shared compile cache (tests/conftest.py), else ``fallback()`` (a run without it)."""
    shared = os.environ.get("REMAT_LAB_TEST_COMPILE_CACHE")
    return Path(shared) if shared else Path(fallback())


@contextlib.contextmanager
def start_server(log_path: Path, cache: Path):
    """Run ``streamlit run app.py`` on a free port; yields its base URL. The log goes to ``log_path``."""
    try:
        import streamlit  # noqa: F401
    except ImportError:
        _skip("streamlit is not installed in this Python")
    env = {**os.environ, "REMAT_LAB_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1",
           "REMAT_LAB_WORKERS": os.environ.get("REMAT_LAB_E2E_WORKERS", "1")}  # the app's own setting
    proc = None
    with open(log_path, "w") as log:
        for _attempt in range(3):  # another process may grab the free port first
            port = _free_port()
            cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                   "--server.port", str(port), "--server.address", "127.0.0.1",
                   "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + SERVER_START_S
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with _NO_PROXY.open(f"{url}/_stcore/health", timeout=2) as resp:
                        if resp.status == 200 and resp.read().strip() == b"ok":
                            break
                except OSError:
                    pass
                time.sleep(0.3)
            else:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                continue
            if proc.poll() is None:  # healthy, and the port is ours (not another server's)
                break
        else:
            pytest.fail(f"streamlit did not start; log tail:\n{log_tail(log_path)}")
        try:
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def server(request, artifacts, tmp_path_factory) -> str:
    """One server for the session; its base URL. The log goes to the artifacts."""
    log_path = artifacts / "server.log"
    request.config.stash[_LOG_KEY] = log_path
    with start_server(log_path, compile_cache(lambda: tmp_path_factory.mktemp("remat_lab_cache"))) as url:
        yield url


@pytest.fixture
def fresh_server(artifacts, tmp_path) -> str:
    """A server that has served nothing yet (for first-request behaviour; the run's compile cache,
    which holds programs, not server state)."""
    with start_server(artifacts / "fresh-server.log", compile_cache(lambda: tmp_path / "cache")) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        _skip(f"Playwright for Python is not installed ({err}); "
              "install requirements-dev.txt")
    exe = _chromium()
    if exe is None:
        _skip("Chromium not found (looked for $REMAT_LAB_CHROMIUM, /usr/bin/chromium-headless-shell, "
              "/usr/bin/chromium, chromium on PATH); install Debian's `chromium-headless-shell` or "
              "`chromium` package (.ci/run installs both)")
    pw = sync_playwright().start()
    try:
        try:
            browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, headless=True)
        except PlaywrightError as err:
            _skip(f"Chromium at {exe} could not be launched: {str(err).splitlines()[0]}")
        yield browser
        browser.close()
    finally:
        pw.stop()


def _context(browser, viewport: dict | None = None):
    ctx = browser.new_context(viewport=viewport or VIEWPORT, device_scale_factor=1)
    ctx.set_default_timeout(30_000)
    ctx.add_init_script(INIT_JS)
    return ctx


@pytest.fixture(scope="session")
def shared_context(browser):
    """One browser context for the session's pages: each page is still its own Streamlit session
    (its own websocket), but the pages share Chromium's HTTP and compiled-script caches, so the app's
    JavaScript is parsed and compiled once, not once per test (Chromium's CPU is most of a browser
    test's). Tests that need no cookies and no stored state ask ``new_page(fresh=True)``."""
    ctx = _context(browser)
    yield ctx
    ctx.close()


@pytest.fixture
def new_page(request, browser, shared_context, artifacts):
    """``new_page(viewport=None, fresh=False)``: a new page (several per test for parallel sessions),
    in the shared context, or in a context of its own with ``fresh``.

    On failure each page's screenshot is saved as ``FAILED-<test>-<n>.png`` in the artifacts dir.
    """
    contexts, pages = [], []

    def make(viewport: dict | None = None, fresh: bool = False):
        if fresh:
            contexts.append(_context(browser, viewport))
            page = contexts[-1].new_page()
        else:
            page = shared_context.new_page()
            page.set_viewport_size(viewport or VIEWPORT)
        watch_runs(page)
        pages.append(page)
        return page

    yield make
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for i, page in enumerate(pages):
            try:
                page.screenshot(path=str(artifacts / f"FAILED-{request.node.name}-{i}.png"))
            except Exception as err:  # noqa: BLE001 - best effort
                print(f"(could not screenshot page {i}: {err})")
    for page in pages:
        if not page.is_closed():
            page.close()
    for ctx in contexts:
        ctx.close()


@pytest.fixture
def page(new_page):
    return new_page()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
    log_path = item.config.stash.get(_LOG_KEY, None)
    if rep.failed and log_path is not None and "server" in item.fixturenames:
        rep.sections.append((f"streamlit server log (tail of {log_path})", log_tail(log_path)))

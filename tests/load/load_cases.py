"""The load benchmark's issue-21 cases: uploads on Open results and the Advisor hog (used by load_bench)."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from streamlit_driver import url, wait_idle

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


# The upload widget's own check (Streamlit 1.67, in the browser) reads max_upload_size=20 as
# 20 x 1000^2 bytes on Linux and macOS (1024^2 on Windows): a file of 20 MiB - 4 KiB is refused there
# ("File must be 20.0MB or smaller") and never reaches the server. The largest it lets through.
UPLOAD_WIDGET_MAX = 20 * 1000 ** 2


def upload_files(folder: Path) -> tuple[Path, Path]:
    """The junk and valid files of ``tests/test_uploads.py`` as large as the widget lets through
    (20 MB, 19.07 MiB; ``UPLOAD_WIDGET_MAX``), written to ``folder``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_uploads import write_junk, write_valid

    junk, valid = folder / "junk.jsonl", folder / "valid.jsonl"
    size = min(20 * MIB, UPLOAD_WIDGET_MAX) - 4096
    write_junk(junk, size)
    write_valid(valid, size)
    return junk, valid


def _answer_locators(page, name: str):
    heading = page.get_by_role("heading", name=re.compile(r"(Sweep|Run|Comparison|Advice): "))
    alert = page.locator('[data-testid^="stAlertContent"]').filter(has_text=name)
    refused = page.get_by_test_id("stFileUploader").get_by_text(re.compile("must be|not allowed"))
    return heading, alert, refused


def _answer_counts(page, name: str) -> tuple[int, int]:
    """How many views' headings, and alerts naming ``name``, the page shows now (before an upload)."""
    heading, alert, _ = _answer_locators(page, name)
    return heading.count(), alert.count()


def _upload_answer(page, name: str, timeout: int = 600_000, before: tuple[int, int] = (0, 0)) -> str:
    """Wait until Open results shows the parse of ``name`` (one more view heading than ``before``,
    or one more alert naming the file), then until the page is idle; what it shows, in short.
    (Waiting for idle alone returns while the file is still being sent: the page is idle then, and
    "ok" was measured; waiting for any heading returns at once on a page that already shows one.)"""
    heading, alert, refused = _answer_locators(page, name)
    end = time.monotonic() + timeout / 1000
    while heading.count() <= before[0] and alert.count() <= before[1] and refused.count() == 0:
        if time.monotonic() > end:
            raise TimeoutError(f"no answer to {name} in {timeout / 1000:.0f} s")
        page.wait_for_timeout(250)
    wait_idle(page, timeout=timeout)
    shown = [" ".join(t.split())[:120] for t in heading.all_inner_texts()[before[0]:][-1:]]
    shown += [" ".join(t.split())[:160] for t in alert.all_inner_texts()[before[1]:][:2]]
    shown += [f"refused by the widget: {t.strip()[:80]}" for t in refused.all_inner_texts()[:1]]
    return " | ".join(shown)


def upload(b, page, path: Path) -> tuple[float, str]:
    """Open results with ``path`` uploaded: seconds until its parse is shown, and what is shown."""
    page.goto(url(b.base, "results"), wait_until="domcontentloaded")
    wait_idle(page, timeout=300_000)
    t0 = time.perf_counter()
    page.get_by_test_id("stFileUploader").locator("input[type=file]").set_input_files(str(path))
    said = _upload_answer(page, path.name)
    return time.perf_counter() - t0, said


def upload_steps(b, folder: Path) -> None:
    junk, valid = upload_files(folder)
    p = b.page()
    for path in (junk, valid):
        took, said = upload(b, p, path)
        b.record(f"upload {path.name} ({path.stat().st_size / MIB:.2f} MiB)", seconds=round(took, 2),
                 said=said)
    took, said = upload(b, p, valid)
    b.record("upload valid.jsonl again (cached parse)", seconds=round(took, 2), said=said)
    pages = [b.page(), b.page()]
    t0 = time.perf_counter()
    for q, path in zip(pages, (junk, valid)):
        q.goto(url(b.base, "results"), wait_until="domcontentloaded")
        wait_idle(q, timeout=300_000)
        q.get_by_test_id("stFileUploader").locator("input[type=file]").set_input_files(str(path))
    said = [_upload_answer(q, path.name) for q, path in zip(pages, (junk, valid))]
    b.record("uploads from two sessions at once (junk, valid)", seconds=round(time.perf_counter() - t0, 1),
             said=said)
    for q in pages + [p]:
        q.context.close()


TRANSFORMER_POLICIES = ("no_remat,nnx_remat_default,nothing_saveable,everything_saveable,dots_saveable,"
                        "dots_with_no_batch_dims_saveable,offload_dot_with_no_batch_dims,full,minimal,"
                        "minimal_with_context,save_dot_with_context_except_mlp,save_dot_except_mlpwi,"
                        "save_dot_except_mlp,save_qkv_proj,save_out_proj,qkv_proj_offloaded,"
                        "minimal_offloaded")  # every policy a transformer takes but custom: 17


def _texts(page, testid: str) -> list[str]:
    return [" ".join(t.split())[:200] for t in page.get_by_test_id(testid).all_inner_texts()]


def hog_steps(b) -> None:
    """Issue 21's hog: session 1 asks the Advisor for budget 1000T over all 17 transformer policies
    (refused in public mode: what does it say?), then clicks the largest advice public mode allows
    (256 GiB, the first 8 policies, timed); right after, session 2 (another browser) runs a small
    configuration: its seconds to an answer against the deadlines (``serve/quotas.py``)."""
    from remat_lab.serve import quotas

    limits_s = quotas.deadlines()
    s1, s2 = b.page(), b.page()
    took, said = b.visit(s2, "", width="16", batch="2", depth="1", repeats="1")  # the worker warm
    b.record("session 2 warm-up (tiny run)", seconds=round(took, 2), said=said)
    s1.goto(url(b.base, "advisor", model="transformer", budget="1000T", policies=TRANSFORMER_POLICIES,
                timed="1"), wait_until="domcontentloaded")
    wait_idle(s1, timeout=300_000)
    button = s1.get_by_role("button", name="Find the largest batches")
    b.record("session 1: Advisor link, 1000T, 17 transformer policies",
             said={"errors": _texts(s1, "stAlertContentError"),
                   "warnings": _texts(s1, "stAlertContentWarning"),
                   "button_shown": button.count() > 0})
    most = f"{quotas.PUBLIC_ADVISOR_MAX_BUDGET >> 30}G"
    s1.goto(url(b.base, "advisor", model="transformer", budget=most, timed="1"),
            wait_until="domcontentloaded")
    wait_idle(s1, timeout=300_000)
    caption = [t for t in _texts(s1, "stCaptionContainer") if "shared" in t]
    t0 = time.perf_counter()
    s1.get_by_role("button", name="Find the largest batches").click()
    s1.wait_for_timeout(1500)  # the advice is queued and started before session 2 asks
    t2 = time.perf_counter()
    took, said2 = b.visit(s2, "", timeout_s=1200, width="40", batch="3", depth="1", repeats="2")
    b.record("session 2: small run while session 1's advice runs", seconds=round(took, 2), said=said2,
             started_after_s=round(t2 - t0, 2), deadline_run_s=limits_s.get("run"),
             deadline_advise_s=limits_s.get("advise"),
             within_run_deadline=took <= (limits_s.get("run") or 1e9),
             within_advise_deadline_plus_run=took <= (limits_s.get("advise") or 1e9)
             + (limits_s.get("run") or 0))
    wait_idle(s1, timeout=1_200_000)
    status = _texts(s1, "stExpander")
    b.record("session 1: the advice (256G, 8 policies, timed) ended",
             seconds=round(time.perf_counter() - t0, 2),
             said={"status": status[:1], "errors": _texts(s1, "stAlertContentError")[:2],
                   "caption": caption[:1]})
    took, said = b.visit(s2, "", width="48", batch="3", depth="1", repeats="2")
    b.record("session 2: next small run, server idle", seconds=round(took, 2), said=said)
    for q in (s1, s2):
        q.context.close()


# ---------------------------------------------------------------- issue 33's cases


def _client_page(b, forwarded_for: str | None = None, n: int = 1) -> list:
    """``n`` tabs of one browser (one context: one client); with ``forwarded_for`` each tab's
    ``base`` is its own front door (``xff_proxy``: every connection, the WebSocket's too, carries
    that X-Forwarded-For; the server trusts 127.0.0.1 as its proxy: a visitor's address)."""
    from streamlit_driver import INIT_JS
    from xff_proxy import forwarding

    base = b.base
    if forwarded_for:
        base = f"http://127.0.0.1:{forwarding(int(b.base.rsplit(':', 1)[1]), forwarded_for)}"
    ctx = b.browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.add_init_script(INIT_JS)
    ctx.set_default_timeout(600_000)
    pages = [ctx.new_page() for _ in range(n)]
    for p in pages:
        p.base = base  # where this client's requests go
    return pages


def _rss_hwm_mib(pid: int) -> float | None:
    """The process's peak resident memory since it started (``VmHWM``), MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _rss_back(b, idle_mib: float, after_s: float, most_s: float, step: float = 5.0,
              within_mib: float = 50.0) -> tuple[list[float], float | None]:
    """The server's RSS (MiB) every ``step`` seconds, until ``after_s`` have passed and it is within
    ``within_mib`` of ``idle_mib``, or for ``most_s``; the samples, and the seconds until it was
    back (None: not within ``most_s``)."""
    from remat_lab.config import limits

    out, t0 = [], time.perf_counter()
    while time.perf_counter() - t0 < most_s:
        time.sleep(step)
        out.append(round((limits.rss_bytes(b.server.pid) or 0) / MIB, 1))
        took = time.perf_counter() - t0
        if took >= after_s and out[-1] - idle_mib <= within_mib:
            return out, round(took, 1)
    return out, None


def many_upload_steps(b, folder: Path, sessions: int = 5, files: int = 5,
                      size: int = UPLOAD_WIDGET_MAX - 4096, follow_s: float = 300.0,
                      server_ttl_s: float = 120.0) -> None:
    """Issue 33: ``sessions`` browsers each upload ``files`` distinct files (junk and valid, as large
    as the widget lets through), every session's j-th file sent at the same time; then three
    sessions upload at once; then every tab closes and the server's RSS is followed past the
    disconnected-session TTL (``server_ttl_s``, the server's ``server.disconnectedSessionTTL``: this
    app drops a session's uploads and open parses then) until it is within 50 MiB of the idle RSS,
    recorded first, or for ``follow_s`` at most."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_uploads import write_junk, write_valid

    paths = []
    for j in range(files):  # distinct bytes: a parse is not shared through the cache
        path = folder / f"{'valid' if j % 2 else 'junk'}-{j}.jsonl"
        (write_valid if j % 2 else write_junk)(path, size - 8192 * j)
        paths.append(path)
    idle = b.record("issue 33: idle before the uploads")["server_rss_mib"]
    pages = [_client_page(b)[0] for _ in range(sessions)]
    for q in pages:
        q.goto(url(b.base, "results"), wait_until="domcontentloaded")
        wait_idle(q, timeout=300_000)
    for j, path in enumerate(paths):
        before = [_answer_counts(q, path.name) for q in pages]
        t0 = time.perf_counter()
        for q in pages:
            q.get_by_test_id("stFileUploader").locator("input[type=file]").set_input_files(str(path))
        said = [_upload_answer(q, path.name, before=n) for q, n in zip(pages, before)]
        b.record(f"issue 33: {sessions} sessions upload file {j + 1} of {files} ({path.name}) at once",
                 seconds=round(time.perf_counter() - t0, 1),
                 read=sum("not read" not in s for s in said), refused=sum("not read" in s for s in said),
                 said=sorted({s[:120] for s in said}))
    three = [_client_page(b)[0] for _ in range(3)]
    for q in three:
        q.goto(url(b.base, "results"), wait_until="domcontentloaded")
        wait_idle(q, timeout=300_000)
    t0 = time.perf_counter()
    for q in three:
        q.get_by_test_id("stFileUploader").locator("input[type=file]").set_input_files(str(paths[1]))
    said = [_upload_answer(q, paths[1].name) for q in three]
    b.record("issue 33: three new sessions upload the same file at once",
             seconds=round(time.perf_counter() - t0, 1), said=said)
    for q in pages + three:
        q.context.close()
    t_closed = time.perf_counter()
    closed = b.record("issue 33: every tab closed")
    trail, back_s = _rss_back(b, idle, server_ttl_s + 10, follow_s)  # its sweep runs every 10 s
    row = b.record(f"issue 33: RSS followed {time.perf_counter() - t_closed:.0f} s after the tabs closed",
                   rss_trail_mib=trail, idle_before_mib=idle, at_close_mib=closed["server_rss_mib"],
                   peak_sampled_mib=max(r["server_rss_mib"] for r in b.rows if r["server_alive"]),
                   peak_hwm_mib=_rss_hwm_mib(b.server.pid),
                   server_session_ttl_s=server_ttl_s, back_within_50_mib_after_s=back_s)
    row["within_50_mib_of_idle"] = row["server_rss_mib"] - idle <= 50
    print(json.dumps({"within_50_mib_of_idle": row["within_50_mib_of_idle"]}), flush=True)


def visitor_steps(b, tabs: int = 4) -> None:
    """Issue 33's fair queue: one client (one address) opens ``tabs`` tabs, each clicks a slow run
    (1000 timed repeats of a width-1024, batch-768 step: about 12 times the flops of the width-512,
    batch-256 one these runs had, which a faster machine finished before the third tab clicked; its
    need, about 193 MiB, fits beside the server and worker under 1 GiB, 355 MiB did not); then another
    visitor's tiny run. Its seconds to an
    answer against the bound the README states (the run deadline, for the job running, plus its own
    length), and what the client's tabs were told (a visitor has at most 2 jobs in flight)."""
    from remat_lab.serve import quotas

    deadline = quotas.deadlines().get("run")
    a = _client_page(b, "198.51.100.1", tabs)
    other = _client_page(b, "198.51.100.2")[0]
    alone, said = b.visit(other, "", base=other.base, width="16", batch="2", depth="1",
                          repeats="1")  # its own length
    b.record("issue 33: the other visitor's tiny run alone", seconds=round(alone, 2), said=said)
    for i, q in enumerate(a):
        q.goto(url(q.base, "", width=str(1024 - 8 * i), batch="768", depth="1", repeats="1000"),
               wait_until="domcontentloaded")  # distinct runs: equal requests would share one job
        wait_idle(q, timeout=300_000)
        q.get_by_role("button", name="Run this configuration").click()
        q.wait_for_timeout(1000)
    t0 = time.perf_counter()
    took, said = b.visit(other, "", base=other.base, timeout_s=1200, width="24", batch="2", depth="1",
                         repeats="1")
    told = []
    for q in a:
        wait_idle(q, timeout=1_200_000)
        told.append(" ".join(((q.get_by_test_id("stAlertContentWarning").all_inner_texts()
                               + q.get_by_test_id("stAlertContentError").all_inner_texts()) or ["ran"])[0]
                             .split())[:120])
    b.record(f"issue 33: another visitor's tiny run while one client has {tabs} tabs of slow runs",
             seconds=round(took, 2), said=said, deadline_run_s=deadline,
             bound_s=round((deadline or 0) + alone, 1), within_bound=took <= (deadline or 1e9) + alone,
             client_tabs_told=told,
             client_all_done_s=round(time.perf_counter() - t0, 1))
    for q in a + [other]:
        q.context.close()


def target_steps(b) -> None:
    """Issue 33's named-target compile in public mode: a visitor opens Explore for an H100 (the
    default configuration otherwise) and clicks Run; the compile for the absent GPU runs in the
    1 GiB cgroup's worker. Its seconds to an answer, what the page says, and the memory after."""
    page = _client_page(b, "198.51.100.3")[0]
    t0 = time.perf_counter()
    page.goto(url(page.base, "", target="h100"), wait_until="domcontentloaded")
    wait_idle(page, timeout=300_000)
    button = page.get_by_role("button", name="Run this configuration")
    if button.count():
        button.click()
        page.wait_for_timeout(1000)
        wait_idle(page, timeout=900_000)
    main = " ".join(page.get_by_test_id("stMain").inner_text().split())
    errors = _texts(page, "stAlertContentError")
    status = _texts(page, "stExpander")
    b.record("issue 33: an H100 compile of the default configuration, public mode",
             seconds=round(time.perf_counter() - t0, 2), served=not errors and "H100" in main,
             said={"errors": errors[:2], "warnings": _texts(page, "stAlertContentWarning")[:2],
                   "status": status[:1]})
    page.context.close()

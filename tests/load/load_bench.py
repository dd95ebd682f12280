"""Load benchmark: the real server in a 1 GiB memory cgroup, driven by headless Chromium (run by hand).

    PYTHONPATH=src python tests/load/load_bench.py [--small 200 --wide 20 --sessions 8] [--json out.json]
    PYTHONPATH=src python tests/load/load_bench.py --only new --json out.json   # issue 21's cases only
    PYTHONPATH=src python tests/load/load_bench.py --only round3 --server-session-ttl 30 --json out.json
                                                            # issue 33's cases, one after the other

Root only (it creates a cgroup-v1 child of this process's memory cgroup, or a v2 child where v2
has the memory controller; ``prlimit --as`` cannot stand in, JAX reserves address space far beyond
its use). The server runs with the README's settings (``REMAT_LAB_MEMORY_BUDGET=512M``, one
worker, ``REMAT_LAB_PUBLIC=1``, the shared host's ``PYTHONMALLOC=malloc MALLOC_ARENA_MAX=2``) and
joins the cgroup in its own process before it execs (its pid
written to ``cgroup.procs`` by ``preexec_fn``), so its workers are in it too: every row records
whether the server and each worker are members (``in_cgroup``), and the benchmark stops if the
server is not. The sequence:
the default page (first answer with a warm worker, then the cached answer), the width-4096 bf16
link, ``--wide`` distinct width-2048 models, ``--small`` distinct small configurations,
``--sessions`` concurrent sessions, a worker killed with SIGKILL and the next answer, then (unless
``--no-uploads``; ``--only uploads`` runs just these; ``--only round3`` issue 33's: five sessions
uploading five files each, three at once, RSS after the tabs close, and one client's four tabs of
slow runs against another visitor's tiny one, told apart by X-Forwarded-For from a trusted
127.0.0.1, and an H100 compile of the default configuration; ``round3-target`` that alone)
uploads on Open results: a 20 MiB junk file, a
20 MiB file of valid sweep rows, one after the other, then both from two sessions at once; then
the Advisor hog (``hog_steps``: 1000T over every transformer policy, then the largest advice public
mode allows, and a second visitor's small run meanwhile). After each step: the server alive?, its
RSS and its worker's, the cgroup's peak usage and OOM kills, the machine's load average. Not in CI:
it measures, it does not test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
sys.path.insert(0, str(ROOT / "src"))

from streamlit_driver import INIT_JS, url, wait_idle  # noqa: E402

from remat_lab.config import limits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_cases import (  # noqa: E402
    hog_steps,
    many_upload_steps,
    target_steps,
    upload_steps,
    visitor_steps,
)

MIB = 1 << 20


def make_cgroup(name: str, limit: int) -> Path:
    """A child memory cgroup of this process's own, limited to ``limit`` bytes; its directory."""
    paths = limits.cgroup_paths()
    v1 = Path("/sys/fs/cgroup/memory")
    if v1.is_dir() and "v1" in paths:
        parent = v1 / paths["v1"].strip("/")
        cg = parent / name
        if cg.is_dir():  # left by a stopped run: a fresh one, so its peak and OOM count start at 0
            cg.rmdir()
        cg.mkdir()
        (cg / "memory.limit_in_bytes").write_text(str(limit))
        return cg
    v2 = Path("/sys/fs/cgroup")
    cg = v2 / paths.get("v2", "/").strip("/") / name
    cg.mkdir(exist_ok=True)
    (cg / "memory.max").write_text(str(limit))
    return cg


def cgroup_stats(cg: Path) -> dict:
    def read(name):
        try:
            return (cg / name).read_text()
        except OSError:
            return None
    oom = read("memory.oom_control") or read("memory.events") or ""
    kills = next((int(line.split()[1]) for line in oom.splitlines() if line.startswith("oom_kill ")), None)
    peak = read("memory.max_usage_in_bytes") or read("memory.peak")
    stat = dict(line.split() for line in (read("memory.stat") or "").splitlines() if len(line.split()) == 2)
    anon = stat.get("total_rss", stat.get("anon"))  # v1, v2: the processes' own memory, now
    cache = stat.get("total_cache", stat.get("file"))  # the page cache charged to it (reclaimable)
    return {"cgroup_peak_mib": round(int(peak) / MIB, 1) if peak else None, "oom_kills": kills,
            "cgroup_anon_mib": round(int(anon) / MIB, 1) if anon else None,
            "cgroup_cache_mib": round(int(cache) / MIB, 1) if cache else None}


def children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmd:
                out.append(int(d.name))
    return out


def _join_cgroup(procs: Path):
    """For ``preexec_fn``: the child writes its own pid to ``procs`` before it execs, so the server,
    and every process it starts (its workers), are in the cgroup from their first byte."""
    def join():
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
    return join


def cgroup_of(pid: int) -> str | None:
    """The memory cgroup path of ``pid`` (v1 ``memory`` line, else the v2 ``0::`` line)."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    lines = [line.split(":", 2) for line in text.splitlines()]
    v1 = [p for _, ctl, p in lines if "memory" in ctl.split(",")]
    return v1[0] if v1 else next((p for h, ctl, p in lines if h == "0" and ctl == ""), None)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (workers, multiprocessing's resource tracker, ...)."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


class Bench:
    def __init__(self, args):
        self.args, self.rows = args, []
        self.cg = make_cgroup("remat_lab_load", args.limit_mib * MIB)
        port = args.port
        env = {**os.environ, "REMAT_LAB_MEMORY_BUDGET": args.budget, "REMAT_LAB_WORKERS": "1",
               "REMAT_LAB_PUBLIC": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT / "src"),
               "REMAT_LAB_TRUSTED_PROXIES": "127.0.0.1"}  # X-Forwarded-For names the bench's visitors
        if args.malloc_arena_max:  # glibc reads it at the server's start (README: a shared host's command)
            env["MALLOC_ARENA_MAX"] = str(args.malloc_arena_max)
        env.update(kv.split("=", 1) for kv in args.server_env)
        cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
               "--server.port", str(port), "--server.address", "127.0.0.1",
               "--server.fileWatcherType", "none"]
        if args.server_session_ttl is not None:  # Streamlit's default: 120 s
            cmd += ["--server.disconnectedSessionTTL", str(args.server_session_ttl)]
        self.log = open(args.log, "w")
        self.server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                       preexec_fn=_join_cgroup(self.cg / "cgroup.procs"))
        self.base = f"http://127.0.0.1:{port}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for _ in range(200):
            try:
                with opener.open(f"{self.base}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        if self.pid_outside():
            raise SystemExit(f"the server is not in {self.cg}: {self.pid_outside()}")
        from playwright.sync_api import sync_playwright
        self.pw = sync_playwright().start()
        self.browser = self.pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                               args=["--no-sandbox", "--disable-gpu"])

    def pid_outside(self) -> dict:
        """The server's processes (it and everything below it) whose memory cgroup is not ours."""
        members = {int(p) for p in (self.cg / "cgroup.procs").read_text().split()}
        pids = [self.server.pid] + descendants(self.server.pid)
        return {p: cgroup_of(p) for p in pids if p not in members and cgroup_of(p) is not None}

    def page(self):
        ctx = self.browser.new_context(viewport={"width": 1280, "height": 900})
        ctx.add_init_script(INIT_JS)
        ctx.set_default_timeout(300_000)
        return ctx.new_page()

    def record(self, step: str, **extra) -> dict:
        alive = self.server.poll() is None
        workers = children(self.server.pid) if alive else []
        members = {int(p) for p in (self.cg / "cgroup.procs").read_text().split()}
        row = {"step": step, "server_alive": alive, "load_avg_1m": round(os.getloadavg()[0], 2),
               "in_cgroup": {"server": self.server.pid in members,
                             "workers": [w in members for w in workers],
                             "outside": list(self.pid_outside().values()) if alive else []},
               "server_rss_mib": round((limits.rss_bytes(self.server.pid) or 0) / MIB, 1),
               "worker_rss_mib": round(sum(limits.rss_bytes(w) or 0 for w in workers) / MIB, 1),
               **cgroup_stats(self.cg), **extra}
        self.rows.append(row)
        print(json.dumps(row), flush=True)
        return row

    def visit(self, page, path: str = "", timeout_s: float = 300, base: str | None = None,
              **params) -> tuple[float, str]:
        """Load a configuration (through ``base``, default the server's own address); seconds until
        the page is idle, and what the main area says."""
        t0 = time.perf_counter()
        page.goto(url(base or self.base, path, **params), wait_until="domcontentloaded")
        wait_idle(page, timeout=int(timeout_s * 1000))
        took = time.perf_counter() - t0
        alerts = page.get_by_test_id("stAlertContentError").all_inner_texts()
        if alerts:
            return took, " ".join(alerts[0].split())[:160]
        status = page.get_by_test_id("stExpander").all_inner_texts()  # "Done: ... (0.0 s, from cache)"
        return took, " ".join(status[0].split())[-40:] if status else "ok"

    def close(self):
        self.browser.close()
        self.pw.stop()
        self.server.send_signal(signal.SIGTERM)
        try:
            self.server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.server.kill()
        time.sleep(1)
        for pid in (self.cg / "cgroup.procs").read_text().split():  # a worker left by a killed server
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        time.sleep(1)
        try:
            self.cg.rmdir()
        except OSError:
            pass


def classic_steps(b: Bench, args, folder: Path) -> None:
    """The sequence of the first load benchmark (pages, wide and small models, sessions, a killed
    worker), then the uploads and the Advisor hog."""
    p = b.page()
    took, said = b.visit(p, "", width="16", batch="2", repeats="1")  # waits for the warm worker
    b.record("first page (tiny config, worker warm-up)", seconds=round(took, 2), said=said)
    took, said = b.visit(p)
    b.record("default configuration, first answer, warm worker", seconds=round(took, 2), said=said)
    took, said = b.visit(p)
    b.record("default configuration again (cached)", seconds=round(took, 2), said=said)
    took, said = b.visit(p, "", width="4096", batch="1", dtype="bfloat16")
    b.record("width-4096 bf16 link (depth 8, the app's default)", seconds=round(took, 2), said=said)
    took, said = b.visit(p, "", width="4096", batch="1", dtype="bfloat16", depth="1")
    b.record("width-4096 bf16 link at depth 1", seconds=round(took, 2), said=said)
    t0, outcomes = time.perf_counter(), {}
    for i in range(args.wide):
        _, said = b.visit(p, "", width="2048", batch=str(1 + i), depth="1", repeats="1")
        said = "ok" if "s)" in said or "cache)" in said else said
        outcomes[said[:60]] = outcomes.get(said[:60], 0) + 1
    b.record(f"{args.wide} distinct width-2048 models", seconds=round(time.perf_counter() - t0, 1),
             said=outcomes)
    widths = [8, 16, 24, 32, 40, 48, 56, 64, 80, 96]
    t0, first, outcomes = time.perf_counter(), None, {}
    for i in range(args.small):
        w, batch, depth = widths[i % 10], 1 + (i // 10) % 10, 1 + (i // 100) % 2
        _, said = b.visit(p, "", width=str(w), batch=str(batch), depth=str(depth), repeats="2")
        said = "ok" if "s)" in said or "cache)" in said else said
        outcomes[said[:60]] = outcomes.get(said[:60], 0) + 1
        if first is None:
            first = b.record("after the first small configuration")
    last = b.record(f"after {args.small} distinct small configurations",
                    seconds=round(time.perf_counter() - t0, 1), said=outcomes)
    if first["server_rss_mib"]:
        last["server_rss_ratio"] = round(last["server_rss_mib"] / first["server_rss_mib"], 2)
        print(json.dumps({"server_rss_ratio_after_small": last["server_rss_ratio"]}), flush=True)
    pages = [b.page() for _ in range(args.sessions)]
    t0 = time.perf_counter()
    for i, q in enumerate(pages):
        q.goto(url(b.base, "", width=str(24 + 8 * i), batch="3", repeats="2"), wait_until="commit")
    for q in pages:
        wait_idle(q, timeout=300_000)
    said = [(q.get_by_test_id("stAlertContentError").all_inner_texts() or ["ok"])[0][:60]
            for q in pages]
    b.record(f"{args.sessions} concurrent sessions", seconds=round(time.perf_counter() - t0, 1),
             said=said)
    for q in pages:
        q.context.close()
    workers = children(b.server.pid)
    for w in workers:
        os.kill(w, signal.SIGKILL)
    time.sleep(0.5)
    took, said = b.visit(p, "", width="72", batch="5", repeats="2")
    b.record("worker killed, next answer", seconds=round(took, 2), said=said)
    if not args.no_uploads:
        upload_steps(b, folder)
    hog_steps(b)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit-mib", type=int, default=1024)
    ap.add_argument("--budget", default="512M")
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--wide", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--port", type=int, default=8650)
    ap.add_argument("--log", default="/tmp/remat_lab_load_server.log")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-uploads", action="store_true", help="skip the Open results upload steps")
    ap.add_argument("--only", choices=("uploads", "hog", "new", "round3", "round3-uploads", "round3-target"),
                    default=None,
                    help="run only the upload steps, the Advisor hog, or both (new: issue 21's cases); "
                         "round3: issue 33's (many uploads from several sessions, one client's tabs); "
                         "round3-uploads: its uploads alone; round3-target: its H100 compile alone")
    ap.add_argument("--upload-sessions", type=int, default=5)
    ap.add_argument("--upload-files", type=int, default=5)
    ap.add_argument("--upload-mb", type=float, default=None, help="file size (default: the widget's most)")
    ap.add_argument("--session-ttl", type=float, default=300.0,
                    help="at most this many seconds following the server's RSS after the tabs close "
                         "(it stops once the RSS is within 50 MiB of idle and the session TTL has passed)")
    ap.add_argument("--server-session-ttl", type=int, default=None,
                    help="the server's server.disconnectedSessionTTL (seconds; Streamlit's default 120)")
    ap.add_argument("--malloc-arena-max", type=int, default=2,
                    help="the server's MALLOC_ARENA_MAX (default 2, the README's shared-host command; "
                         "0: glibc's own, 8 per core)")
    ap.add_argument("--server-env", action="append", default=None, metavar="NAME=VALUE",
                    help="one more variable of the server's environment (default PYTHONMALLOC=malloc, "
                         "the README's shared-host command; given, only those given)")
    ap.add_argument("--upload-dir", default="/tmp/remat_lab_load_uploads")
    args = ap.parse_args(argv)
    if args.server_env is None:
        args.server_env = ["PYTHONMALLOC=malloc"]
    folder = Path(args.upload_dir)
    folder.mkdir(parents=True, exist_ok=True)
    b = Bench(args)
    try:
        if args.only:
            p = b.page()
            took, said = b.visit(p, "", width="16", batch="2", repeats="1")  # the worker started
            b.record("first page (tiny config, worker warm-up)", seconds=round(took, 2), said=said)
            p.context.close()
            if args.only in ("uploads", "new"):
                upload_steps(b, folder)
            if args.only in ("hog", "new"):
                hog_steps(b)
            if args.only.startswith("round3"):
                size = int(args.upload_mb * 1000 ** 2) if args.upload_mb else None
                if args.upload_sessions and args.only != "round3-target":  # 0: the fair-queue case alone
                    many_upload_steps(b, folder, args.upload_sessions, args.upload_files,
                                      **({"size": size} if size else {}), follow_s=args.session_ttl,
                                      server_ttl_s=args.server_session_ttl or 120)
                if args.only == "round3":
                    visitor_steps(b)
                if args.only in ("round3", "round3-target"):
                    target_steps(b)
        else:
            classic_steps(b, args, folder)
    finally:
        b.close()
        if args.json:  # also when a step failed: the rows measured so far
            Path(args.json).write_text(json.dumps(b.rows, indent=1))
    return 0 if all(r["server_alive"] for r in b.rows) else 1


if __name__ == "__main__":
    sys.exit(main())


# ---------------------------------------------------------------- the queue's fairness (issue 21)


def queue_fairness(deadline_s: float = 8.0) -> dict:
    """One worker, no browser: session A's slow run (stopped at ``deadline_s``) then a second run,
    session B's tiny run; B's wait, A's second's, and the bound (A's stop + B's own run + a restart).

        PYTHONPATH=src python -c "import sys; sys.path.insert(0, 'tests/load'); import load_bench as b;
        print(b.queue_fairness())"
    """
    from remat_lab.config import RunConfig
    from remat_lab.serve.worker import Pool, TimeLimit

    slow = RunConfig(width=512, batch=256, repeats=1000, warmup=100)
    tiny = RunConfig(width=16, batch=2, repeats=1, warmup=0)
    pool = Pool(size=1, deadlines={"run": deadline_s})
    try:
        pool._ensure(0)
        t0, done = time.perf_counter(), {}

        def at(name):
            return lambda value: done.setdefault(name, round(time.perf_counter() - t0, 2))

        a1 = pool.submit("run", {"config": slow.as_dict()}, key=slow, session="A")
        while "building" not in a1.stages:
            time.sleep(0.05)
        a2 = pool.submit("run", {"config": tiny.replace(width=24).as_dict()}, key="a2", session="A",
                         on_done=at("a2"))
        b1 = pool.submit("run", {"config": tiny.as_dict()}, key="b1", session="B", on_done=at("b1"))
        try:
            a1.wait()
            stopped = None
        except TimeLimit as err:
            stopped = str(err)
        a1_end = round(time.perf_counter() - t0, 2)
        b1.wait()
        a2.wait()
        row = {"deadline_s": deadline_s, "a1_ended_s": a1_end, "a1_stopped": stopped,
               "b1_done_s": done.get("b1"), "a2_done_s": done.get("a2"),
               "b_before_a2": done.get("b1", 1e9) < done.get("a2", 1e9)}
    finally:
        pool.close()
    print(json.dumps(row), flush=True)
    return row

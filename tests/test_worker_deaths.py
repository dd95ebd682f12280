"""A killed worker is said to be killed from outside, not "out of memory", unless the OOM killer did it.

The counter is read from fixture cgroup trees (v1, v2, an ancestor's limit, none at all), then a real
worker is killed by this test with SIGTERM and with SIGKILL: neither is the out-of-memory killer, and
the message says so (where this machine counts OOM kills; where it cannot, it says it cannot tell).
Where this process may make a memory cgroup (root, a writable memory controller), a worker is run
into a 600 MiB limit and the real OOM killer's kill is reported as out of memory.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from remat_lab.config import RunConfig, limits
from remat_lab.serve import deaths
from remat_lab.serve.worker import Pool, WorkerLost

SLOW = RunConfig(width=512, batch=256, repeats=1000, warmup=100)  # ~10 s of timing: time to kill it
GIB = 1 << 30


def _tree(root: Path, cgroup: str, files: dict[str, str]) -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text(cgroup)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_oom_kills_are_read_from_the_cgroup_and_its_ancestors(tmp_path):
    v1 = _tree(tmp_path / "v1", "4:memory:/box/app\n0::/\n", {
        "sys/fs/cgroup/memory/box/app/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        "sys/fs/cgroup/memory/box/memory.oom_control": "oom_kill_disable 0\noom_kill 1\n",
        "proc/vmstat": "oom_kill 40\n"})
    assert deaths.oom_kills(v1) == 3  # the machine's count is not used where a cgroup counts
    v2 = _tree(tmp_path / "v2", "0::/user.slice/app\n", {
        "sys/fs/cgroup/cgroup.controllers": "cpu memory\n",
        "sys/fs/cgroup/user.slice/app/memory.events": "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        "proc/vmstat": "oom_kill 7\n"})
    assert deaths.oom_kills(v2) == 1
    bare = _tree(tmp_path / "bare", "0::/\n", {"proc/vmstat": "pgfault 1\noom_kill 5\n"})
    assert deaths.oom_kills(bare) == 5  # no cgroup counts: the machine's
    assert deaths.oom_kills(_tree(tmp_path / "none", "", {})) is None


def test_the_message_tells_the_oom_killer_from_a_kill_from_outside():
    oom = deaths.message(-signal.SIGKILL, GIB, 0, 1)
    assert oom.startswith("This configuration ran out of memory in the worker (limit 1.0 GiB)")
    outside = deaths.message(-signal.SIGKILL, GIB, 3, 3)
    assert "stopped from outside the app (SIGKILL, not by the out-of-memory killer)" in outside
    assert "out of memory in the worker" not in outside and "not the cause" in outside
    assert "from outside the app (SIGTERM" in deaths.message(-signal.SIGTERM, GIB, None, None)
    unknown = deaths.message(-signal.SIGKILL, GIB, None, None)
    assert "cannot tell which" in unknown and "may have run out of memory (limit 1.0 GiB)" in unknown
    assert "exit code 3" in deaths.message(3, GIB, 0, 0)
    for text in (oom, outside, unknown):
        assert "--" not in text and "REMAT_LAB" not in text and "$" not in text


@pytest.fixture(scope="module")
def pool():
    p = Pool(size=1, max_runs=100)
    yield p
    p.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_worker_killed_by_someone_is_reported_as_such(pool, sig):
    job = pool.submit("run", {"config": SLOW.as_dict()}, key=("kill", sig))
    deadline = time.monotonic() + 180
    while "timing" not in job.stages:
        assert time.monotonic() < deadline and not job.done.is_set(), (job.stages, job.error)
        time.sleep(0.05)
    counted = deaths.oom_kills() is not None
    os.kill(pool.workers[0].process.pid, sig)
    with pytest.raises(WorkerLost) as err:
        job.wait()
    said = str(err.value)
    assert "ran out of memory in the worker" not in said, said
    if sig == signal.SIGTERM or counted:
        assert f"stopped from outside the app ({sig.name}" in said, said
    else:
        assert "cannot tell which" in said, said


OOM = textwrap.dedent("""
    import json, os, sys
    with open(sys.argv[1], "w") as f:  # into the small cgroup first: the worker is spawned in it
        f.write(str(os.getpid()))
    from remat_lab.config import RunConfig
    from remat_lab.serve.worker import Pool
    pool = Pool(size=1, limit=1 << 40, env={"REMAT_LAB_MEMORY_BUDGET": "1T"})
    big = RunConfig(width=8192, batch=8, depth=4, repeats=1, warmup=0)  # ~4 GiB of parameters and moments
    try:
        pool.call("run", {"config": big.as_dict()})
        said = None
    except Exception as err:
        said = [type(err).__name__, str(err)]
    pool.close()
    print(json.dumps(said))
""")


def _small_cgroup(limit: int) -> Path | None:
    """A child of this process's memory cgroup limited to ``limit`` bytes (v1 or v2); None if not allowed."""
    paths, fs = limits.cgroup_paths(), Path("/sys/fs/cgroup")
    name = f"remat_lab_oom_test_{os.getpid()}"
    try:
        if (fs / "memory").is_dir() and "v1" in paths:
            cg = fs / "memory" / paths["v1"].strip("/") / name
            cg.mkdir()
            (cg / "memory.limit_in_bytes").write_text(str(limit))
            if (cg / "memory.memsw.limit_in_bytes").exists():  # no swapping out of the limit
                (cg / "memory.memsw.limit_in_bytes").write_text(str(limit))
            return cg
        if "memory" in (fs / "cgroup.controllers").read_text() and "v2" in paths:
            cg = fs / paths["v2"].strip("/") / name
            cg.mkdir()
            (cg / "memory.max").write_text(str(limit))
            (cg / "memory.swap.max").write_text("0")
            return cg
    except OSError:
        return None
    return None


def test_a_worker_the_oom_killer_kills_is_reported_as_out_of_memory():
    cg = _small_cgroup(600 << 20)
    if cg is None:
        pytest.skip("cannot make a memory cgroup here (not root, or no writable memory controller)")
    try:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
        out = subprocess.run([sys.executable, "-c", OOM, str(cg / "cgroup.procs")], capture_output=True,
                             text=True, env=env, timeout=300)
        kind, said = json.loads(out.stdout.strip().splitlines()[-1])
        assert kind == "WorkerLost", (kind, said)
        assert said.startswith("This configuration ran out of memory in the worker"), said
        assert "out-of-memory killer stopped the worker" in said
    finally:
        for _ in range(50):  # the processes are gone once the subprocess has ended
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)

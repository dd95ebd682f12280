"""The cgroup reader on fixture trees: v1, v2, nested paths, a host path in a container, no limit."""

from pathlib import Path

from remat_lab.config import limits

GIB = 1 << 30


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


V1_CGROUP = "9:name=systemd:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n"


def test_v1_nested_path_takes_the_smallest_limit_on_the_way_up(tmp_path):
    root = _tree(tmp_path, {
        "proc/self/cgroup": V1_CGROUP,
        "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": str(4 * GIB),
        "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": str(GIB),
        "sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes": str(300 << 20),
    })
    got = limits.cgroup_memory(root)
    assert got == {"limit": GIB, "usage": 300 << 20, "kind": "v1", "path": "process_api/abc"}
    assert limits.memory_limit(root) == min(GIB, limits.system_memory_bytes())


def test_v1_parent_limit_applies_to_an_unlimited_child(tmp_path):
    root = _tree(tmp_path, {
        "proc/self/cgroup": V1_CGROUP,
        "sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": str(2 * GIB),
        "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": "9223372036854771712",
    })
    assert limits.cgroup_memory(root)["limit"] == 2 * GIB


def test_v2_nested_and_max(tmp_path):
    root = _tree(tmp_path, {
        "proc/self/cgroup": "0::/user.slice/app.scope\n",
        "sys/fs/cgroup/cgroup.controllers": "cpu io memory pids\n",
        "sys/fs/cgroup/user.slice/memory.max": str(GIB),
        "sys/fs/cgroup/user.slice/app.scope/memory.max": "max\n",
        "sys/fs/cgroup/user.slice/app.scope/memory.current": str(123 << 20),
    })
    got = limits.cgroup_memory(root)
    assert got["limit"] == GIB and got["kind"] == "v2" and got["path"] == "user.slice"
    assert got["usage"] == 123 << 20  # the process's own cgroup when the limiting one has none


def test_container_sees_a_host_path_and_reads_the_mount_root(tmp_path):
    """Inside a container /proc/self/cgroup may name the host's path; the mount is its own cgroup."""
    root = _tree(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/pod1/container\n",
        "sys/fs/cgroup/cgroup.controllers": "memory\n",
        "sys/fs/cgroup/memory.max": str(GIB),
    })
    assert limits.cgroup_memory(root)["limit"] == GIB


def test_unlimited_falls_back_to_system_memory(tmp_path):
    root = _tree(tmp_path, {
        "proc/self/cgroup": V1_CGROUP,
        "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": "9223372036854771712",
        "sys/fs/cgroup/unified/cgroup.controllers": "",  # v2 mounted without the memory controller
    })
    assert limits.cgroup_memory(root)["limit"] is None
    assert limits.memory_limit(root) == limits.system_memory_bytes()
    assert limits.memory_limit(tmp_path / "nothing") == limits.system_memory_bytes()


def test_rss_of_this_process_and_of_a_missing_one():
    rss, peak = limits.rss_bytes(), limits.peak_rss_bytes()
    assert rss and peak and 10 << 20 < rss <= peak
    assert limits.rss_bytes(2**22 + 7) is None


# Peak RSS growth of a fresh, warmed worker, measured by tests/load/memory_model.py (README, Limits
# and safety): the process estimate must stay above every one of them, with room for noise.
MEASURED_GROWTH_MIB = [
    (dict(width=256, batch=128, depth=8), 68.4),
    (dict(width=64, batch=8), 11.7),
    (dict(width=1024, batch=64), 68.7),
    (dict(width=2048, batch=16), 158.3),
    (dict(width=2048, batch=256, depth=2), 280.9),
    (dict(width=4096, batch=1, dtype="bfloat16"), 449.6),
    (dict(width=4096, batch=1), 455.0),
    (dict(model="seq_mixer", width=256, batch=16, seq=256), 150.2),
    (dict(model="transformer", width=512, batch=8, seq=128, heads=8, depth=2), 383.7),
    (dict(model="transformer", width=1024, batch=4, seq=256, heads=8), 539.1),
    (dict(width=1024, batch=512, depth=4, stack="loop", policy="nothing_saveable"), 194.5),
    (dict(model="transformer", width=256, batch=4, seq=64, depth=16, stack="loop"), 792.7),
    (dict(model="seq_mixer", width=512, batch=8, seq=128, depth=16, stack="loop", dtype="bfloat16"), 426.2),
]


def test_process_estimate_stays_above_every_measured_growth():
    from remat_lab.config import RunConfig, estimate_process_bytes

    for cfg, grown in MEASURED_GROWTH_MIB:
        estimate = estimate_process_bytes(RunConfig(**{"repeats": 3, "warmup": 1, **cfg})) / (1 << 20)
        assert estimate >= 1.2 * grown, (cfg, estimate, grown)

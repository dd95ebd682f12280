"""Compile-only devices of a named accelerator (GPU or TPU) that is not attached, and a quiet JAX start.

GPUs: the CUDA PJRT plugin compiles for the XLA ``GpuTargetConfig`` in ``target_specs/`` (or the
user's own); TPUs: libtpu makes a topology's devices. Nothing runs on them: programs are lowered on
``jax.ShapeDtypeStruct`` inputs placed on these devices and compiled. The plugin and libtpu write to
the native stderr when they load (no driver, no TPU here): ``quiet_native_stderr`` keeps that from
users and replays it when something fails.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from remat_lab.config import ConfigError, get_target
from remat_lab.config.targets import GPUS_PER_HOST

SPECS = Path(__file__).with_name("target_specs")
# What a compile-only run on a named target may add to a worker (backends started, a local run done,
# the machine's roofs calibrated; nothing of the model's size is allocated), measured 2026-12-02 on the
# default configuration (an 8-block width-1024 MLP) as peak RSS over the RSS before: the first H100
# compile +76 MiB (the GPU compiler's start), the first v5e one +213 MiB (libtpu's compiler loads at
# the first compile); a second, twice as wide, +20 and +3 MiB. The need: the first compile's share
# rounded up, and 64 MiB for the program (three times the larger second; bigger programs' texts).
# tests/test_targets.py measures it again.
COMPILE_ONLY_BYTES = {"cuda": (128 + 64) << 20, "tpu": (256 + 64) << 20}


def compile_only_bytes(name: str) -> int:
    """What a compile-only run for named target ``name`` may add to a worker (COMPILE_ONLY_BYTES)."""
    try:
        return COMPILE_ONLY_BYTES[get_target(name).platform]
    except KeyError:  # not a named target: the larger
        return max(COMPILE_ONLY_BYTES.values())


_LOCK = threading.Lock()
_DEVICES: dict[tuple[str, int, str | None, int], list] = {}

# libtpu's own lock: a process that loads libtpu without ALLOW_MULTIPLE_LIBTPU_LOAD takes a POSIX
# lock on this file and keeps it until it exits; a second such process cannot load libtpu at all
# ("Internal error when accessing libtpu multi-process lockfile"). With the variable set (the
# package sets it when no TPU is attached) libtpu takes no lock and processes share it.
LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
# The lab's own lock around a process's first libtpu load: lab processes load it one at a time,
# each waiting (at most this long) for a process that holds libtpu's lock to end.
TPU_INIT_LOCKFILE = os.path.join(tempfile.gettempdir(), "remat_lab_tpu_init.lock")
TPU_INIT_WAIT_S = 30.0
_TPU_INIT = threading.Lock()
_TPU_LOADED = False  # this process has loaded libtpu (its lock, when it took one, is its own)


def _shares_libtpu() -> bool:
    return os.environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD", "").strip().lower() in ("1", "true")


def lock_holder(path: str) -> int | None:
    """The id of another process that holds a lock on ``path`` (Linux ``/proc/locks``), or None."""
    try:
        st = os.stat(path)
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:  # "1: POSIX  ADVISORY  WRITE 9923 fe:00:2146362 0 EOF" ("->": a waiter)
        parts = line.split()
        if "->" not in parts and len(parts) >= 6 and parts[5] == where and parts[4].isdigit():
            if int(parts[4]) != os.getpid():
                return int(parts[4])
    return None


def process_name(pid: int) -> str:
    """``process 1234 (python -m remat_lab)``: the program and its module or script, no folders."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        args = []
    if not args:
        return f"process {pid}"
    words = [os.path.basename(args[0])]
    if len(args) > 2 and args[1] == "-m":
        words += ["-m", args[2]]
    elif len(args) > 1 and not args[1].startswith("-"):
        words.append(os.path.basename(args[1]))
    return f"process {pid} ({' '.join(words)[:80]})"


def _libtpu_busy(name: str, pid: int | None, waited: float, loader: int | None = None) -> ConfigError:
    """The error when libtpu's lock is held by process ``pid`` (``loader``: a lab process that holds
    the lab's lock, waiting for it too)."""
    who = process_name(pid) if pid else "another process"
    if loader is not None:
        who += f", for which {process_name(loader)} is waiting too"
    setting = os.environ.get("ALLOW_MULTIPLE_LIBTPU_LOAD")
    return ConfigError(
        f"cannot compile for {name} here: libtpu is in use by {who} (waited {waited:.0f} s). "
        "libtpu lets one process load it at a time unless ALLOW_MULTIPLE_LIBTPU_LOAD=1, which "
        "Remat Lab sets when no TPU is attached"
        + (f" (here it is {setting!r})" if setting is not None else " (here a TPU device is present)")
        + ". Wait for that process to end, or set ALLOW_MULTIPLE_LIBTPU_LOAD=1 for compile-only use.")


@contextlib.contextmanager
def _first_libtpu_load(name: str, wait_s: float):
    """Around this process's first libtpu load when libtpu is not shared: the lab's lock (one lab
    process loads at a time), then libtpu's own lock free of other processes, each waited for at
    most ``wait_s``; ``ConfigError`` naming the process that holds it."""
    import fcntl

    t0 = time.monotonic()
    with open(TPU_INIT_LOCKFILE, "a+") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() - t0 > wait_s:  # another lab process is loading libtpu
                    lock.seek(0)
                    text = lock.read().strip()
                    loader = int(text) if text.isdigit() else None
                    holder = lock_holder(LIBTPU_LOCKFILE)
                    raise _libtpu_busy(name, holder or loader, time.monotonic() - t0,
                                       loader if holder else None) from None
                time.sleep(0.1)
        try:
            lock.seek(0)
            lock.truncate()
            lock.write(str(os.getpid()))
            lock.flush()
            while (holder := lock_holder(LIBTPU_LOCKFILE)) is not None:
                if time.monotonic() - t0 > wait_s:
                    raise _libtpu_busy(name, holder, time.monotonic() - t0)
                time.sleep(0.1)
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)



@contextlib.contextmanager
def quiet_native_stderr():
    """File descriptor 2 to a temporary file for the block; written back if the block raises."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real fd 2
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        ok = False
        try:
            yield
            ok = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not ok:
                tmp.seek(0)
                sys.stderr.write(tmp.read().decode(errors="replace"))


def start_backend_quietly() -> None:
    """Start JAX's backends (plugin discovery prints to fd 2 when no GPU driver is present)."""
    import jax

    with quiet_native_stderr():
        jax.devices()


def config_text(name: str, path: str | None = None) -> str:
    """The ``GpuTargetConfig`` text of GPU target ``name`` (or of the user's file ``path``)."""
    if path is not None:
        try:
            return Path(path).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"the target config {Path(path).name} cannot be read ({err}).") from None
    target = get_target(name)
    return (SPECS / target.config_file).read_text()


def _factor2(n: int) -> tuple[int, int]:
    a = math.isqrt(n)
    while n % a:
        a -= 1
    return a, n // a


def _tpu_topology(topology: str, n: int) -> tuple[str, dict]:
    """The smallest libtpu topology of this generation with at least ``n`` devices."""
    gen, one_chip = topology.split(":")
    per_chip = 2 if gen == "v4" else 1  # compile-only v4 devices are TensorCores
    chips = max(1, math.ceil(n / per_chip))
    if one_chip.count("x") == 1:
        a, b = _factor2(chips)
        shape, name = (a, b, 1), f"{gen}:{a}x{b}"
    else:
        a, rest = _factor2(chips)
        b, c = _factor2(rest)
        shape = tuple(sorted((a, b, c), reverse=True))
        name = f"{gen}:{'x'.join(map(str, shape))}"
    # libtpu's default chips per host are 2x2x1: a smaller or odd shape needs its own bounds.
    kwargs = {"chips_per_host_bounds": shape} if any(d % h for d, h in zip(shape, (2, 2, 1))) else {}
    return name, kwargs


def _tpu_topology_desc(name: str, one_chip: str, n: int, slices: int = 1):
    """libtpu's topology for ``n`` devices per slice, ``slices`` slices (``num_slices``: libtpu's
    multi-slice devices, each with its ``slice_index``); this process's first load under
    ``_first_libtpu_load`` unless libtpu is shared (``ALLOW_MULTIPLE_LIBTPU_LOAD``)."""
    global _TPU_LOADED
    from jax.experimental import topologies

    topo_name, kwargs = _tpu_topology(one_chip, n)
    if slices > 1:
        kwargs["num_slices"] = slices
    with _TPU_INIT:
        if _TPU_LOADED or _shares_libtpu():
            topo = topologies.get_topology_desc(topo_name, "tpu", **kwargs)
        else:
            with _first_libtpu_load(name, TPU_INIT_WAIT_S):
                topo = topologies.get_topology_desc(topo_name, "tpu", **kwargs)
        _TPU_LOADED = True
    return topo


def granule(device) -> int:
    """The slice (TPU: ``slice_index``) or host (GPU, CPU: ``process_index``) of a device: what a
    collective crosses the slower network to leave."""
    if getattr(device, "platform", "") == "tpu":
        return int(getattr(device, "slice_index", 0) or 0)
    return int(device.process_index)


def target_devices(name: str, n: int = 1, config_file: str | None = None, slices: int = 1) -> list:
    """``n`` compile-only devices of target ``name`` (cached), over ``slices`` slices (TPU) or
    hosts (GPU) of ``n / slices`` each, in slice order; one slice: GPUs come in hosts of
    ``GPUS_PER_HOST``. ``ConfigError`` when the backend for it is missing or refuses."""
    key = (name, n, config_file, slices)
    with _LOCK:
        if key in _DEVICES:
            return list(_DEVICES[key])
    target = get_target(name)
    from jax.experimental import topologies

    try:
        with quiet_native_stderr():
            if target.platform == "cuda":
                if slices > 1:
                    hosts, per_host = slices, n // slices
                else:
                    hosts = math.ceil(n / GPUS_PER_HOST)
                    per_host = n // hosts if n % hosts == 0 else n
                    hosts = n // per_host
                topo = topologies.get_topology_desc(platform="cuda", topology_name="",
                                                    topology=f"1x{hosts}x{per_host}",
                                                    target_config=config_text(name, config_file))
            else:
                topo = _tpu_topology_desc(name, target.topology, n // slices, slices)
    except ConfigError:
        raise
    except Exception as err:  # plugin missing, a config the plugin refuses, libtpu locked
        if target.platform == "tpu" and "lockfile" in str(err):  # loaded between our look and its
            raise _libtpu_busy(name, lock_holder(LIBTPU_LOCKFILE), 0.0) from None
        package = "jax-cuda12-plugin" if target.platform == "cuda" else "libtpu"
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise ConfigError(f"cannot compile for {name} here ({first}); is {package} installed at "
                          "the version requirements.txt pins?") from None
    devices = list(topo.devices)[:n]
    if len(devices) < n:
        raise ConfigError(f"the {name} topology has {len(devices)} devices; {n} were asked for.")
    with _LOCK:
        _DEVICES[key] = devices
    return list(devices)

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
from pathlib import Path

from remat_lab.config import ConfigError, get_target

SPECS = Path(__file__).with_name("target_specs")
# What a compile-only run on a named target may add to a process: nothing of the model's size is
# allocated; measured +20 MiB for an H100 compile and +140 MiB for a first v5e one (libtpu loads) of
# an 8-block width-1024 MLP at batch 4096; twice the larger, for bigger programs' texts and dumps.
COMPILE_ONLY_BYTES = 320 << 20
_LOCK = threading.Lock()
_DEVICES: dict[tuple[str, int, str | None], list] = {}


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


def target_devices(name: str, n: int = 1, config_file: str | None = None) -> list:
    """``n`` compile-only devices of target ``name`` (cached); ``ConfigError`` when the backend for
    it is missing or refuses."""
    key = (name, n, config_file)
    with _LOCK:
        if key in _DEVICES:
            return list(_DEVICES[key])
    target = get_target(name)
    from jax.experimental import topologies

    try:
        with quiet_native_stderr():
            if target.platform == "cuda":
                hosts = math.ceil(n / 8)
                per_host = n // hosts if n % hosts == 0 else n
                hosts = n // per_host
                topo = topologies.get_topology_desc(platform="cuda", topology_name="",
                                                    topology=f"1x{hosts}x{per_host}",
                                                    target_config=config_text(name, config_file))
            else:
                topo_name, kwargs = _tpu_topology(target.topology, n)
                topo = topologies.get_topology_desc(topo_name, "tpu", **kwargs)
    except ConfigError:
        raise
    except Exception as err:  # plugin missing, a config the plugin refuses, libtpu locked
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

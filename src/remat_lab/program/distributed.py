"""Devices before JAX starts: emulated CPU devices (``--host-devices``) and ``jax.distributed``.

Both must be settled before JAX initialises its backends (the first ``jax.devices()`` or array):
the CLI calls ``setup`` first thing in ``main``, the app (and any worker process that runs
experiments) calls ``apply_env`` at start. Importing ``jax`` alone does not initialise a backend.
On GPU/TPU the host-device count changes only the CPU backend: the real devices are used.
"""

from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager

import jax

from remat_lab.config import ConfigError

HOST_DEVICES_ENV = "REMAT_LAB_HOST_DEVICES"
MAX_HOST_DEVICES = 512
MAX_PROCESSES = 1024
_XLA_COUNT = re.compile(r"--xla_force_host_platform_device_count=(\d+)")
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-]{1,253}:\d{1,5}$|^\[[0-9A-Fa-f:]{2,45}\]:\d{1,5}$")


def _initialised() -> bool:
    from jax._src import xla_bridge  # no public way to ask without initialising

    return bool(xla_bridge._backends)


def parse_host_devices(text: object) -> int:
    """A host-device count: a whole number from 1 to ``MAX_HOST_DEVICES``."""
    value = str(text).strip()
    # Plain decimal digits without leading zeros: "0000019999" must not pass as "00000" (a cut
    # taken to keep int() cheap) and then make 19,999 devices.
    plain = value.isascii() and value.isdigit() and len(value) <= 6 and not value.startswith("0")
    if not plain or not 1 <= int(value) <= MAX_HOST_DEVICES:
        raise ConfigError(f"host devices must be a whole number from 1 to {MAX_HOST_DEVICES}, "
                          f"not {value[:40]!r}.")
    return int(value)


def use_host_devices(n: int) -> None:
    """Emulate ``n`` CPU devices in this process (``jax_num_cpu_devices``); refused once JAX has
    started with another count. An ``XLA_FLAGS`` device count already set is left alone."""
    n = parse_host_devices(n)
    flag = _XLA_COUNT.search(os.environ.get("XLA_FLAGS", ""))
    if flag:
        if int(flag.group(1)) != n:
            raise ConfigError(f"XLA_FLAGS already asks for {flag.group(1)} host devices; "
                              f"{n} were asked for: set one of them.")
        return
    if _initialised():
        if jax.config.jax_num_cpu_devices == n or (n == 1 and jax.config.jax_num_cpu_devices < 0):
            return
        raise ConfigError(f"JAX has already started in this process; {n} host devices must be "
                          f"asked for before it starts (set {HOST_DEVICES_ENV} before launching).")
    jax.config.update("jax_num_cpu_devices", n)


def apply_env() -> int | None:
    """Apply ``$REMAT_LAB_HOST_DEVICES`` (for the app and worker processes); returns the count."""
    raw = os.environ.get(HOST_DEVICES_ENV, "").strip()
    if not raw:
        return None
    n = parse_host_devices(raw)
    use_host_devices(n)
    return n


def initialize(coordinator: str, num_processes: int, process_id: int) -> None:
    """Join a ``jax.distributed`` run of ``num_processes`` processes (CPU: gloo collectives)."""
    if not _ADDRESS.match(coordinator or ""):
        raise ConfigError(f"coordinator must be HOST:PORT (e.g. 127.0.0.1:12355), not "
                          f"{str(coordinator)[:40]!r}.")
    if not 1 <= num_processes <= MAX_PROCESSES:
        raise ConfigError(f"num processes must be from 1 to {MAX_PROCESSES}; got {num_processes}.")
    if not 0 <= process_id < num_processes:
        raise ConfigError(f"process id must be from 0 to {num_processes - 1}; got {process_id}.")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id)


def setup(host_devices: int | None = None, coordinator: str | None = None,
          num_processes: int | None = None, process_id: int | None = None) -> None:
    """The CLI's device flags: host devices (else ``$REMAT_LAB_HOST_DEVICES``), then
    ``jax.distributed`` when a coordinator is given. Call before anything touches a device."""
    if host_devices is not None:
        use_host_devices(host_devices)
    else:
        apply_env()
    given = [v is not None for v in (coordinator, num_processes, process_id)]
    if any(given) and not all(given):
        raise ConfigError("a multi-process run needs all of --coordinator HOST:PORT, "
                          "--num-processes P and --process-id I.")
    if all(given):
        initialize(coordinator, num_processes, process_id)


@contextmanager
def native_stdout_to_stderr():
    """Send what native code writes to file descriptor 1 (gloo's "[Gloo] Rank 0 is connected"
    lines) to stderr while the block runs, so stdout carries only the JSON document."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)

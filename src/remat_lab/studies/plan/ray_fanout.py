"""The planner's compiles on a Ray cluster: the same jobs as ``fanout``'s, one Ray task each."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Iterator
from pathlib import Path

from remat_lab.config import ConfigError, RunConfig
from remat_lab.studies.plan.fanout import compile_one, start_worker

# What a compile reads from its environment, passed to the cluster's workers as they are here.
ENV_PREFIXES = ("JAX_", "XLA_", "REMAT_LAB_", "TPU_", "LIBTPU", "ALLOW_MULTIPLE_LIBTPU_LOAD")


def _task(fields: dict, cache: bool) -> dict:
    start_worker(cache)
    return compile_one(fields)


def runtime_env() -> dict:
    """The lab's own package shipped to the cluster (its nodes need only its requirements) and the
    compile's environment variables."""
    import remat_lab

    package = str(Path(remat_lab.__file__).parent)
    return {"py_modules": [package], "excludes": ["__pycache__", "*.pyc"],
            "env_vars": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)}}


def reachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why the cluster head at ``[ray://]HOST:PORT`` cannot be reached, or None (``auto``: Ray
    finds it itself). Ray's own connect retries for minutes before it gives up."""
    if address == "auto":
        return None
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as err:
        return f"nothing answers at {host}:{port}: {err.strerror or type(err).__name__}" \
            if isinstance(err, OSError) else f"not HOST:PORT: {address[:80]!r}"
    return None


def _unjoined(address: str, why: str) -> ConfigError:
    return ConfigError(f"could not join the Ray cluster at {address[:80]!r} ({why}); start one with "
                       "'ray start --head' and give its head's host:port, or 'auto' on one of its "
                       "machines.")


class RayFanout:
    """Compiles as Ray tasks on the cluster at ``address`` (``host:port`` of its head, ``auto``
    for the one this machine belongs to), one CPU each; ``workers``: the cluster's CPUs, as many
    at a time. ``run`` and ``close`` as ``Fanout``'s."""

    def __init__(self, address: str, cache: bool = True) -> None:
        import ray

        self._ray, self.cache = ray, cache
        self._owned = not ray.is_initialized()
        if self._owned:
            why = reachable(address)
            if why:
                raise _unjoined(address, why)
            try:
                ray.init(address=address, runtime_env=runtime_env(), log_to_driver=False,
                         logging_level="ERROR", include_dashboard=False)
            except Exception as err:  # Ray raises ConnectionError, ValueError, RuntimeError...
                said = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
                raise _unjoined(address, said) from None
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = ray.remote(num_cpus=1, max_retries=0)(_task)

    def run(self, jobs: Iterable[tuple[object, RunConfig]]) -> Iterator[tuple[object, dict | Exception]]:
        """``(key, config)`` jobs compiled on the cluster; yields ``(key, figures)`` (or the
        exception the compile raised) as each ends."""
        ray = self._ray
        pending = {self._remote.remote(c.as_dict(), self.cache): k for k, c in jobs}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                key = pending.pop(ref)
                try:
                    yield key, ray.get(ref)
                except ray.exceptions.RayTaskError as err:
                    yield key, err.cause if isinstance(err.cause, Exception) else err
                except ray.exceptions.RayError as err:  # a worker or node lost: that compile failed
                    yield key, err

    def close(self) -> None:
        if self._owned:
            self._ray.shutdown()
            self._owned = False

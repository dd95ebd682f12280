"""Shared fixtures: small configurations and one cached run per configuration."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

from remat_lab.config import RunConfig
from remat_lab.studies.experiment import run_experiment

# The app's page modules (``from pages import _running, _shared, _sidebar``) import from the repository root.
if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)


@pytest.fixture(scope="session", autouse=True)
def _history_in_temp(tmp_path_factory):
    """Runs the tests complete (CLI ``run``, pages) are recorded in a throwaway history, never the
    developer's (``REMAT_LAB_HOME``; subprocesses and test servers inherit it)."""
    saved = os.environ.get("REMAT_LAB_HOME")
    os.environ["REMAT_LAB_HOME"] = str(tmp_path_factory.mktemp("remat_lab_home"))
    yield
    if saved is None:
        os.environ.pop("REMAT_LAB_HOME", None)
    else:
        os.environ["REMAT_LAB_HOME"] = saved
# The app's runs go to a worker process (remat_lab.serve.worker); the AppTest pages run them in-process
# instead, so tests can patch the engine. tests/test_worker.py and the e2e server use real workers.
os.environ.setdefault("REMAT_LAB_WORKERS", "0")
# Public mode is the default of a deployed app (store.history.public_mode); the tests (and their
# servers) see a private instance, as before, unless a test sets REMAT_LAB_PUBLIC itself.
os.environ.setdefault("REMAT_LAB_PUBLIC", "0")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n``, the project's default) a file's tests stay on one worker, so its
    module fixtures compile once, and the browser tests share one worker and one server."""
    for item in items:
        group = "browser" if item.get_closest_marker("e2e") else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(group))


@functools.lru_cache(maxsize=64)
def _run(config: RunConfig, timing: bool) -> dict:
    return run_experiment(config, timing=timing)


@pytest.fixture(scope="session")
def run():
    """``run(config, timing=False)``: the engine's result, computed once per configuration."""
    return lambda config, timing=False: _run(config, timing)


@pytest.fixture
def small() -> RunConfig:
    return RunConfig(width=32, batch=4, repeats=3, warmup=1)

"""Shared fixtures: small configurations and one cached run per configuration."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# A compile-time saving in every XLA compile of the run (this process, its workers, the CLI and
# worker subprocesses and the browser tests' servers inherit it through XLA_FLAGS): LLVM's
# optimisation off. The HLO passes, the buffer assignment, the memory analysis and the flop counts the
# lab reads are unchanged on every backend (tests/test_analysis_compile.py compiles against XLA's
# defaults to check it); only machine code is less optimised, and no test times it. (XLA 0.12's CPU
# backend has no classic fusion emitters any more: `--xla_cpu_use_fusion_emitters` is gone.) And the
# GPU compiles' autotuning off: it changes only the tiling in some fusions' backend_config, never an
# instruction, a buffer or a flop (the same test); an H100 llm compile takes 8.4 s instead of 13.7.
FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                "--xla_gpu_autotune_level=0")
if FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):  # before anything starts a JAX backend
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}".strip()
os.environ["REMAT_LAB_TEST_XLA_FLAGS"] = FAST_COMPILE  # for a test that runs without them

from remat_lab.config import RunConfig  # noqa: E402 - after XLA_FLAGS
from remat_lab.program import backend  # noqa: E402
from remat_lab.studies.experiment import run_experiment  # noqa: E402

# The app's page modules (``from pages import _running, _shared, _sidebar``) import from the repository root.
if (_root := str(Path(__file__).resolve().parents[1])) not in sys.path:
    sys.path.insert(0, _root)


_SHARED_CACHE = "REMAT_LAB_TEST_COMPILE_CACHE"  # set by the run's first process, inherited by the rest


def pytest_configure(config):
    """One persistent compile cache for the whole run, in a fresh folder: the workers, the CLI and
    worker subprocesses and the browser tests' servers compile each program once (tests that need
    a cache of their own set ``REMAT_LAB_CACHE_DIR`` themselves). Never the developer's cache."""
    path = os.environ.get(_SHARED_CACHE)
    if path is None:  # the controller, or a run without xdist: the folder is this process's to remove
        path = tempfile.mkdtemp(prefix="remat_lab_test_cache_")
        os.environ[_SHARED_CACHE] = config._remat_lab_cache = path
    os.environ["REMAT_LAB_CACHE_DIR"] = path
    backend.enable_compilation_cache(path)


def pytest_unconfigure(config):
    if getattr(config, "_remat_lab_cache", None):
        shutil.rmtree(config._remat_lab_cache, ignore_errors=True)
        os.environ.pop(_SHARED_CACHE, None)


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


@pytest.fixture(autouse=True)
def _apptest_session_ends():
    """Every AppTest runs as the same session ("test session id"), so what one test opened on the
    Open results page would still be open in the next: each test's session ends with the test, as a
    closed tab's does."""
    yield
    from remat_lab.store import upload_budget, uploads

    uploads.OPENED.end("test session id")
    upload_budget.BUDGET.take_refusals("test session id")


def _scan_installed_components_once() -> None:
    """Streamlit's ``AppTest`` scans every installed distribution's metadata for custom components
    on each new test app (``BidiComponentManager.discover_and_register_components``): about 0.3 s a
    test app on this machine (the URL fuzz test alone makes 200 apps). The installed packages do not
    change during a run, so the scan is done once per process and its answer reused (a real
    server scans once, at start-up)."""
    from streamlit.components.v2 import manifest_scanner

    scan = manifest_scanner.scan_component_manifests
    if not hasattr(scan, "cache_info"):  # Streamlit imports it from the module at each call
        manifest_scanner.scan_component_manifests = functools.cache(scan)


_scan_installed_components_once()


# The app's runs go to a worker process (remat_lab.serve.worker); the AppTest pages run them in-process
# instead, so tests can patch the engine. tests/test_worker.py and the e2e server use real workers.
os.environ.setdefault("REMAT_LAB_WORKERS", "0")
# Public mode is the default of a deployed app (store.history.public_mode); the tests (and their
# servers) see a private instance, as before, unless a test sets REMAT_LAB_PUBLIC itself.
os.environ.setdefault("REMAT_LAB_PUBLIC", "0")


# The slowest files, slowest first (each file's summed ``--durations=0``, 2 cores, a cold cache). Under
# pytest-xdist they are handed out first, so no worker is left alone with a long file at the end.
SLOW_FIRST = (
    "tests/e2e/test_app_e2e.py", "tests/test_compiled_truth.py", "tests/test_synthesize.py",
    "tests/test_tpu_memory.py", "tests/test_synthesize_tpu.py", "tests/test_predict.py",
    "tests/test_published.py", "tests/test_synthesize_llama3.py", "tests/test_maxtext_program.py",
    "tests/test_by_kind_buffers.py", "tests/test_llm_mesh.py", "tests/test_moe.py",
    "tests/test_targets_app.py", "tests/test_attention_twin.py",
    "tests/e2e/test_public_e2e.py", "tests/test_targets.py", "tests/e2e/test_page_state_e2e.py",
    "tests/test_reliability.py", "tests/test_llm.py", "tests/test_attention.py",
    "tests/e2e/test_results_e2e.py", "tests/test_transformer.py", "tests/test_gradcheck.py",
    "tests/test_app.py", "tests/e2e/test_begin_e2e.py", "tests/test_bench.py", "tests/test_engine.py",
    "tests/test_advisor.py", "tests/e2e/test_layout_e2e.py", "tests/test_worker.py", "tests/test_sharding.py",
)


def pytest_collection_modifyitems(config, items):
    """The slowest files first (a stable sort: each file's own order is kept)."""
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under ``-p no:xdist``
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (``-n``, the project's default) each file is one unit of work on one worker,
    so its module fixtures compile once, handed out in collection order (the slowest files first).
    The browser tests are one unit: one worker starts the session's Streamlit server and Chromium
    once, instead of each worker starting its own (each server imports the engine and warms a JAX
    worker process; each browser compiles the app's JavaScript).
    xdist's own ``loadgroup`` marks no longer group anything under pytest 9 (they rename
    ``item._nodeid``, which pytest 9 no longer reads): every module fixture compiled once per worker."""
    if config.getvalue("dist") != "loadfile":  # the project's default; another --dist is the user's
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/e2e" if path.startswith("tests/e2e/") else path

    config.option.loadscopereorder = False  # keep SLOW_FIRST's order, not the test count's
    return ByFile(config, log)


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

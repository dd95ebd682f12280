"""A lean web server: the Streamlit process loads neither the CUDA plugin nor libtpu and starts no JAX
backend (the workers do), and a public server's refusals name no command-line flag or environment variable.

The server check runs the app's router (``app.py``, Explore and its default run) under AppTest in a
fresh process with one worker, as ``streamlit run`` would, then compiles for an H100 through the same
pool: the worker loads the plugin the server refused.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from remat_lab.config import ConfigError, MemoryBudgetError, RunConfig, check_budget
from remat_lab.serve import safe_text

ROOT = Path(__file__).resolve().parents[1]
SETTING = re.compile(r"(?<![\w-])--[a-z][\w-]*|REMAT_LAB_[A-Z_]+")

SERVER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, os.getcwd())
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(os.path.join(os.getcwd(), "app.py"), default_timeout=600).run()
    from remat_lab.config import RunConfig
    from remat_lab.serve import worker
    h100 = RunConfig(width=16, batch=2, depth=1, target="h100")  # compile-only, in the worker
    done = worker.shared_pool().call("run", {"config": h100.as_dict()}, key=h100)
    from jax._src import xla_bridge
    import gc
    print(json.dumps({
        "frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
        "exceptions": [str(e.value)[:300] for e in at.exception],
        "errors": [e.value[:300] for e in at.error],
        "plugins": sorted(m for m in sys.modules if m.split(".")[0] in ("jax_plugins", "libtpu")
                          or m.startswith(("jax_cuda", "jax_rocm"))),
        "backends": sorted(getattr(xla_bridge, "_backends", {})),
        "h100": (done.get("target") or {}).get("name") or done["config"]["target"],
        "h100_peak": done["memory"]["peak_bytes"],
    }))
    worker.shared_pool().close()
""")


@pytest.mark.slow
def test_the_server_process_loads_no_accelerator_plugin_and_starts_no_backend():
    env = {**os.environ, "REMAT_LAB_WORKERS": "1", "REMAT_LAB_PUBLIC": "1", "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", SERVER], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert not seen["exceptions"] and not seen["errors"], seen
    assert seen["plugins"] == [], seen["plugins"]  # jax_plugins, jax_cuda12_plugin, libtpu: none
    assert not {"cuda", "gpu", "rocm", "tpu"} & set(seen["backends"]), seen["backends"]
    assert seen["backends"] == []  # no JAX backend at all: the worker answers device questions
    assert seen["h100"] == "h100" and seen["h100_peak"] > 0  # the worker still loads the plugin
    # the modules the server imported are frozen (pages/__init__.py): Streamlit's collection after
    # every script run walks only what the runs left, a small part of the heap
    assert seen["frozen"] > 3 * seen["tracked"], seen


def test_keep_out_makes_the_plugins_look_not_installed_only_when_workers_run_the_jobs():
    code = textwrap.dedent("""
        import importlib.util, json, sys
        sys.path.insert(0, ".")
        spec = importlib.util.spec_from_file_location("lean", "pages/_lean_server.py")
        lean = importlib.util.module_from_spec(spec); spec.loader.exec_module(lean)
        on = lean.keep_out({"REMAT_LAB_WORKERS": sys.argv[1]})
        import jax, jax.numpy as jnp
        float(jnp.ones(3).sum())  # JAX still works, on the CPU
        print(json.dumps([on, sorted(m for m in sys.modules if m.startswith(("jax_cuda", "libtpu",
                                                                             "jax_plugins")))]))
    """)
    seen = {}
    for workers in ("1", "0"):
        out = subprocess.run([sys.executable, "-c", code, workers], cwd=ROOT, capture_output=True,
                             text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
        assert out.returncode == 0, out.stderr[-2000:]
        seen[workers] = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["1"] == [True, []]
    assert seen["0"][0] is False  # jobs in this process (AppTest, REMAT_LAB_WORKERS=0): untouched


def _refusals() -> list[str]:
    """Refusals the engine gives for what a web visitor can ask, each naming a setting for the CLI."""
    out = []
    try:
        check_budget(RunConfig(width=4096, batch=4096), 1 << 20)
    except MemoryBudgetError as err:
        out.append(str(err))
    from remat_lab.model import user_block

    before = os.environ.get("REMAT_LAB_PUBLIC")
    os.environ["REMAT_LAB_PUBLIC"] = "1"
    try:
        user_block.refuse_if_public()
    except ConfigError as err:
        out.append(str(err))
    finally:
        os.environ["REMAT_LAB_PUBLIC"] = before if before is not None else "0"
    from remat_lab.program import mesh

    try:
        mesh.build_mesh("fsdp=64")
    except ConfigError as err:
        out.append(str(err))
    return out


def test_a_public_servers_refusals_name_no_flag_or_variable():
    refusals = _refusals()
    assert len(refusals) == 3 and all(SETTING.search(t) for t in refusals), refusals
    for text in refusals:
        shown = safe_text.for_visitor(text, public=True)
        assert not SETTING.search(shown), shown
        assert len(shown) > 30 and shown.endswith("."), shown
        assert safe_text.for_visitor(text, public=False) == text  # its owner reads which setting
    assert safe_text.for_visitor(refusals[0], public=True).endswith("lower width, batch, seq or depth.")
    from remat_lab.serve import in_worker

    before = os.environ.get("REMAT_LAB_PUBLIC")
    os.environ["REMAT_LAB_PUBLIC"] = "1"
    try:
        with pytest.raises(ConfigError) as err:
            in_worker.execute("run", {"config": {**RunConfig().as_dict(), "model": "user",
                                                 "model_module": "x.py:f",
                                                 "input_shape": f"{RunConfig().batch},8"}}, print)
    finally:
        os.environ["REMAT_LAB_PUBLIC"] = before if before is not None else "0"
    assert not SETTING.search(str(err.value)) and "public server" in str(err.value)


@pytest.mark.parametrize("public", ["1", "0"])
def test_the_red_box_of_a_public_server_names_no_flag(monkeypatch, public):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    (text,) = _refusals()[:1]
    monkeypatch.setenv("REMAT_LAB_PUBLIC", public)

    def page(message, root):
        import sys as _sys

        _sys.path.insert(0, root)
        from pages import _running
        from remat_lab.config import MemoryBudgetError as _Refused

        _running.show_error(_Refused(message))

    at = AppTest.from_function(page, args=(text, str(ROOT)), default_timeout=120).run()
    (box,) = at.error
    assert "This configuration cannot run" in box.value
    assert ("--memory-budget" in box.value) == (public == "0"), box.value
    assert ("REMAT_LAB_MEMORY_BUDGET" in box.value) == (public == "0"), box.value


def test_comparing_on_a_mesh_is_a_worker_job():
    """Compare's mesh table compiles every policy: the worker's job now (``mesh_table``), not the server's."""
    code = textwrap.dedent("""
        import json
        from remat_lab.config import RunConfig
        from remat_lab.serve.in_worker import execute
        cfg = RunConfig(width=16, batch=4, depth=1, mesh="fsdp=2")
        rows = execute("mesh_table", {"config": cfg.as_dict(), "policies": ["no_remat", "nothing_saveable"]},
                       print)
        print(json.dumps([[r["policy"], r["peak_bytes"]] for r in rows]))
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"),
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert [p for p, _ in rows] == ["no_remat", "nothing_saveable"] and all(b > 0 for _, b in rows)

"""Security: no user input reaches eval/exec/a shell, names resolve through the registries only,
the Streamlit server keeps XSRF protection on and usage statistics off, files are written only to
the cache directory and temp, and every dependency is pinned."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from remat_lab.config import ConfigError, RunConfig, coerce_config
from remat_lab.model.models import MODELS
from remat_lab.model.policies import POLICIES, get_policy

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted([ROOT / "app.py", *(ROOT / "pages").glob("*.py"),
                  *(ROOT / "src" / "remat_lab").rglob("*.py")])

DANGEROUS_CALLS = {"eval", "exec", "compile", "__import__", "execfile"}
DANGEROUS_ATTRS = {("os", "system"), ("os", "popen"), ("os", "execv"), ("os", "execvp"),
                   ("os", "spawnl"), ("pickle", "loads"), ("pickle", "load"), ("marshal", "loads"),
                   ("yaml", "load"), ("shelve", "open"), ("dill", "loads"), ("cloudpickle", "loads")}


def dangerous_calls(source: str) -> list[str]:
    """``name(line)`` for every eval/exec/shell/unpickling call in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            found += [f"import {n}({node.lineno})" for n in names
                      if n.split(".")[0] in ("pickle", "marshal", "shelve", "dill", "cloudpickle")]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in DANGEROUS_CALLS:
            found.append(f"{func.id}({node.lineno})")
        if isinstance(func, ast.Attribute):
            base = func.value.id if isinstance(func.value, ast.Name) else ""
            if (base, func.attr) in DANGEROUS_ATTRS:
                found.append(f"{base}.{func.attr}({node.lineno})")
            if base == "subprocess" or func.attr in ("Popen", "run", "call", "check_output",
                                                      "check_call"):
                for kw in node.keywords:
                    if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant)
                                                  and kw.value.value is False):
                        found.append(f"{base}.{func.attr}(shell=...)({node.lineno})")
    return found


def test_the_scanner_finds_what_it_looks_for():
    bad = ("import pickle\neval(x)\nexec(y)\nos.system(c)\nsubprocess.run(c, shell=True)\n"
           "pickle.loads(b)\n__import__(m)\n")
    assert len(dangerous_calls(bad)) == 7
    assert dangerous_calls("subprocess.run(['ls'], shell=False)\nfoo.evaluate(x)\n") == []


# bench.py (benchmarks, not reachable from the app or `run`/`explain`) copies results the way
# st.cache_data does: pickle.dumps of its own in-process result, then pickle.loads of those bytes.
# Never data from a user, a file or the network.
ALLOWED_DANGEROUS = {"bench.py": {"import pickle", "pickle.loads"}}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_eval_exec_shell_or_unpickling(path):
    found = {f.rsplit("(", 1)[0] for f in dangerous_calls(path.read_text())}
    assert found <= ALLOWED_DANGEROUS.get(path.name, set()), dangerous_calls(path.read_text())


def test_sources_are_scanned():
    names = {str(p.relative_to(ROOT)) for p in SOURCES}  # the engine's layers are sub-packages
    assert {"app.py", "pages/_sidebar.py", "pages/_running.py", "pages/_shared.py", "pages/explore.py",
            "src/remat_lab/config/run.py", "src/remat_lab/studies/experiment.py",
            "src/remat_lab/cli/__init__.py"} <= names


def test_no_plain_text_eval_or_shell_either():
    """A text grep as a second net (catches e.g. ``getattr(builtins, 'eval')`` spelled out)."""
    pattern = re.compile(r"\beval\(|\bexec\(|os\.system|shell\s*=\s*True|pickle\.loads")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in SOURCES
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)
            and not (p.name == "bench.py" and "pickle.loads(store[key])" in line)]
    assert hits == []


# ---------------------------------------------------------------- names only through registries


@pytest.mark.parametrize("name", ["checkpoint_dots", "save_any_names_but_these", "__class__",
                                  "__init__", "os.system('id')", "nothing_saveable()",
                                  "jax.checkpoint_policies.nothing_saveable", "", "NO_REMAT"])
def test_policy_names_resolve_through_the_registry_only(name):
    with pytest.raises(ConfigError, match="unknown policy"):
        RunConfig(policy=name)
    with pytest.raises(ConfigError, match="unknown policy"):
        coerce_config({"policy": name})
    with pytest.raises(KeyError):
        get_policy(name)


@pytest.mark.parametrize("name", ["MLP", "SeqMixer", "__class__", "build_model", "resnet", ""])
def test_model_names_resolve_through_the_registry_only(name):
    with pytest.raises(ConfigError, match="unknown model"):
        RunConfig(model=name)


def test_every_registry_name_is_accepted():
    for pid in POLICIES:
        assert RunConfig(policy=pid).policy == pid
    for model in MODELS:
        assert RunConfig(model=model).model == model


def test_policy_lookup_is_a_dict_lookup():
    """No getattr on a user-supplied name: step.py resolves policies via get_policy only."""
    for name in ("program/step.py", "model/models.py", "model/policies.py"):
        tree = ast.parse((ROOT / "src" / "remat_lab" / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "getattr":
                assert isinstance(node.args[1], ast.Constant), (name, node.lineno)


# ---------------------------------------------------------------- server configuration


def test_streamlit_config_keeps_xsrf_on_and_usage_stats_off():
    with open(ROOT / ".streamlit" / "config.toml", "rb") as fh:
        cfg = tomllib.load(fh)
    assert cfg["server"]["enableXsrfProtection"] is True
    assert cfg["browser"]["gatherUsageStats"] is False
    assert cfg["server"].get("enableCORS", True) is True


# ---------------------------------------------------------------- files written


def test_files_are_written_only_to_the_cache_directory_and_temp(tmp_path):
    """A CLI run with the default cache location writes under $XDG_CACHE_HOME/remat_lab only."""
    home, xdg, tmp, cwd = (tmp_path / n for n in ("home", "xdg", "tmp", "cwd"))
    for d in (home, xdg, tmp, cwd):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "REMAT_LAB_CACHE_DIR"}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(xdg), TMPDIR=str(tmp),
               PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-m", "remat_lab", "explain", "--width", "16", "--batch",
                           "2", "--no-jaxpr"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written, "the compilation cache should have been written"
    outside = [p for p in written if not (p.is_relative_to(xdg / "remat_lab")
                                          or p.is_relative_to(tmp))]
    assert outside == []
    assert not any(cwd.iterdir()) and not any(home.iterdir())


WRITE_CALLS = {"makedirs", "mkdir", "write_text", "write_bytes", "mkdtemp", "mkstemp",
               "NamedTemporaryFile", "TemporaryDirectory", "rename", "replace", "remove", "unlink",
               "rmtree", "copy", "copyfile", "move", "dump", "to_csv", "to_json", "to_parquet",
               "savefig", "write_image", "save"}


def _writes(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "open":
            mode = node.args[1] if len(node.args) > 1 else next(
                (k.value for k in node.keywords if k.arg == "mode"), None)
            if mode is not None and not (isinstance(mode, ast.Constant) and set(mode.value) <= set("rbt")):
                out.append(f"open({node.lineno})")
        elif name in WRITE_CALLS:
            # to_csv()/to_json() with no path return a string (download buttons): not a write.
            if name in ("to_csv", "to_json") and not node.args and not any(
                    k.arg in ("path_or_buf", "path") for k in node.keywords):
                continue
            if name in ("replace", "copy", "remove", "rename") and isinstance(
                    func, ast.Attribute) and not (isinstance(func.value, ast.Name)
                                                  and func.value.id in ("os", "shutil")):
                continue  # str.replace, dict.copy, RunConfig.replace, list.remove
            if name == "dump" and not (isinstance(func, ast.Attribute) and isinstance(
                    func.value, ast.Name) and func.value.id in ("json", "pickle")):
                continue
            out.append(f"{name}({node.lineno})")
    return out


# Every file-writing call in the app and the engine, and where it writes.
ALLOWED_WRITES = {
    # the compilation cache directory (REMAT_LAB_CACHE_DIR): created, its least recently used entries deleted
    "backend.py": {"makedirs", "remove"},
    # benchmarks: a throwaway compilation cache made by mkdtemp and deleted afterwards
    "bench.py": {"mkdtemp", "copyfile", "rmtree"},  # its throwaway cache; the calibration copied in
    # the machine's calibrated roofs: calibration.json in the compilation cache directory
    "roofline.py": {"makedirs", "write_text", "replace"},
    # the memory timeline: XLA's dump of one compile, into a mkdtemp folder deleted afterwards
    "timeline.py": {"mkdtemp", "rmtree", "makedirs", "open", "replace"},  # + dumps in the cache dir
    # the run history: its directory ($REMAT_LAB_HOME); sqlite3 writes history.sqlite3 there
    "history.py": {"mkdir"},
    # sweep --out FILE.jsonl, the file the user names: rows appended (cli.py), a cut last line cut off
    "sweep.py": {"open"},  # cli/sweep.py opens it, studies/sweep.py locks and repairs it
    # the CLI under jax.distributed: stdout of the non-zero processes to os.devnull
    "devices.py": {"open"},
    # the Advisor's Stop: an empty flag file in the temp directory (server-made name), removed after
    "_advisor_run.py": {"unlink", "touch"},
    # a TPU target's first libtpu load: the lab's lock file in the temp directory (a fixed name, its
    # holder's pid written in it) when libtpu is not shared (program/targets.py)
    "targets.py": {"open"},
}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_file_writes_are_only_the_known_ones(path):
    kinds = {w.split("(")[0] for w in _writes(path)}
    assert kinds <= ALLOWED_WRITES.get(path.name, set()), _writes(path)


# ---------------------------------------------------------------- pinned dependencies

PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!-]+$")


@pytest.mark.parametrize("name", sorted(p.name for p in ROOT.glob("requirements*.txt")))
def test_every_requirement_is_pinned(name):
    lines = (ROOT / name).read_text().splitlines()
    assert lines
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        text = text.split(" #")[0].strip()
        ok = PIN.match(text) or re.match(r"^-r \S+\.txt$", text) or text == "-e ."
        assert ok, f"{name}: {line!r} is not pinned (name==version, -r, -e . or a comment)"


def test_requirements_files_exist_and_chain():
    dev = (ROOT / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in dev and "hypothesis==" in dev

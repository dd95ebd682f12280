"""The house's shape: layers that import only downward, no import circle, short modules, one-line docs.

The import graph is built by grimp (import-linter's engine: it reads every ``import`` statement with
``ast``, those inside functions included). The layers are the ``[tool.importlinter]`` contract in
``pyproject.toml``; this test reads them from there, so the contract and the test cannot drift.
"""

from __future__ import annotations

import ast
import shutil
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "remat_lab"
MAX_MODULE_LINES = 400
MAX_PAGE_LINES = 250


def contract_layers() -> list[str]:
    """The layers contract of pyproject.toml, top first (``a | b``: independent siblings)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (layers,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return layers["layers"]


def graph_of(src: Path) -> grimp.ImportGraph:
    """The import graph of the ``remat_lab`` package found under ``src`` (a fresh process's view)."""
    sys.path.insert(0, str(src))
    saved = {k: v for k, v in sys.modules.items() if k == "remat_lab" or k.startswith("remat_lab.")}
    for k in saved:
        del sys.modules[k]
    try:
        return grimp.build_graph("remat_lab", cache_dir=None)
    finally:
        sys.path.remove(str(src))
        for k in [k for k in sys.modules if k == "remat_lab" or k.startswith("remat_lab.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def upward_imports(graph: grimp.ImportGraph) -> list[str]:
    """Every import that points up a layer or across independent siblings, as ``a -> b``."""
    layers = [grimp.Layer(*(f"remat_lab.{n.strip()}" for n in line.split("|")), independent=True)
              for line in contract_layers()]
    bad = graph.find_illegal_dependencies_for_layers(layers=layers)
    return sorted(f"{d.importer} -> {d.imported}" for d in bad)


def cycles(graph: grimp.ImportGraph) -> list[tuple[str, ...]]:
    """Every import circle: a direct import ``a -> b`` with a chain back ``b -> ... -> a``."""
    found = set()
    for a in graph.modules:
        for b in graph.find_modules_directly_imported_by(a):
            back = graph.find_shortest_chain(importer=b, imported=a)
            if back:
                found.add(tuple(sorted({a, *back})))
    return sorted(found)


@pytest.fixture(scope="module")
def graph():
    return graph_of(ROOT / "src")


def test_every_engine_package_is_in_a_layer(graph):
    named = {f"remat_lab.{n.strip()}" for line in contract_layers() for n in line.split("|")}
    top = {m for m in graph.modules if m.count(".") == 1 and m != "remat_lab.__main__"}
    assert top == named, "each module of remat_lab lives in one of the contract's layers"


def test_imports_point_down_the_layers(graph):
    assert upward_imports(graph) == []


def test_no_import_circle(graph):
    assert cycles(graph) == []


def test_the_checks_catch_an_upward_import_and_a_circle(tmp_path):
    """A copy of the package with ``config`` importing ``studies`` (up five layers): both checks
    must fail on it, so a green result above means something."""
    shutil.copytree(PACKAGE, tmp_path / "remat_lab", ignore=shutil.ignore_patterns("__pycache__"))
    catalog = tmp_path / "remat_lab" / "config" / "catalog.py"
    catalog.write_text(catalog.read_text() + "\nfrom remat_lab.studies import experiment  # noqa\n")
    bad = graph_of(tmp_path)
    assert "remat_lab.config -> remat_lab.studies" in upward_imports(bad)
    assert any("remat_lab.config.catalog" in c and "remat_lab.studies.experiment" in c for c in cycles(bad))


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _modules(PACKAGE), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_engine_module_is_short_and_says_its_job(path):
    text = path.read_text()
    assert len(text.splitlines()) <= MAX_MODULE_LINES, "a module this long usually does two jobs"
    doc = ast.get_docstring(ast.parse(text))
    assert doc and doc.splitlines()[0].strip().endswith((".", ":", ")")), "a one-line docstring first"


@pytest.mark.parametrize("path", [ROOT / "app.py", *_modules(ROOT / "pages")], ids=lambda p: p.name)
def test_page_is_thin(path):
    assert len(path.read_text().splitlines()) <= MAX_PAGE_LINES


def test_the_engine_knows_nothing_of_streamlit(graph):
    for module in graph.modules:
        if module.startswith("remat_lab"):
            imported = {m.split(".")[0] for m in graph.find_modules_directly_imported_by(module)}
            assert "streamlit" not in imported, module


def test_no_page_shadows_the_standard_library():
    """A page script named like a standard-library module (``inspect.py``) shadows it wherever
    ``pages/`` is on the path: an AppTest of a page then cannot start its worker."""
    import sys

    pages = {p.stem for p in (Path(__file__).resolve().parents[1] / "pages").glob("*.py")}
    assert not pages & set(sys.stdlib_module_names), pages & set(sys.stdlib_module_names)


def test_every_routed_page_has_its_address_in_streamlits_legacy_mode_too():
    """A cold server's first requests can run in Streamlit's legacy ``pages/`` mode, which names a
    page by its file (a leading number dropped): a routed page whose file gives another address
    answers a shared link with "Page not found" (the router's default page is served at ``/``)."""
    import re

    from streamlit.source_util import page_icon_and_name

    root = Path(__file__).resolve().parents[1]
    routed = re.findall(r'st\.Page\("(pages/[^"]+)"[^)]*?url_path="([^"]+)"(,\s*default=True)?',
                        (root / "app.py").read_text())
    assert len(routed) >= 10, routed
    for path, url_path, default in routed:
        assert (root / path).exists(), path
        if not default:
            assert page_icon_and_name(root / path)[1] == url_path, (path, url_path)

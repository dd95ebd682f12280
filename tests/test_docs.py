"""README.md and docs/: a short README, tables equal to their files, every doc linked, no broken link."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
ISSUE = re.compile(r"\bissues? \d+|#\d+\b", re.I)


def _tables():
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "benchmarks" / "doc_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _documents() -> list[Path]:
    return [README, *DOCS, *[p for p in (ROOT / "CHANGELOG.md",) if p.exists()]]


def _outside_code(text: str) -> str:
    """``text`` without fenced or indented code blocks and inline code (links there are not links)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = "\n".join(line for line in text.splitlines() if not line.startswith("    "))
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_the_readme_is_short_names_no_issue_and_opens_on_the_two_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 200, len(lines)
    assert not ISSUE.search(text), ISSUE.search(text)
    first_screen = "\n".join(lines[:20])
    assert ("    python3.12 -m venv .venv && .venv/bin/pip install -r requirements.txt && "
            "REMAT_LAB_PUBLIC=0 .venv/bin/streamlit run app.py") in first_screen
    assert ("    python3.12 -m venv .venv && .venv/bin/pip install -r requirements-dev.txt && "
            ".venv/bin/python -m pytest") in first_screen
    assert "rematerialization" in lines[2] or "rematerialization" in lines[3]


def test_ci_runs_the_readmes_test_command_verbatim():
    command = next(line.strip() for line in README.read_text().splitlines()
                   if line.startswith("    ") and "requirements-dev.txt" in line)
    assert command in (ROOT / ".ci" / "run").read_text()


def test_no_section_title_names_an_issue():
    for path in _documents():
        for heading in re.findall(r"^#{1,6} (.+)$", path.read_text(), flags=re.M):
            assert not ISSUE.search(heading), (path.name, heading)


def test_every_doc_is_linked_from_the_readme_or_another_doc():
    for doc in DOCS:
        linking = [p.name for p in _documents() if p != doc
                   for target in LINK.findall(_outside_code(p.read_text()))
                   if (p.parent / target.split("#")[0]).resolve() == doc.resolve()]
        assert linking, f"docs/{doc.name} is linked from no other document"


def test_no_relative_link_or_anchor_is_broken():
    checked = 0
    for path in _documents():
        for target in LINK.findall(_outside_code(path.read_text())):
            if re.match(r"[a-z]+:", target) or target.startswith("/"):
                continue  # a web address, or a path of the running app
            file, _, anchor = target.partition("#")
            linked = (path.parent / file).resolve() if file else path
            assert linked.exists(), f"{path.name}: {target} does not exist"
            if anchor and linked.suffix == ".md":
                assert anchor in _anchors(linked), f"{path.name}: {target}: no such heading"
            checked += 1
    assert checked > 10


def test_images_are_there_and_small():
    images = {(p.parent / t).resolve() for p in _documents() for t in LINK.findall(p.read_text())
              if t.endswith(".png")}
    assert len(images) >= 3
    for image in images:
        assert image.exists() and image.stat().st_size < 400 * 1024, image


def test_every_generated_table_equals_its_file():
    tables = _tables()
    assert tables.stale() == [], "run python benchmarks/doc_tables.py"
    names = {m for p in _documents() for m in re.findall(r"<!-- table:([a-z0-9-]+):start -->", p.read_text())}
    loads = {n for n in names if n.startswith("load-")}  # a load benchmark's rows, by its file
    data = {n for n in names if n.startswith("data-")}  # a measurement's rows kept in docs/data
    assert names - loads - data == set(tables.TABLES)  # every table is somewhere, nothing else is one
    assert all((ROOT / "tests" / "load" / f"{n[len('load-'):]}.json").exists() for n in loads)
    assert {f"data-{p.stem}" for p in (ROOT / "docs" / "data").glob("*.json")} == data  # none unused
    assert "issue" not in " ".join(tables.table_load(ROOT, n[len("load-"):]) for n in loads).lower()


def test_the_readmes_cli_lines_parse():
    from remat_lab.cli import build_parser

    lines = [line.strip() for line in README.read_text().splitlines()
             if line.strip().startswith("python -m remat_lab ")]
    assert len(lines) >= 6
    for line in lines:
        build_parser().parse_args(shlex.split(line)[3:])


def _tmp_root(tmp_path: Path) -> Path:
    """A copy of what the generator reads, for changing a file and seeing the table disagree."""
    for part in ("benchmarks/published_checks", "benchmarks/tpu_step_model"):
        shutil.copytree(ROOT / part, tmp_path / part, ignore=shutil.ignore_patterns("*.gz"))
    (tmp_path / "src/remat_lab/config").mkdir(parents=True)
    for name in ("targets.json", "published.json"):
        shutil.copy(ROOT / "src/remat_lab/config" / name, tmp_path / "src/remat_lab/config" / name)
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "published.md", tmp_path / "docs" / "published.md")
    shutil.copytree(ROOT / "docs" / "data", tmp_path / "docs" / "data")
    shutil.copy(README, tmp_path / "README.md")
    return tmp_path


def test_a_table_disagrees_when_its_file_changes(tmp_path):
    tables = _tables()
    root = _tmp_root(tmp_path)
    chip = ROOT / tables.CHIP
    if chip.exists():
        (root / tables.CHIP).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(chip, root / tables.CHIP)
    assert tables.stale(root) == []
    path = root / "benchmarks/published_checks/llama2-7b-a3-1host.json"
    doc = json.loads(path.read_text())
    doc["predicted_s"] *= 1.5  # 0.886x becomes 1.33x: the row and the error summary change
    path.write_text(json.dumps(doc))
    assert tables.stale(root) == ["docs/published.md"]
    text = tables.rewrite((root / "docs/published.md").read_text(), root)
    assert "1.898 s (1.330×)" in text and "one of the seventeen is outside 20 %" in text


def test_the_chip_tables_come_from_its_jsonl_and_say_when_there_is_none(tmp_path):
    tables = _tables()
    assert tables.table_chip(tmp_path) == tables.table_chip_short(tmp_path) == (
        "No chip catalogue yet: `benchmarks/chip/tpu-v5e.jsonl` is not there.")
    line = {"name": "mlp-1024", "args": ["--model", "mlp", "--width", "1024"], "held_out": True,
            "measured": {"device_kind": "TPU v5 lite", "jax": "0.12.0.1", "date": "2026-12-07 15:00 UTC",
                         "step_s": 0.0125, "step_p25": 0.0124, "step_p75": 0.0127,
                         "allocator_peak_bytes": 3 * 2**30, "compiled_peak_bytes": 2.5 * 2**30,
                         "flops": 1.5e12},
            "deviceless": {"jax": "0.12.0.1", "peak_bytes": 2.5 * 2**30, "flops": 1.5e12,
                           "predicted_s": 0.0150, "bound_s": 0.0100}}
    path = tmp_path / tables.CHIP
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(line) + "\n")
    full, short = tables.table_chip(tmp_path), tables.table_chip_short(tmp_path)
    assert "Measured on TPU v5 lite (2026-12-07, JAX 0.12.0.1)" in full
    row = full.splitlines()[-1]
    assert row.startswith("| `mlp-1024` | `--model mlp --width 1024` | yes | 12.50 ms (12.40 ms–12.70 ms)")
    assert "15.00 ms (1.200×)" in row and "10.00 ms (0.800×)" in row
    assert "| 2.50 GiB | 3.00 GiB | 2.50 GiB | 1.500e+12 / 1.500e+12 |" in row
    assert short.splitlines()[-1] == ("| `mlp-1024` (held out) | 12.50 ms | 15.00 ms (1.200×) | 2.50 GiB "
                                      "| 3.00 GiB |")


def test_an_unknown_table_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown table 'nope'"):
        _tables().rewrite("<!-- table:nope:start -->\n<!-- table:nope:end -->")


def test_the_guide_page_shows_the_docs_words_and_keeps_no_copy():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    from pages import _docs

    sections = [_docs.section("guide.md", name) for name in ("timeline", "reading")]
    for text in sections:
        assert text.startswith("### ") and not text.startswith("*This part")
        relative = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:|/", t)]
        assert not relative, relative  # a docs-relative link would be broken in the app
    at = AppTest.from_file(str(ROOT / "pages" / "guide.py"), default_timeout=120).run()
    assert not at.exception, at.exception
    shown = [m.value for m in at.markdown]
    assert all(text in shown for text in sections)
    page = (ROOT / "pages" / "guide.py").read_text()
    assert "The batch-dims rule" not in page and "Memory over the program** chart" not in page


def test_a_missing_docs_section_is_said_not_raised():
    from pages import _docs

    assert "docs/nope.md" in _docs.section("nope.md", "reading")
    assert "docs/guide.md" in _docs.section("guide.md", "no-such-section")

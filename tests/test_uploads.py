"""Uploads on Open results: streamed in bounded memory and time, cached by digest, ranges checked, capped."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from remat_lab.config import RunConfig
from remat_lab.store import docstream, results, upload_budget, uploads
from remat_lab.store.bytecache import ByteCache

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
POLICIES = ("no_remat", "nothing_saveable", "dots_saveable", "everything_saveable")


def run_row(i: int = 0) -> dict:
    """A valid sweep row (a run document without texts) of the shape ``run --json`` writes."""
    policy, width, batch = POLICIES[i % 4], 8 * (1 + (i // 4) % 64), 1 + i // 256
    dots = [{"index": k, "lhs_shape": [batch, width], "rhs_shape": [width, width],
             "out_shape": [batch, width],
             "verdict": "save", "saved": True, "recomputed": False, "compiled_recomputed": False,
             "note": "forward product"} for k in range(4)]
    return {
        "schema": 1, "config": RunConfig(width=width, batch=batch, policy=policy).as_dict(),
        "environment": {"backend": "cpu", "device_kind": "cpu", "device_count": 1, "jax": "0.10.2"},
        "step_time_s": {"median": 1e-3, "p25": 9e-4, "p75": 1.1e-3, "min": 8e-4, "max": 2e-3, "repeats": 20,
                        "warmup": 3, "samples": [1e-3 + k * 1e-6 for k in range(20)]},
        "memory": {"argument_bytes": 4096, "output_bytes": 4096, "alias_bytes": 0, "temp_bytes": 8192,
                   "generated_code_bytes": 0, "peak_bytes": 16384 + i},
        "totals": {"residual_bytes": 2048, "activation_residual_bytes": 1024,
                   "parameter_residual_bytes": 1024,
                   "dots_saved": 2, "dots_recomputed": 1, "recompute_flops": 1e6},
        "hlo": {"dot_count": 6, "excess_dots_vs_no_remat": 0, "excess_flops_vs_no_remat": 0},
        "compile": {"compile_s": 0.5}, "gradient_check": {"ok": True}, "flops": 3e6,
        "dots": dots, "residuals": [{"name": f"r{k}", "shape": [batch, width], "bytes": 4 * batch * width}
                                    for k in range(4)],
        "notes": ["a note"],
    }


def lines(*docs) -> bytes:
    return "".join(json.dumps(d) + "\n" for d in docs).encode()


def write_valid(path: Path, size: int) -> int:
    """JSON lines of valid sweep rows up to ``size`` bytes; the number of rows."""
    n = 0
    with open(path, "wb") as f:
        while True:
            line = lines(run_row(n))
            if f.tell() + len(line) > size:
                return n
            f.write(line)
            n += 1


def write_junk(path: Path, size: int) -> None:
    """Every kind of junk a visitor may send, line after line: text, deep and wide JSON, NaN, bad UTF-8."""
    pieces = [b"not json at all, " * 40 + b"\n", b"[" + b"[]," * 3000 + b"[]]\n",
              b'{"a": [' + b"{}," * 3000 + b"{}]}\n", b"[NaN, Infinity, 1e999]\n", b"\xff\xfe\xfa\n",
              b"[" * 5000 + b"\n", b'{"schema": ' + b"9" * 4000 + b', "config": {}}\n', b"17\n"]
    with open(path, "wb") as f:
        i = 0
        while f.tell() < size - 100_000:
            f.write(pieces[i % len(pieces)])
            i += 1


MEASURE = textwrap.dedent("""
    import json, sys, time
    from remat_lab.config import limits
    from remat_lab.store import results
    before = limits.rss_bytes()
    t0 = time.perf_counter()
    with open(sys.argv[1], "rb") as f:
        loaded = results.load(sys.argv[2], f)
    print(json.dumps({"seconds": time.perf_counter() - t0, "growth": limits.peak_rss_bytes() - before,
                      "runs": len(loaded.runs), "bad": loaded.bad, "problems": len(loaded.problems),
                      "stopped": loaded.stopped}))
""")


def measure(path: Path, name: str) -> dict:
    """Parse ``path`` in a fresh process: seconds, peak resident growth over the imports, counts."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), name], capture_output=True, text=True,
                         env=env, timeout=600, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("kind", ["junk", "valid"])
def test_a_20_mib_file_parses_as_a_stream_with_bounded_memory_and_time(tmp_path, kind):
    path, size = tmp_path / f"{kind}.jsonl", 20 * MIB - 4096
    rows = write_valid(path, size) if kind == "valid" else write_junk(path, size)
    got = measure(path, path.name)
    print(kind, path.stat().st_size, got)
    assert got["growth"] < 3 * path.stat().st_size, got  # the old reader took ~75x
    assert got["seconds"] < 120, got
    assert not got["stopped"]
    if kind == "valid":
        assert got["runs"] == rows > 5000 and got["bad"] == 0
    else:
        assert got["runs"] == 0 and got["problems"] == results.MAX_PROBLEMS and got["bad"] > 5000


def test_a_json_list_of_20_mib_is_read_item_by_item(tmp_path):
    path = tmp_path / "list.json"
    nested = b"[" + b"[]," * 2_000_000 + b"[]],\n"
    # As many rows as fit with the nested list below just under the 20 MiB cap (a row grows with the config).
    count = (20 * MIB - len(nested) - 8192) // (len(json.dumps(run_row(99999)).encode()) + 2)
    with open(path, "wb") as f:
        f.write(b"[")
        for i in range(count):
            f.write(json.dumps(run_row(i)).encode() + b",\n")
        f.write(b'{"hello": NaN},\n' + json.dumps(run_row(1)).encode() + b",\n")
        f.write(nested + json.dumps(run_row(2)).encode() + b"]")
    got = measure(path, path.name)
    print(path.stat().st_size, got)
    assert got["growth"] < 3 * path.stat().st_size, got
    assert count > 5000 and path.stat().st_size < 20 * MIB
    assert got["runs"] == count + 1 and got["bad"] == 2 and got["seconds"] < 120, got
    data = b'[{"hello": NaN}, ' + json.dumps(run_row(1)).encode() + b", [" + b"[]," * 10**6 + b"[]], 7]"
    loaded = results.load("l.json", data)
    assert len(loaded.runs) == 1 and "NaN is not a finite number" in loaded.problems[0], loaded.problems
    assert "the rest of the list is not read" in loaded.problems[1], loaded.problems


def test_the_cache_answers_a_rerun_without_reading_or_parsing(monkeypatch):
    data = lines(*(run_row(i) for i in range(20)))
    cache = ByteCache(64 * MIB)
    first = uploads.open_upload("s.jsonl", io.BytesIO(data), cache=cache)
    assert len(first.runs) == 20 and first.sha256 and len(cache) == 1

    class Unreadable(io.BytesIO):
        def read(self, *a):
            raise AssertionError("read again")

    assert uploads.open_upload("s.jsonl", Unreadable(), sha=first.sha256, cache=cache) is first

    def no_parse(*a, **k):
        raise AssertionError("parsed again")

    monkeypatch.setattr(results, "load", no_parse)
    assert uploads.open_upload("s.jsonl", io.BytesIO(data), cache=cache) is first  # same bytes: digest only
    small = ByteCache(1024)  # a parse larger than the cache is not kept, and still returned
    monkeypatch.undo()
    assert len(uploads.open_upload("s.jsonl", io.BytesIO(data), cache=small).runs) == 20 and not len(small)


@pytest.mark.parametrize("text, message", [
    ('"peak_bytes": NaN', "NaN is not a finite number"),
    ('"peak_bytes": Infinity', "Infinity is not a finite number"),
    ('"peak_bytes": -Infinity', "-Infinity is not a finite number"),
    ('"peak_bytes": 1e999', "1e999 is too large for a number"),
    ('"peak_bytes": -1000000000000000000', "memory.peak_bytes is negative (-1000000000000000000)"),
    ('"peak_bytes": 1e30', "memory.peak_bytes is 1e+30: over"),
    ('"peak_bytes": 1000000000000000000000000000000000000000', "memory.peak_bytes is a 40-digit number"),
])
def test_non_finite_negative_and_absurd_bytes_are_refused_per_row(text, message):
    good = json.dumps(run_row(0))
    bad = good.replace('"peak_bytes": 16384', text)
    assert bad != good
    loaded = results.load("r.jsonl", f"{good}\n{bad}\n{good}\n".encode())
    assert len(loaded.runs) == 2 and loaded.bad == 1, loaded.problems
    assert loaded.problems[0].startswith("line 2: ") and message in loaded.problems[0], loaded.problems


@pytest.mark.parametrize("path, value, message", [
    (("step_time_s", "median"), -1.0, "step_time_s.median is negative"),
    (("step_time_s", "samples"), [1e-3, 1e9], "step_time_s.samples[1] is 1000000000.0: over"),
    (("compile", "compile_s"), 1e12, "compile.compile_s is 1000000000000.0: over"),
    (("totals", "residual_bytes"), -5, "totals.residual_bytes is negative"),
    (("environment", "device_count"), 0, "environment.device_count must be at least 1"),
    (("config", "width"), 10**6, "config: width must be from 1 to 16384"),
    (("config", "batch"), -3, "config: batch must be from 0 to 65536"),
])
def test_times_counts_widths_and_batches_outside_their_ranges_are_refused(path, value, message):
    bad = run_row(0)
    bad[path[0]][path[1]] = value
    loaded = results.load("r.jsonl", lines(run_row(1), bad))
    assert len(loaded.runs) == 1 and loaded.bad == 1
    assert message in loaded.problems[0], loaded.problems


def test_a_long_schema_number_or_field_name_is_not_echoed_in_full():
    loaded = results.load("x.json", b'{"schema": ' + b"7" * 4000 + b', "config": {}}')
    (problem,) = loaded.problems
    assert "4,000-digit number" in problem and len(problem) < 160, problem
    wide = run_row(0)
    wide["config"]["x" * 5000] = 1
    (problem,) = results.load("y.json", json.dumps(wide).encode()).problems
    assert "does not know" in problem and len(problem) < 160, problem


def test_runs_are_kept_compact():
    row = run_row(0)
    row["texts"] = {"hlo": "x" * 100_000}
    loaded = results.load("r.jsonl", lines(*[row] * 5))
    first, last = loaded.runs[0], loaded.runs[-1]
    assert "texts" not in first and first["dots"] == row["dots"]
    assert first["config"] == json.loads(json.dumps(row["config"]))
    assert "dots" not in last and "samples" not in last["step_time_s"] and "save_names" not in last["config"]
    assert last["memory"] == row["memory"] and last["config"]["policy"] == "no_remat"


def test_an_over_long_line_and_a_memory_shortage_stop_with_a_sentence():
    data = lines(run_row(0)) + b"[" + b"1," * (docstream.MAX_DOC_BYTES // 2) + b"1]\n" + lines(run_row(1))
    loaded = results.load("r.jsonl", data)
    assert len(loaded.runs) == 2 and "over the 8 MiB one document may take" in loaded.problems[0]
    short = docstream.Guard(limit=1)  # no memory to spare at all
    stopped = results.load("r.jsonl", lines(run_row(0)), guard=short)
    assert stopped.count == 0 and "too little memory" in stopped.stopped and "/" not in stopped.stopped


def _manager(budget, ended=None):
    pytest.importorskip("streamlit")
    from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager

    return upload_budget.bound_manager(MemoryUploadedFileManager("/upload"), budget, ended)


def _rec(file_id: str, nbytes: int, name: str = "r.jsonl"):
    from streamlit.runtime.uploaded_file_manager import UploadedFileRec

    return UploadedFileRec(file_id=file_id, name=name, type="application/json", data=b"x" * nbytes)


def test_a_second_concurrent_upload_over_the_server_budget_is_refused_with_a_sentence():
    budget = upload_budget.UploadBudget(per_session=10 * MIB, total=15 * MIB)
    ended = []
    mgr = _manager(budget, ended.append)
    assert upload_budget.bound_manager(mgr, budget) is mgr  # bound once
    mgr.add_file("A", _rec("a1", 8 * MIB))
    mgr.add_file("B", _rec("b1", 8 * MIB, "b.jsonl"))  # A's 8 MiB are still being read: 16 > 15
    assert budget.in_flight() == 8 * MIB and mgr.get_files("B", ["b1"]) == []  # B's bytes not kept
    ((name, why),) = budget.take_refusals("B")
    assert name == "b.jsonl" and why.startswith("not read now: this server is reading other visitors' "
                                                "uploads (8.0 MiB of the 15.0 MiB it reads at once)")
    assert budget.take_refusals("B") == []  # said once
    mgr.add_file("A", _rec("a2", MIB))  # one file at a time per session
    assert "one file at a time" in budget.take_refusals("A")[0][1] and budget.held("A") == 8 * MIB
    mgr.add_file("C", _rec("c1", 11 * MIB))
    assert "over the 10.0 MiB a file may have" in budget.take_refusals("C")[0][1]
    mgr.remove_file("A", "a1")  # A's file parsed: its bytes go back
    assert budget.in_flight() == 0 and mgr._total_bytes == 0
    mgr.add_file("B", _rec("b1", 8 * MIB))  # now it fits
    assert budget.held("B") == 8 * MIB and len(mgr.get_files("B", ["b1"])) == 1
    mgr.remove_session_files("B")  # the session ended
    assert budget.in_flight() == 0 and ended == ["B"]


def test_the_open_parses_of_a_session_leave_the_cache_when_it_ends():
    cache = ByteCache(MIB)
    opened = uploads.Opened(cache, most=2)
    for key in [("s1", "a"), ("s2", "b"), ("s3", "c")]:
        cache.put(key, {"parse": key})
    assert opened.add("A", ("s1", "a")) == [] and opened.add("B", ("s1", "a")) == []
    opened.add("A", ("s2", "b"))
    assert opened.add("A", ("s3", "c")) == [("s1", "a")]  # the oldest closed; B still has it open
    assert ("s1", "a") in cache and opened.keys("A") == [("s2", "b"), ("s3", "c")]
    opened.end("A")
    assert ("s2", "b") not in cache and ("s3", "c") not in cache and ("s1", "a") in cache
    opened.end("B")
    assert len(cache) == 0 and cache.nbytes == 0


def test_the_page_lets_go_of_an_uploaded_files_bytes_once_it_is_parsed(monkeypatch):
    pytest.importorskip("streamlit")
    from streamlit.runtime.memory_uploaded_file_manager import MemoryUploadedFileManager
    from streamlit.testing.v1 import AppTest

    managers, removed = [], []
    original = MemoryUploadedFileManager.remove_file

    def spy(self, session_id, file_id):
        managers.append(self)
        removed.append(file_id)
        original(self, session_id, file_id)

    monkeypatch.setattr(MemoryUploadedFileManager, "remove_file", spy)
    at = AppTest.from_file(str(ROOT / "pages/results.py"), default_timeout=120).run()
    assert at.file_uploader(key="results_files").accept_multiple_files is False  # one file at a time
    data = lines(run_row(0), run_row(1))
    at.file_uploader(key="results_files").set_value(("one.jsonl", data, "text/plain"))
    at.run()
    assert not at.exception, at.exception
    assert removed and all(m._total_bytes == 0 and not any(m.file_storage.values()) for m in managers)
    assert upload_budget.BUDGET.in_flight() == 0
    (widget,) = at.file_uploader
    assert widget.key == "results_files_1" and widget.value is None  # a fresh, empty uploader
    assert any("Sweep: 2 configurations" in h.value for h in at.subheader)
    at.file_uploader(key="results_files_1").set_value(("two.jsonl", lines(run_row(2)), "text/plain"))
    at.run()
    assert any("Run: dots_saveable" in h.value for h in at.subheader)  # both files open
    assert any("Sweep: 2 configurations" in h.value for h in at.subheader)
    at.button(key="results_close").click().run()
    assert not at.subheader and "Upload a results file" in at.info[0].value


def test_the_page_draws_the_first_rows_of_a_big_sweep_in_seconds():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    data = lines(*(run_row(i) for i in range(4024)))
    at = AppTest.from_file(str(ROOT / "pages/results.py"), default_timeout=300).run()
    at.file_uploader(key="results_files").set_value(("sweep.jsonl", data, "application/json"))
    t0 = time.perf_counter()
    at.run()
    took = time.perf_counter() - t0
    assert not at.exception, at.exception
    said = " ".join(i.value for i in at.info)
    assert f"Showing the first {uploads.MAX_ROWS_DRAWN} of 4,024 rows" in said, said
    assert any(len(df.value) == uploads.MAX_ROWS_DRAWN for df in at.dataframe)
    assert any("Sweep: 4,024 configurations" in h.value for h in at.subheader)
    assert took < 60, took
    t0 = time.perf_counter()
    at.run()  # a rerun (a click): the parse comes from the cache
    assert not at.exception and time.perf_counter() - t0 < took + 5


def test_the_page_names_a_bad_row_without_markdown_from_the_file():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    bad = run_row(0)
    bad["memory"]["peak_bytes"] = -1
    evil = "[click](https://evil.example) /home/someone/secret.json"
    at = AppTest.from_file(str(ROOT / "pages/results.py"), default_timeout=120).run()
    at.file_uploader(key="results_files").set_value((f"{evil}.jsonl", lines(run_row(1), bad), "text/plain"))
    at.run()
    assert not at.exception
    (warning,) = at.warning
    assert "line 2: memory.peak_bytes is negative" in warning.value, warning.value
    assert "](https://" not in warning.value and "/home/someone" not in warning.value

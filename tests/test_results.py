"""Reading results files: real documents load; bad files and bad rows are refused with a message each."""

from __future__ import annotations

import copy
import json

import pytest

from remat_lab.config import RunConfig
from remat_lab.store import results
from remat_lab.studies.compare import compare_policies

TINY = RunConfig(width=8, batch=2, repeats=2, warmup=0)


@pytest.fixture(scope="module")
def run_doc() -> dict:
    from remat_lab.studies.experiment import run_experiment

    doc = run_experiment(TINY)
    doc.pop("texts")
    return json.loads(json.dumps(doc))  # as a file holds it


@pytest.fixture(scope="module")
def compare_doc() -> dict:
    return json.loads(json.dumps(compare_policies(TINY, ["no_remat", "nothing_saveable"], rounds=2)))


@pytest.fixture(scope="module")
def advice_doc() -> dict:
    from remat_lab.studies.advisor import advise

    doc = advise(TINY.replace(depth=2), 1 << 18, policies=["no_remat", "nothing_saveable"],
                 time_budget_s=5.0)
    return json.loads(json.dumps(doc))


def test_an_advice_file_loads_as_advice(advice_doc):
    loaded = results.load("a.json", json.dumps(advice_doc).encode())
    assert loaded.advice == [advice_doc] and not loaded.problems and loaded.count == 1
    bad = copy.deepcopy(advice_doc)
    bad["rows"][0]["probes"][0]["peak_bytes"] = "big"
    refused = results.load("a.json", json.dumps(bad).encode())
    assert refused.count == 0 and "rows[0].probes[0].peak_bytes" in refused.problems[0]


def _lines(*docs) -> bytes:
    return "".join(json.dumps(d) + "\n" for d in docs).encode()


def test_run_compare_and_sweep_files_load(run_doc, compare_doc):
    assert run_doc["schema"] == 1 and compare_doc["schema"] == 1
    one = results.load("run.json", json.dumps(run_doc, indent=2).encode())
    assert len(one.runs) == 1 and not one.problems
    cmp = results.load("compare.json", json.dumps(compare_doc).encode())
    assert len(cmp.compares) == 1 and not cmp.problems
    error = {"schema": 1, "config": {"width": 6}, "environment": run_doc["environment"],
             "error": {"kind": "refused", "message": "too big"}}
    sweep = results.load("r.jsonl", _lines(run_doc, run_doc, error))
    assert (len(sweep.runs), len(sweep.errors), sweep.problems) == (2, 1, [])
    old = {k: v for k, v in run_doc.items() if k != "schema"}  # written before the schema field
    assert len(results.load("old.json", json.dumps(old).encode()).runs) == 1
    assert len(results.load("list.json", json.dumps([run_doc, compare_doc]).encode()).runs) == 1
    pytest.importorskip("streamlit")
    from pages import _views  # the Sweep and History pages' JSON-lines downloads open here too

    again = results.load("remat_lab_sweep.jsonl", _views.json_lines([run_doc, run_doc]).encode())
    assert len(again.runs) == 2 and not again.problems


@pytest.mark.parametrize("data, name, message", [
    (b"\x89PNG\r\n\x1a\n\x00\x00garbage", "x.json", "not a text file"),
    (b"garbage, not json", "x.json", "not valid JSON"),
    (b"\xff\xfe\xfa not utf-8", "x.json", "not UTF-8"),
    (b"", "x.jsonl", "empty"),
    (b"[" * 200_000, "x.json", "nested too deeply"),
    (b'{"config": {"width": 8}, "environment": 3}', "x.json", "environment must be an object"),
    (b'{"hello": "world"}', "x.json", "not a Remat Lab result"),
    (b'{"schema": 7, "config": {}}', "x.json", "schema 7; this version reads schema 1"),
    (b'{"schema": "1", "config": {}}', "x.json", "schema must be a whole number"),
    (b'17', "x.json", "must be a JSON object"),
])
def test_bad_files_are_refused_with_a_sentence(data, name, message):
    loaded = results.load(name, data)
    assert loaded.count == 0 and len(loaded.problems) == 1
    assert message in loaded.problems[0], loaded.problems


def test_a_truncated_file_keeps_its_whole_rows_and_names_the_cut(run_doc):
    data = _lines(run_doc, run_doc, run_doc)
    loaded = results.load("r.jsonl", data[:-500])
    assert len(loaded.runs) == 2
    assert loaded.problems == ["line 3: cut off (the file ends in the middle of a document)"]
    one = results.load("run.json", json.dumps(run_doc).encode()[:-40])
    assert one.count == 0 and "cut off" in one.problems[0]


def test_a_file_over_the_size_cap_is_refused_unread():
    loaded = results.load("big.jsonl", b" " * (50 * 2**20))
    assert loaded.count == 0 and "50.0 MiB is over the 20 MiB limit" in loaded.problems[0]


@pytest.mark.parametrize("path, value, message", [
    (("config", "width"), "64", "config: width must be a whole number"),
    (("config", "policy"), "rm -rf /", "config: unknown policy"),
    (("config", "colour"), "red", "config has a field this version does not know"),
    (("step_time_s", "median"), "fast", "step_time_s.median must be a number, not text"),
    (("step_time_s", "samples"), [1.0, "x"], "samples must hold numbers only"),
    (("memory", "peak_bytes"), [1], "memory.peak_bytes must be a number, not a list"),
    (("environment", "device_count"), True, "environment.device_count must be a number"),
    (("gradient_check", "ok"), "yes", "gradient_check.ok must be true/false"),
    (("dots",), [1, 2], "dots must be a list of objects"),
    (("config",), None, "config is missing"),
    (("config",), {}, "config.model is missing"),
])
def test_wrong_types_are_refused_per_row_naming_the_field(run_doc, path, value, message):
    bad = copy.deepcopy(run_doc)
    target = bad
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    loaded = results.load("r.jsonl", _lines(run_doc, bad))
    assert len(loaded.runs) == 1 and len(loaded.problems) == 1
    assert loaded.problems[0].startswith("line 2: ") and message in loaded.problems[0], loaded.problems


def test_many_bad_rows_give_a_bounded_list_of_messages(run_doc):
    loaded = results.load("r.jsonl", _lines(run_doc) + b"nope\n" * 500)
    assert len(loaded.runs) == 1 and loaded.bad == 500 and len(loaded.problems) == results.MAX_PROBLEMS


def test_every_accepted_mutation_can_be_drawn(run_doc, compare_doc, advice_doc, monkeypatch):
    """Documents that pass the checks never break the views (each field set to a wrong value)."""
    pytest.importorskip("streamlit")
    import logging

    from streamlit.delta_generator import DeltaGenerator

    from pages import _views
    from remat_lab.present import charts, tables

    # The figures and frames are built; sending them to a browser (slow, and there is none) is not.
    monkeypatch.setattr(DeltaGenerator, "plotly_chart", lambda self, fig, **kw: fig.to_dict())
    monkeypatch.setattr(DeltaGenerator, "dataframe", lambda self, df, **kw: df.to_dict())
    monkeypatch.setitem(charts.PAGE_LAYOUT, "template", "none")  # building the theme is most of the time
    logging.getLogger("streamlit").setLevel(logging.ERROR)  # bare mode: no script run to draw into
    read = {"config", "environment", "step_time_s", "memory", "totals", "hlo", "gradient_check",
            "memory_timeline", "dots", "residuals", "rows", "pareto", "fastest_reason", "failed",
            "budget_bytes", "recommended", "reason", "notes", "timed", "peak_flops_per_s"}
    drawn = 0
    for doc, view in ((run_doc, _views.run_view), (compare_doc, _views.compare_view),
                      (advice_doc, _views.advice_view)):
        for key in read & set(doc):
            value = doc[key]
            fields = list(value[0]) if key == "rows" else list(value) if isinstance(value, dict) else []
            for field, wrong in [(None, None), (None, "x"), *((f, None) for f in fields)]:
                mutated = copy.deepcopy(doc)
                if field is None:
                    mutated[key] = wrong
                else:
                    (mutated["rows"][0] if key == "rows" else mutated[key])[field] = wrong
                loaded = results.load("m.json", json.dumps(mutated).encode())
                for ok in loaded.runs + loaded.compares + loaded.advice:
                    view(ok, key=f"k{drawn}")
                    if ok in loaded.runs:
                        tables.summary_frame([ok])
                    drawn += 1
    assert drawn > 40


def test_environment_in_words():
    assert results.describe_environment({"backend": "gpu", "device_kind": "NVIDIA H100", "device_count": 8,
                                         "jax": "0.10.2"}) == "NVIDIA H100 × 8, jax 0.10.2"
    assert results.describe_environment({"backend": "cpu", "device_kind": "cpu", "device_count": 1,
                                         "jax": "0.10.2"}) == "CPU × 1, jax 0.10.2"
    assert results.describe_environment(None) == "unknown environment"


def test_open_results_page_without_files_asks_for_them():
    pytest.importorskip("streamlit")
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "pages/results.py")).run()
    assert not at.exception and not at.error
    assert any("Upload a results file" in i.value for i in at.info)  # one file at a time (issue 33)

"""The Synthesize page while and after it runs: elapsed, the plan's compiles of at most its limit,
an estimate of the time left and each compile as it ends; a stop with no answer said as such; no
Stop button after the end; the answer once in the table; flops in a readable unit."""

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from pages import _advisor_run, _synth_live  # noqa: E402
from remat_lab.config import RunConfig, human_flops  # noqa: E402
from remat_lab.present.synth_charts import synthesis_frame  # noqa: E402
from remat_lab.studies.synthesize import synthesize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LINK = {"model": "mlp", "width": "64", "depth": "2", "stack": "scan", "budget": "400K",
        "policies": "nothing_saveable,dots_saveable"}
CFG = RunConfig(model="mlp", width=64, depth=2, stack="scan", batch=1, policy="no_remat")


class _Live:
    def __init__(self):
        self.steps = []
        self.tick = lambda: None

    def __call__(self, step):
        self.steps.append(step)


def test_the_lines_become_counted_steps_with_the_compiles_so_far():
    clock = iter([100.0, 102.0, 104.0, 110.0])  # made at 100; lines at 102, 104, 110
    live = _Live()
    lines = _synth_live.Lines(live, clock=lambda: next(clock))
    lines("compile 1/14: no_remat, batch 1 per device")
    lines("compile 2/14: no_remat, batch 2 per device")
    lines("named 1/2 nothing_saveable: compiling batch 105")
    first, second, third = live.steps
    assert first.done == 0 and first.eta_s() is None and not first.rows
    assert second.done == 1 and second.rows == ({"what": "compile 1/14: no_remat, batch 1 per device",
                                                 "took_s": 2.0},)
    assert second.left_s == pytest.approx(4.0 / 1 * 13)  # 4 s for one compile, at most 13 to go
    assert "≤14 compiles for the plan" in second.summary(now=second.at) and "4 s elapsed" in \
        second.summary(now=second.at)
    assert third.done == 1 and len(third.rows) == 2 and third.rows[1]["took_s"] == 6.0
    assert lines.compiled()[-1].startswith("named 1/2")


def test_flops_are_said_in_a_readable_unit():
    assert human_flops(202_600) == "202.6 kFLOP" and human_flops(3.441e6) == "3.441 MFLOP"
    assert human_flops(2.5e12) == "2.5 TFLOP" and human_flops(12) == "12 FLOP"


def test_a_plan_compiled_twice_is_one_row_and_the_answer_one_row():
    plan = {"save": ["a"], "offload": [], "recompute": ["b"], "remat_layers": 2}
    cand = {"plan": plan, "max_batch": 8, "peak_bytes": 3 << 20, "predicted_peak_bytes": 3 << 20,
            "error_share": 0.0, "recomputed_flops": 1e6, "fits": True}
    doc = {"answer": "plan", "plan": plan, "max_batch": 8,
           "candidates": [{**cand, "max_batch": 4, "peak_bytes": 2 << 20}, cand, dict(cand)]}
    frame = synthesis_frame(doc)
    assert len(frame) == 2 and frame["answer"].tolist() == [False, True]


@pytest.fixture(scope="module")
def stopped_doc():
    """A real synthesis stopped before its fourth compile: no answer yet."""
    asked = []
    return synthesize(CFG, 400 << 10, goal="max-batch", policies=["nothing_saveable", "dots_saveable"],
                      should_stop=lambda: asked.append(1) or len(asked) > 3)


def _page_with(monkeypatch, doc, lines=("compile 1/14: no_remat, batch 1 per device",
                                        "compile 2/14: no_remat, batch 2 per device")) -> AppTest:
    def run(kind, cache, key, payload, say, need):
        for line in lines:
            say(line)
        return doc
    monkeypatch.setattr(_advisor_run, "run", run)
    at = AppTest.from_file(str(ROOT / "pages" / "synthesize.py"), default_timeout=300)
    at.query_params.update(LINK)
    at.run()
    return at.button(key="synth_run").click().run()


def test_a_stop_before_an_answer_says_so_with_what_was_compiled(monkeypatch, stopped_doc):
    assert stopped_doc["answer"] is None and stopped_doc["stopped_because"].startswith("stopped before")
    at = _page_with(monkeypatch, stopped_doc)
    assert not at.exception and not at.error
    said = " ".join(w.value for w in at.warning)
    assert "**Stopped before an answer**" in said and "Nothing fits" not in said
    assert f"{stopped_doc['compiles']} compiles for the plan" in said
    assert not [b for b in at.button if b.key == "synth_stop"]  # gone with the job
    assert [s.label for s in at.status][0].startswith("Stopped before an answer")


@pytest.fixture(scope="module")
def answer_doc():
    return synthesize(CFG, 400 << 10, goal="max-batch", policies=["nothing_saveable", "dots_saveable"])


def test_the_answer_page_has_no_stop_and_readable_flops(monkeypatch, answer_doc):
    doc = answer_doc
    at = _page_with(monkeypatch, doc)
    assert not at.exception and not at.error
    assert not [b for b in at.button if b.key == "synth_stop"]
    answer = at.success[0].value
    assert human_flops(doc["recomputed_flops"]) in answer and "GFLOP" not in answer, answer
    assert [s.label for s in at.status][0].startswith("Done: ")
    table = next(df.value for df in at.dataframe if "answer" in df.value.columns)
    assert table["answer"].sum() == 1


def test_the_answers_code_blocks_wrap_rather_than_cut(monkeypatch, answer_doc):
    """Two code blocks side by side at 1024 px: the policy and MaxText's YAML wrap, as do the commands."""
    doc = answer_doc
    at = _page_with(monkeypatch, doc)
    blocks = {c.value: c.proto.wrap_lines for c in at.code}
    assert blocks[doc["code"]] and blocks[doc["maxtext_yaml"]] and blocks[doc["command"]], blocks


def test_the_cli_says_flops_in_the_same_unit(answer_doc):
    from remat_lab.cli.synthesize import format_synthesis

    answer = next(line for line in format_synthesis(answer_doc).splitlines() if line.startswith("Answer:"))
    assert f"recomputes {human_flops(answer_doc['recomputed_flops'])}" in answer, answer
    assert "GFLOP" not in answer  # a 14 MFLOP step: not "0.003441 GFLOP"

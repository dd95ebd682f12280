"""Live progress: steps with counts, time and finished rows; the partial table; a stop that keeps rows."""

from __future__ import annotations

import pickle
import re
import threading
from pathlib import Path

import pytest

from remat_lab.config import RunConfig
from remat_lab.studies.progress import Step, Tracker, duration

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    """A clock the test moves by hand (no test times anything)."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_step_is_its_line_with_counts_and_survives_the_worker_queue():
    clock, got = Clock(), []
    track = Tracker(got.append, planned=4, unit="policies sized", item="policy", phase="sizing",
                    after="then up to 30 s of timing", clock=clock)
    track("1/4 a: compiling batch 1")
    assert got[-1] == "1/4 a: compiling batch 1" and got[-1].done == 0 and got[-1].rows == ()
    assert "time left estimated once the first finishes" in got[-1].summary(now=got[-1].at)
    clock.t += 20
    track.finished({"policy": "a", "max_batch": 8}, "a: sized")
    step = pickle.loads(pickle.dumps(got[-1]))  # as the worker's reply queue carries it
    assert isinstance(step, Step) and str(step) == "a: sized"
    assert (step.done, step.planned, step.rows) == (1, 4, ({"policy": "a", "max_batch": 8},))
    assert step.eta_s() == pytest.approx(60.0)  # 20 s per policy, 3 left
    text = step.summary(now=step.at + 5)  # 5 s later: elapsed grows, the estimate shrinks
    assert text.startswith("25 s elapsed · 1 of 4 policies sized · about 55 s left")
    assert "(estimated: 20 s per policy so far)" in text and text.endswith("then up to 30 s of timing")
    clock.t += 10  # 10 s into the second policy: the pace is still the finished one's, less the 10 s
    track("2/4 b: compiling batch 8")
    assert got[-1].eta_s() == pytest.approx(50.0) and "20 s per policy" in got[-1].summary()
    # a policy that takes far longer than the finished ones (Mixtral on 256 chips: a refusal in
    # 4 s, then a search of 12 minutes) is not "about to finish": the overrun is said with its time
    late = got[-1].summary(now=got[-1].at + 300)
    assert "about to finish" not in late and "left" not in late
    assert "past the estimate: 5 min 10 s on the next policy so far, 20 s per policy before it" in late
    # a step with its own counts (timing rounds against a budget) keeps them and its known time left
    track.phase("timing")
    track(Step("timing round 3 of ≤12", done=2, planned=12, unit="timing rounds", at_most=True,
               left_s=20.0, left_why="of the time budget"))
    last = got[-1]
    assert last.counts() == "2 of ≤12 timing rounds" and last.rows == step.rows and last.fraction() == 2 / 12
    assert "20 s left of the time budget" in last.summary(now=last.at) and "estimated" not in last.summary()
    assert duration(100) == "1 min 40 s" and duration(4000) == "1 h 06 min"
    assert duration(0.25, precise=True) == "250 ms" and duration(0.25) == "0 s"


def test_the_tracker_counts_every_finish_from_several_threads():
    got = []
    track = Tracker(got.append, planned=40, unit="items")
    threads = [threading.Thread(target=lambda i=i: track.finished({"i": i}, f"{i} done")) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(len(s.rows) for s in got) == list(range(1, 41))
    assert all(s.done == len(s.rows) for s in got)


def test_the_advice_reports_each_policy_s_row_as_it_is_sized():
    from remat_lab.studies.advisor import advise

    got = []
    cfg = RunConfig(width=32, depth=1, batch=1, repeats=1, warmup=0)
    doc = advise(cfg, 256 << 10, policies=["no_remat", "nothing_saveable"], timing=False,
                 progress=got.append, workers=1)
    steps = [s for s in got if isinstance(s, Step) and s.phase == "sizing"]
    assert steps and all(s.planned == 2 and s.unit == "policies sized" for s in steps)
    finished = [s for s in steps if s.endswith(": sized")]
    assert [s.done for s in finished] == [1, 2] and [len(s.rows) for s in finished] == [1, 2]
    by_policy = {r["policy"]: r for r in doc["rows"]}
    for row in finished[-1].rows:  # the live rows are the answer's rows, as they were sized
        assert row["max_batch"] == by_policy[row["policy"]]["max_batch"]
        assert row["peak_bytes"] == by_policy[row["policy"]]["peak_bytes"]
        assert "probes" not in row
    # after the sizing, every phase to the last is a counted step (issue 46: minutes were silent)
    phases = [s.phase for s in got if isinstance(s, Step)]
    assert phases[-1] == "answers" and phases.index("model flops") > phases.index("sizing")
    for name, planned in (("model flops", len({r["max_batch"] for r in doc["rows"]})), ("answers", 2)):
        last = [s for s in got if isinstance(s, Step) and s.phase == name][-1]
        assert last.done == last.planned == planned and last.elapsed_s is not None


def test_a_stop_that_names_a_reason_is_recorded_as_that_reason():
    from remat_lab.studies.advisor import advise

    cfg = RunConfig(width=32, depth=1, batch=1, repeats=1, warmup=0)
    doc = advise(cfg, 256 << 10, policies=["no_remat"], timing=True, time_budget_s=5,
                 should_stop=lambda: "deadline")
    assert doc["stopped_because"] == "deadline" and doc["rounds"] == 0
    assert doc["rows"][0]["max_batch"] > 0  # the sizes are kept


def test_the_worker_stops_an_advice_s_timing_before_its_deadline(monkeypatch, tmp_path):
    from remat_lab.serve import in_worker, quotas

    monkeypatch.setenv(quotas.PUBLIC_ENV, "0")
    monkeypatch.delenv(quotas.DEADLINE_ENV, raising=False)
    assert in_worker.stopper("advise", None) is None  # a private server: no deadline, no Stop
    flag = tmp_path / "stop"
    stop = in_worker.stopper("advise", str(flag))
    assert stop() is None
    flag.touch()
    assert stop() == "stopped"
    monkeypatch.setenv(quotas.DEADLINE_ENV, "1")  # advise's deadline then 1.5 s: already near
    assert in_worker.stopper("advise", None)() == "deadline"
    monkeypatch.setenv(quotas.DEADLINE_ENV, "1200")  # 30 min for an advice: far
    assert in_worker.stopper("advise", None)() is None


def test_the_deadline_note_names_the_setting_only_to_a_private_server_s_owner():
    from pages import _progress
    from remat_lab.serve import quotas

    private, public = _progress.deadline_note("advise", False), _progress.deadline_note("advise", True)
    assert quotas.DEADLINE_ENV in private and "this server's time limit" in private
    assert "$" not in public and "REMAT_LAB" not in public and "this server's time limit" in public


def _live_script():
    """The partial table after K finished policies (K from the session state), then a stop."""
    import streamlit as st

    from pages import _progress
    from remat_lab.studies.progress import Tracker

    k = st.session_state["k"]
    status, live = _progress.running("Advising…", _progress.ADVICE, title="Policies sized so far")
    track = Tracker(live, planned=3, unit="policies sized", item="policy")
    for i in range(k):
        track(f"{i + 1}/3 p{i}: compiling batch 4")
        track.finished({"policy": f"p{i}", "max_batch": 4 * (i + 1), "peak_bytes": 3 << 20,
                        "limited_by": "search_limit" if i == 2 else "budget", "compiles": 3},
                       f"p{i}: sized")
    live.stopped() if k < 3 else live.tick()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_partial_table_has_one_row_per_finished_policy_and_says_the_time(k):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_live_script, default_timeout=60)
    at.session_state["k"] = k
    at.run()
    assert not at.exception, at.exception
    (table,) = [d.value for d in at.dataframe]
    assert len(table) == k and list(table["policy"]) == [f"p{i}" for i in range(k)]
    assert table["compiled peak (per device)"].iloc[0] == "3.0 MiB"
    if k == 3:
        assert table["largest batch"].iloc[2] == "≥ 12 (the search's limit)"
    (bar,) = at.get("progress")
    assert bar.value == 100 * k // 3  # Streamlit truncates
    assert f"{k} of 3 policies sized" in bar.text
    if k < 3:  # stopped: the clock stops at the time it took
        assert bar.text.startswith("Stopped after ") and "left" not in bar.text
    else:
        # the pace in ms here (the script takes milliseconds); in s on a host stalled past 1 s a policy
        assert "elapsed" in bar.text and re.search(r"\d(\.\d)? m?s per policy so far\)", bar.text), bar.text
    assert any(f"Policies sized so far ({k})" in c.value for c in at.caption)


@pytest.mark.parametrize("public", [False, True])
def test_an_advice_stopped_at_its_deadline_keeps_the_sized_policies_and_says_why(monkeypatch, public):
    """AppTest, the pool in this process: the engine sizes two of three policies, then the job is
    stopped at its deadline; the page keeps both rows and names the setting to a private owner only."""
    from streamlit.testing.v1 import AppTest

    from remat_lab.serve import quotas, worker
    from remat_lab.studies import advisor
    from remat_lab.studies.advisor.timing import tracker

    monkeypatch.setenv(quotas.PUBLIC_ENV, "1" if public else "0")
    monkeypatch.setenv(quotas.DEADLINE_ENV, "120")

    def stopped_advice(config, budget, *, policies, progress=None, **kw):
        say = tracker(progress, list(policies), None)
        for i, p in enumerate(policies[:2], 1):
            say(f"{i}/{len(policies)} {p}: compiling batch 1")
            say.finished({"policy": p, "max_batch": 8 * i, "peak_bytes": i << 20, "compiles": 2,
                          "limited_by": "budget"}, f"{p}: sized")
        raise worker.TimeLimit(quotas.stopped_message("advise_sizes", 120.0))

    monkeypatch.setattr(advisor, "advise", stopped_advice)
    at = AppTest.from_file(str(ROOT / "pages" / "advisor.py"), default_timeout=120)
    at.query_params.update({"width": "32", "depth": "1", "budget": "1M", "timed": "0",
                            "policies": "no_remat,nothing_saveable,everything_saveable"})
    at.run()
    at.button(key="advisor_run").click().run()
    assert not at.exception, at.exception
    (table,) = [d.value for d in at.dataframe]
    assert list(table["policy"]) == ["no_remat", "nothing_saveable"]
    assert list(table["largest batch"]) == ["8", "16"]
    (bar,) = at.get("progress")
    assert bar.text.startswith("Stopped after ") and "2 of 3 policies sized" in bar.text
    (error,) = [e.value for e in at.error]
    assert "this server's limit for an advice" in error
    assert (quotas.DEADLINE_ENV in error) is (not public)  # a web visitor never reads a variable
    assert any("2 of 3 policies finished before the stop" in i.value for i in at.info)


def test_compare_on_the_command_line_prints_one_progress_line_per_step(capsys):
    from remat_lab.cli import main

    assert main(["compare", "--width", "8", "--batch", "2", "--depth", "1", "--repeats", "2",
                 "--warmup", "0", "--policies", "no_remat,nothing_saveable", "--no-cache"]) == 0
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("[") and " s] " in ln]
    assert any("1/2 no_remat" in ln and "of 2 policies compiled and checked" in ln for ln in lines)
    assert any("2 of 2 policies compiled and checked" in ln for ln in lines), lines
    rounds = [ln for ln in lines if "round 2 done" in ln]
    assert rounds and "2 of 2 timing rounds" in rounds[0], lines
    assert "no_remat" in captured.out and "[" not in captured.out.splitlines()[0]  # stdout: the answer


def test_sweep_without_a_terminal_prints_a_line_per_step_with_counts(capsys, tmp_path):
    from remat_lab.cli import main

    assert main(["sweep", "--widths", "8", "--batches", "2", "--policies", "no_remat,nothing_saveable",
                 "--repeats", "2", "--warmup", "0", "--no-cache", "--out", str(tmp_path / "r.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "no_remat: compiling and checking (0 of 2 configurations" in err
    assert "round 2 done" in err
    assert "[2/2] mlp w8 b2 nothing_saveable: median" in err and "2 of 2 configurations" in err

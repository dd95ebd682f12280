"""compare_policies: interleaved timing, bootstrap intervals, same-program groups, ranking beyond noise."""

import json

import numpy as np
import pytest

from remat_lab.analysis import hlo
from remat_lab.cli import main
from remat_lab.config import MemoryBudgetError, RunConfig
from remat_lab.studies import compare

# At this size the two policies save the same dots (the mlp's dots have no batch axes), so XLA
# compiles them to one program; nothing_saveable is a different one.
PAIR = ("dots_saveable", "dots_with_no_batch_dims_saveable")
SMALL = RunConfig(width=64, batch=8, repeats=5, warmup=1)


def _row(policy, low, high, peak=100, fingerprint=None):
    return {"policy": policy, "median_s": (low + high) / 2, "ci_low_s": low, "ci_high_s": high,
            "peak_bytes": peak, "fingerprint": fingerprint}


# ---------------------------------------------------------------- intervals (no JAX)


def test_bootstrap_interval_contains_the_median_and_is_reproducible():
    samples = np.random.default_rng(1).lognormal(0.0, 0.3, size=(20, 2))
    med, low, high = compare.median_interval(samples)
    assert med == pytest.approx(np.median(samples))
    assert low <= med <= high and low < high
    assert compare.median_interval(samples) == (med, low, high)
    assert compare.median_interval(samples, seed=7) != (med, low, high)
    wide = compare.median_interval(samples[:4])
    assert wide[2] - wide[1] > high - low  # fewer rounds, a wider interval


def test_bootstrap_resamples_whole_rounds():
    # Two levels of load: every round is either fast or slow; treating calls as independent would
    # shrink the interval, resampling rounds keeps it spanning both levels.
    samples = np.array([[1.0, 1.0, 1.0]] * 5 + [[2.0, 2.0, 2.0]] * 5)
    _, low, high = compare.median_interval(samples)
    assert low == 1.0 and high == 2.0
    one = compare.median_interval([3.0])
    assert one == (3.0, 3.0, 3.0)


# ---------------------------------------------------------------- ranking (no JAX)


def test_clearly_separated_intervals_name_a_winner():
    out = compare.rank([_row("a", 1.0, 1.1), _row("b", 2.0, 2.2), _row("c", 3.0, 3.3)])
    assert out["fastest"] == "a" and out["fastest_group"] == ["a"]
    assert out["fastest_reason"].startswith("Fastest: a")
    assert out["pareto"] == ["a"]  # same memory, faster beyond noise


def test_overlapping_intervals_name_no_winner():
    out = compare.rank([_row("a", 1.0, 1.5), _row("b", 1.4, 2.0), _row("c", 3.0, 3.3)])
    assert out["fastest"] is None and out["fastest_group"] == []
    reason = out["fastest_reason"]
    assert reason.startswith("No winner") and "of a and b overlap" in reason
    assert out["pareto"] == ["a", "b"]  # neither is faster beyond noise


def test_same_program_is_one_group_never_a_winner_and_a_loser():
    # Disjoint intervals, but one program: noise, not a difference.
    out = compare.rank([_row("x", 1.0, 1.1, fingerprint="f"), _row("y", 2.0, 2.1, fingerprint="f")])
    assert out["fastest"] is None and "same program" in out["fastest_reason"]
    assert out["groups"] == [["x", "y"]] and out["pareto"] == []  # one program: nothing to trade
    # A shared program that beats the others wins as a group: both are flagged, a tie.
    out = compare.rank([_row("x", 1.0, 1.1, fingerprint="f"), _row("y", 1.2, 1.3, fingerprint="f"),
                        _row("z", 2.0, 2.1, fingerprint="g")])
    assert out["fastest"] == "x" and out["fastest_group"] == ["x", "y"]
    # The group's interval is the union of its members': z overlaps y, so nobody wins.
    out = compare.rank([_row("x", 1.0, 1.1, fingerprint="f"), _row("y", 1.9, 2.05, fingerprint="f"),
                        _row("z", 2.0, 2.1, fingerprint="g")])
    assert out["fastest"] is None
    assert "x (= y)" in out["fastest_reason"]


def test_pareto_uses_intervals_and_memory():
    rows = [_row("fast_big", 1.0, 1.1, peak=300), _row("slow_small", 2.0, 2.1, peak=100),
            _row("same_time_smaller", 1.05, 1.2, peak=200), _row("slow_big", 3.0, 3.1, peak=300)]
    out = compare.rank(rows)
    # fast_big is beaten by same_time_smaller: its time is indistinguishable and its peak smaller.
    assert out["pareto"] == ["slow_small", "same_time_smaller"]
    # Overlapping times: no front at all (see tests/test_labels.py).
    assert compare.rank([_row("a", 1, 2), _row("b", 1.5, 2.5)])["pareto"] == []
    # An unknown peak is not comparable with a known one.
    assert compare.rank([_row("a", 1, 2, peak=None), _row("b", 3, 4)])["pareto"] == ["a", "b"]
    assert compare.rank([])["fastest"] is None


# ---------------------------------------------------------------- the engine


@pytest.fixture(scope="module")
def small_result():
    return compare.compare_policies(SMALL, [*PAIR, "nothing_saveable"])


def test_same_program_pair_is_reported_as_one_program(small_result):
    rows = {r["policy"]: r for r in small_result["rows"]}
    a, b = (rows[p] for p in PAIR)
    assert a["fingerprint"] == b["fingerprint"] != rows["nothing_saveable"]["fingerprint"]
    assert a["same_program_as"] is None and b["same_program_as"] == PAIR[0]
    assert a["fastest"] == b["fastest"] and a["pareto"] == b["pareto"]
    assert PAIR in [tuple(g) for g in small_result["programs"]]
    if small_result["fastest"] is not None:
        assert set(PAIR) <= set(small_result["fastest_group"]) or not (
            set(PAIR) & set(small_result["fastest_group"]))
    for r in small_result["rows"]:
        assert r["samples"] == SMALL.repeats * compare.CALLS_PER_ROUND == len(r["samples_s"])
        assert r["ci_low_s"] <= r["median_s"] <= r["ci_high_s"]
        assert r["peak_bytes"] > 0 and r["grad_ok"]
    assert small_result["method"]["rounds"] == SMALL.repeats
    assert "bootstrap 95%" in small_result["method"]["interval"]
    assert list(small_result["timelines"]) == [r["policy"] for r in small_result["rows"]]
    json.dumps(small_result)  # JSON-ready


def test_each_policy_keeps_its_memory_timeline(run):
    doc = run(SMALL.replace(policy="no_remat"))
    timeline = {"source": "synthetic", "instructions": 2, "points": [[0, 8.0], [1, 16.0]]}
    out = compare.compare_policies(SMALL, ["no_remat"],
                                   results={"no_remat": {**doc, "memory_timeline": timeline}})
    assert out["timelines"] == {"no_remat": timeline}


def test_fingerprints_are_those_of_the_compiled_programs():
    import jax

    from remat_lab.program.step import build_problem, make_step

    prints = []
    for p in PAIR:
        problem = build_problem(SMALL.replace(policy=p))
        compiled = jax.jit(make_step(problem)).trace(*problem.args).lower().compile()
        prints.append(hlo.fingerprint(compiled.as_text()))
    assert prints[0] == prints[1]


def test_over_budget_is_refused_once_before_compiling(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("compiled although over budget")

    monkeypatch.setattr(compare, "run_experiment", boom)
    monkeypatch.setattr(compare, "_compile", boom)
    with pytest.raises(MemoryBudgetError, match="memory budget"):
        compare.compare_policies(SMALL, budget="1K")


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        compare.compare_policies(SMALL, ["no_remat", "bogus"])


# ---------------------------------------------------------------- the CLI


def test_cli_compare_json(capsys):
    code = main(["compare", "--width", "32", "--batch", "4", "--repeats", "3",
                 "--policies", "no_remat,nothing_saveable", "--rounds", "4", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in out["rows"]] == ["no_remat", "nothing_saveable"]
    assert out["method"]["rounds"] == 4 and out["rows"][0]["samples"] == 4 * compare.CALLS_PER_ROUND
    assert out["config"]["width"] == 32 and "policy" not in out["config"]
    assert {"fastest", "fastest_reason", "pareto", "environment"} <= set(out)
    assert out["rows"][0]["excess_dots_vs_no_remat"] == 0


def test_cli_compare_text(capsys):
    assert main(["compare", "--width", "16", "--batch", "2", "--repeats", "3",
                 "--policies", "no_remat"]) == 0
    out = capsys.readouterr().out
    assert "95% interval" in out and "No winner: only one policy" in out


@pytest.mark.parametrize("argv,words", [
    (["--policies", "no_remat,bogus"], ["unknown policy 'bogus'", "no_remat"]),
    (["--policies", ","], ["no policy given"]),
    (["--rounds", "0"], ["rounds", "1 to 1000"]),
])
def test_cli_compare_bad_input_exits_2(capsys, argv, words):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--json", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("remat_lab: error:")
    for w in words:
        assert w in err

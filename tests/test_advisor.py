"""The advisor: every answer holds against an independent compile (concrete inputs, not the probe's)."""

import json
import math
import subprocess
import sys

import jax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remat_lab.analysis.costs import cost_of, memory_report, step_flops
from remat_lab.cli import main
from remat_lab.config import ConfigError, RunConfig
from remat_lab.program.step import build_problem, make_step
from remat_lab.studies import advisor
from remat_lab.studies.advisor import search as advisor_search
from remat_lab.studies.advisor import sizing as advisor_sizing

SMALL = RunConfig(model="mlp", width=64, depth=4, stack="scan", batch=1, repeats=3, warmup=1)
BUDGET = 2 << 20  # lands the largest batch of SMALL between about 100 and 400


def concrete(config: RunConfig) -> dict:
    """Compile the step on real arrays (not the advisor's abstract path): peak and flops."""
    problem = build_problem(config)
    compiled = jax.jit(make_step(problem)).trace(*problem.args).lower().compile()
    return {"peak": memory_report(compiled)["peak_bytes"],
            "flops": step_flops(cost_of(compiled)["flops"], compiled.as_text())}


@pytest.fixture(scope="module")
def sized():
    return advisor.advise(SMALL, BUDGET, timing=False,
                          policies=["no_remat", "nothing_saveable", "dots_saveable"])


def test_every_row_fits_and_the_next_batch_does_not(sized):
    assert sized["budget_bytes"] == BUDGET and sized["budget_source"] == "given"
    for row in sized["rows"]:
        assert 16 <= row["max_batch"] < 4096, row
        assert row["next_batch"] == row["max_batch"] + 1
        cfg = SMALL.replace(policy=row["policy"])
        fit = concrete(cfg.replace(batch=row["max_batch"]))
        over = concrete(cfg.replace(batch=row["next_batch"]))
        assert fit["peak"] == row["peak_bytes"] <= BUDGET
        assert over["peak"] == row["next_peak_bytes"] > BUDGET
        assert row["compiles"] <= 2 * math.log2(advisor.MAX_BATCH) + 2
        assert {p["batch"] for p in row["probes"]} >= {row["max_batch"], row["next_batch"]}
        assert all(p["fits"] == (p["peak_bytes"] <= BUDGET) for p in row["probes"])


def test_saving_less_never_fits_a_smaller_batch(sized):
    rows = {r["policy"]: r for r in sized["rows"]}
    # Under scan, nothing_saveable keeps only the layer inputs: the compiled peaks say it fits more.
    assert rows["nothing_saveable"]["max_batch"] >= rows["no_remat"]["max_batch"]
    at = SMALL.replace(batch=rows["no_remat"]["max_batch"], policy="nothing_saveable")
    assert concrete(at)["peak"] <= BUDGET  # independently: it fits where no_remat's answer is


def test_untimed_advice_recommends_by_batch(sized):
    assert not sized["timed"]
    best = max(r["max_batch"] for r in sized["rows"])
    assert sized["recommended"] in [r["policy"] for r in sized["rows"] if r["max_batch"] == best]
    assert "not timed" in sized["reason"]
    assert all(r["step_time_s"] is None and r["mfu"] is None for r in sized["rows"])


def test_model_flops_between_compiled_counts_hold_against_compiles_of_their_own():
    advisor_search.clear_cache()
    base = SMALL.replace(policy="no_remat")
    for b in (2, 10):  # what no_remat's own search would have probed
        advisor_search.probe(base.replace(batch=b))
    asked = {1, 10, 17, 23, 31}
    got, on_line = advisor_sizing.model_flops_at(base, asked)
    assert set(got) == asked
    assert on_line == 1  # 23: between the compiled 17 and 31 (1 and 10 probed, 17 and 31 compiled)
    for b in sorted(asked):
        truth = concrete(base.replace(batch=b))["flops"]
        assert got[b] == pytest.approx(truth, rel=advisor_sizing.FLOPS_RTOL), b
    # XLA CPU counts this MLP's flops per example differently from batch 45 on (0.4 % more):
    # the counts then lie on no line, and every batch asked is compiled.
    got, on_line = advisor_sizing.model_flops_at(base, {10, 17, 24, 45})
    assert on_line == 0
    assert got[24] == concrete(base.replace(batch=24))["flops"]


def test_timed_advice_has_consistent_rates():
    doc = advisor.advise(SMALL, BUDGET, policies=["no_remat", "nothing_saveable"], time_budget_s=10.0)
    assert doc["timed"] and doc["recommended"] in ("no_remat", "nothing_saveable")
    assert doc["reason"].startswith(doc["recommended"])
    for r in doc["rows"]:
        b = r["max_batch"]
        # Model flops: the no_remat program's at this batch; hardware flops: this policy's.
        model = concrete(SMALL.replace(batch=b, policy="no_remat"))["flops"]
        assert r["model_flops"] == pytest.approx(model, rel=1e-9)
        assert r["hardware_flops"] == pytest.approx(
            concrete(SMALL.replace(batch=b, policy=r["policy"]))["flops"], rel=1e-9)
        assert r["examples_per_s"] == pytest.approx(b / r["step_time_s"], rel=1e-9)
        lo, hi = r["examples_per_s_ci"]
        assert lo <= r["examples_per_s"] <= hi
        peak = doc["peak_flops_per_s"]
        assert r["mfu"] == pytest.approx(r["model_flops"] / r["step_time_s"] / peak)  # never capped
        assert 0 < r["mfu"] <= r["hfu"] and (r["hfu"] <= 1 or r["rate_error"])
        assert r["recompute_overhead"] == pytest.approx(r["hardware_flops"] / r["model_flops"] - 1)
    rows = {r["policy"]: r for r in doc["rows"]}
    assert rows["no_remat"]["hardware_flops"] == rows["no_remat"]["model_flops"]
    assert rows["nothing_saveable"]["hardware_flops"] > rows["nothing_saveable"]["model_flops"]


def test_a_policy_that_does_not_fit_batch_one():
    doc = advisor.advise(SMALL, 1 << 16, policies=["no_remat"], timing=False)
    (row,) = doc["rows"]
    assert row["max_batch"] == 0 and row["peak_bytes"] is None and row["next_batch"] == 1
    assert row["next_peak_bytes"] > 1 << 16 and "batch 1" in row["reason"]
    assert doc["recommended"] is None and "no policy fits" in doc["reason"]


@pytest.mark.parametrize("budget", ["0", "-1", "12XB", "1e30", "nan", "", "1T1"])
def test_bad_budgets_are_refused(budget, capsys):
    with pytest.raises(ConfigError):
        advisor.advice_budget(budget)
    assert main(["advise", "--budget", budget, "--no-time"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("remat_lab: error: memory budget") and err.count("\n") == 1


# ------------------------------------------------ the search itself, on synthetic peak curves


@settings(max_examples=200, deadline=None)
@given(fixed=st.integers(1, 1 << 30), slope=st.integers(1, 1 << 20), step=st.integers(1, 64),
       flat=st.integers(0, 4096), square=st.integers(0, 64), budget=st.integers(1, 1 << 40),
       guess=st.one_of(st.none(), st.integers(1, advisor.MAX_BATCH)),
       base=st.one_of(st.none(), st.integers(0, 1 << 31)))
def test_search_finds_the_exact_boundary(fixed, slope, step, flat, square, budget, guess, base):
    """A peak flat up to some batch (fixed buffers dominate), then growing in steps (padding),
    linearly or faster, predicted from any intercept (``base``, right or wrong): the answer is
    exact and takes at most 2·log2(max batch) + 3 compiles."""
    def curve(b):
        rows = max(0, -(-b // step) * step - flat)
        return fixed + slope * rows + square * rows * rows // 1024
    measure = lambda cfg: {"peak_bytes": curve(cfg.batch), "cached": False}
    found = advisor.largest_batch(SMALL, budget, guess=guess, measure=measure, base_bytes=base)
    lo, hi = found["max_batch"], found["next_batch"]
    if lo:
        assert curve(lo) <= budget
    else:
        assert curve(1) > budget
    if hi is None:
        assert lo == advisor.MAX_BATCH
    else:
        assert hi == lo + 1 and curve(hi) > budget
    assert found["compiles"] <= 2 * math.log2(advisor.MAX_BATCH) + 3


def test_nothing_is_allocated_while_searching():
    """Width 8192: batch 1 needs ~1.5 GiB for real, the answer ~6 GiB: a search that allocated
    would grow the process by gigabytes; compiling on abstract inputs grows it by little."""
    code = (
        "import resource, json, jax, jax.numpy as jnp\n"
        "from remat_lab.studies import advisor\n"
        "from remat_lab.config import RunConfig\n"
        "jnp.ones(4).block_until_ready()\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "doc = advisor.advise(RunConfig(width=8192, depth=1, batch=1), '6G', timing=False,\n"
        "                     policies=['no_remat'])\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(json.dumps({'grown_kib': after - before, 'max_batch': doc['rows'][0]['max_batch'],\n"
        "                  'probes': len(doc['rows'][0]['probes'])}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["max_batch"] > 10000  # the probed sizes really are gigabytes
    assert got["grown_kib"] < 300 * 1024, got  # no array of them was made


def test_cli_json_document(capsys):
    assert main(["advise", "--width", "64", "--depth", "4", "--budget", "2M", "--no-time", "--json",
                 "--policies", "no_remat,nothing_saveable"]) == 0
    doc = json.loads(capsys.readouterr().out)
    keys = {"policy", "max_batch", "peak_bytes", "next_batch", "next_peak_bytes", "probes",
            "step_time_s", "examples_per_s", "model_flops", "hardware_flops", "mfu", "hfu"}
    assert {"budget_bytes", "config", "rows", "recommended", "reason", "search_s"} <= set(doc)
    assert all(keys <= set(r) for r in doc["rows"]) and doc["budget_bytes"] == 2 << 20


def test_notes_say_what_the_cpu_cannot_show():
    cfg = RunConfig(width=16, depth=1, batch=1, dtype="bfloat16")
    doc = advisor.advise(cfg, 1 << 20, timing=False, policies=["no_remat", "offload_dot_with_no_batch_dims"])
    if jax.default_backend() != "cpu":
        pytest.skip("the notes are about XLA CPU")
    assert any("offload_dot_with_no_batch_dims offload nothing" in n for n in doc["notes"])
    assert any("bfloat16 products in float32" in n for n in doc["notes"])
    plain = advisor.advise(cfg.replace(dtype="float32"), 1 << 20, timing=False, policies=["no_remat"])
    assert plain["notes"] == []


# ------------------------------------------- sizing in threads: the same answers as one search each

SIZED_POLICIES = ["no_remat", "nnx_remat_default", "nothing_saveable", "dots_saveable",
                  "everything_saveable"]


@settings(max_examples=40, deadline=None)
@given(curves=st.lists(st.tuples(st.integers(1, 1 << 24), st.integers(1, 1 << 16),
                                 st.integers(1, 16)), min_size=5, max_size=5),
       shared=st.lists(st.integers(0, 4), min_size=5, max_size=5), budget=st.integers(1, 1 << 30),
       workers=st.integers(1, 3))
def test_threads_guesses_and_shared_programs_give_the_plain_searchs_answers(curves, shared, budget,
                                                                            workers):
    """Policies searched in threads from each other's answers and intercepts, some sharing a
    program (a key): every max_batch is the one a plain search (no guess, one thread) finds."""
    group = {p: min(shared[i], i) for i, p in enumerate(SIZED_POLICIES)}  # an earlier one or itself

    def curve(p: str, b: int) -> int:
        fixed, slope, step = curves[group[p]]
        return fixed + slope * (-(-b // step) * step)

    def measure(cfg):
        return {"peak_bytes": curve(cfg.policy, cfg.batch), "cached": False}

    configs = {p: SMALL.replace(policy=p) for p in SIZED_POLICIES}
    sized = advisor_sizing.size_policies(configs, budget, measure=measure, workers=workers,
                                         key=lambda cfg: group[cfg.policy])
    for p, cfg in configs.items():
        plain = advisor.largest_batch(cfg, budget, measure=measure)
        assert sized[p]["max_batch"] == plain["max_batch"], p
        assert sized[p]["next_batch"] == plain["next_batch"], p


def test_sizing_in_two_threads_matches_one_plain_search_per_policy():
    """On a real (tiny) model: the advice sized in two threads, from guesses, intercepts and shared
    programs, has each policy's max_batch of a plain search from batch 1 in this thread; a policy
    that lowers as an earlier one compiles nothing of its own."""
    advisor.clear_cache()
    doc = advisor.advise(SMALL, BUDGET, timing=False, policies=SIZED_POLICIES, workers=2)
    rows = {r["policy"]: r for r in doc["rows"]}
    for p in SIZED_POLICIES:
        plain = advisor.largest_batch(SMALL.replace(policy=p), BUDGET)
        assert rows[p]["max_batch"] == plain["max_batch"] > 0, p
        assert rows[p]["next_batch"] == plain["next_batch"] == plain["max_batch"] + 1, p
    first = SMALL.replace(batch=1)
    if (advisor_search.program_key(first.replace(policy="nothing_saveable"))
            == advisor_search.program_key(first.replace(policy="nnx_remat_default"))):
        assert rows["nothing_saveable"]["compiles"] == 0


def test_the_kept_lowerings_are_bounded_by_bytes_the_newest_always_kept():
    from remat_lab.studies.probe_cache import ProbeCache

    cache = ProbeCache(entries=10, max_bytes=100)
    for k in "abc":
        cache.put(k, k.upper(), size=40)
    assert [k for k, _ in cache.items()] == ["b", "c"]  # 120 bytes > 100: the oldest out
    cache.put("huge", "H", size=1000)
    assert [k for k, _ in cache.items()] == ["huge"]  # alone over the bound, still kept
    cache.drop("huge")
    cache.put("d", "D", size=60)
    cache.put("e", "E", size=40)
    assert [k for k, _ in cache.items()] == ["d", "e"]  # the dropped entry's bytes are forgotten
    counted = ProbeCache(entries=2)
    for k in "xyz":
        counted.put(k, k)
    assert [k for k, _ in counted.items()] == ["y", "z"]


def test_an_llm_advice_takes_maxtexts_model_flops_and_its_overheads_against_no_remat():
    """Issue 45: the llm's MFU numerator is MaxText's model flops (6 N T and causal attention, per
    device), not no_remat's program, which a chunked loss makes larger (each chunk's forward runs
    again); the recomputation shares stay against no_remat's program (``no_remat_flops``)."""
    from remat_lab.config import llm_model_flops

    cfg = RunConfig(model="llm", width=64, depth=2, heads=2, kv_heads=1, mlp_dim=128, vocab=256,
                    seq=32, batch=1, loss_chunks=2, stack="scan")
    doc = advisor.advise(cfg, 8 << 20, policies=["no_remat", "nothing_saveable"], timing=False)
    rows = {r["policy"]: r for r in doc["rows"]}
    for r in rows.values():
        at = cfg.replace(batch=r["max_batch"])
        assert r["model_flops"] == pytest.approx(llm_model_flops(at), rel=1e-12)
        no_remat = concrete(at.replace(policy="no_remat"))["flops"]
        assert r["no_remat_flops"] == pytest.approx(no_remat, rel=1e-9)
        assert no_remat > r["model_flops"]  # the loss chunks' forward again, element-wise work
        assert r["recompute_overhead"] == pytest.approx(r["hardware_flops"] / no_remat - 1)
    assert rows["no_remat"]["recompute_overhead"] == pytest.approx(0.0, abs=1e-12)

"""The advice in the user's terms: a search's own limit said as a lower bound, ties to headroom."""

from __future__ import annotations

from remat_lab.config import RunConfig
from remat_lab.present.advisor_tables import advice_display_frame
from remat_lab.studies import advisor
from remat_lab.studies.advisor.batch_search import largest_batch


def _curve(per_example: int, base: int):
    return lambda cfg: {"peak_bytes": base + per_example * cfg.batch, "cached": False}


def test_a_search_that_reaches_its_own_limit_says_so_and_is_not_a_fit_at_the_budget():
    cfg = RunConfig(model="mlp", width=64, batch=1)
    roomy = largest_batch(cfg, budget=1 << 40, max_batch=64, measure=_curve(10, 100))
    assert roomy["max_batch"] == 64 and roomy["next_batch"] is None
    assert roomy["limited_by"] == "search_limit" and "≥ 64" in roomy["reason"]
    tight = largest_batch(cfg, budget=100 + 10 * 20, max_batch=64, measure=_curve(10, 100))
    assert tight["max_batch"] == 20 and tight["limited_by"] == "budget"
    shown = advice_display_frame({"budget_bytes": 1 << 40, "rows": [
        {"policy": "a", **roomy}, {"policy": "b", **tight}]})
    assert list(shown["largest batch"]) == ["≥ 64 (the search's limit)", "20"]


def test_equal_batches_untimed_recommend_the_smallest_peak():
    rows = [{"policy": "everything_saveable", "max_batch": 64, "peak_bytes": 900},
            {"policy": "no_remat", "max_batch": 64, "peak_bytes": 700},
            {"policy": "nothing_saveable", "max_batch": 32, "peak_bytes": 100}]
    best, ties, _ = advisor._recommend(rows, timed=False)
    assert best == "no_remat" and set(ties) == {"no_remat", "everything_saveable"}


def test_equal_estimates_on_a_target_recommend_the_smallest_peak():
    rows = [{"policy": "everything_saveable", "max_batch": 64, "peak_bytes": 900,
             "examples_per_s_estimate": 1000.0},
            {"policy": "no_remat", "max_batch": 64, "peak_bytes": 700, "examples_per_s_estimate": 1000.0}]
    best, _, _ = advisor.recommend_by_estimate(rows, "tpu-v5e", advisor._recommend)
    assert best == "no_remat"


def test_the_timing_race_drops_a_clearly_slower_program_and_keeps_its_time_budget(monkeypatch):
    from remat_lab.studies.advisor import timing as advisor_timing

    now = [0.0]  # a clock of our own: each call of a synthetic "executable" advances it by its step

    class Step:
        def __init__(self, s, jitter=(1.0,)):
            self.s, self.jitter, self.calls = s, jitter, 0

        def __call__(self, *args):
            now[0] += self.s * self.jitter[self.calls % len(self.jitter)]
            self.calls += 1
            return 0

    monkeypatch.setattr(advisor_timing.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(advisor_timing, "time_executable", lambda c, a, **k: c(*a))
    monkeypatch.setattr(advisor_timing.jax, "block_until_ready", lambda x: x)
    ex = {"fast": (Step(0.01, (1.0, 1.02, 0.98)), ()), "slow": (Step(0.04, (1.0, 0.97, 1.03)), ())}
    times, why, out = advisor_timing._run_rounds(ex, {"fast": 8, "slow": 8}, warmup=1, deadline=30.0,
                                                 seed=0, say=lambda m: None, should_stop=None,
                                                 budget_s=30.0)
    assert why == "separated" and out == {"slow": (advisor_timing.MIN_ROUNDS, "fast")}
    assert len(times["slow"]) == len(times["fast"]) == advisor_timing.MIN_ROUNDS
    # steps of 5 s against a 12 s budget: it ends within the budget plus one call of each
    now[0] = 0.0
    ex = {"a": (Step(5.0), ()), "b": (Step(5.0), ())}
    times, why, _ = advisor_timing._run_rounds(ex, {"a": 8, "b": 8}, warmup=1, deadline=12.0, seed=0,
                                               say=lambda m: None, should_stop=None, budget_s=12.0)
    assert why == "time budget" and now[0] <= 12.0 + 2 * 5.0 + 2 * 5.0  # + warm-up + one round
    assert len(times["a"]) == 1  # the interval the answer gets is from one round: said by the doc


def test_a_probe_a_tpu_refuses_for_its_hbm_is_a_batch_that_does_not_fit():
    from remat_lab.program.backend import needed_bytes
    from remat_lab.studies.advisor import search as advisor_search

    err = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for "
                       "HLO temporaries (32.00G) exceeds available HBM (15.75G).")
    assert needed_bytes(err) == 32 * 2**30
    assert needed_bytes(RuntimeError("Used 21.27M of 21.00M hbm")) == int(21.27 * 2**20)
    assert needed_bytes(RuntimeError("something else")) is None
    found = advisor_search._over_the_device(err)
    assert found["peak_bytes"] == 32 * 2**30 and found["flops"] is None
    # the search treats it as any probe over the budget: the batch before it is the answer
    cfg = RunConfig(model="mlp", width=64, batch=1)
    curve = lambda c: {**found, "cached": False} if c.batch > 20 else {"peak_bytes": 100 + 10 * c.batch,
                                                                          "cached": False}
    out = largest_batch(cfg, budget=10 << 30, max_batch=64, measure=curve)
    assert out["max_batch"] == 20 and out["next_batch"] == 21 and out["limited_by"] == "budget"


def test_an_llm_advice_names_its_attention_and_precision_in_its_summary():
    cfg = RunConfig(model="llm", width=64, heads=2, seq=32, vocab=128, depth=2, batch=1,
                    attention="flash", attention_block=16, step="train", dtype="bfloat16",
                    param_dtype="float32", optimizer_dtype="float32")
    doc = advisor.advise(cfg, 64 << 20, policies=["nothing_saveable"], timing=False, max_batch=4)
    # XLA CPU has neither cuDNN nor a TPU: flash runs as chunked, and the answer says so
    assert doc["attention"].startswith("chunked (block 16), in place of flash")
    why = doc["decision"]["why"]
    assert "Attention: chunked (block 16), in place of flash" in why and "Precision: " in why


def test_on_a_target_one_runner_up_by_the_estimate_per_device_and_each_sentence_once():
    from remat_lab.cli.advise import format_advice

    rows = [{"policy": p, "max_batch": b, "per_device_batch": b // 8, "devices": 8, "peak_bytes": pk,
             "examples_per_s_estimate": e, "probes": []}
            for p, b, pk, e in (("minimal", 8, 40 << 30, 20.5), ("nothing_saveable", 96, 58 << 30, 15.8),
                                ("save_qkv_proj", 48, 56 << 30, 17.3))]
    best, ties, reason = advisor.recommend_by_estimate(rows, "h100", advisor._recommend)
    assert best == "minimal" and "fits batch 1 per device (8 global) on the h100" in reason
    note = "Compiled for the h100 without the device: step times are estimates."
    doc = {"rows": rows, "budget_bytes": 60 << 30, "recommended": best, "reason": reason,
           "target": {"name": "h100", "device_kind": "H100"}, "timed": False, "notes": [note],
           "config": {"model": "llm", "width": 4096, "depth": 32, "stack": "scan", "dtype": "bfloat16",
                      "objective": "value_and_grad", "seq": 8192},
           "budget_source": "given", "search_s": 1.0}
    doc["decision"] = advisor.decide(doc, [note])
    why = doc["decision"]["why"]
    # the runner-up by the same order the pick was made in: the estimate, not the largest batch
    assert "Runner-up save_qkv_proj at batch 6 per device (48 global): about 17.3 examples/s" in why
    assert format_advice(doc).count(note) == 1


def _xla_decides(rewritten: bool):
    """Issue 45 (7): what a plain llama3-8b twin does near the H100's memory, in small: batch 12
    is refused, 13 fits, 14 and 15 do not; XLA's own pass rewrote the programs from 11 up."""
    def measure(cfg):
        b = cfg.batch
        peak = 100 + 10 * b if b <= 11 else 220 if b == 13 else 1000
        return {"peak_bytes": peak, "cached": False,
                "xla_remat": {"applied": rewritten and b >= 11, "instructions": 3}}
    return measure


def test_where_xla_decides_batches_above_the_first_refusal_are_compiled_and_the_margin_said():
    cfg = RunConfig(model="mlp", width=64, batch=1)
    found = largest_batch(cfg, budget=225, max_batch=64, measure=_xla_decides(True))
    assert found["max_batch"] == 13 and found["next_batch"] == 14 and found["xla_decided"]
    assert found["checked_above"] == [13, 14] and found["margin_bytes"] == 225 - 220
    assert {p["batch"]: p["fits"] for p in found["probes"]}[12] is False
    assert "XLA's own rematerialization pass decided it" in found["reason"]
    assert "2.2 % under the budget" in found["reason"]
    plain = largest_batch(cfg, budget=225, max_batch=64, measure=_xla_decides(False))
    assert plain["max_batch"] == 11 and plain["checked_above"] == [] and not plain["xla_decided"]
    from remat_lab.studies.advisor.decision import decide
    doc = {"rows": [{"policy": "no_remat", **found}], "budget_bytes": 225,
           "recommended": "no_remat", "reason": ""}
    decision = decide(doc, [])
    assert decision["xla_decided"] and decision["headroom_bytes"] == 5
    assert "XLA's own rematerialization pass decided that batch" in decision["why"]
    assert "batches 13, 14 above the first refusal" in decision["why"]


def test_a_refusal_for_pinned_host_memory_is_said_as_the_hosts():
    """Offloaded activations fill pinned host memory: libtpu's refusal of batch 2 names the host
    (Mixtral 8x7B on v6e-256 with minimal_offloaded: 11.2 GiB at batch 1, 'would need 133 GiB' at
    2 was the host's memory, not the chip's)."""
    from remat_lab.program.backend import refused_memory

    host = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space host. Used 133.00G of 64.00G")
    hbm = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 40.00G of 31.25G hbm")
    assert refused_memory(host) == "host" and refused_memory(hbm) == "hbm"

    def curve(cfg):
        if cfg.batch == 1:
            return {"peak_bytes": 12 << 30, "cached": False}
        return {"peak_bytes": 133 << 30, "cached": False, "refused_memory": "host"}

    found = largest_batch(RunConfig(model="mlp", width=64, batch=1), budget=30 << 30, max_batch=64,
                          measure=curve)
    assert found["max_batch"] == 1 and "refuses batch 2 for pinned host memory" in found["reason"]
    assert "would need" not in found["reason"]


def test_a_batch_the_runtime_refuses_is_the_refusal_and_the_search_goes_below_it():
    """On a chip a compile can fit what the runtime then refuses (gpt2-small, batch 115, v5e): the
    answer is the largest batch that compiles and runs, and the reason says the device refused."""
    cfg = RunConfig(model="mlp", width=64, batch=1)
    calls = []

    def check(c):  # the runtime holds 10 % more than the compiled peak
        calls.append(c.batch)
        ok = 1.1 * (100 + 10 * c.batch) <= 400
        return {"ran": ok, **({} if ok else {"error": "RESOURCE_EXHAUSTED: RuntimeProgramAllocationFailure"})}

    found = largest_batch(cfg, budget=400, max_batch=64, measure=_curve(10, 100), check=check)
    assert found["max_batch"] == 26 and found["next_batch"] == 27  # 1.1 x 360 = 396; 1.1 x 370 = 407
    assert found["limited_by"] == "runtime" and "refused it when it ran" in found["reason"]
    assert found["runs"][26]["ran"] and not found["runs"][27]["ran"]
    assert 30 in calls  # the compile's answer was run first
    plain = largest_batch(cfg, budget=400, max_batch=64, measure=_curve(10, 100),
                          check=lambda c: {"ran": True})
    assert plain["max_batch"] == 30 and plain["limited_by"] == "budget"
    assert "ran once on the device" in plain["reason"]
    none = largest_batch(cfg, budget=400, max_batch=64, measure=_curve(10, 100),
                         check=lambda c: {"ran": False, "error": "RESOURCE_EXHAUSTED"})
    assert none["max_batch"] == 0 and none["reason"].startswith("does not run even batch 1")


def test_a_runtime_refusal_reads_as_one_in_the_advice_table():
    rows = [{"policy": "nothing_saveable", "max_batch": 26, "peak_bytes": 360, "next_batch": 27,
             "next_peak_bytes": 370, "limited_by": "runtime"},
            {"policy": "minimal", "max_batch": 30, "peak_bytes": 400, "next_batch": 31,
             "next_peak_bytes": 410, "limited_by": "budget"}]
    shown = advice_display_frame({"budget_bytes": 400, "rows": rows})
    assert list(shown["next batch (over by)"]) == ["27 (compiles to 370 B; refused when run)",
                                                   "31 (+10 B)"]

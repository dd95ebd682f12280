"""The planner's check converging (studies/plan/converge): refusals rule out, batches are bracketed."""

from __future__ import annotations

import pytest

from remat_lab.config import RunConfig
from remat_lab.studies.plan.converge import bracket, next_batch, ruled_out
from remat_lab.studies.plan.fit import Line
from remat_lab.studies.plan.space import Family

TINY = dict(model="llm", width=64, heads=4, depth=1, seq=64, vocab=256, mlp_dim=128, step="train",
            attention="flash", dtype="bfloat16", compile_only=True, target="tpu-v6e", target_devices=8,
            mesh="fsdp=8", batch=8)
FAM = Family("fsdp=8", "full")
GIB = 2**30


def _fit(peak):
    return {"peak_bytes": peak, "refused": False, "predicted_s": 1.0}


def _refused(need):
    return {"peak_bytes": need, "refused": True, "predicted_s": None}


def test_a_refusal_rules_out_larger_batches_and_accumulation_on_them():
    compiled = {(FAM, 10, 1): _refused(40 * GIB)}
    hbm = 30 * GIB
    assert ruled_out((FAM, 12, 1), compiled, hbm) and ruled_out((FAM, 10, 2), compiled, hbm)
    assert not ruled_out((FAM, 9, 1), compiled, hbm)
    assert not ruled_out((Family("fsdp=8", "minimal"), 12, 1), compiled, hbm)  # another plan
    # a refusal with accumulation says nothing of one step at that batch
    assert not ruled_out((FAM, 5, 1), {(FAM, 5, 2): _refused(40 * GIB)}, hbm)


def test_the_next_batch_goes_where_the_refusals_bytes_say_and_never_creeps():
    hbm = 100 * GIB
    line = Line(10 * GIB, 0.5 * GIB)  # the fit's line: 180 a device would fit
    compiled = {(FAM, 2, 1): _fit(11 * GIB), (FAM, 180, 1): _refused(370 * GIB)}
    assert bracket(FAM, compiled, hbm) == (2, 11 * GIB, 180, 370 * GIB)
    # where the line between the fit (11 GiB) and the refusal's bytes (370 GiB) reaches 100 GiB
    b = next_batch(FAM, line, compiled, hbm)
    assert b == 2 + int(178 * 89 / 359) == 46
    compiled[(FAM, b, 1)] = _fit(90 * GIB)
    assert next_batch(FAM, line, compiled, hbm) == 46 + int(134 * 10 / 280)
    compiled[(FAM, 50, 1)] = _fit(91 * GIB)
    # two fits in a row: the refusal's end weighed half (270 GiB over counts as 135)
    assert next_batch(FAM, line, compiled, hbm) == 50 + int(130 * 9 / (9 + 135))
    # no refusal yet and one fit: where the line reaches the HBM, at least one more; closed: none
    assert next_batch(FAM, line, {(FAM, 4, 1): _fit(int(99.8 * GIB))}, hbm) == 5
    assert next_batch(FAM, line, {(FAM, 4, 1): _fit(90 * GIB)}, hbm) == 4 + 20
    assert next_batch(FAM, line, {(FAM, 4, 1): _fit(99 * GIB), (FAM, 5, 1): _refused(101 * GIB)},
                      hbm) is None


def test_as_large_as_fits_converges_in_few_compiles(monkeypatch):
    """Issue 64: the fit's line said 145 a device, the compiles fit only up to 64; the check once
    compiled 145, 144, ... one batch a compile. Here a peak convex in the batch: the check brackets
    the largest fitting batch and closes it in at most 12 compiles after the fit."""
    from remat_lab.studies.plan import fanout
    from remat_lab.studies.plan.question import Space
    from remat_lab.studies.plan.search import search

    hbm = Space(RunConfig(**TINY), None, None, (1,), ("full",), False).hbm
    base, slope = 0.05 * hbm, 0.0025 * hbm
    curve = (hbm - base - slope * 64.5) / 64.5**2  # the peak reaches the HBM at 64.5 a device

    def fake(fields: dict) -> dict:
        b = fields["batch"] // 8 // fields["microbatches"]
        peak = int(base + slope * b + curve * b * b + (0.01 * hbm if fields["microbatches"] > 1 else 0))
        out = {"peak_bytes": peak, "refused": peak > hbm,
               "predicted_s": None if peak > hbm else 0.1 + 0.01 * b,
               "bound_s": None, "limited_by": "compute", "temp_bytes": None, "flops": 1.0,
               "xla_remat": False, "compile_s": 0.0}
        return out

    monkeypatch.setattr(fanout, "compile_one", fake)
    lines = []
    result = search(RunConfig(**TINY), tokens=None, tensor=(1,), plans=("full",), offload=False, top=1,
                    workers=0, cache=False, progress=lines.append)
    fitted = {k for k in result["compiled"] if k not in result["before_check"]}
    checked = result["before_check"]
    assert len(checked) <= 12, [k[1] for k in checked]
    best = max(b for (f, b, m), c in result["compiled"].items() if not c["refused"] and m == 1)
    assert best == 64 and (FAM, 65, 1) in result["compiled"]  # the bracket closed on the answer
    assert fitted and any("fitted again" in str(line) for line in lines)


def test_a_tie_with_the_published_configuration_matches_it():
    from remat_lab.studies.plan.doc import STEP_ERROR, _against_published

    pub = {"name": "x", "predicted_tokens_per_s_per_device": 1000.0}
    same = {"predicted_tokens_per_s_per_device": 1000.0, "same_as": "the published configuration x"}
    assert _against_published(same, pub)["beats_published"] is False
    assert _against_published(same, pub)["against_published"]["verdict"] == "matches"
    near = {"predicted_tokens_per_s_per_device": 1000.0 * (1 + STEP_ERROR / 2)}
    assert _against_published(near, pub)["against_published"]["verdict"] == "matches"
    far = {"predicted_tokens_per_s_per_device": 1000.0 * (1 + 2 * STEP_ERROR)}
    assert _against_published(far, pub)["beats_published"] is True
    assert _against_published(None, pub)["beats_published"] is None


@pytest.mark.parametrize("mesh", ["fsdp=8", "fsdp=2,tensor=4"])
def test_the_estimate_moves_different_bytes_on_different_meshes(mesh):
    from remat_lab.studies.plan.instant import Instant
    from remat_lab.studies.plan.question import Space

    space = Space(RunConfig(**TINY), None, None, (1, 4), ("full",), False)
    est = Instant(space)
    assert est.collectives_s(mesh, 2, 1) > 0
    assert est.collectives_s(mesh, 2, 2) > est.collectives_s(mesh, 2, 1)  # gathered each microbatch


def _fake_compile(hbm_of):
    """A compile's figures from a peak convex in the per-device batch, for the target compiled for."""
    def fake(fields: dict) -> dict:
        hbm = hbm_of(fields["target"])
        b = fields["batch"] // fields["target_devices"] // fields["microbatches"]
        peak = int(0.05 * hbm + 0.01 * hbm * b)
        over = peak > hbm
        return {"peak_bytes": peak, "refused": over, "predicted_s": None if over else 0.1 + 0.01 * b,
                "bound_s": None, "limited_by": "compute", "temp_bytes": None, "flops": 1.0,
                "xla_remat": False, "compile_s": 0.0}
    return fake


def test_also_an_h100_with_no_price_typed_shows_both_costs(monkeypatch, capsys):
    """``plan ... --also h100:8`` with no price: each accelerator's cost per million tokens at its
    sourced default price, side by side; a token budget gives the days and dollars."""
    from remat_lab.cli import main
    from remat_lab.config import get_target
    from remat_lab.studies.plan import fanout

    monkeypatch.setattr(fanout, "compile_one", _fake_compile(lambda t: get_target(t).memory_bytes))
    status = main(["plan", "--model", "llm", "--width", "64", "--heads", "4", "--depth", "1", "--seq", "64",
                   "--vocab", "256", "--mlp-dim", "128", "--target", "tpu-v6e", "--target-devices", "8",
                   "--tensor", "1", "--plans", "full", "--no-optimizer-offload", "--workers", "0",
                   "--no-cache", "--global-batch-tokens", str(64 * 8 * 4), "--also", "h100:8",
                   "--token-budget", "1T"])
    out = capsys.readouterr().out
    assert status == 0
    side = out[out.index("Side by side"):]
    assert side.count("per million tokens") == 2 and "8 x h100" in side and "8 x tpu-v6e" in side
    assert "days for $" in side
    assert "price: $2.7 a device-hour (default, as of 2026-12-07" in out


def test_a_heartbeat_says_what_compiles_how_long_and_why():
    """While compiles run the search is never silent for long: a line names what compiles, the
    time since the first compile, how many are queued and what for; the time left is paced from
    the first compile, not from the start."""
    import time

    from remat_lab.studies.plan.ledger import HEARTBEAT_S, Said

    lines = []
    say = Said(lines.append)
    say.t0 -= 600  # ten minutes of estimate and set-up before the first compile
    say.first, say.workers, say.planned = time.time() - 60, 1, 4
    say.running = [(FAM, 4, 1), (FAM, 2, 1)]
    say.why = "the largest batch that fits"
    say.last = time.time()
    say.beat()
    assert not lines  # a line was said just now
    say.last -= HEARTBEAT_S + 1
    say.beat()
    assert HEARTBEAT_S <= 30 and len(lines) == 1
    text = str(lines[0])
    assert "compiling fsdp=8 · full · b4x1" in text and "1 min 00 s since the first compile" in text
    assert "1 more queued in this phase: the largest batch that fits" in text
    say("compiled one", {"what": "x", "peak_bytes": 1})
    assert lines[-1].left_s == pytest.approx(60 * 3, rel=0.05)  # 60 s a compile, 3 left


def test_the_published_configuration_among_the_plans_is_compiled_and_listed_once(monkeypatch):
    """Issue 67: the top plan was the published configuration itself and the same compile was
    listed twice. A program the search already compiled is filed from that compile, and the text
    lists it once."""
    from remat_lab.cli.plan import format_plan
    from remat_lab.config import get_target
    from remat_lab.studies.plan import fanout
    from remat_lab.studies.plan.search import search

    calls = []
    fake = _fake_compile(lambda t: get_target(t).memory_bytes)
    monkeypatch.setattr(fanout, "compile_one", lambda fields: (calls.append(fields), fake(fields))[1])
    published = FAM.apply(RunConfig(**TINY), 4, 1)
    result = search(RunConfig(**TINY), tokens=64 * 8 * 4, tensor=(1,), plans=("full",), offload=False, top=2,
                    workers=0, cache=False, extra=[("tiny-published", published)])
    assert result["compiled"][(FAM, 4, 1)]["same_as"] == "the published configuration tiny-published"
    assert len(calls) == len(result["compiled"]) + len(result["extra"]) - 1  # compiled once
    row = {"same_as": "the published configuration tiny-published", "mesh": "fsdp=8", "plan_text": "full",
           "per_device_batch": 4, "microbatches": 1, "optimizer_offload": False, "peak_bytes": 1,
           "predicted_s": 1.0, "bound_s": None, "maxtext_yaml": "", "run_command": ""}
    doc = {"config": {"preset": ""}, "devices": 8, "target": "tpu-v6e", "slices": 1, "hbm_bytes": 1,
           "global_batch_tokens": 2048, "plans": [row], "published_rows": [{"name": "tiny-published"}],
           "against_published": None, "memory_model_error": {"max": None, "compiled_candidates": 0},
           "candidates_predicted": 1, "candidates_compiled": 1, "wall_s": 0, "left_out": []}
    assert "published tiny-published: plan 1 above (the same program)" in format_plan(doc)


def test_a_refusal_that_names_no_bytes_bisects():
    """A refusal whose message names no bytes is filed at 2**60: the bracket is halved, never crept
    up one batch a compile from the largest fit."""
    hbm = 100 * GIB
    compiled = {(FAM, 2, 1): _fit(11 * GIB), (FAM, 180, 1): _refused(1 << 60)}
    assert next_batch(FAM, Line(10 * GIB, 0.5 * GIB), compiled, hbm) == 91

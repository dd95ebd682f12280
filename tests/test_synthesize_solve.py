"""The synthesizer's exact solver against brute force on synthetic additive costs (no compiles)."""

from __future__ import annotations

import random

import pytest

from remat_lab.studies.synthesize.solve import MAX_NAMES, Model, Plan, best_under, brute_force, solve


def _model(seed: int, k: int, layers: int = 4, offload: bool = True) -> Model:
    rng = random.Random(seed)
    names = tuple(f"n{i}" for i in range(k))
    sizes, flops, host = {}, {}, {}
    for n in names:
        b = rng.randint(1, 40) * 1000.0
        f = rng.randint(1, 90) * 1e6
        sizes[(n, "save")], flops[(n, "save")], host[(n, "save")] = b, f, 0.0
        # offloading: a little device staging, the same flops spared, the bytes moved to the host
        sizes[(n, "offload")] = rng.randint(0, 3) * 100.0
        flops[(n, "offload")], host[(n, "offload")] = f, b
    return Model(names=names, layers=layers, layer_counts=tuple(range(layers + 1)),
                 intercept_full=2e6, slope_full=3e5, intercept_base=2e6, slope_base=5e4,
                 recompute=sum(flops[(n, "save")] for n in names) + 5e7, bytes=sizes, flops=flops,
                 host=host, offload=offload)


def _objective(found: dict) -> tuple:
    p = found["predicted"]
    return p["recomputed_flops"], p["offloaded_bytes"], p["peak_bytes"]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("offload", [True, False])
def test_min_recompute_is_the_brute_force_optimum(seed, offload):
    model = _model(seed, k=5, offload=offload)
    rng = random.Random(100 + seed)
    batch = rng.randint(1, 12)
    budget = model.intercept_full + batch * rng.uniform(0.1, 1.2) * model.slope_full
    got = solve(model, budget, "min-recompute", batch)["candidates"]
    want = brute_force(model, budget, batch)
    if want is None:
        assert got == []
        return
    assert got, "the solver found nothing where brute force found a plan"
    # the same objective (a different plan only where two plans tie exactly)
    for g, w in zip(_objective(got[0]), _objective(want), strict=True):
        assert g == pytest.approx(w, rel=1e-9, abs=1e-6)
    assert got[0]["predicted"]["peak_bytes"] <= budget + 1e-6


@pytest.mark.parametrize("seed", range(8))
def test_max_batch_is_the_largest_any_plan_fits_then_the_fewest_recomputed(seed):
    model = _model(seed, k=4, layers=3)
    budget = model.intercept_full + random.Random(seed).uniform(2, 30) * model.slope_base
    solved = solve(model, budget, "max-batch")
    import itertools

    from remat_lab.studies.synthesize.solve import _plan
    largest = 0
    for r in model.layer_counts:
        for picks in itertools.product(model.choices(), repeat=len(model.names)):
            largest = max(largest, model.largest_batch(_plan(model.names, picks, r), budget))
    assert solved["batch"] == largest
    want = brute_force(model, budget, largest)
    assert _objective(solved["candidates"][0]) == pytest.approx(_objective(want))


def test_best_under_pairs_the_halves_exactly():
    model = _model(3, k=7)
    cap = 60000.0
    found = best_under(model, cap)
    best = brute_force(Model(**{**model.__dict__, "layer_counts": (model.layers,),
                                "intercept_full": 0.0, "intercept_base": 0.0, "slope_full": 0.0,
                                "slope_base": 0.0}), cap, 1)
    assert found[1] == pytest.approx(sum(model.flops[(n, "save")] for n in best["plan"].save)
                                     + sum(model.flops[(n, "offload")] for n in best["plan"].offload))
    assert found[0] <= cap


def test_sixteen_names_solve_quickly_and_seventeen_are_refused():
    model = _model(1, k=MAX_NAMES, layers=2)
    solved = solve(model, 4e6, "max-batch")
    assert solved["batch"] > 0 and solved["candidates"]
    plan = solved["candidates"][0]["plan"]
    assert isinstance(plan, Plan) and not set(plan.save) & set(plan.offload)
    with pytest.raises(ValueError, match="at most 16"):
        solve(_model(1, k=MAX_NAMES + 1), 4e6, "max-batch")


def test_without_host_memory_nothing_is_offloaded():
    model = _model(5, k=6, offload=False)
    solved = solve(model, 3e6, "max-batch")
    assert all(not c["plan"].offload for c in solved["candidates"])


def test_the_command_refuses_bad_input_in_one_line(capsys):
    from remat_lab.cli import main

    assert main(["synthesize", "--model", "mlp", "--goal", "min-recompute"]) == 2
    assert "goal min-recompute needs --batch" in capsys.readouterr().err
    assert main(["synthesize", "--model", "mlp", "--save-names", "l1"]) == 2
    assert "chooses the names itself" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["synthesize", "--goal", "most"])
    assert exit_.value.code == 2



class _Programs:
    """A meter over synthetic compiled programs whose bytes per example from batch 1 to 2 are not
    those beyond (as XLA's: a 3-name SwiGLU block on the H100, 2.69 MB per example from 1 to 2,
    1.67 from 2 to 39), each saved name adding 50 bytes per example per layer, each offloaded one
    moving 60 to the host, XLA's schedule shifting the device peak by -5 per example once for any
    offload (not per name: it does not add up); ``kept``: offloads XLA left on the device."""

    def __init__(self, kept: tuple[str, ...] = ()):
        self.kept, self.compiles = kept, 0

    def plan(self, plan: Plan, b: int, written: bool = True) -> dict:
        self.compiles += 1
        moved = [n for n in plan.offload if n not in self.kept]
        if plan.remat_layers == 0:
            peak = 1000 + 900 * b + 500 * min(b, 2)
        else:
            kept = len(plan.save) + len(plan.offload) - len(moved)
            peak = 500 + 100 * b + 300 * min(b, 2) + 4 * 50 * b * kept
            peak -= 5 * b if moved else 0
        flops = 1e6 * b * (1 if plan.remat_layers == 0 else 2 - 0.2 * len(plan.save + plan.offload))
        return {"peak_bytes": peak, "written_peak_bytes": peak, "flops": flops,
                "written_flops": flops, "host_bytes": float(4 * 60 * b * len(moved)), "xla_remat": False}


def test_the_model_is_exact_at_the_batch_it_measured_and_offloaded_bytes_are_on_the_host():
    """Issue 45 (3): the synthesizer's model was 2.2-2.3x the compiled peak with offload on the
    H100. Its lines were batches 1-2's, and an offloaded name's device bytes were XLA's schedule
    moving, added up across names. Now the lines go through the compiled peaks at 2 and at the
    batch the names are probed at, and an offloaded name has no device bytes per example."""
    from remat_lab.config import RunConfig
    from remat_lab.studies.synthesize.costs import measure

    meter = _Programs()
    meter.base = RunConfig(model="mlp", width=64, depth=4, batch=1)
    names = ("gate", "up", "act")
    model, rows = measure(meter, names, True, False, budget=10_000, at=None)
    hi = rows[-1]["batch"]  # 23: where recompute-everything's line from 1 and 2 reaches the budget
    assert hi == 23
    for plan in (Plan((), names, 4), Plan((), ("gate",), 4), Plan(("gate",), ("up",), 4),
                 Plan(names, (), 4), Plan((), (), 4)):
        for b in (hi, 2 * hi):
            compiled = meter.plan(plan, b)["peak_bytes"]
            assert model.predict(plan, b)["peak_bytes"] == pytest.approx(compiled, rel=0.05), (plan, b)
    assert all(model.bytes[(n, "offload")] == 0.0 for n in names)
    assert model.predict(Plan((), names, 4), 10)["offloaded_bytes"] == 3 * 4 * 60 * 10
    # an offload XLA kept on the device (nothing moved to the host) keeps its measured bytes
    kept = _Programs(kept=("up",))
    kept.base = meter.base
    model, _ = measure(kept, names, True, False, budget=10_000, at=None)
    assert model.host[("up", "offload")] == 0 and model.bytes[("up", "offload")] == pytest.approx(200)


def _with_savings(seed: int, k: int, layers: int = 4) -> Model:
    """``_model`` with some names' offload lowering the peak below recompute-everything's."""
    from dataclasses import replace

    model, rng = _model(seed, k=k, layers=layers), random.Random(seed + 7)
    return replace(model, offload_saving={n: -rng.randint(0, 60) * 1000.0 for n in model.names
                                          if rng.random() < 0.6})


def test_a_plans_offload_saving_is_the_least_of_its_names():
    """Issue 67: an offloaded name's own saving is kept (the SwiGLU block's gate alone 262 KB per
    example below recompute-everything), not added across names: the least any of them saves."""
    from dataclasses import replace

    model = replace(_model(0, k=3), offload_saving={"n0": -5000.0, "n1": -2000.0})
    peak = lambda plan: model.predict(plan, 10)["peak_bytes"]  # noqa: E731
    none = peak(Plan((), (), 4))
    cost = {n: model.bytes[(n, "offload")] for n in model.names}
    assert peak(Plan((), ("n0",), 4)) == pytest.approx(none + 10 * (cost["n0"] - 5000))
    assert peak(Plan((), ("n0", "n1"), 4)) == pytest.approx(none + 10 * (cost["n0"] + cost["n1"] - 2000))
    assert peak(Plan((), ("n0", "n2"), 4)) == pytest.approx(none + 10 * (cost["n0"] + cost["n2"]))


@pytest.mark.parametrize("seed", range(16))
def test_with_offload_savings_the_solver_is_still_the_brute_force_optimum(seed):
    model = _with_savings(seed, k=5)
    rng = random.Random(100 + seed)
    batch = rng.randint(1, 12)
    budget = model.intercept_full + batch * rng.uniform(0.1, 1.2) * model.slope_full
    got, want = solve(model, budget, "min-recompute", batch)["candidates"], brute_force(model, budget, batch)
    assert (want is None) == (not got)
    if want is not None:
        for g, w in zip(_objective(got[0])[:2], _objective(want)[:2], strict=True):
            assert g == pytest.approx(w, rel=1e-9, abs=1e-6)
    import itertools

    from remat_lab.studies.synthesize.solve import _plan
    budget = model.intercept_full + rng.uniform(2, 30) * model.slope_base
    largest = max(model.largest_batch(_plan(model.names, picks, r), budget) for r in model.layer_counts
                  for picks in itertools.product(model.choices(), repeat=len(model.names)))
    assert solve(model, budget, "max-batch")["batch"] == largest

"""The TPU step model's rates: fitted to one published run, held against the others (minutes a run).

    python benchmarks/tpu_step_model.py compile NAME [NAME ...]  # benchmarks/tpu_step_model/NAME.json.gz
    python benchmarks/tpu_step_model.py fit CALIBRATION          # the fit and the table, from those
    python benchmarks/tpu_step_model.py schedule NAME [NAME ...] # the collectives as libtpu writes them

``compile``: each catalogued TPU run (``python -m remat_lab published``) compiled as the lab's
``published --check`` compiles it (deviceless, libtpu), and its kernels one by one
(``analysis/kernels.py``: kind, flops, HBM bytes, runs) stored with the roofline's transfer terms
(collectives and host offload, ``analysis/estimate.py``) and the measured step.

``fit``: no TPU is lent here, so the rates cannot be measured on a chip as the H200's were. Instead
one efficiency for the MXU (GEMMs and splash attention alike) is fitted so that the CALIBRATION
run's prediction equals its measured step, HBM at libtpu's own 0.9 of the spec (its cost model's
bandwidth, ``tests/test_predict.py``); every other stored run of the same TPU generation is then
predicted out of sample and its ratio to its measured step printed. Each generation with a
measured run has its own fit (a v5p's MXU is not a v6e's: MaxText's Llama 2 70B on v5p-512 ran at
65.4 % MFU, above any step priced at the v6e's fitted efficiency). ``analysis/predict.py`` prices
a step the same way.

``schedule``: what the prediction would be if the collectives ran as today's libtpu writes them
(each compiled again, from the persistent cache where it has them): ``analysis/schedule.py``'s
walk, a collective without a start / done pair holding the kernels for its whole time, at the
fitted rates of ``targets.json``; once as written and once with the all-gathers beside the
kernels, as MaxText's continuation fusion ran them (``CF_FOR_ALL_GATHER`` in its
``benchmarks/xla_flags_library.py``, which libtpu 0.0.52 refuses on a v6e). A diagnosis, not the
model: see docs/methods.md.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

from remat_lab.analysis import schedule
from remat_lab.analysis.estimate import estimate_step
from remat_lab.analysis.kernels import kernels_of
from remat_lab.analysis.predict import kernels_seconds
from remat_lab.config import get_target
from remat_lab.config import published as pub
from remat_lab.program.backend import enable_compilation_cache
from remat_lab.studies.advisor.search import compiled_schedule, probe
from remat_lab.studies.published import config_for

OUT = Path(__file__).parent / "tpu_step_model"
HBM_EFFICIENCY = 0.9  # libtpu's cost model's bandwidth: 0.9 of the spec (tests/test_predict.py)
_ROW = ("kind", "direction", "dtype", "precision", "flops", "bytes", "runs")


def compile_runs(names: list[str]) -> None:
    enable_compilation_cache()
    OUT.mkdir(exist_ok=True)
    for name in names:
        config, differences = config_for(name)
        target = get_target(config.target)
        found = probe(config)
        if found["flops"] is None:  # libtpu refused it: over the chip's HBM
            print(json.dumps({"name": name, "refused": found["fingerprint"]}))
            continue
        est = estimate_step(found["flops"], found.get("bytes_accessed"), target, config.dtype,
                            found.get("traffic"))
        measured = pub.measured_step_s(pub.run_named(name))
        doc = {"name": name, "target": config.target, "config": config.as_dict(),
               "differences": differences, "peak_bytes": found["peak_bytes"],
               "xla_flops": found["flops"],  # XLA's own count: the kernels' must hold it (a test)
               "measured_step_s": measured["step_s"] if measured else None,
               "bound_s": est["estimate_s"], "compute_s": est.get("compute_s"),
               "collectives_s": est.get("collectives_s") or 0.0,
               "offload_s": est.get("offload_s") or 0.0,
               "kernels": [[r[k] for k in _ROW] for r in found["kernels"] or []]}
        with gzip.open(OUT / f"{name}.json.gz", "wt") as f:
            json.dump(doc, f)
        print(json.dumps({k: v for k, v in doc.items() if k not in ("kernels", "config")}))


def _load(name: str) -> dict:
    with gzip.open(OUT / f"{name}.json.gz", "rt") as f:
        doc = json.load(f)
    doc["kernels"] = [dict(zip(_ROW, r)) for r in doc["kernels"]]
    return doc


def predicted(doc: dict, mxu: float) -> float:
    """The run's step at MXU efficiency ``mxu`` (``analysis/predict.py``'s kernel model: never under
    the transfers nor the flops at the peak, the roofline's compute term)."""
    model = {"gemm_efficiency": mxu, "attention_forward_efficiency": mxu,
             "attention_backward_efficiency": mxu, "hbm_efficiency": HBM_EFFICIENCY}
    kernels = kernels_seconds(doc["kernels"], get_target(doc["target"]), model)["kernels_s"]
    return max(kernels, doc["collectives_s"] + doc["offload_s"], doc.get("compute_s") or 0.0)


def fit(calibration: str) -> dict:
    """The MXU efficiency at which ``calibration``'s prediction is its measured step (bisection)."""
    doc = _load(calibration)
    lo, hi = 0.05, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if predicted(doc, mid) > doc["measured_step_s"] else (lo, mid)
    mxu = (lo + hi) / 2
    rows = []
    for path in sorted(OUT.glob("*.json.gz")):
        other = _load(path.name.removesuffix(".json.gz"))
        if other["target"] != doc["target"]:  # another generation: its own fit
            continue
        step = predicted(other, mxu)
        m = other["measured_step_s"]
        rows.append({"name": other["name"], "measured_step_s": m, "predicted_s": step,
                     "predicted_over_measured": step / m if m else None,
                     "bound_s": other["bound_s"], "bound_over_measured": other["bound_s"] / m if m else None,
                     "calibration": other["name"] == calibration})
    return {"calibration": calibration, "target": doc["target"], "mxu_efficiency": mxu,
            "hbm_efficiency": HBM_EFFICIENCY, "runs": rows}


def schedule_runs(names: list[str]) -> None:
    enable_compilation_cache()
    for name in names:
        config, _ = config_for(name)
        target = get_target(config.target, config.network)
        text, found = compiled_schedule(config)
        priced = kernels_seconds(kernels_of(text), target, target.step_model)
        written, gathers = (schedule.walk(found, priced["by_name_s"], target, hidden)
                            for hidden in ((), ("all-gather",)))
        by_kind: dict[str, float] = {}
        for times, seq in found["computations"]:
            for tag, n in seq:
                if tag in "sc":
                    row = found["collectives"][n]
                    key = f"{row['kind']} ({row['link']})"
                    by_kind[key] = by_kind.get(key, 0.0) + times * schedule.collective_seconds(row, target)
        measured = pub.measured_step_s(pub.run_named(name))
        m = measured["step_s"] if measured else None
        tags = [tag for _, seq in found["computations"] for tag, _ in seq]
        print(json.dumps({"name": name, "measured_step_s": m, "kernels_s": priced["kernels_s"],
                          "as_written_s": written["step_s"], "exposed_s": written["exposed_s"],
                          "all_gathers_beside_s": gathers["step_s"],
                          "as_written_over_measured": written["step_s"] / m if m else None,
                          "all_gathers_beside_over_measured": gathers["step_s"] / m if m else None,
                          "synchronous": tags.count("c"), "asynchronous": tags.count("s"),
                          "collective_s_by_kind": {k: round(v, 3) for k, v in sorted(by_kind.items())}}),
              flush=True)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "compile":
        compile_runs(argv[1:])
    elif len(argv) >= 2 and argv[0] == "schedule":
        schedule_runs(argv[1:])
    elif len(argv) == 2 and argv[0] == "fit":
        print(json.dumps(fit(argv[1]), indent=1))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

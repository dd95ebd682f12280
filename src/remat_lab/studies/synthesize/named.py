"""The named policies in a synthesis: each sized on the synthesis's goal by the same compiles."""

from __future__ import annotations

from collections.abc import Sequence

from remat_lab.studies.advisor.sizing import size_policies
from remat_lab.studies.synthesize.costs import Meter, Stopped


def give_back(meter: Meter, before: tuple[int, int]) -> int:
    """The compiles since ``before`` (``(compiles, forced)``), taken off the meter: the named
    policies', counted apart."""
    spent = meter.compiles - before[0]
    meter.compiles, meter.forced = before
    return spent


def named_rows(run, policies: Sequence[str], goal: str, b: int | None,
                workers: int) -> tuple[list, int]:
    """Each named policy on the same goal, compiled: ``(rows, compiles)``; ``run``: the synthesis's
    ``_Run`` (``base``, ``unit``, ``budget``, ``meter``, ``prefill``, ``recomputed``)."""
    base, unit = run.base, run.unit
    configs = {p: base.replace(policy=p, batch=unit) for p in policies}
    rows, compiles = [], 0
    if goal == "max-batch":
        sized = size_policies(configs, run.budget, max_batch=run.max_batch, workers=workers,
                              progress=lambda m: run.meter.say(f"named {m}"))
        compiles += run.prefill({f["max_batch"] // unit for f in sized.values()})
        before = run.meter.compiles, run.meter.forced
        for p in policies:
            found = sized[p]
            compiles += found["compiles"]
            pb = found["max_batch"] // unit
            got = {"flops": None, "host_bytes": None}
            if pb:  # its probe at that batch, compiled by the search (written=False: no recompile)
                at = configs[p].replace(batch=found["max_batch"])
                got = run.meter.figures(at, f"{p} at its largest batch", written=False)
            rows.append({"policy": p, "max_batch": found["max_batch"],
                         "per_device_batch": found["per_device_batch"], "peak_bytes": found["peak_bytes"],
                         "flops": got["flops"],
                         "recomputed_flops": run.recomputed(got["flops"], pb) if pb else None,
                         "offloaded_bytes": got["host_bytes"], "fits": pb > 0})
        return rows, compiles + give_back(run.meter, before)  # (probes the cache had let go)
    for p in policies:
        if run.meter.should_stop():
            raise Stopped("named")
        before = run.meter.compiles, run.meter.forced
        got = run.meter.figures(configs[p].replace(batch=b * unit), f"{p} at batch {b * unit}",
                                written=False)
        compiles += give_back(run.meter, before)
        rows.append({"policy": p, "max_batch": b * unit, "per_device_batch": b * base.microbatches,
                     "peak_bytes": got["peak_bytes"], "flops": got["flops"],
                     "recomputed_flops": run.recomputed(got["flops"], b),
                     "offloaded_bytes": got["host_bytes"], "fits": got["peak_bytes"] <= run.budget})
    return rows, compiles

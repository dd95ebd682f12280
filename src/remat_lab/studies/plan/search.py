"""The planner's search: a few compiles fit each family's lines, every split predicted, the best compiled."""

from __future__ import annotations

import time

from remat_lab.config import RunConfig
from remat_lab.studies.plan.converge import bracket, fits, next_batch, ruled_out
from remat_lab.studies.plan.fanout import Fanout, default_workers
from remat_lab.studies.plan.fit import Line, accumulated_step, peak_line, relative_error, step_line
from remat_lab.studies.plan.instant import estimate
from remat_lab.studies.plan.ledger import Progress, Said, collect, key_text
from remat_lab.studies.plan.question import PREDICTION_SLACK, Space
from remat_lab.studies.plan.space import DEFAULT_PLANS, DEFAULT_TENSOR, Family


def fit_points(space: Space) -> list[tuple[Family, int, int]]:
    """The compiles that fit the model, ``(family, per-device batch, microbatches)``: per mesh the
    first plan at the largest and smallest per-device batch of one step (the mesh's intercept) and
    at the first split with accumulation (what accumulating adds: f32 gradient sums, and the
    gathered weights XLA may keep across the microbatches), every other plan at the largest;
    optimizer offload is predicted from the plan without it (its peak, and the moments' transfer)."""
    jobs = []
    for mesh, per_row in space.rows.items():
        hi = per_row if per_row is not None else 2
        lo = 1
        accumulated = [(b, m) for b, m in space.splits(mesh, hi) if m > 1]
        for i, fam in enumerate(f for f in space.families if f.mesh == mesh and not f.optimizer_offload):
            jobs.append((fam, hi, 1))
            if i == 0 and lo != hi:
                jobs.append((fam, lo, 1))
            if i == 0 and accumulated:
                jobs.append((fam, *accumulated[0]))
    return jobs


def second_points(space: Space, compiled: dict) -> list[tuple[tuple, RunConfig]]:
    """A plan the compiler refused at its largest per-device batch compiled at the smallest too:
    the line through a refusal (libtpu's temporaries after XLA's own rematerialization tried to fit
    them) is not the plan's, and its splits with accumulation run at the small batches."""
    out = []
    for fam in (f for f in space.families if not f.optimizer_offload):
        pts = {b: c for (f, b, m), c in compiled.items() if f == fam and m == 1 and not c.get("error")}
        if pts and all(c["refused"] for c in pts.values()) and 1 not in pts:
            out.append(((fam, 1, 1), fam.apply(space.config, 1, 1)))
    return out


def fit(space: Space, compiled: dict) -> dict[Family, dict]:
    """Each family's peak and step lines from the compiled points (``compiled[(family, b, 1)]``)."""
    lines: dict[Family, dict] = {}
    for mesh in space.rows:
        fams = [f for f in space.families if f.mesh == mesh and not f.optimizer_offload]
        base = None
        for fam in fams:
            pts = [(b, c) for (f, b, m), c in compiled.items()
                   if f == fam and m == 1 and c and not c.get("error")]
            # a refusal's bytes are libtpu's HLO temporaries after XLA's own rematerialization tried
            # to fit them: a line through compiled points where the family has two
            ok = [(b, c) for b, c in pts if not c["refused"]]
            pts = ok if len(ok) >= 2 or (ok and base is not None) else pts
            peak = peak_line([(b, c["peak_bytes"]) for b, c in pts], base and base["peak"].a)
            step = step_line([(b, c["predicted_s"]) for b, c in pts if c.get("predicted_s")],
                             base and base["step"])
            entry = {"peak": peak, "step": step, "refused": any(c["refused"] for _, c in pts),
                     "accumulation": _accumulation(fam, peak, compiled)}
            lines[fam] = entry
            if base is None and peak is not None:
                base = entry
        for fam in fams:
            # a family whose own compile with accumulation steps was not made borrows the mesh's
            if base is not None and lines[fam]["accumulation"] is None:
                lines[fam]["accumulation"] = base["accumulation"]
        for fam in fams:
            on = Family(fam.mesh, fam.plan, True)
            if on in space.families and lines[fam]["peak"] is not None:
                lines[on] = _offloaded(space, on, lines[fam], compiled)
    return lines


def _offloaded(space: Space, on: Family, base: dict, compiled: dict) -> dict:
    """An optimizer-offload family's lines: its peak through its own two compiled points, or the
    plan's line moved through its one, else the plan's own line: the compiler brings the moments
    back to the chip for the update, so the peak barely moves (Llama 3.1 70B on 256 v6e chips, the
    moments 2.2 GiB a chip: -0.56 to +0.43 GiB for MaxText's offload plan at 1, 5 and 1 x 5 a chip,
    -0.41 GiB for ``full`` at 1 x 5; an H100 compile ignores the memory kinds); its step the plan's
    with the moments' transfer over the host link."""
    own = [(b, c["peak_bytes"]) for (f, b, m), c in compiled.items()
           if f == on and m == 1 and not c.get("error") and not c["refused"]]
    p, s = base["peak"], base["step"]
    if len(own) >= 2:
        peak = peak_line(own, None)
    elif own:
        peak = Line(p.a + own[0][1] - p.at(own[0][0]), p.slope)
    else:
        peak = p
    acc = _accumulation(on, peak, compiled)
    return {"peak": peak, "step": s and Line(s.a + space.offload_s(on), s.slope), "refused": False,
            "accumulation": base.get("accumulation") if acc is None else acc}


def _accumulation(fam: Family, peak: Line | None, compiled: dict) -> Line | None:
    """What accumulation steps add to ``fam``'s peak, as a line in the per-device batch, from its
    own compiles with them (the f32 gradient sums, and the gathered weights XLA may keep across
    microbatches): through two (Llama 2 7B on two A3 hosts, layers unrolled,
    ``minimal_with_context``: +22.7 GiB at 2 x 2, +25.6 GiB at 1 x 4), constant through one;
    None without one."""
    acc = sorted((b, c["peak_bytes"] - peak.at(b)) for (f, b, m), c in compiled.items()
                 if peak is not None and f == fam and m > 1 and not c.get("error") and not c["refused"])
    if not acc:
        return None
    return Line.through(acc[0], acc[-1]) if len(acc) > 1 else Line(acc[0][1], 0.0)


def refine_points(space: Space, compiled: dict, candidates: list[dict], top: int, width: int = 1
                  ) -> list[tuple[tuple, RunConfig]]:
    """The families of the best predicted candidates measured on their own before any is checked:
    two compiled batches of one step where a family's line had fewer (it borrowed the mesh's
    batch-independent bytes; an optimizer-offload family's is its plan's) and
    its own compiles with accumulation steps, at its largest and smallest accumulating per-device
    batch, where its candidates accumulate (what that adds depends on the plan and the batch).
    The families of the first ``2 * top`` candidates predicted to fit, at
    most ``top + 1`` of them; and the accumulation steps of the families of the first ``width``
    candidates ``_verify`` would check that the fit has not compiled (the model's error is measured
    on a family's own lines, never on what another plan's accumulation adds: Llama 2 7B on two A3
    hosts, ``minimal_with_context`` at 2 x 2 borrowing ``save_qkv_proj``'s, predicted 5.4 % over)."""
    best: list[Family] = []
    accumulating: set[Family] = set()
    for c in [c for c in candidates if c["predicted_fits"]][:2 * top]:
        # an optimizer-offload family is its plan's, measured: the plan's family is refined
        fam = Family(c["family"].mesh, c["family"].plan, False)
        if fam not in best and len(best) <= top:
            best.append(fam)
        if c["microbatches"] > 1:
            accumulating.add(fam)
    for c in _checked(space, candidates, compiled)[:width]:
        if c["microbatches"] > 1:
            accumulating.add(Family(c["family"].mesh, c["family"].plan, False))
    out = []
    for fam in best:
        own = {b: c for (f, b, m), c in compiled.items() if f == fam and m == 1 and not c.get("error")}
        ok = [b for b, c in own.items() if not c["refused"]]
        fitting = sorted({c["per_device_batch"] for c in candidates
                          if c["predicted_fits"] and c["family"] == fam}, reverse=True)
        hi = space.rows[fam.mesh] or 2
        options = [b for b in dict.fromkeys([hi, 1, *fitting]) if b not in own]
        out += [((fam, b, 1), fam.apply(space.config, b, 1)) for b in options[:max(2 - len(ok), 0)]]
        has_acc = any(f == fam and m > 1 and not c.get("error") and not c["refused"]
                      for (f, b, m), c in compiled.items())
        if fam in accumulating and not has_acc:
            out += _accumulating(space, fam)
    for fam in accumulating - set(best):
        if not any(f == fam and m > 1 and not c.get("error") and not c["refused"]
                   for (f, b, m), c in compiled.items()):
            out += _accumulating(space, fam)
    return [job for job in dict(out).items() if job[0] not in compiled]


def _accumulating(space: Space, fam: Family) -> list[tuple[tuple, RunConfig]]:
    """The family's accumulating splits with the largest and the smallest per-device batch."""
    acc = [(b, m) for b, m in space.splits(fam.mesh, None) if m > 1]
    return [((fam, b, m), fam.apply(space.config, b, m)) for b, m in dict.fromkeys((acc[0], acc[-1]))]


def _checked(space: Space, candidates: list[dict], compiled: dict) -> list[dict]:
    """The candidates ``_verify`` compiles, in its order: predicted within the slack of the HBM,
    not yet compiled."""
    limit = space.hbm * (1 + PREDICTION_SLACK)
    return [c for c in candidates if c["predicted_peak_bytes"] <= limit
            and (c["family"], c["per_device_batch"], c["microbatches"]) not in compiled]


def predict(space: Space, lines: dict[Family, dict]) -> list[dict]:
    """Every candidate (family x split) with its predicted peak and step, best first among those
    predicted to fit."""
    rows = []
    for fam, line in lines.items():
        peak, step = line["peak"], line["step"]
        if peak is None:
            continue
        most = int((space.hbm - peak.a) // peak.slope) if peak.slope > 0 else 1
        for b, m in space.splits(fam.mesh, most):
            # accumulating adds what the family's (else the mesh's) compiles with microbatches
            # measured, else the f32 gradient sums' bytes
            acc = line.get("accumulation")
            p = peak.at(b) + ((space.state_per_device(fam) / 2 if acc is None else acc.at(b)) if m > 1 else 0)
            s = accumulated_step(step, b, m) if step else None
            tok = space.tokens_per_device(fam, b, m)
            rows.append({"family": fam, "per_device_batch": b, "microbatches": m,
                         "predicted_peak_bytes": int(p), "predicted_fits": p <= space.hbm,
                         "model_step_s": s, "model_tokens_per_s_per_device": tok / s if s else None})
    rows.sort(key=lambda r: (not r["predicted_fits"], -(r["model_tokens_per_s_per_device"] or 0)))
    return rows


def search(config: RunConfig, *, tokens: int | None, slices: int | None = None,
           tensor: tuple[int, ...] = DEFAULT_TENSOR, plans: tuple[str, ...] = DEFAULT_PLANS,
           offload: bool = True, top: int = 3, workers: int | None = None, cache: bool = True,
           extra: list[tuple[str, RunConfig]] | None = None, progress: Progress | None = None,
           ray: str | None = None) -> dict:
    """Fit, predict, compile the best: ``{"space", "compiled", "lines", "candidates", "extra",
    "wall_s", "workers", "ray"}``. ``extra``: named configurations compiled beside the search (the
    published row); ``ray``: a Ray cluster's address, the compiles run there (``workers`` unused)."""
    say = Said(progress or (lambda message: None))
    t0 = time.perf_counter()
    space = Space(config, tokens, slices, tuple(tensor), tuple(plans), offload)
    if ray:
        from remat_lab.studies.plan.ray_fanout import RayFanout

        pool = RayFanout(ray, cache)
        workers = pool.workers
    else:
        workers = default_workers() if workers is None else workers
        pool = Fanout(workers, cache)
    compiled: dict[tuple, dict] = {}
    extras: dict[str, dict] = {}
    instant = estimate(space)
    say.instant = {(r["family"], r["per_device_batch"], r["microbatches"]): r for r in instant}
    said = [r for r in instant if r["instant_fits"]][:3]
    say.estimates = [{"what": "estimate by hand (not compiled): "
                      + key_text((r["family"], r["per_device_batch"], r["microbatches"])),
                      "peak_bytes": r["instant_peak_bytes"], "predicted_s": r["instant_step_s"],
                      "took_s": None, "error": "an estimate: the compiles below replace it"} for r in said]
    say("estimate in seconds (by hand, uncompiled; compiles follow): " + ("; ".join(
        f"{key_text((r['family'], r['per_device_batch'], r['microbatches']))} ~"
        f"{r['instant_peak_bytes'] / 2**30:.1f} GiB, "
        f"~{r['instant_tokens_per_s_per_device']:,.0f} tokens/s/device"
        for r in said) or "no candidate is estimated to fit"))
    try:
        jobs = [((fam, b, m), fam.apply(space.config, b, m)) for fam, b, m in fit_points(space)]
        # the published rows first: a candidate that is one of them is filed from its compile
        jobs = [(("extra", name), c) for name, c in (extra or [])] + jobs
        say.planned, say.workers = len(jobs) + top + 1, max(workers, 1)
        say.why = "fitting the model: each mesh's plans at two batches, the lines every candidate follows"
        n, k = len(space.rows), len(plans)
        say(f"fitting the model: {len(jobs)} compiles over {n} mesh{'es' * (n != 1)} and "
            f"{k} plan{'s' * (k != 1)}, {max(workers, 1)} at a time"
            + (f" on the Ray cluster at {ray}" if ray else ""))
        collect(pool, jobs, compiled, extras, say)
        again = second_points(space, compiled)
        if again:
            say.planned += len(again)
            say.why = "plans refused at their largest batch, compiled at their smallest"
            say(f"{len(again)} plans refused at their largest batch: each compiled at its smallest too")
            collect(pool, again, compiled, extras, say)
        phases = {"fit": len(compiled) + len(extras)}
        lines = fit(space, compiled)
        candidates = predict(space, lines)
        before: dict[tuple, int] = {}  # what the model said of each refinement compile beforehand
        for _ in range(3):  # the best families measured on their own, then predicted again
            again = refine_points(space, compiled, candidates, top, max(workers, 1))
            if not again:
                break
            said = {(c["family"], c["per_device_batch"], c["microbatches"]): c["predicted_peak_bytes"]
                    for c in candidates}
            before.update({k: said[k] for k, _ in again if k in said})
            say.planned += len(again)
            say.why = "the best families measured on their own"
            say(f"the best families measured on their own: {len(again)} compiles (a second batch, "
                "their own accumulation steps)")
            collect(pool, again, compiled, extras, say)
            lines = fit(space, compiled)
            candidates = predict(space, lines)
        phases["refine"] = len(compiled) + len(extras) - phases["fit"]
        off = [relative_error(p, compiled[k]["peak_bytes"]) for k, p in before.items()
               if not compiled[k].get("error") and not compiled[k]["refused"]]
        say("estimate (the model, not yet compiled): " + "; ".join(
            key_text((c["family"], c["per_device_batch"], c["microbatches"]))
            for c in candidates[:3] if c["predicted_fits"])
            + (f" (the model's peak was off by up to {max(off):.0%} on the {len(off)} compiles that "
               "measured the best families before they were compiled)" if off else ""))
        checked: dict[tuple, int | None] = {}
        lines, candidates = _verify(space, pool, candidates, lines, compiled, extras, top,
                                    max(workers, 1), say, checked)
        phases["check"] = len(compiled) + len(extras) - phases["fit"] - phases["refine"]
    finally:
        pool.close()
    return {"phases": phases, "space": space, "compiled": compiled, "lines": lines, "candidates": candidates,
            "extra": extras, "wall_s": time.perf_counter() - t0, "workers": max(workers, 1), "ray": ray,
            "before_refinement": before, "before_check": checked, "instant": instant}


def _verify(space: Space, pool: Fanout, candidates: list[dict], lines: dict, compiled: dict,
            extras: dict, top: int, width: int, say: Said, before: dict) -> tuple[dict, list[dict]]:
    """Compile candidates best first (``width`` at a time) until the ``top`` best are compiled and
    fit, one of them held out (a compile the fit did not use: the model's error is measured on it),
    or none is left that the model says may fit. A compile over the HBM rules out what it dominates
    (``converge.ruled_out``); with no global batch the best family's batch is bracketed between its
    largest fit and its smallest refusal (``converge.next_batch``), never walked down one a compile.
    ``before``: what the model said of each compile's peak beforehand; the model is fitted again
    when a compile is off it by more than its stated error (``PREDICTION_SLACK``)."""
    focus: dict = {}
    while True:
        batch = _next_compiles(space, candidates, lines, compiled, top, width, bool(before), focus)
        if not batch:
            return lines, candidates
        said = {_key(c): c["predicted_peak_bytes"] for c in candidates}
        for k, _ in batch:
            fam, b, m = k
            line = (lines.get(fam) or {}).get("peak")
            before[k] = said.get(k) or (int(line.at(b)) if line and m == 1 else None)
        say.planned = max(say.planned, len(say.rows) + len(batch))
        say.why = ("checking the best candidates at full size" if space.sequences is not None else
                   "the largest batch that fits, between the largest fit and the smallest refusal")
        collect(pool, batch, compiled, extras, say)
        off = [(k, before[k], compiled[k]) for k, _ in batch if before.get(k) and not compiled[k].get("error")
               and (compiled[k]["refused"] and before[k] <= space.hbm
                    or relative_error(before[k], compiled[k]["peak_bytes"]) > PREDICTION_SLACK)]
        if off:
            k, p, c = off[0]
            say(f"{key_text(k)}: the model said {p / 2**30:.2f} GiB, the compile "
                + ("was refused over HBM" if c["refused"] else f"{c['peak_bytes'] / 2**30:.2f} GiB")
                + f", more than the model's stated error ({PREDICTION_SLACK:.0%}): the model is fitted again "
                "with it")
            lines = fit(space, compiled)
            candidates = predict(space, lines)


def _key(c: dict) -> tuple:
    return (c["family"], c["per_device_batch"], c["microbatches"])


def _next_compiles(space: Space, candidates: list[dict], lines: dict, compiled: dict, top: int,
                   width: int, held_out: bool, focus: dict) -> list[tuple[tuple, RunConfig]]:
    """The next ``width`` compiles of the check, or none when it is done (``held_out``: one was
    compiled already; ``focus``: the family being bracketed, kept between calls)."""
    limit, hbm = space.hbm * (1 + PREDICTION_SLACK), space.hbm
    ranked = [c for c in candidates if (_key(c) in compiled and fits(compiled[_key(c)], hbm))
              or (_key(c) not in compiled and c["predicted_peak_bytes"] <= limit
                  and not ruled_out(_key(c), compiled, hbm))]
    out: list[tuple] = []
    if space.sequences is None and ranked:  # as large as fits: the best family's batch bracketed
        # the family being bracketed is kept until it is closed (ties would spread the compiles)
        fam = next((c["family"] for c in ranked if c["family"] == focus.get("family")), ranked[0]["family"])
        lo, _, hi, _ = bracket(fam, compiled, hbm)
        first = next(c for c in ranked if c["family"] == fam)
        if _key(first) in compiled and hi is not None and hi - lo <= 1:
            rate = "model_tokens_per_s_per_device"
            if _key(ranked[0]) in compiled or (ranked[0][rate] or 0) <= (first[rate] or 0) * (1 + 1e-9):
                return out  # its largest batch that fits is compiled, the next one over the HBM
            # another family is predicted better: bracketed in turn, first at the batch the closed
            # one found (its line has not yet met what the compiles said of this mesh's growth)
            known, fam, first = lo, ranked[0]["family"], ranked[0]
            lo, _, hi, _ = bracket(fam, compiled, hbm)
            if hi is None and lo < known < first["per_device_batch"]:
                focus["family"] = fam
                return [((fam, known, 1), fam.apply(space.config, known, 1))]
        focus["family"] = fam
        b = next_batch(fam, (lines.get(fam) or {}).get("peak"), compiled, hbm)
        b = first["per_device_batch"] if b is None else b
        # one compile a round: a second at once halves no more rounds than the first alone
        if (fam, b, 1) not in compiled and lo < b and (hi is None or b < hi):
            out.append(((fam, b, 1), fam.apply(space.config, b, 1)))
        if out or _key(first) in compiled:
            return out
    if held_out and all(_key(c) in compiled for c in ranked[:top]):
        return out
    for c in [c for c in ranked if _key(c) not in compiled][:width]:
        out.append((_key(c), c["family"].apply(space.config, c["per_device_batch"], c["microbatches"])))
    return out

"""The largest batch whose compiled peak fits a budget: predictions from a line, doubling, bisection."""

from __future__ import annotations

from collections.abc import Callable

from remat_lab.config import ConfigError, RunConfig, human_bytes
from remat_lab.studies.advisor.search import (
    MAX_BATCH,
    Progress,
    batch_unit,
    checks_runs,
    probe,
    runs_here,
)


def _interpolate(lo: int, p_lo: int, hi: int, p_hi: int, budget: int) -> int:
    """The batch where the line through (lo, p_lo) and (hi, p_hi) reaches ``budget``, rounded down."""
    if p_hi <= p_lo:
        return (lo + hi) // 2
    return lo + int((budget - p_lo) * (hi - lo) // (p_hi - p_lo))


def intercept(found: dict) -> int | None:
    """The bytes at batch 0 of the line through a finished search's lowest and highest probes (the
    batch-independent part of a peak: parameters, gradients, code), or None with too few probes."""
    rows = sorted((p["batch"], p["peak_bytes"]) for p in found["probes"])
    (b1, p1), (b2, p2) = rows[0], rows[-1]
    if b2 <= b1 or p2 <= p1:
        return None
    return int(p1 - (p2 - p1) * b1 // (b2 - b1))


def largest_batch(config: RunConfig, budget: int, *, guess: int | None = None,
                  max_batch: int = MAX_BATCH, progress: Progress | None = None,
                  measure: Callable[[RunConfig], dict] | None = None,
                  base_bytes: int | None = None,
                  check: Callable[[RunConfig], dict] | None = None) -> dict:
    """The largest batch of ``config`` (its policy) whose compiled peak is at most ``budget``.

    The batch is searched per device and per microbatch: batch ``b`` is the global batch
    ``b * batch_unit(config)`` (data x fsdp devices, microbatches), whose compiled peak is one
    device's; ``guess`` and ``max_batch`` are global batches, and so are the batches returned.
    The compiled peak grows about linearly with the batch, so the search predicts from a line
    through what it has measured and checks the prediction and the batch after it; bisection
    takes over once a prediction does not narrow the bracket by half. It starts at ``guess`` (the
    previous policy's answer) and its next batch, or at batches 1 and 2; given ``base_bytes`` (another
    policy's ``intercept``: the peak's part that does not grow with the batch), it predicts from the
    line through it and the guess instead of probing the batch after the guess. At most about
    2·log2(max_batch) + 3 compiles, usually 2 to 5. Near the budget XLA's own rematerialization
    pass decides what fits, not monotonically in the batch: when it rewrote the answer's program or
    the first refusal's, the two batches after the refusal are compiled too and a fit among them
    moves the search on (``xla_decided``, ``checked_above``; the reason says so with the margin).
    Returns ``{"max_batch", "per_device_batch", "peak_bytes", "next_batch", "next_peak_bytes",
    "probes": [{"batch", "per_device_batch", "peak_bytes", "fits"}], "compiles", "reason",
    "limited_by", "margin_bytes", "xla_decided", "checked_above"}``: ``max_batch`` 0 when batch 1
    (per device) does not fit, ``next_batch`` None and ``limited_by`` "search_limit" when even
    ``max_batch`` (the lab's limit) fits: the answer is then a lower bound.

    Locally on an accelerator (``search.checks_runs``; or given ``check``) the answer is also run
    once (``search.runs_here``): where the runtime refuses what the compile fitted, that batch is
    the refusal and the search bisects below it among batches that compile and run (``runs``:
    ``{batch: check's answer}``; ``limited_by`` "runtime").
    """
    say = progress or (lambda message: None)
    if check is None and checks_runs(config):  # the Advisor's and the synthesizer's searches
        check = runs_here
    measure = measure or probe  # ``probe`` (a compile); tests pass synthetic curves
    probes: dict[int, dict] = {}
    unit = batch_unit(config)
    rows_per_device = unit // config.microbatches
    if max_batch < unit:
        raise ConfigError(f"max_batch {max_batch} is less than one example per device and "
                          f"microbatch ({unit}); raise it to {unit} or more.")
    guess = guess // unit if guess else None
    max_batch = max_batch // unit

    def peak(b: int) -> int:
        if b not in probes:
            say(f"{config.policy}: compiling batch {b * unit}"
                + (f" ({b * config.microbatches} per device)" if rows_per_device > 1 else ""))
            probes[b] = measure(config.replace(batch=b * unit))
        return probes[b]["peak_bytes"]

    def fits(b: int) -> bool:
        return peak(b) <= budget

    def take(b: int, predicted: bool) -> None:
        """``b`` fits: the new ``lo``; after a prediction, the batch after it says whether it is the
        answer (the prediction is usually the boundary or one short of it)."""
        nonlocal lo, hi
        lo = b
        if predicted and lo < max_batch and (hi is None or hi - lo > 1):
            if fits(lo + 1):
                lo += 1
            else:
                hi = lo + 1

    # 1. A bracket: lo fits (0: nothing does yet), hi does not (None: not found yet).
    first = min(max(guess or 1, 1), max_batch)
    lo, hi = (first, None) if fits(first) else (0, first)
    pred = None
    if guess and base_bytes is not None and peak(first) > base_bytes:  # the line from batch 0
        pred = min(max(first * (budget - base_bytes) // (peak(first) - base_bytes), 1), max_batch)
    if pred is not None and abs(pred - first) > 1 and (pred > lo if lo else pred < hi):
        if fits(pred):
            take(pred, True)
        else:
            hi = pred
    elif lo and guess and lo < max_batch:  # is the guess already the answer?
        if not fits(lo + 1):
            hi = lo + 1
        else:
            lo = lo + 1

    def search(predicted: int) -> None:
        """Up (predictions, then doubling) until a batch does not fit, down (halving) while
        none fits, then the bracket narrowed to adjacent batches."""
        nonlocal lo, hi
        while hi is None and lo < max_batch:
            b, use = lo * 2, False
            if predicted < 2:
                small = min(probes)
                if lo > small and peak(lo) > peak(small):
                    # the line says lo is the answer or past it: the batch after lo checks that
                    pred = max(_interpolate(small, peak(small), lo, peak(lo), budget), lo + 1)
                    b, use, predicted = pred, True, predicted + 1
            b = min(b, max_batch)
            if fits(b):
                take(b, use)
            else:
                hi = b
        if hi is not None and lo == 0:  # downward: the first probe did not fit
            while hi > 1 and lo == 0:
                b = hi // 2
                if fits(b):
                    lo = b
                else:
                    hi = b
        # 2. Narrow the bracket: predict from the line through its ends (and check the batch after a
        # prediction that fits); once a prediction does not halve the bracket, bisect.
        predict = True
        while hi is not None and hi - lo > 1:
            width = hi - lo
            use = predict and lo > 0
            b = _interpolate(lo, peak(lo), hi, peak(hi), budget) if use else (lo + hi) // 2
            b = min(max(b, lo + 1), hi - 1)
            if fits(b):
                take(b, use)
            else:
                hi = b
            predict = predict and hi - lo <= width // 2  # one that does not halve it: bisect from now on

    above: list[int] = []  # batches probed above a refusal XLA's own pass decided
    predicted = 0  # upward: two predictions from a line, then doubling
    while True:
        search(predicted)
        # Near the budget XLA's own rematerialization pass decides, and what fits is not monotone
        # in the batch there (a plain llama3-8b twin fits 11, not 12, fits 13): when the pass
        # rewrote the answer's program or the first refusal's, the two batches after the refusal
        # are compiled too, and a fit among them moves the answer up (and the search on from it).
        if hi is None or above or not (_rewritten(probes.get(lo)) or _rewritten(probes.get(hi))):
            break
        top = hi
        for b in (top + 1, top + 2):
            if b <= max_batch:
                above.append(b)
                if fits(b):
                    lo = b
        if lo < top:
            break
        hi = lo + 1 if lo + 1 in probes and not fits(lo + 1) else None  # else on up from lo
    ran: dict[int, dict] = {}

    def runs(b: int) -> bool:
        if b not in ran:
            say(f"{config.policy}: running batch {b * unit} once on the device (its compile fits; "
                "does the runtime take it?)")
            ran[b] = check(config.replace(batch=b * unit))
        return ran[b]["ran"]

    refused_at_run = None
    if check is not None and lo and not runs(lo):
        # the runtime refused what the compile fitted: below it, the batches that compile and run
        refused_at_run = hi = lo
        below = sorted((b for b, v in probes.items() if b < lo and v["peak_bytes"] <= budget),
                       reverse=True)
        lo = 0
        for b in below:
            if runs(b):
                lo = b
                break
            hi = b
        while hi - lo > 1:
            b = (lo + hi) // 2
            if fits(b) and runs(b):
                lo = b
            else:
                hi = b
        refused_at_run = hi if hi in ran and not ran[hi]["ran"] else None
    decided = (bool(lo) and refused_at_run is None
               and (_rewritten(probes.get(lo)) or _rewritten(probes.get(hi))))
    rows = [{"batch": k * unit, "per_device_batch": k * config.microbatches,
             "peak_bytes": v["peak_bytes"], "fits": v["peak_bytes"] <= budget}
            for k, v in sorted(probes.items())]
    per = " per device" if rows_per_device > 1 else ""
    if refused_at_run is not None:
        measured = ran.get(lo, {}).get("measured_peak_bytes")
        reason = "does not run even batch 1: "
        if lo:
            reason = (f"batch {lo * unit} peaks at {human_bytes(probes[lo]['peak_bytes'])}{per} and "
                      "ran on the device" + (f" (the allocator measured {human_bytes(measured)})"
                                             if measured else "") + "; ")
        reason += (f"batch {hi * unit} compiles to {human_bytes(probes[hi]['peak_bytes'])}, under "
                   f"the budget of {human_bytes(budget)}, but the device refused it when it ran: the "
                   "device holds more than the compiled peak when it runs (the allocator's rounding, "
                   f"other arrays) ({ran[hi]['error'][:160]})")
    elif lo == 0 and probes[1].get("refused_memory") == "host":
        reason = (f"does not fit even batch 1{per}: libtpu refuses it for pinned host memory (its "
                  f"offloaded tensors: {human_bytes(probes[1]['peak_bytes'])} a device)")
    elif lo == 0:
        reason = (f"does not fit even batch 1{per}: its compiled peak is "
                  f"{human_bytes(probes[1]['peak_bytes'])}, over the budget of {human_bytes(budget)}")
    elif hi is None:
        reason = (f"fits ≥ {max_batch * unit}, the search's limit (the lab searches no larger "
                  "batch): the budget was not reached")
    elif probes[hi].get("refused_memory") == "host":
        reason = (f"batch {lo * unit} peaks at {human_bytes(probes[lo]['peak_bytes'])}{per}; libtpu "
                  f"refuses batch {hi * unit} for pinned host memory (its offloaded tensors: "
                  f"{human_bytes(probes[hi]['peak_bytes'])} a device), not the device's")
    else:
        reason = (f"batch {lo * unit} peaks at {human_bytes(probes[lo]['peak_bytes'])}{per}; batch "
                  f"{hi * unit} would need {human_bytes(probes[hi]['peak_bytes'])}")
        if lo in ran:
            reason += "; it ran once on the device"
    margin = budget - probes[lo]["peak_bytes"] if lo else None
    if decided:
        reason += (f"; XLA's own rematerialization pass decided it (it rewrote batch "
                   f"{(lo if _rewritten(probes.get(lo)) else hi) * unit}'s program), "
                   f"{human_bytes(margin)} = {100 * margin / budget:.1f} % under the budget; "
                   "fitting is not monotone in the batch there: batch"
                   f"{'es' * (len(above) > 1)} {', '.join(str(b * unit) for b in above)} above the "
                   "first refusal compiled too")
    return {
        "max_batch": lo * unit, "per_device_batch": lo * config.microbatches,
        "peak_bytes": probes[lo]["peak_bytes"] if lo else None,
        "next_batch": hi * unit if hi else None,
        "next_peak_bytes": probes[hi]["peak_bytes"] if hi else None,
        "probes": rows, "compiles": sum(not v["cached"] for v in probes.values()),
        "reason": reason,
        # what stopped the search: the memory budget, or its own largest batch (a lower bound)
        "limited_by": ("runtime" if refused_at_run is not None else
                       "budget" if hi is not None else "search_limit"),
        # the budget less the answer's peak; XLA's own pass rewrote the answer's or the refusal's
        # program (the batches above the refusal compiled: ``checked_above``)
        "margin_bytes": margin, "xla_decided": decided,
        "checked_above": [b * unit for b in above],
        "runs": {b * unit: v for b, v in sorted(ran.items())},
    }


def _rewritten(found: dict | None) -> bool:
    """Whether XLA's own rematerialization pass rewrote a probe's program."""
    return bool(((found or {}).get("xla_remat") or {}).get("applied"))

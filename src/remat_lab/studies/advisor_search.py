"""The advisor's batch search: compile-only probes (cached by configuration) and the largest batch that fits.

XLA's compiled memory analysis is known before anything is allocated, so the search needs compiles,
not runs: each probe lowers and compiles the program (``config.step``'s: the gradient step, or the
whole training step with its optimizer state) on abstract inputs (``jax.ShapeDtypeStruct``, sharded
on a mesh) and reads ``memory.peak_bytes``, per device on a mesh. Two policies whose lowered
programs are the same text (e.g. ``full`` and ``nothing_saveable``) share one compile. The batch is
searched per device and per microbatch (``batch_unit``): the global batch is that times data x fsdp
times the microbatches. Per policy: from a first guess (the previous policy's answer) and, when
known, the bytes that do not grow with the batch, predictions from a line through the measured
peaks, doubling and bisection, down to the exact batch that fits and the next one that does not.
Probes may run in several threads (``advisor_sizing``): lowerings take turns, compiles overlap, and
a program in flight is compiled once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable

from remat_lab.analysis import hlo
from remat_lab.analysis.by_kind import memory_by_kind
from remat_lab.analysis.by_kind import source as by_kind_source
from remat_lab.analysis.by_kind_buffers import SOURCE as BUFFERS
from remat_lab.analysis.by_kind_buffers import compile_with_dump, read_kinds
from remat_lab.analysis.costs import memory_report, step_costs
from remat_lab.analysis.kernels import kernels_of
from remat_lab.analysis.timeline import compile_dumped
from remat_lab.analysis.traffic import traffic_of
from remat_lab.analysis.xla_remat import rematerialized
from remat_lab.config import (
    LIMITS,
    LOCAL,
    SEQ_MODELS,
    ConfigError,
    RunConfig,
    get_target,
    human_bytes,
    mesh_devices,
    parse_mesh,
)
from remat_lab.model.models import block_names
from remat_lab.program.analysis_compile import compile_for_analysis, compile_unlimited
from remat_lab.program.backend import needed_bytes, out_of_memory, xla_error
from remat_lab.program.mesh import granules
from remat_lab.program.step import (
    abstract_problem,
    device_model_report,
    jit_program,
    logits_bytes,
    program_args,
)
from remat_lab.program.tracing import trace_and_lower
from remat_lab.studies.probe_cache import Once, ProbeCache

MAX_BATCH = LIMITS["batch"][1]
PROBE_CACHE_ENTRIES = 1024  # a probe is a few numbers: ~1 KB each

Progress = Callable[[str], None]


_PROBES = ProbeCache(PROBE_CACHE_ENTRIES)
_PROGRAMS = ProbeCache(64)  # compiled figures by lowered program text: policies that lower alike
# Lowerings made by program_key, until a probe of them takes them; sized by their program text
# (a 128-layer loop llm's is tens of MiB).
_KEYED = ProbeCache(32, max_bytes=64 << 20)
_COMPILING = Once()  # the same program text compiled once even when two threads ask at once
# Tracing and lowering hold the GIL anyway and NNX keeps graph state while tracing: one at a time.
# XLA's compiles release the GIL, so probes in parallel threads (``advisor_sizing``) overlap those.
_LOWERING = threading.Lock()


def _probe_key(config: RunConfig) -> RunConfig:
    return config.replace(repeats=1, warmup=0, seed=0)  # none of these changes the program


def batch_unit(config: RunConfig) -> int:
    """Examples per step for each example searched: one per device of data x fsdp, per
    microbatch (the searched batch is per device and per microbatch)."""
    sizes = parse_mesh(config.mesh)
    return sizes.get("data", 1) * sizes.get("fsdp", 1) * config.microbatches


def _lowered(config: RunConfig):
    """``(problem, lowered)``: ``config.step``'s program traced and lowered on abstract inputs."""
    with _LOWERING:
        problem = abstract_problem(config)
        try:
            return problem, trace_and_lower(jit_program(problem), *program_args(problem))[1]
        except Exception as err:  # XlaRuntimeError and friends
            raise xla_error("compiling", err) from err


def _text_key(config: RunConfig, lowered, text: str | None = None) -> tuple:
    text = lowered.as_text() if text is None else text
    return (config.target, config.target_devices, config.compile_only,
            hashlib.sha256(text.encode()).hexdigest())


def program_key(config: RunConfig) -> tuple:
    """What identifies ``config``'s lowered program (two policies with equal keys compile alike);
    the lowering is kept for a probe of the same configuration (``probe`` takes it)."""
    problem, lowered = _lowered(config)
    text = lowered.as_text()
    _KEYED.put(_probe_key(config), (problem, lowered), size=len(text))
    return _text_key(config, lowered, text)


def compile_abstract(config: RunConfig, unlimited: bool = False):
    """``config.step``'s program lowered and compiled on abstract inputs (nothing allocated);
    ``unlimited``: with XLA's rematerialization limit lifted (``compile_unlimited``)."""
    _, lowered = _lowered(config)
    platform = "cpu" if config.target == LOCAL else get_target(config.target).platform
    try:
        return compile_unlimited(lowered, platform) if unlimited else compile_for_analysis(lowered)
    except Exception as err:
        raise xla_error("compiling" + " with XLA's remat limit lifted" * unlimited, err) from err


def _compiled_figures(lowered, on_target: bool = True, train: RunConfig | None = None,
                      granules: list[int] | None = None, gpu: bool = False) -> dict:
    """What a probe reads from the compiled program: the peak and its parts, flops, fingerprint,
    whether XLA's own rematerialization pass rewrote it (``xla_remat``: cheap, from the text),
    compiled for a named target (``on_target``), what the step-time estimate reads (``traffic``:
    locally steps are timed, not estimated) and, for ``train`` (a training step's configuration),
    its memory by kind read from its own buffers (``buffers``: None after a persistent-cache hit,
    which dumps nothing); ``granules``: each device's slice or host (``mesh.granules``)."""
    dump = None
    try:
        if train is None:
            compiled = compile_for_analysis(lowered)
        else:
            compiled, dump = compile_dumped(lowered, read_only=True)
    except Exception as err:
        if out_of_memory(err):  # a TPU's compile refuses a program over its HBM: it does not fit
            return _over_the_device(err)
        raise xla_error("compiling", err) from err
    text = compiled.as_text()
    xla_remat = len(rematerialized(text))
    memory = memory_report(compiled) or {}
    if memory.get("peak_bytes") is None:
        raise ConfigError("this backend gives no compiled memory analysis, so the advisor cannot "
                          "size batches on it.")
    costs = step_costs(compiled, text)
    flops, bytes_accessed = costs["flops"], costs["bytes_accessed"]
    parts = ("peak_bytes", "temp_bytes", "argument_bytes", "output_bytes", "alias_bytes",
             "generated_code_bytes")
    return {"peak_bytes": int(memory["peak_bytes"]), "memory": {k: memory.get(k) for k in parts},
            "flops": flops, "bytes_accessed": bytes_accessed, "fingerprint": hlo.fingerprint(text),
            "xla_remat": {"applied": bool(xla_remat), "instructions": xla_remat},
            "traffic": traffic_of(text, granules) if on_target else None,  # analysis/estimate.py reads it
            # analysis/predict.py prices these one by one (a GPU target's prediction)
            "kernels": kernels_of(text) if on_target and gpu else None,
            "kernel_flops": costs["kernel_flops"],
            "buffers": _buffers(train, dump, memory)}


def _buffers(config: RunConfig | None, dump, memory: dict) -> dict | None:
    """The training step's kinds from its buffers (``by_kind_buffers.read_kinds``), or None."""
    return config and read_kinds(dump, memory, depth=config.depth, names=block_names(config))


def _over_the_device(err: Exception) -> dict:
    """A probe XLA refused for lack of device memory (libtpu checks HBM at compile time): its peak
    is the bytes XLA says it needs (``backend.needed_bytes``; else over any budget)."""
    need = needed_bytes(err) or 1 << 60
    parts = dict.fromkeys(("argument_bytes", "output_bytes", "alias_bytes", "generated_code_bytes"), 0)
    return {"peak_bytes": need, "memory": {"peak_bytes": need, "temp_bytes": need, **parts},
            "flops": None, "bytes_accessed": None, "fingerprint": f"over the device: {err}"[:240],
            "xla_remat": {"applied": False, "instructions": 0}, "traffic": None, "buffers": None}


def probe(config: RunConfig) -> dict:
    """One compile-only probe: ``{"batch", "peak_bytes", "memory", "by_kind", "flops",
    "fingerprint", "cached", "s"}``.

    ``peak_bytes`` is XLA's compiled peak (``memory.peak_bytes``; one device's on a mesh);
    ``by_kind`` what fills that device (``analysis/by_kind.py``, with the parameters' and optimizer
    state's bytes of one device's shards); ``flops`` the step's flops with loop bodies scaled by
    their trip counts. Results are cached in this process by configuration, and the compiled
    figures by the lowered program's text (a policy that lowers as another reuses its compile).
    """
    key = _probe_key(config)
    found = _PROBES.get(key)
    if found is not None:
        return {**found, "cached": True}
    t0 = time.perf_counter()
    kept = _KEYED.get(key)
    _KEYED.drop(key)
    problem, lowered = kept if kept is not None else _lowered(config)
    text_key = _text_key(config, lowered)

    def compiled() -> tuple[dict, bool]:
        figures = _PROGRAMS.get(text_key)
        if figures is None:
            figures = _compiled_figures(lowered, config.target != LOCAL,
                                        config if config.step == "train" else None,
                                        granules(getattr(problem, "mesh", None)),
                                        gpu=config.target != LOCAL
                                        and get_target(config.target).platform == "cuda")
            _PROGRAMS.put(text_key, figures)
            return figures, False
        return figures, True

    (figures, reused), waited = _COMPILING.run(text_key, compiled)
    reused = reused or waited
    kinds = memory_by_kind(figures["memory"], device_model_report(problem),
                           train=config.step == "train",
                           logits_bytes=logits_bytes(config, per_device=True), buffers=figures["buffers"])
    out = {"batch": config.batch, **figures, "by_kind": {k: v for k, v in kinds.items()
                                                         if k != "method"},
           "by_kind_source": by_kind_source(kinds), "same_program": reused, "s": time.perf_counter() - t0}
    _PROBES.put(key, out)
    return {**out, "cached": reused}


def probed_flops(config: RunConfig) -> dict[int, float | None]:
    """``{batch: flops}`` of every cached probe of ``config``'s program (any batch)."""
    mine = _probe_key(config)  # compared field by field, the batch left out (``replace`` validates)
    names = [f.name for f in dataclasses.fields(config) if f.name not in ("batch", "input_shape")]
    return {k.batch: v["flops"] for k, v in _PROBES.items() if k.input_shape[1:] == mine.input_shape[1:]
            and all(getattr(k, n) == getattr(mine, n) for n in names)
            and not v.get("xla_remat", {}).get("applied")}  # XLA's recomputation is no model flop


def clear_cache() -> None:
    _PROBES.clear()
    _PROGRAMS.clear()
    _KEYED.clear()


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
                  base_bytes: int | None = None) -> dict:
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
    """
    say = progress or (lambda message: None)
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
    decided = bool(lo) and (_rewritten(probes.get(lo)) or _rewritten(probes.get(hi)))
    rows = [{"batch": k * unit, "per_device_batch": k * config.microbatches,
             "peak_bytes": v["peak_bytes"], "fits": v["peak_bytes"] <= budget}
            for k, v in sorted(probes.items())]
    per = " per device" if rows_per_device > 1 else ""
    if lo == 0:
        reason = (f"does not fit even batch 1{per}: its compiled peak is "
                  f"{human_bytes(probes[1]['peak_bytes'])}, over the budget of {human_bytes(budget)}")
    elif hi is None:
        reason = (f"fits ≥ {max_batch * unit}, the search's limit (the lab searches no larger "
                  "batch): the budget was not reached")
    else:
        reason = (f"batch {lo * unit} peaks at {human_bytes(probes[lo]['peak_bytes'])}{per}; batch "
                  f"{hi * unit} would need {human_bytes(probes[hi]['peak_bytes'])}")
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
        "limited_by": "budget" if hi is not None else "search_limit",
        # the budget less the answer's peak; XLA's own pass rewrote the answer's or the refusal's
        # program (the batches above the refusal compiled: ``checked_above``)
        "margin_bytes": margin, "xla_decided": decided,
        "checked_above": [b * unit for b in above],
    }


def _rewritten(found: dict | None) -> bool:
    """Whether XLA's own rematerialization pass rewrote a probe's program."""
    return bool(((found or {}).get("xla_remat") or {}).get("applied"))


def device_fields(config: RunConfig, found: dict) -> dict:
    """An advice row's per-device figures at ``found``'s largest batch (``largest_batch``):
    ``devices``, ``tokens_per_step`` (global batch x seq for the sequence models, else None) and
    ``by_kind``, what fills one device at that batch (``probe``'s, from the cache)."""
    batch = found["max_batch"]
    seq = config.seq if config.model in SEQ_MODELS else None
    at = probe(config.replace(batch=batch)) if batch else {}
    kinds, source = at.get("by_kind"), at.get("by_kind_source")
    if batch and config.step == "train" and at["buffers"] is None and at["flops"] is not None:
        compiled, dump = compile_with_dump(_lowered(config.replace(batch=batch))[1])  # a cache hit
        kinds = _buffers(config, dump, memory_report(compiled)) or kinds  # dumped nothing: again
        source = BUFFERS if kinds is not at.get("by_kind") else source
    return {"devices": mesh_devices(config.mesh), "tokens_per_step": batch * seq if seq else None,
            "by_kind": kinds, "by_kind_source": source}


def probe_seconds(config: RunConfig, repeats: int = 5) -> list[float]:
    """Seconds of ``repeats`` uncached compile-only probes of ``config`` (the probe cache cleared
    before each; XLA's persistent cache, when on, still applies): for the benchmark."""
    out = []
    for _ in range(repeats):
        _PROBES.drop(_probe_key(config))
        _PROGRAMS.clear()
        t = time.perf_counter()
        probe(config)
        out.append(time.perf_counter() - t)
    return out


"""The advisor's compile-only probes of a configuration, cached: each program's peak, flops and kinds.

XLA's compiled memory analysis is known before anything is allocated, so the search needs compiles,
not runs: each probe lowers and compiles the program (``config.step``'s: the gradient step, or the
whole training step with its optimizer state) on abstract inputs (``jax.ShapeDtypeStruct``, sharded
on a mesh) and reads ``memory.peak_bytes``, per device on a mesh. Two policies whose lowered
programs are the same text (e.g. ``full`` and ``nothing_saveable``) share one compile. The batch is
counted per device and per microbatch (``batch_unit``): the global batch is that times data x fsdp
times the microbatches; ``batch_search`` finds the largest that fits from these probes. Probes may
run in several threads (``advisor_sizing``): lowerings take turns, compiles overlap, and a program
in flight is compiled once.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import threading
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp

from remat_lab.analysis import hlo
from remat_lab.analysis.by_kind import memory_by_kind
from remat_lab.analysis.by_kind import source as by_kind_source
from remat_lab.analysis.by_kind_buffers import SOURCE as BUFFERS
from remat_lab.analysis.by_kind_buffers import compile_with_dump, read_kinds
from remat_lab.analysis.costs import memory_report, step_costs
from remat_lab.analysis.kernels import kernels_of
from remat_lab.analysis.schedule import events as schedule_events
from remat_lab.analysis.timeline import compile_dumped
from remat_lab.analysis.traffic import traffic_of
from remat_lab.analysis.xla_remat import rematerialized
from remat_lab.config import (
    LIMITS,
    LOCAL,
    SEQ_MODELS,
    ConfigError,
    RunConfig,
    batch_rows,
    get_target,
    mesh_devices,
    parse_mesh,
)
from remat_lab.model.models import block_names
from remat_lab.program.analysis_compile import compile_for_analysis, compile_unlimited
from remat_lab.program.backend import needed_bytes, out_of_memory, refused_memory, xla_error
from remat_lab.program.mesh import granules
from remat_lab.program.step import (
    abstract_problem,
    device_model_report,
    jit_program,
    logits_bytes,
    program_args,
    release_other_models,
)
from remat_lab.program.tracing import trace_and_lower
from remat_lab.studies.device_checks import allocator_before, allocator_report
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
    """Examples per step for each example searched: one per device of data x fsdp (x expert), per
    microbatch (the searched batch is per device and per microbatch)."""
    return batch_rows(parse_mesh(config.mesh)) * config.microbatches


def lowered_program(config: RunConfig):
    """``(problem, lowered)``: ``config.step``'s program (a training step's whole program, its
    optimizer update included) traced and lowered on abstract inputs."""
    return _lowered(config)


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
            bool(config.collective_overlap),  # a TPU's figures then carry the schedule
            hashlib.sha256(text.encode()).hexdigest())


def program_key(config: RunConfig) -> tuple:
    """What identifies ``config``'s lowered program (two policies with equal keys compile alike);
    the lowering is kept for a probe of the same configuration (``probe`` takes it)."""
    problem, lowered = _lowered(config)
    text = lowered.as_text()
    _KEYED.put(_probe_key(config), (problem, lowered), size=len(text))
    return _text_key(config, lowered, text)


def compiled_schedule(config: RunConfig) -> tuple[str, dict]:
    """``config.step``'s optimized HLO on its target and its schedule (``schedule.events``, each
    device's slice or host from its mesh): what a TPU's step would be with the collectives as
    libtpu writes them (benchmarks/tpu_step_model.py)."""
    problem, lowered = _lowered(config)
    try:
        text = compile_for_analysis(lowered).as_text()
    except Exception as err:
        raise xla_error("compiling", err) from err
    return text, schedule_events(text, granules(getattr(problem, "mesh", None)))


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
                      granules: list[int] | None = None, schedule: bool = False) -> dict:
    """What a probe reads from the compiled program: the peak and its parts, flops, fingerprint,
    whether XLA's own rematerialization pass rewrote it (``xla_remat``: cheap, from the text),
    compiled for a named target (``on_target``), what the step-time estimate reads (``traffic``:
    locally steps are timed, not estimated) and, for ``train`` (a training step's configuration),
    its memory by kind read from its own buffers (``buffers``: None after a persistent-cache hit,
    which dumps nothing); ``granules``: each device's slice or host (``mesh.granules``);
    ``schedule``: its collectives' schedule too (a GPU's, a TPU's with a ``collective_overlap``)."""
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
            # analysis/predict.py prices these one by one (a target's prediction)
            "kernels": kernels_of(text) if on_target else None,
            # a GPU's, or a TPU's with a collective_overlap (predict.py)
            "schedule": schedule_events(text, granules) if schedule else None,
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
            "refused_memory": refused_memory(err), "flops": None, "bytes_accessed": None,
            "fingerprint": f"over the device: {err}"[:240],
            "xla_remat": {"applied": False, "instructions": 0}, "traffic": None, "kernels": None,
            "schedule": None, "buffers": None}


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
            on_target = config.target != LOCAL
            figures = _compiled_figures(lowered, on_target, config if config.step == "train" else None,
                                        granules(getattr(problem, "mesh", None)),
                                        schedule=on_target and (get_target(config.target).platform != "tpu"
                                                           or bool(config.collective_overlap)))
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


_RUNNING = threading.Lock()  # one runtime check on the device at a time (probes run in threads)


def checks_runs(config: RunConfig) -> bool:
    """Whether the search calls ``runs_here`` on its answer: locally on an accelerator, where the
    runtime can refuse a program its compile fitted (the device holds more than the program)."""
    # (a test's stand-in configuration may have no target)
    return getattr(config, "target", None) == LOCAL and jax.default_backend() != "cpu"


def runs_here(config: RunConfig) -> dict:
    """``config.step``'s program compiled for this process's device and called once on zero-filled
    inputs: ``{"ran": bool, "error"?, "measured_peak_bytes"?, "exact"?}``.

    A compile that fits is not yet a program that runs: the device also holds what the compile
    does not see (this process's other arrays; the allocator's rounding: it measured 1.00-1.09x
    the compiled peak on 6 steps of a v5e, benchmarks/chip). There gpt2-small's training step at
    batch 115 compiled to 15.0 of the chip's 15.75 GiB and was refused when it ran
    ("RuntimeProgramAllocationFailure") while an earlier model's parameters were still cached.
    Out of memory at run time is ``ran`` False with the error; any other failure is raised."""
    with _RUNNING:
        release_other_models(config)  # an earlier model's cached parameters off the device
        gc.collect()  # executables and buffers of earlier probes that only a collection frees
        problem, lowered = _lowered(config)
        try:
            compiled = lowered.compile()
        except Exception as err:
            if out_of_memory(err):
                return {"ran": False, "error": f"its compile was refused: {str(err)[:300]}"}
            raise xla_error("compiling", err) from err
        zeros = lambda s: (jnp.zeros(s.shape, s.dtype, device=s.sharding)
                           if isinstance(s, jax.ShapeDtypeStruct) else s)
        out = None
        try:
            args = jax.tree_util.tree_map(zeros, program_args(problem))
            before = allocator_before()
            out = jax.block_until_ready(compiled(*args))
            report = allocator_report(before, memory_report(compiled), "step") or {}
            return {"ran": True, "measured_peak_bytes": report.get("measured_peak_bytes"),
                    "exact": report.get("exact")}
        except Exception as err:
            if out_of_memory(err):
                return {"ran": False, "error": str(err).strip()[:300]}
            raise xla_error("running", err) from err
        finally:
            del out, compiled
            args = None
            gc.collect()


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


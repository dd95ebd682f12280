"""XLA compiles of programs that are read and never run: LLVM's optimisation off, XLA's HLO passes unchanged.

What the lab reads from a compiled program (the memory analysis, the optimized HLO text, XLA's cost
analysis) comes from XLA's HLO passes and its buffer assignment, which run before any machine code
is generated. ``xla_backend_optimization_level=0`` and ``xla_llvm_disable_expensive_passes`` change
only the LLVM work after them: on XLA CPU a transformer's compile takes 1.0-1.1 s instead of
1.7-2.0 s (width 512, seq 256, depth 8, scan; 2 cores). ``tests/test_analysis_compile.py`` checks
that the optimized HLO text and every memory field are identical to the default compile's, on the
local CPU and on a named GPU and TPU target. Never for a program that is run or timed.

``compile_unlimited`` compiles the same program with the device's memory limit lifted for XLA's own
rematerialization pass (``HloRematerialization``), which otherwise rewrites a program that is over
the device's memory: the lab reads the model's flops from such a compile (``analysis/xla_remat``).
"""

from __future__ import annotations

ANALYSIS_ONLY = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}

# The memory limit XLA's rematerialization pass works to, lifted 1000x: on a GPU it is the device's
# memory less the program's inputs and outputs times ``xla_gpu_memory_limit_slop_factor`` percent
# (XLA's gpu_compiler, default 95); on a TPU libtpu's pass works to
# ``xla_jf_rematerialization_percent_shared_memory_limit`` percent of HBM. Under the limit both
# change nothing: the same optimized HLO text (tests/test_xla_remat.py).
UNLIMITED = {
    "cuda": {"xla_gpu_memory_limit_slop_factor": 100_000},
    "tpu": {"xla_jf_rematerialization_percent_shared_memory_limit": 100_000},
}


def compile_for_analysis(lowered, **options):
    """``lowered.compile()`` with :data:`ANALYSIS_ONLY` (plus ``options``, e.g. ``xla_dump_to``)."""
    return lowered.compile(compiler_options={**ANALYSIS_ONLY, **options})


def compile_unlimited(lowered, platform: str):
    """``compile_for_analysis`` with XLA's rematerialization limit lifted on ``platform`` ("cuda",
    "tpu"; other backends have no such pass: a plain analysis compile)."""
    return compile_for_analysis(lowered, **UNLIMITED.get(platform, {}))


# libtpu's option to finish a compile whose program is over the chip's HBM instead of refusing it:
# the program it would run, every pass done (memory-space assignment too), its peak over HBM.
TPU_PAST_HBM = {"xla_tpu_no_crash_on_oom": True}


def compile_past_hbm(lowered):
    """``compile_for_analysis`` of a TPU program libtpu refuses for HBM, finished anyway
    (:data:`TPU_PAST_HBM`): read for its kernels and step time, never run."""
    return compile_for_analysis(lowered, **TPU_PAST_HBM)

"""XLA compiles of programs that are read and never run: LLVM's optimisation off, XLA's HLO passes unchanged.

What the lab reads from a compiled program (the memory analysis, the optimized HLO text, XLA's cost
analysis) comes from XLA's HLO passes and its buffer assignment, which run before any machine code
is generated. ``xla_backend_optimization_level=0`` and ``xla_llvm_disable_expensive_passes`` change
only the LLVM work after them: on XLA CPU a transformer's compile takes 1.0-1.1 s instead of
1.7-2.0 s (width 512, seq 256, depth 8, scan; 2 cores). ``tests/test_analysis_compile.py`` checks
that the optimized HLO text and every memory field are identical to the default compile's, on the
local CPU and on a named GPU and TPU target. Never for a program that is run or timed.
"""

from __future__ import annotations

ANALYSIS_ONLY = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def compile_for_analysis(lowered, **options):
    """``lowered.compile()`` with :data:`ANALYSIS_ONLY` (plus ``options``, e.g. ``xla_dump_to``)."""
    return lowered.compile(compiler_options={**ANALYSIS_ONLY, **options})

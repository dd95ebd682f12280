"""A run's witness compiles, started beside its main compile: no_remat's program and the gradient reference.

Both are independent of the policy's own compile, and XLA's compiles release the GIL, so on a
fresh configuration they run in threads while the main program lowers and compiles; the run waits
for them before it times its step (nothing else then shares the cores with the timed calls).
The no_remat witness is cached per model and objective (a sweep over policies compiles it once).
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor, wait

from remat_lab.analysis.costs import memory_report, program_flops
from remat_lab.analysis.gradcheck import reference_loss_and_grads
from remat_lab.analysis.xla_remat import rematerialized
from remat_lab.config import LOCAL, RunConfig, get_target
from remat_lab.program.analysis_compile import compile_for_analysis, compile_unlimited
from remat_lab.program.step import Problem, jit_step, problem_for
from remat_lab.program.tracing import trace_and_lower

# Two witnesses per run; runs in one process take turns (the worker runs one job at a time).
_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="remat_lab_witness")


def baseline_program(config: RunConfig) -> dict:
    """The ``no_remat`` compile of ``config``'s model with the same objective, not run.

    The witness for what a policy's compiled program recomputes (``dissect.compare_compiled``):
    ``{"text", "flops", "memory", "xla_remat_instructions"}``. Where XLA's own rematerialization
    pass rewrote no_remat's program (over the device's memory), ``text`` and ``flops`` are those of
    a second compile with the pass's limit lifted (the model as written: the model flops), and
    ``memory`` stays the first compile's. Cached per model and objective, so a sweep over
    policies compiles it once.
    """
    return _baseline(config.replace(policy="no_remat", repeats=1, warmup=0))


@functools.lru_cache(maxsize=16)
def _baseline(ref_cfg: RunConfig) -> dict:
    problem = problem_for(ref_cfg)
    _, lowered = trace_and_lower(jit_step(problem), *problem.args)
    compiled = compile_for_analysis(lowered)
    text = compiled.as_text()
    memory, rewritten = memory_report(compiled), len(rematerialized(text))
    if rewritten:  # XLA's own pass recomputed to fit: the witness is the program as written
        platform = "cpu" if ref_cfg.target == LOCAL else get_target(ref_cfg.target).platform
        compiled = compile_unlimited(lowered, platform)
        text = compiled.as_text()
    return {"text": text, "flops": program_flops(compiled, text)[0], "memory": memory,
            "xla_remat_instructions": rewritten}


baseline_program.cache_clear = _baseline.cache_clear  # type: ignore[attr-defined]


class Witnesses:
    """The witness compiles of one run, in flight. ``baseline()`` is no_remat's program (raises
    what its compile raised); ``settle()`` waits for all, so nothing runs beside the timed calls.

    The gradient reference is only compiled (and run once) here to fill its compile cache; the
    gradient check calls it again and, the executable cached, only runs it. Its failure is left to
    the check to report. A problem on a device mesh checks against a gathered copy: not warmed;
    ``reference=False`` (compile-only: nothing is checked) leaves it out. ``parallel=False``: the
    baseline is compiled when asked for, in this thread (the order before this module).
    """

    def __init__(self, config: RunConfig, problem: Problem, *, reference: bool = True,
                 parallel: bool = True):
        self.config = config
        self.retried = False
        self._base: Future | None = None
        self._reference: Future | None = None
        if parallel:
            self._base = _POOL.submit(baseline_program, config)
            if reference and getattr(problem, "mesh", None) is None:
                self._reference = _POOL.submit(reference_loss_and_grads, problem)

    def settle(self) -> None:
        """Wait until every witness has finished (successfully or not)."""
        wait([f for f in (self._base, self._reference) if f is not None])

    def baseline(self) -> dict:
        """No_remat's program: from the thread, else (not started in parallel) compiled now. A
        thread's trace that met JAX's tracing store already written (``StoreException: Store
        occupied``, issue 46; ``program/tracing`` should prevent it) is traced again here, alone,
        and ``retried`` says so."""
        if self._base is None:
            return baseline_program(self.config)
        try:
            return self._base.result()
        except Exception as err:
            if type(err).__name__ != "StoreException":
                raise
            self.retried = True
            return baseline_program(self.config)

"""A run's witness compiles, started beside its main compile: no_remat's program and the gradient reference.

Both are independent of the policy's own compile, and XLA's compiles release the GIL, so on a
fresh configuration they run in threads while the main program lowers and compiles; the run waits
for them before it times its step (nothing else then shares the cores with the timed calls).
The no_remat witness is cached per model and objective (a sweep over policies compiles it once).
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor, wait

import jax

from remat_lab.analysis.costs import memory_report, program_flops
from remat_lab.analysis.gradcheck import reference_loss_and_grads
from remat_lab.analysis.xla_remat import rematerialized
from remat_lab.config import LOCAL, RunConfig, get_target
from remat_lab.program.analysis_compile import compile_for_analysis, compile_unlimited
from remat_lab.program.backend import needed_bytes, out_of_memory, xla_error
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
    # on an attached accelerator from abstract inputs: the witness allocates nothing on the device
    accelerator = ref_cfg.target == LOCAL and jax.default_backend() != "cpu"
    problem = problem_for(ref_cfg.replace(compile_only=True) if accelerator else ref_cfg)
    _, lowered = trace_and_lower(jit_step(problem), *problem.args)
    compiled = compile_for_analysis(lowered)
    text = compiled.as_text()
    memory, rewritten = memory_report(compiled), len(rematerialized(text))
    if rewritten:  # XLA's own pass recomputed to fit: the witness is the program as written
        platform = (jax.default_backend() if ref_cfg.target == LOCAL
                    else get_target(ref_cfg.target).platform)
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

    def baseline_or_left_out(self, refusable: bool) -> tuple[dict | None, str | None]:
        """``(no_remat's program, None)``, or where its compile was refused for the device's memory
        and ``refusable`` (a named target, or an attached accelerator: its compiler checks the
        memory), ``(None, why it is left out)``: the policy's own program stands, and what needs
        the witness is left out and said. Any other failure is raised as XLA's error."""
        try:
            return self.baseline(), None
        except Exception as err:
            if not (refusable and out_of_memory(err)):
                raise xla_error("compiling the no_remat baseline", err) from err
            need = needed_bytes(err)
        where = "this device" if self.config.target == LOCAL else f"one {self.config.target} device"
        return None, (
            f"The no_remat program, the witness for what this policy recomputes, does not fit "
            f"{where}{f' (it needs {need / 2**30:.2f} GiB)' if need else ''}: its compile was "
            "refused, so the compiled program's recomputation, the recomputed phases of the "
            "timeline and the collectives against no_remat are left out; the memory, flops and "
            "timing are this policy's program's own.")

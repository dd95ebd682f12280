"""The bench's synthesizer timings: the bench transformer in 2 GiB, and llama3-8b on 8 x H100 (fsdp=8).

``synthesize_transformer_s``: the bench transformer (width 512, seq 256, 8 heads, depth 8, scan) in
2 GiB, goal max-batch, locally (XLA CPU: no offload); ``synthesize_llama3_8b_s``: llama3-8b, seq 8192,
the training step, 8 x H100 with fsdp=8 (flash attention falling back to chunked, the loss in 8
chunks), goal max-batch. Each from empty probe and persistent caches; ``compiles`` the synthesizer's
own and the named policies' apart. The llama3-8b synthesis takes tens of minutes on 2 cores, so
``bench --quick`` leaves both out.
"""

from __future__ import annotations

import time
from contextlib import nullcontext

from remat_lab.config import RunConfig
from remat_lab.studies.bench_advise import ADVISE_TRANSFORMER, ADVISE_TRANSFORMER_BUDGET
from remat_lab.studies.bench_env import clear_caches

LLAMA = dict(seq=8192, step="train", target="h100", target_devices=8, mesh="fsdp=8", batch=8,
             attention="flash", loss_chunks=8)


def synthesize_timed(config: RunConfig, budget: int | None, cache=None) -> dict:
    """Seconds to the synthesis of ``config`` (goal max-batch) from empty caches, and its figures."""
    from remat_lab.studies import advisor
    from remat_lab.studies.synthesize import synthesize

    with (cache() if cache else nullcontext()):
        clear_caches()
        advisor.clear_cache()
        t0 = time.perf_counter()
        doc = synthesize(config, budget)
    return {"s": time.perf_counter() - t0, "answer": doc["answer"], "plan": doc["plan"],
            "max_batch": doc["max_batch"], "compiles": doc["compiles"],
            "xla_forced_compiles": doc["xla_forced_compiles"], "named_compiles": doc["named_compiles"],
            "compile_limit": doc["compile_limit"]}


def synthesize_bench(cache=None) -> dict:
    """``{"transformer": ..., "llama3_8b": ...}`` (``synthesize_timed`` each)."""
    return {"transformer": synthesize_timed(ADVISE_TRANSFORMER, ADVISE_TRANSFORMER_BUDGET, cache),
            "llama3_8b": synthesize_timed(RunConfig.from_preset("llama3-8b", **LLAMA), None, cache)}

"""One lock around JAX tracing: threads that trace (witnesses, the Advisor's searches) take turns.

JAX's traced functions keep per-transformation stores that two threads tracing the same cached
function at once can both write: Pallas's splash attention kernel (``attention="flash"`` on TPU) is
one, built once and reused, and a no_remat witness traced in a thread beside the main program failed
with JAX's ``StoreException: Store occupied`` (issue 46). Tracing and lowering are Python-bound and
hold the GIL anyway; only XLA's compiles, outside the lock, ran in parallel, and still do.
"""

from __future__ import annotations

import threading

TRACING = threading.RLock()


def trace_and_lower(jitted, *args):
    """``(traced, lowered)`` of ``jitted`` on ``args``, under ``TRACING``."""
    with TRACING:
        traced = jitted.trace(*args)
        return traced, traced.lower()

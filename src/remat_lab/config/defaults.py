"""The one default configuration: what the app opens on and ``run``/``explain`` use without flags.

``RunConfig()``'s own field defaults stay the seed's one-block case (the engine's tests and the
studies build on them); a user, in the app or at the command line, starts from ``APP_DEFAULT``: a
scanned 8-block mlp (width 256, batch 128), where checkpoint policies visibly differ on a CPU.
Measured (XLA CPU): peak 10.4 MiB (nothing_saveable) / 11.7 (no_remat) / 12.2
(dots_with_no_batch_dims_saveable), one step about 8 ms.
"""

from __future__ import annotations

from .run import RunConfig

APP_DEFAULT = RunConfig(width=256, batch=128, depth=8, stack="scan")


def flag_defaults() -> dict[str, object]:
    """The fields where ``APP_DEFAULT`` differs from ``RunConfig()`` (for argparse's ``set_defaults``)."""
    base = RunConfig()
    return {k: v for k, v in APP_DEFAULT.as_dict().items() if getattr(base, k) != v}

"""The planner: mesh x remat plan x per-device batch x accumulation x offload, searched, compiled."""

from __future__ import annotations

from remat_lab.config import RunConfig
from remat_lab.studies.plan.doc import document, published_rows
from remat_lab.studies.plan.search import Progress, search
from remat_lab.studies.plan.space import DEFAULT_PLANS, DEFAULT_TENSOR


def plan(config: RunConfig, *, global_batch_tokens: int | None = None, slices: int | None = None,
         tensor: tuple[int, ...] = DEFAULT_TENSOR, plans: tuple[str, ...] = DEFAULT_PLANS,
         offload: bool = True, top: int = 3, workers: int | None = None, cache: bool = True,
         published: bool = True, block_from_published: bool = False,
         progress: Progress | None = None) -> dict:
    """The whole run planned for ``config``'s model, target and devices (``plan --json``; see
    ``doc.document``): a global batch of ``global_batch_tokens`` (None: as large as fits), the
    published configuration of the same question compiled beside it when ``published``, and with
    ``block_from_published`` the attention kernel's block size taken from it (MaxText tunes it per
    run: 2048 for the v6e's 8k-token runs; the lab's default is 512)."""
    from remat_lab.studies.published import config_for

    sequences = None if global_batch_tokens is None else global_batch_tokens // config.seq
    pubs = {name: config_for(name)[0] for name in published_rows(config, sequences)} if published else {}
    if block_from_published and pubs:
        config = config.replace(attention_block=next(iter(pubs.values())).attention_block)
    result = search(config, tokens=global_batch_tokens, slices=slices, tensor=tensor, plans=plans,
                    offload=offload, top=top, workers=workers, cache=cache,
                    extra=list(pubs.items()), progress=progress)
    return document(result["space"], result, pubs, top)


__all__ = ["DEFAULT_PLANS", "DEFAULT_TENSOR", "plan"]

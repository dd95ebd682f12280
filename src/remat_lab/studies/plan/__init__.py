"""The planner: mesh x remat plan x per-device batch x accumulation x offload, searched, compiled."""

from __future__ import annotations

from remat_lab.config import RunConfig
from remat_lab.studies.plan.cost import across_row, add_costs
from remat_lab.studies.plan.doc import document, published_rows
from remat_lab.studies.plan.search import Progress, search
from remat_lab.studies.plan.space import DEFAULT_PLANS, DEFAULT_TENSOR

# What the search takes from a published run of the same question when the command gives none.
KNOBS = ("attention_block", "stack", "loss_chunks")


def plan(config: RunConfig, *, global_batch_tokens: int | None = None, slices: int | None = None,
         tensor: tuple[int, ...] = DEFAULT_TENSOR, plans: tuple[str, ...] = DEFAULT_PLANS,
         offload: bool = True, top: int = 3, workers: int | None = None, cache: bool = True,
         published: bool = True, knobs_from_published: tuple[str, ...] = (),
         progress: Progress | None = None, ray: str | None = None) -> dict:
    """The whole run planned for ``config``'s model, target and devices (``plan --json``; see
    ``doc.document``): a global batch of ``global_batch_tokens`` (None: as large as fits), the
    published configuration of the same question compiled beside it when ``published``, and the
    fields ``knobs_from_published`` names (of ``KNOBS``: the knobs the search does not range over)
    taken from it: MaxText tunes them per run (the attention blocks, 2048 for the v6e's 8k-token
    runs against the lab's 512; its GPU runs' layers unrolled, ``scan_layers: false``; its vocabulary
    loss whole, ``num_vocab_tiling: 1``, where a preset's is in 8 chunks). ``ray``: a Ray cluster's
    address (``host:port`` of its head, or ``auto``): the compiles run there."""
    from remat_lab.studies.published import config_for

    sequences = None if global_batch_tokens is None else global_batch_tokens // config.seq
    pubs = {name: config_for(name)[0] for name in published_rows(config, sequences)} if published else {}
    taken = {}
    if pubs and knobs_from_published:
        first = next(iter(pubs.values()))
        taken = {k: getattr(first, k) for k in knobs_from_published if k in KNOBS}
        config = config.replace(**taken)
    result = search(config, tokens=global_batch_tokens, slices=slices, tensor=tensor, plans=plans,
                    offload=offload, top=top, workers=workers, cache=cache,
                    extra=list(pubs.items()), progress=progress, ray=ray)
    doc = document(result["space"], result, pubs, top)
    doc["knobs_from_published"] = taken
    return doc


def plan_across(config: RunConfig, also: list[tuple[str, int, float | None]], *, price: float | None = None,
                budget_tokens: float | None = None, progress: Progress | None = None, **question) -> dict:
    """``plan`` on ``config``'s accelerator and on each of ``also`` (``(target, devices, price per
    device-hour or None for its default)``), the same model and global batch: the first's document,
    each priced (``cost.add_costs``), with ``across``: every accelerator's best plan side by side."""
    say = progress or (lambda message: None)
    doc = plan(config, progress=progress, **question)
    add_costs(doc, price, budget_tokens)
    across = [across_row(config.target, config.target_devices, doc)]
    for target, devices, typed in also:
        say(f"the same question on {devices} x {target}")
        other = config.replace(target=target, target_devices=devices, mesh=f"fsdp={devices}",
                               batch=devices, network="", collective_overlap="")
        found = plan(other, progress=progress, **{k: v for k, v in question.items() if k != "slices"})
        add_costs(found, typed, budget_tokens)
        across.append(across_row(target, devices, found))
    if also:
        doc["across"] = across
    return doc


__all__ = ["DEFAULT_PLANS", "DEFAULT_TENSOR", "KNOBS", "plan", "plan_across"]

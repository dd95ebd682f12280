"""The synthesizer's costs: what saving, offloading or recomputing each checkpoint name costs, compiled.

Every figure is a compiled program's (``advisor_search.probe``: compile-only, per device), never an
estimate: no_remat and "every name recomputed" (policy ``custom`` with no names, every layer
remat'd) are compiled at per-device batches 1 and 2, and again at the batch the answer will be near
(the goal's batch, or the largest batch recompute-everything fits by its line from 1 and 2): each
one's peak line (bytes at batch 0 and bytes per example) is the line through 2 and that batch. Each
name saved alone (and, where the target has a host memory space, offloaded alone) is compiled at
that batch, its bytes per example the difference from recompute-everything's there, so the names'
interactions with XLA's schedule there are in the figures; an offloaded name's bytes are on the host
(``host``: what its program moved there), none per example on the device. Flops are the programs' as
the policies wrote them (``xla_free``: a probe XLA's own rematerialization pass rewrote is compiled
again with its limit lifted), so the recomputed flops of a program are its flops less no_remat's at
the same batch (the model is fitted to the programs as written; a candidate's answer is its compiled
program's, XLA's recomputation in): 2k + 6 compiles for k names with offload, k + 6 without.

On a TPU, libtpu refuses a program over the chip's HBM when it compiles it, so such a program has
no flop count: the names are probed at the largest batch no_remat fits by its line (every plan
keeps at most what no_remat keeps, so all compile as written); where no_remat is refused at the
batch probed (the goal's), recompute-everything's recomputation per example is read at batch 1;
where it is refused at every batch, only plans with every layer remat'd are solved for, the names'
spared flops still each program's own (``Model.recompute_basis`` says which). No no_remat figure
is ever estimated.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from remat_lab.config import LOCAL, ConfigError, RunConfig, get_target
from remat_lab.model.models import block_names
from remat_lab.program.backend import ExecutionError, out_of_memory
from remat_lab.studies.advisor.search import batch_unit, probe
from remat_lab.studies.advisor.sizing import xla_free
from remat_lab.studies.synthesize.solve import MAX_NAMES, Model, Plan

# The llm's names outside the per-block remat (the embedding, the vocabulary projection): a policy
# cannot move them, so they are not choices.
OUTSIDE_THE_BLOCK = ("embed", "logits")
# The block's input (MaxText's decoder_layer_input): saving it is what the remat does anyway, so the
# plans leave it on the device (maxtext_yaml writes 'device'); offloading it is not yet a choice.
NOT_CHOSEN = ("decoder_layer_input",)
LO, HI = 1, 2  # the per-device batches probed


class Stopped(Exception):
    """The caller's ``should_stop`` said so: what was compiled is kept."""


def host_memory(config: RunConfig) -> tuple[bool, str]:
    """``(offload possible, why)``: a named target (a GPU's or TPU's pinned host memory) or a local
    GPU/TPU has a host memory space the compiled program can place values in; XLA CPU has none."""
    if config.target != LOCAL:
        return True, f"the {config.target} has pinned host memory: offload is a choice"
    backend = jax.default_backend()
    if backend == "cpu":
        return False, ("XLA CPU has no separate host memory space: offload is not a choice here "
                       "(an offloaded name would stay on the device); compile for a named target "
                       "(--target h100, tpu-v5e, ...) to include it")
    return True, f"the local {backend} has pinned host memory: offload is a choice"


def choice_names(config: RunConfig) -> tuple[str, ...]:
    """The checkpoint names a plan chooses for: the block's (the llm's inside its blocks)."""
    names = tuple(n for n in block_names(config) if n not in (*OUTSIDE_THE_BLOCK, *NOT_CHOSEN))
    if len(names) > MAX_NAMES:
        raise ConfigError(f"the block has {len(names)} checkpoint names; the synthesizer solves "
                          f"exactly for at most {MAX_NAMES}.")
    return names


def plan_config(base: RunConfig, plan: Plan, batch: int) -> RunConfig:
    """The configuration of ``plan`` at per-device ``batch``: policy custom with its names and
    remat'd layer count (no_remat when none is remat'd)."""
    b = batch * batch_unit(base)
    if plan.remat_layers == 0:
        return base.replace(policy="no_remat", batch=b, remat_layers=0)
    return base.replace(policy="custom", save_names=plan.save, offload_names=plan.offload, batch=b,
                        remat_layers=0 if plan.remat_layers >= base.depth else plan.remat_layers)


class Meter:
    """Compiled figures of plans, counted: ``compiles`` is the probes that were not already
    compiled in this process, plus XLA's-pass-free recompiles; ``should_stop`` is asked before each."""

    def __init__(self, base: RunConfig, progress: Callable[[str], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, planned: int = 0):
        self.base, self.compiles, self.planned = base, 0, planned
        self.forced = 0  # of ``compiles``: probes XLA's own pass rewrote, compiled again as written
        self.answer = 0  # of ``compiles``: the refined answer's exact batch search, its own allowance
        self.say = progress or (lambda message: None)
        self.should_stop = should_stop or (lambda: False)

    def own(self) -> int:
        """The compiles that count against the 3k + 12 limit: all but XLA's forced recompiles and
        the refined answer's exact batch search (``answer``)."""
        return self.compiles - self.forced - self.answer

    def figures(self, config: RunConfig, what: str, written: bool = True) -> dict:
        """``{"peak_bytes", "flops", "host_bytes", "written_peak_bytes", "written_flops",
        "xla_remat"}`` of ``config``'s compiled program: ``peak_bytes`` and ``flops`` the compiled
        program's (XLA's own rematerialization included), ``written_*`` the program as the policy
        wrote it (where XLA's pass rewrote it: compiled again with its limit lifted; ``written``
        False: not asked, the compiled program's)."""
        if self.should_stop():
            raise Stopped(what)
        self.say(f"compile {self.compiles + 1}/{max(self.planned, self.compiles + 1)}: {what}")
        found = probe(config)
        self.compiles += not found["cached"]
        applied = bool((found.get("xla_remat") or {}).get("applied"))
        traffic = found.get("traffic") or {}
        if not written:
            return {"peak_bytes": found["peak_bytes"], "flops": found.get("flops"),
                    "written_peak_bytes": found["peak_bytes"], "written_flops": found.get("flops"),
                    "host_bytes": traffic.get("to_host_bytes") or 0.0, "xla_remat": applied}
        free, refused = {"flops": None, "xla_remat": {}}, False
        if found.get("flops") is not None:
            try:
                free = xla_free(config)
            except ExecutionError as err:  # as written, over a TPU's HBM: libtpu refuses it
                if not (_refuses(config) and out_of_memory(err)):
                    raise
                refused = True
        self.compiles += applied
        self.forced += applied
        written = (free.get("xla_remat") or {}).get("from_bytes") if applied else None
        as_written = None if refused else free["flops"] if free["flops"] is not None else found.get("flops")
        return {"peak_bytes": found["peak_bytes"], "flops": found.get("flops"),
                "written_peak_bytes": written or found["peak_bytes"], "written_flops": as_written,
                "host_bytes": traffic.get("to_host_bytes") or 0.0, "xla_remat": applied}

    def plan(self, plan: Plan, batch: int, written: bool = True) -> dict:
        return self.figures(plan_config(self.base, plan, batch), _words(plan, batch), written)


def _words(plan: Plan, batch: int) -> str:
    parts = [f"save {','.join(plan.save)}" if plan.save else "",
             f"offload {','.join(plan.offload)}" if plan.offload else ""]
    what = "; ".join(p for p in parts if p) or "every name recomputed"
    if plan.remat_layers == 0:
        return f"no_remat, batch {batch} per device"
    return f"{what}, {plan.remat_layers} layers remat'd, batch {batch} per device"


def measure(meter: Meter, names: tuple[str, ...], offload: bool, partial: bool, budget: int,
            at: int | None = None) -> tuple[Model, list[dict]]:
    """The cost model of ``meter.base`` over ``names`` from compiled probes, and the probes
    (``{"what", "batch", "peak_bytes", "flops", "host_bytes"}``, per device). The names are probed
    at per-device batch ``at`` (default: the largest recompute-everything fits in ``budget`` by its
    line, at least 2)."""
    depth = meter.base.depth
    rows: list[dict] = []

    def fig(plan: Plan, b: int, what: str) -> dict:
        got = meter.plan(plan, b)
        out = {"peak_bytes": got["written_peak_bytes"], "flops": got["written_flops"],
               "host_bytes": got["host_bytes"]}
        rows.append({"what": what, "batch": b, **out, "xla_remat": got["xla_remat"]})
        return out

    full = [fig(Plan((), (), 0), b, "no_remat") for b in (LO, HI)]
    base = [fig(Plan((), (), depth), b, "every name recomputed") for b in (LO, HI)]

    def line(pair: list[dict]) -> tuple[float, float]:
        slope = (pair[1]["peak_bytes"] - pair[0]["peak_bytes"]) / (HI - LO)
        return pair[0]["peak_bytes"] - slope * LO, slope

    (a_full, s_full), (a_base, s_base) = line(full), line(base)
    hi = at or (int((budget - a_base) // s_base) if s_base > 0 else HI)
    if at is None and _refuses(meter.base) and s_full > 0:  # a TPU compiles nothing over its HBM
        hi = min(hi, int((budget - a_full) // s_full))  # as written: where no_remat fits, so do all
    hi = min(max(hi, HI), 4096)
    if hi != HI:
        base.append(fig(Plan((), (), depth), hi, "every name recomputed"))
        over = base[-1]["peak_bytes"] - budget
        if at is None and over > 0 and hi > HI:  # its line from batches 1-2 under-predicted: the
            s_hi = (base[-1]["peak_bytes"] - a_base) / hi  # batch its compiled peak there gives
            hi = max(min(int((budget - a_base) // s_hi), hi - 1), HI)
            base.append(fig(Plan((), (), depth), hi, "every name recomputed"))
        full.append(fig(Plan((), (), 0), hi, "no_remat"))
    if hi > HI:  # the lines through the compiled peaks at 2 and at hi, where the answer will be:
        # XLA's bytes per example from 1 to 2 are not those at tens (a 3-name SwiGLU block, width 256:
        # 2.69 MB from 1 to 2, 1.67 from 2 to 39; the model 48 % over the compiled peak at 55)
        a_base, s_base = _through(HI, base[1]["peak_bytes"], hi, base[-1]["peak_bytes"])
        if full[-1]["flops"] is not None:  # compiled (not a TPU's refusal, whose peak is libtpu's need)
            a_full, s_full = _through(HI, full[1]["peak_bytes"], hi, full[-1]["peak_bytes"])
    if base[-1]["flops"] is None:
        raise ConfigError(_no_flops(meter.base, "every name recomputed", hi, base[-1]["peak_bytes"]))
    counts = tuple(range(depth + 1)) if partial else (0, depth)
    basis = f"no_remat at {hi} per device"
    if full[-1]["flops"] is not None:
        recompute = max(base[-1]["flops"] - full[-1]["flops"], 0.0) / hi
    elif full[0]["flops"] is not None and base[0]["flops"] is not None:  # over the HBM at hi only
        recompute = max(base[0]["flops"] - full[0]["flops"], 0.0) / LO
        basis = f"no_remat at {LO} per device ({_refused(meter.base, hi, full[-1])})"
    elif _refuses(meter.base):  # no_remat compiles at no batch: every layer remat'd, flops vs the names
        counts, recompute = (depth,), None
        basis = f"the names' own spared flops ({_refused(meter.base, LO, full[0])}, at any batch)"
    else:
        raise ConfigError(_no_flops(meter.base, "no_remat", hi, full[-1]["peak_bytes"]))
    sizes, spared, host, saving = {}, {}, {}, {}
    for n in names:
        for choice in ("save", "offload") if offload else ("save",):
            plan = Plan((n,), (), depth) if choice == "save" else Plan((), (n,), depth)
            got = fig(plan, hi, f"{choice} {n}")
            sizes[(n, choice)] = (got["peak_bytes"] - base[-1]["peak_bytes"]) / hi
            if choice == "offload" and got["host_bytes"]:  # it went to the host: no device bytes
                # per example; the compiled difference (-262 KB to +40 B per example on the SwiGLU
                # block) is the layer's backward reading it back instead of recomputing it, which
                # does not add up across names: kept apart (``Model._offload_saving``)
                saving[n] = min(sizes[(n, choice)], 0.0)
                sizes[(n, choice)] = 0.0
            spared[(n, choice)] = max(base[-1]["flops"] - (got["flops"] or base[-1]["flops"]), 0.0) / hi
            host[(n, choice)] = got["host_bytes"] / hi
    if recompute is None:  # recompute-everything recomputes at least what saving every name spares
        recompute = sum(max(spared[(n, c)] for c in ("save", "offload") if (n, c) in spared) for n in names)
    model = Model(names=names, layers=depth, layer_counts=counts, intercept_full=a_full,
                  slope_full=s_full, intercept_base=a_base, slope_base=s_base, recompute=recompute,
                  bytes=sizes, flops=spared, host=host, offload=offload, recompute_basis=basis,
                  offload_saving=saving)
    return model, rows


def _through(b1: int, p1: float, b2: int, p2: float) -> tuple[float, float]:
    """``(intercept, slope)`` of the line through ``(b1, p1)`` and ``(b2, p2)``."""
    slope = (p2 - p1) / (b2 - b1)
    return p1 - slope * b1, slope


def _refuses(config: RunConfig) -> bool:
    """A TPU target: libtpu refuses a program over the chip's HBM at compile time (no flop count)."""
    return config.target != LOCAL and get_target(config.target).platform == "tpu"


def _refused(config: RunConfig, batch: int, got: dict) -> str:
    return (f"no_remat at {batch} per device needs {got['peak_bytes'] / 2**30:.1f} GiB, over the "
            f"{config.target}'s HBM: libtpu refuses it, no flop count")


def _no_flops(config: RunConfig, what: str, batch: int, peak: int) -> str:
    """Why recomputation cannot be measured: a TPU refuses a program over its HBM at compile time
    (so it has no flop count), other backends give none."""
    if config.target != LOCAL and get_target(config.target).platform == "tpu":
        return (f"{what} at {batch} per device needs {peak / 2**30:.1f} GiB, over the "
                f"{config.target}'s HBM, and libtpu refuses a program over its HBM when it compiles "
                "it, so there is no flop count: recomputation (a program's flops less no_remat's at "
                "the same batch) cannot be measured at this size on this target. A smaller model or "
                "sequence, or a target with more HBM (e.g. tpu-v5p), can be synthesized.")
    return "this backend's compiled programs give no flop count, so recomputation cannot be measured here."


def planned_compiles(k: int, offload: bool) -> int:
    """The measurement's compiles for ``k`` names (before the candidates')."""
    return 6 + k * (2 if offload else 1)

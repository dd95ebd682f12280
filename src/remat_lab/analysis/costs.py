"""XLA's own accounting of a compiled program: its memory analysis and its cost (flops, bytes)."""

from __future__ import annotations

import jax
import jax.extend.backend

from remat_lab.analysis import hlo, hlotext, kernel_flops
from remat_lab.config import human_bytes

MEMORY_FIELDS = ("argument", "output", "alias", "temp", "generated_code")
# On a TPU (tests/test_tpu_memory.py, libtpu's own HBM check under ``xla_tpu_max_hbm_size_mib``):
PEAK_FROM_SUM = ("argument + output - alias + temp + generated_code (XLA's memory analysis): the HBM "
                 "libtpu's own check counts for this program")
PEAK_FROM_XLA_PEAK = ("XLA's peak_memory_in_bytes + generated_code: the HBM libtpu's own check counts "
                      "for this program; libtpu's temp_size_in_bytes is above its temporary HBM here "
                      "(temp_bytes is the rest of the peak; xla_temp_bytes is libtpu's field)")
_DISAGREE = 0.01  # a note when the two figures differ by more than this fraction (and 1 MiB)


def _platform(compiled) -> str | None:
    """The platform of the devices the program was compiled for (None when it names none)."""
    try:
        shardings = jax.tree.leaves((compiled.input_shardings, compiled.output_shardings))
        return next(iter(shardings[0].device_set)).platform if shardings else None
    except Exception:
        return None


def _tpu_peak(out: dict, xla_peak: int | None) -> None:
    """On a TPU the peak is the smaller of the sum and XLA's ``peak_memory_in_bytes`` + code.

    libtpu's ``peak_memory_in_bytes`` also counts buffers it keeps in the chip's on-chip vector
    memory (the dump's ``vmem`` memory space), which take no HBM: for small programs it is far above
    the HBM they use. Its ``temp_size_in_bytes`` is above the temporary HBM its buffer assignment
    holds for large programs (the sum was 1.14x that HBM in one measured case). The smaller of the
    two agrees to 2 MiB or 0.2 % with the HBM libtpu's own check counts (its compile refuses a
    program over ``xla_tpu_max_hbm_size_mib`` with "Used X of Y hbm"), measured for mlp and
    transformer steps on v4, v5e, v5p and v6e, one chip and four (libtpu 0.0.52: for the program
    it compiles under the cap, which, within about 2.5 GiB of the program's need, holds less temp
    than the program compiled for the whole chip that is read here; docs/methods.md). ``temp_bytes`` is
    then the rest of the peak, so that the peak is still argument + output - alias + temp +
    generated_code."""
    total, fixed = out["peak_bytes"], out["peak_bytes"] - out["temp_bytes"]
    out["xla_temp_bytes"] = out["temp_bytes"]
    out["peak_source"], out["notes"] = PEAK_FROM_SUM, []
    if xla_peak is None:
        return
    from_xla = max(xla_peak + out["generated_code_bytes"], fixed)
    if from_xla < total:
        out["peak_bytes"], out["temp_bytes"] = from_xla, from_xla - fixed
        out["peak_source"] = PEAK_FROM_XLA_PEAK
    if abs(from_xla - total) <= max(_DISAGREE * min(from_xla, total), 1 << 20):
        return
    if from_xla > total:
        out["notes"].append(
            f"XLA's peak_memory_in_bytes ({human_bytes(xla_peak)}) is {xla_peak / total:.1f}x this "
            "peak: on a TPU it also counts the buffers libtpu keeps in the chip's on-chip vector "
            "memory (VMEM), which take no HBM; the peak is argument + output - alias + temp + code, "
            "the HBM libtpu's own check counts.")
    else:
        out["notes"].append(
            f"libtpu's temp_size_in_bytes ({human_bytes(out['xla_temp_bytes'])}) is above the "
            f"temporary HBM of this program: argument + output - alias + temp + code would be "
            f"{human_bytes(total)}, {total / from_xla:.2f}x the peak read here, XLA's "
            "peak_memory_in_bytes + generated code, which is the HBM libtpu's own check counts.")


def memory_report(compiled) -> dict | None:
    """Every field of ``compiled.memory_analysis()`` plus the peak; None when unavailable.

    ``peak_bytes = generated_code + argument + output - alias + temp`` is XLA's own lower bound.
    ``xla_peak_memory_bytes`` is XLA's ``peak_memory_in_bytes`` field (on CPU it leaves out temp).
    On a TPU (``_tpu_peak``) the peak is the HBM libtpu's own check counts, and three more keys say
    how: ``peak_source``, ``xla_temp_bytes`` (libtpu's temp field) and ``notes`` (a sentence when
    the two figures disagree); ``temp_bytes`` is the rest of the peak, so the sum above still holds.
    """
    try:
        ma = compiled.memory_analysis()
    except Exception:  # some backends do not implement it
        return None
    if ma is None:
        return None
    out = {}
    for prefix in ("", "host_"):
        for name in MEMORY_FIELDS:
            out[f"{prefix}{name}_bytes"] = int(getattr(ma, f"{prefix}{name}_size_in_bytes", 0) or 0)
    out["peak_bytes"] = (out["generated_code_bytes"] + out["argument_bytes"] + out["output_bytes"]
                         - out["alias_bytes"] + out["temp_bytes"])
    peak = getattr(ma, "peak_memory_in_bytes", None)
    out["xla_peak_memory_bytes"] = None if peak is None else int(peak)
    if _platform(compiled) == "tpu":
        _tpu_peak(out, out["xla_peak_memory_bytes"])
    return out


def cost_of(compiled) -> dict:
    """XLA's cost analysis of the compiled step: ``flops`` and ``bytes_accessed`` (None if absent).

    XLA counts a while loop's body once (a ``scan`` over layers): callers scale by the trip count.
    """
    try:
        cost = compiled.cost_analysis()
    except Exception:
        cost = None
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    cost = cost or {}
    get = lambda key: float(cost[key]) if key in cost else None
    # libtpu's own cost model of the program, in seconds (a loop body counted once); TPU only
    return {"flops": get("flops"), "bytes_accessed": get("bytes accessed"),
            "optimal_seconds": get("optimal_seconds")}


def step_flops(xla_flops: float | None, text: str) -> float | None:
    """The step's flops: XLA's count with every while-loop (scan) body scaled as a whole, plus the
    fused attention kernels XLA counts as 0 (``kernel_flops``: what they compute).

    XLA's cost analysis counts a loop body once. Each body's own cost (products, element-wise work,
    reductions: XLA's rules, from ``body_costs``) is added ``runs - 1`` more times. Where XLA's
    analysis cannot be re-run on the text (see ``body_costs``), only the body's products are
    scaled (``loop_products_left_out``) and element-wise work in a body stays counted once."""
    parts = _step_parts(xla_flops, text)
    return None if parts is None else parts[0] + parts[1]


def _step_parts(xla_flops: float | None, text: str) -> tuple[float, float, float | None] | None:
    """``(XLA's count with loop bodies scaled, the splash kernels' flops, the bytes accessed the
    loop bodies' further runs add)``; None without a count. The bytes are None where XLA's
    analysis cannot be re-run on the text (products only)."""
    if xla_flops is None:
        return None
    text = hlotext.joined(text)
    runs, _ = hlo.executions(text)
    kernels = kernel_flops.kernel_flops(text, runs)
    bodies = _body_parts(text, xla_flops)
    if bodies is None:
        return xla_flops + loop_products_left_out(text, runs), kernels, None
    more = lambda i: sum((runs.get(name, 1) - 1) * own[i] for name, own in bodies.items())
    return xla_flops + more(0), kernels, more(1)


def loop_products_left_out(text: str, runs: dict[str, int] | None = None) -> float:
    """The product flops XLA's cost analysis leaves out by counting each loop body once: over the
    products in loop bodies (and the fusions they call), (runs - 1) x each one's flops, read as
    ``traffic`` reads a product: a dot, a GEMM call or a convolution (libtpu writes a layer's
    products as convolutions, their operands' shapes only at their definitions)."""
    from remat_lab.analysis import traffic

    runs = hlo.executions(text)[0] if runs is None else runs
    module, left_out = traffic.Module(text), 0.0
    for comp, ops in module.comps.items():
        extra = runs.get(comp, 1) - 1
        if extra <= 0:
            continue
        for op in ops:
            if op.opcode in ("dot", "convolution") or (op.opcode == "custom-call" and traffic.is_gemm(op)):
                left_out += extra * (traffic.product_flops(module, op) or 0.0)
    return left_out


def _loops(text: str) -> list[tuple[str, str, str]]:
    """``(computation holding it, body, condition)`` of every ``while`` instruction."""
    out = []
    for comp, ins in hlotext.instructions(text):
        if ins.opcode == "while":
            parts = dict(hlotext.called(ins.rest))
            if "body" in parts and "condition" in parts:
                out.append((comp, parts["body"], parts["condition"]))
    return out


def _analysis_backend():
    """The host's CPU client where there is one: its cost rules give a TPU program's count exactly
    (checked per module, ``_SAME_RULES``; the chip's stored programs recount within 0.002 % of the
    deviceless ones). On a v5e with JAX 0.10.2 the re-analysis in the chip's process (its TPU
    client) fell back to products only, 1.2-1.5 % under; whether it raised or disagreed was not
    told apart, and this choice is not yet run on a chip."""
    try:
        return jax.extend.backend.get_backend("cpu")
    except (RuntimeError, ValueError):  # JAX_PLATFORMS without cpu
        return jax.extend.backend.get_backend()


def _analysed(text: str) -> tuple[float, float]:
    """XLA's cost analysis (``_analysis_backend``) of a module's text, parsed back: its flops and
    bytes accessed."""
    from jax._src.lib import _jax  # XLA's HloCostAnalysis over a parsed module, as jax.stages uses it
    from jaxlib import _hlo

    cost = _jax.hlo_module_cost_analysis(_analysis_backend(), _hlo.hlo_module_from_text(text))
    # libtpu counts a Mosaic kernel's own cost estimate (the grouped experts' ragged_dot kernels);
    # this backend does not: added, so the same rules hold
    return (float(cost.get("flops", 0.0)) + kernel_flops.estimated_flops(text),
            float(cost.get("bytes accessed", 0.0)))


# The whole module re-analysed here may differ from the compiling backend's count by rounding-size
# amounts (libtpu's no_remat llm step: 256 flops in 3.6e9): the same rules; a different rule set
# (another backend's costs for its own instructions) differs by far more.
_SAME_RULES = 1e-6
_CALLS = ("calls=", "to_apply=", "body=", "condition=", "computations=")


class _Module:
    """A module's text split into computations (metadata left out), each with what it calls."""

    def __init__(self, text: str):
        self.blocks: dict[str, list[str]] = {}
        self.callees: dict[str, set[str]] = {}
        self.entry = None
        current = None
        for line in hlotext.without_metadata(text).splitlines():
            comp = hlotext.computation(line)
            if comp is not None:
                current = comp
                self.entry = comp if line.startswith("ENTRY ") else self.entry
                self.blocks[comp] = [line[len("ENTRY "):] if line.startswith("ENTRY ") else line]
                self.callees[comp] = set()
            elif current is not None:
                self.blocks[current].append(line)
                if any(c in line for c in _CALLS):
                    self.callees[current].update(c for _, c in hlotext.called(line))
                if line.startswith("}"):
                    current = None

    def rooted_at(self, name: str | None) -> str:
        """A module of the computations ``name`` reaches (all when None), ``name`` the entry."""
        keep, todo = set(), [name]
        while todo and name is not None:
            comp = todo.pop()
            if comp not in keep and comp in self.blocks:
                keep.add(comp)
                todo.extend(self.callees[comp])
        parts = []
        for comp, block in self.blocks.items():
            if name is None or comp in keep:
                head = "ENTRY " + block[0] if comp == (name or self.entry) else block[0]
                parts.append("\n".join([head, *block[1:]]))
        return "HloModule rooted\n\n" + "\n\n".join(parts)


def body_costs(text: str, xla_flops: float) -> dict[str, float] | None:
    """Each loop body's and condition's own flops (nested loops taken out), by XLA's own rules
    (``_body_parts``' flops)."""
    parts = _body_parts(text, xla_flops)
    return None if parts is None else {name: own[0] for name, own in parts.items()}


def _body_parts(text: str, xla_flops: float) -> dict[str, tuple[float, float]] | None:
    """Each loop body's and condition's own flops and bytes accessed (nested loops taken out), by
    XLA's own rules.

    The compiled text is parsed back and XLA's cost analysis run on it with the body as the entry:
    no compile. Used only when the whole module, analysed the same way, gives XLA's count of the
    compiled program exactly (the same rules as the compiling backend); None otherwise, or when the
    text does not parse back (a target's custom instructions)."""
    text = hlotext.joined(text)
    loops = _loops(text)
    if not loops:
        return {}
    try:
        module = _Module(text)
        if abs(_analysed(module.rooted_at(None))[0] - xla_flops) > _SAME_RULES * max(abs(xla_flops), 1.0):
            return None
        whole = {name: _analysed(module.rooted_at(name))
                 for _, body, cond in loops for name in (body, cond)}
    except Exception:  # the parser or the analysis refuses this text: products only
        return None
    own = dict(whole)
    for comp, body, cond in loops:  # a loop nested in a body: its cost is counted in its own entry
        if comp in own:
            own[comp] = tuple(o - b - c for o, b, c in zip(own[comp], whole[body], whole[cond]))
    return own


def flops_of(compiled) -> float | None:
    """XLA's cost-analysis flop count of the compiled step."""
    return cost_of(compiled)["flops"]


XLA_FLOPS = "XLA's cost analysis, each loop body scaled as a whole by its trip count"
PRODUCT_FLOPS = ("matrix products of the compiled HLO (2 x output elements x contracted size, times "
                 "their runs); XLA gives no cost analysis for this target, elementwise work left out")


def program_flops(compiled, text: str) -> tuple[float | None, float | None, str]:
    """``(flops, bytes accessed, where the flops come from)`` of a compiled step, loop bodies scaled
    by their trip counts, fused attention kernels counted as what they compute (said in the
    source when the program has one). Deviceless GPU compiles carry no cost analysis: their flops
    are then the products counted in the HLO, and bytes accessed are unknown (None)."""
    parts = step_costs(compiled, text)
    return parts["flops"], parts["bytes_accessed"], parts["source"]


def step_costs(compiled, text: str) -> dict:
    """``program_flops``'s three figures (``flops``, ``bytes_accessed``: XLA's, each loop body's
    own scaled by its runs as the flops are; ``source``) and what the
    step-time prediction needs beside them: ``loop_factor`` (the loop-scaled count over XLA's, 1.0
    without XLA's count), ``kernel_flops`` (the fused attention kernels') and libtpu's
    ``optimal_seconds`` (None off a TPU)."""
    cost = cost_of(compiled)
    parts = _step_parts(cost["flops"], text)
    out = {"loop_factor": 1.0, "optimal_seconds": cost["optimal_seconds"]}
    if parts is None:
        products = sum((m["flops"] or 0) * max(m["executions"], 1) for m in hlo.matmuls(text))
        joined = hlotext.joined(text)
        kernels = kernel_flops.kernel_flops(joined, hlo.executions(joined)[0])
        source = f"{PRODUCT_FLOPS}; plus {kernel_flops.SOURCE}" if kernels else PRODUCT_FLOPS
        return {**out, "flops": (products + kernels) or None, "bytes_accessed": None,
                "source": source, "kernel_flops": kernels}
    scaled, kernels, more_bytes = parts
    scale = scaled / cost["flops"] if cost["flops"] else 1.0
    source = f"{XLA_FLOPS}; plus {kernel_flops.SOURCE}" if kernels else XLA_FLOPS
    bytes_accessed = cost["bytes_accessed"]
    if bytes_accessed:  # each loop body's own bytes times its further runs (else: the flops' ratio)
        bytes_accessed = bytes_accessed + more_bytes if more_bytes is not None else bytes_accessed * scale
    return {**out, "flops": scaled + kernels, "loop_factor": scale, "kernel_flops": kernels,
            "bytes_accessed": bytes_accessed or None, "source": source}

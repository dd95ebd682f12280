"""Headless runs: ``python -m remat_lab run|explain|compare|advise|sweep|history|policies`` (and ``bench``).

Bad input exits with status 2 and one line on stderr; an XLA failure exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from remat_lab.config import (
    DTYPES,
    LIMITS,
    OBJECTIVES,
    ConfigError,
    RunConfig,
    human_bytes,
    resolve_budget,
)
from remat_lab.model.models import MODELS, SEQ_MODELS, names_of
from remat_lab.model.policies import DEFAULT_POLICY, GROUPS, POLICIES
from remat_lab.model.stacks import STACKS


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line, exit 2, no usage dump
        # argparse quotes some user text verbatim ("unrecognized arguments: ..."): escape line
        # breaks and other control characters so the message stays one line.
        message = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in message)
        message = " ".join(w if len(w) <= 80 else w[:77] + "..." for w in message.split(" "))
        self.exit(2, f"remat_lab: error: {message}\n")


def _int_arg(name: str):
    lo, hi = LIMITS[name]

    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a whole number from {lo} to {hi}, not {text[:40]!r}") from None
    return parse


def _policies_arg(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in POLICIES]
    if bad or not names:
        what = f"unknown policy {bad[0][:40]!r}" if bad else "no policy given"
        raise argparse.ArgumentTypeError(f"{what}; choose from: {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


def _names_arg(text: str) -> tuple[str, ...]:
    """Comma-separated checkpoint names; checked against the model by ``RunConfig``."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _rounds_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"rounds must be a whole number from 1 to 1000, not {text[:40]!r}")
    return value


def _add_shape_args(p: argparse.ArgumentParser, batch: bool = True) -> None:
    """The model and its sizes (``batch``: with ``--batch``; the advisor searches the batch)."""
    d = RunConfig()
    p.add_argument("--model", choices=MODELS, default=d.model)
    p.add_argument("--width", type=_int_arg("width"), default=d.width, help="features D (1..16384)")
    if batch:
        p.add_argument("--batch", type=_int_arg("batch"), default=d.batch,
                       help="examples B; 0 = the seed's single vector x: (width,) (mlp only)")
    p.add_argument("--seq", type=_int_arg("seq"), default=d.seq,
                   help="sequence length N (seq_mixer, transformer)")
    p.add_argument("--heads", type=_int_arg("heads"), default=d.heads,
                   help="attention heads (transformer; must divide width)")
    p.add_argument("--depth", type=_int_arg("depth"), default=d.depth, help="remat'd blocks (1..16)")
    p.add_argument("--stack", choices=STACKS, default=d.stack,
                   help="depth > 1: scan over stacked layers (default) or an unrolled Python loop")
    p.add_argument("--dtype", choices=DTYPES, default=d.dtype)


def _add_config_args(p: argparse.ArgumentParser) -> None:
    d = RunConfig()
    _add_shape_args(p)
    p.add_argument("--policy", choices=list(POLICIES), default=DEFAULT_POLICY, metavar="POLICY",
                   help=f"one of: {', '.join(POLICIES)}")
    p.add_argument("--save-names", type=_names_arg, default=(), metavar="A,B",
                   help="policy custom: checkpoint names saved on the device (see `policies --model`)")
    p.add_argument("--offload-names", type=_names_arg, default=(), metavar="A,B",
                   help="policy custom: checkpoint names offloaded to pinned host memory")
    p.add_argument("--objective", choices=OBJECTIVES, default=d.objective)
    _add_mesh_args(p)
    p.add_argument("--repeats", type=_int_arg("repeats"), default=d.repeats)
    p.add_argument("--warmup", type=_int_arg("warmup"), default=d.warmup)
    p.add_argument("--seed", type=_int_arg("seed"), default=d.seed)
    p.add_argument("--memory-budget", default=None,
                   help="refuse configurations estimated above this (e.g. 2G); "
                        "default: half the backend's memory, or $REMAT_LAB_MEMORY_BUDGET")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--code", action="store_true",
                   help="print self-contained Flax code for this configuration and exit")
    p.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """The model's settings without batch and policy (the advisor searches those)."""
    d = RunConfig()
    _add_shape_args(p, batch=False)
    p.add_argument("--objective", choices=OBJECTIVES, default=d.objective)
    p.add_argument("--repeats", type=_int_arg("repeats"), default=d.repeats,
                   help="at most this many interleaved timing rounds (fewer when steps are slow)")
    p.add_argument("--seed", type=_int_arg("seed"), default=d.seed)
    p.add_argument("--save-names", type=_names_arg, default=(), metavar="A,B",
                   help="policy custom (in --policies): checkpoint names saved on the device")
    p.add_argument("--offload-names", type=_names_arg, default=(), metavar="A,B",
                   help="policy custom (in --policies): checkpoint names offloaded to the host")


def _add_mesh_args(p: argparse.ArgumentParser) -> None:
    """The device mesh and where its devices come from (sharding.py, distributed.py)."""
    p.add_argument("--mesh", default="", metavar="data=D,fsdp=F,tensor=T",
                   help="shard the step over a device mesh (any subset of the axes; default: one device)")
    p.add_argument("--host-devices", type=_count_arg("host devices", 512), default=None, metavar="N",
                   help="emulate N CPU devices (default: $REMAT_LAB_HOST_DEVICES); GPU/TPU use their own")
    p.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                   help="multi-process run: jax.distributed coordinator (process 0's address)")
    p.add_argument("--num-processes", type=_count_arg("num processes", 1024), default=None, metavar="P")
    p.add_argument("--process-id", type=_count_arg("process id", 1023, lo=0), default=None, metavar="I",
                   help="this process's index, 0..P-1; process 0 prints the result")


def _count_arg(name: str, hi: int, lo: int = 1):
    def parse(text: str) -> int:
        value = int(text) if text.isascii() and text.isdigit() and len(text) < 7 else -1
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number from {lo} to {hi}, "
                                             f"not {text[:40]!r}")
        return value
    return parse


def _setup_devices(args: argparse.Namespace) -> None:
    """Apply --host-devices and join jax.distributed before JAX starts (raises ConfigError)."""
    from remat_lab.program.distributed import setup

    setup(getattr(args, "host_devices", None), getattr(args, "coordinator", None),
          getattr(args, "num_processes", None), getattr(args, "process_id", None))


def _quiet_if_distributed(args: argparse.Namespace):
    """In a multi-process run, native code's stdout lines go to stderr (stdout stays JSON)."""
    from contextlib import nullcontext

    from remat_lab.program.distributed import native_stdout_to_stderr

    return native_stdout_to_stderr() if getattr(args, "coordinator", None) else nullcontext()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m remat_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_config_args(sub.add_parser("run", help="compile, time, size and dissect one configuration"))
    ex = sub.add_parser("explain", help="the residual and per-dot tables and jaxprs, no timing")
    _add_config_args(ex)
    ex.add_argument("--no-jaxpr", action="store_true", help="leave the jaxprs out of the output")
    cmp = sub.add_parser("compare", help="every (or the chosen) policy, timed interleaved, ranked "
                                         "only beyond noise")
    _add_config_args(cmp)
    cmp.add_argument("--policies", type=_policies_arg, default=list(POLICIES),
                     help="comma-separated policy ids (default: all); --policy is ignored")
    cmp.add_argument("--rounds", type=_rounds_arg, default=None,
                     help="interleaved timing rounds (1..1000; default: --repeats)")
    cal = sub.add_parser("calibrate", help="measure this machine's roofs again (peak FLOP/s, copy "
                                           "bandwidth); keeps the higher of the old and new figures")
    cal.add_argument("--json", action="store_true")
    pol = sub.add_parser("policies", help="list the policy registry (and a model's checkpoint names)")
    pol.add_argument("--model", choices=MODELS, default=None,
                     help="also list this model's checkpoint names and which of them each recipe keeps")
    adv = sub.add_parser("advise", help="per policy, the largest batch whose compiled peak fits a "
                                        "memory budget, and the fastest policy at its largest batch")
    _add_model_args(adv)
    adv.add_argument("--budget", default=None, metavar="SIZE",
                     help="device memory to fit, e.g. 256M or 16G (default: the device's memory "
                          "limit, or the run budget on CPU: half the machine's or container's "
                          "memory, or $REMAT_LAB_MEMORY_BUDGET)")
    adv.add_argument("--policies", type=_policies_arg, default=None,
                     help="comma-separated policy ids (default: JAX's named policies)")
    adv.add_argument("--no-time", action="store_true",
                     help="size batches only (compiles, nothing runs); no step times or MFU")
    adv.add_argument("--max-batch", type=_int_arg("batch"), default=LIMITS["batch"][1],
                     help=f"search batches up to this (1..{LIMITS['batch'][1]})")
    adv.add_argument("--memory-budget", default=None,
                     help="what this machine may allocate for the timed runs (as for run); a "
                          "policy whose largest batch is estimated above it is sized, not timed")
    adv.add_argument("--json", action="store_true", help="print one JSON document")
    adv.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")
    _add_sweep_args(sub.add_parser("sweep", help="a grid of configurations, one JSON line each, "
                                                 "appended to --out and resumed from it"))
    _add_history_args(sub.add_parser("history", help="the runs recorded by the app and the CLI"))
    bench = sub.add_parser("bench", help="benchmarks: timing fidelity, latency, sweep throughput")
    bench.add_argument("--quick", action="store_true", help="a smaller run (under 2 min on 2 cores)")
    bench.add_argument("--json", action="store_true")
    return parser


def _config_from(args: argparse.Namespace) -> RunConfig:
    keys = ("model", "width", "batch", "seq", "depth", "stack", "dtype", "policy", "objective",
            "repeats", "warmup", "seed")
    return RunConfig(**{k: getattr(args, k) for k in keys}, heads=args.heads,
                     save_names=args.save_names, offload_names=args.offload_names,
                     mesh=getattr(args, "mesh", ""))


def _fmt_time(s: float | None) -> str:
    return "-" if s is None else f"{s * 1e3:.3f} ms"


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain text table of ``rows`` (for terminals)."""
    if not rows:
        return "(none)"
    cells = [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths))
    return "\n".join([line(columns), line(["-" * w for w in widths]), *map(line, cells)])


DOT_COLUMNS = ["index", "layer", "layers", "lhs_shape", "rhs_shape", "out_shape", "has_batch_dims",
               "policy_verdict", "saved", "offloaded", "recomputed", "recomputed_in_compiled",
               "offloaded_in_compiled"]
RESIDUAL_COLUMNS = ["index", "shape", "dtype", "bytes", "layers", "memory_kind", "kind", "layer", "source"]


def format_tables(result: dict) -> str:
    out = ["Per-dot table (forward pass):", format_table(result["dots"], DOT_COLUMNS)]
    notes = [f"  dot {d['index']} ({d['layer']}): {d['note']}" for d in result["dots"] if d["note"]]
    if notes:
        out += ["", "Dot notes:", *notes]
    out += ["", "Residuals (saved for the backward pass):",
            format_table(result["residuals"], RESIDUAL_COLUMNS)]
    t, h = result["totals"], result["hlo"]
    rec_c = t["dots_recomputed_in_compiled"]
    out += ["", (f"Residual bytes: {human_bytes(t['residual_bytes'])}: activations "
                 f"{human_bytes(t['activation_residual_bytes'])}, parameters "
                 f"{human_bytes(t['parameter_residual_bytes'])}, input "
                 f"{human_bytes(t['input_residual_bytes'])}, zero-cost constants "
                 f"{human_bytes(t['zero_cost_residual_bytes'])} "
                 f"(host in the jaxpr {human_bytes(t['residual_host_bytes'])}, in the compiled program "
                 f"{human_bytes(t['residual_host_bytes_in_compiled'])})"),
            (f"Dots saved {t['dots_saved']}, offloaded {t['dots_offloaded']} "
             f"({t['dots_offloaded_in_compiled']} in the compiled program), recomputed "
             f"{t['dots_recomputed']} in the jaxpr, "
             + ("not compared with no_remat" if rec_c is None else
                f"{rec_c} in the compiled program"))]
    excess = h.get("excess_dots_vs_no_remat")
    line = f"Compiled matrix products: {h['dot_count']}"
    if excess is not None:
        line += f" ({excess:+d} vs no_remat"
        if h.get("excess_flops_vs_no_remat") is not None:
            line += f", {h['excess_flops_vs_no_remat'] / 1e6:+.3g} MFLOP"
        line += ")"
    if h.get("identical_to"):
        line += f"; the same compiled program as {h['identical_to']}"
    out.append(line)
    out += [f"Note: {n}" for n in result["notes"]]
    out += ["", *format_peak(result.get("memory_timeline"))]
    return "\n".join(out)


PEAK_COLUMNS = ["bytes", "shape", "dtype", "kind", "phase", "layer", "name", "instruction"]


def format_peak(timeline: dict | None, top: int = 10) -> list[str]:
    """The largest buffers live at the peak of the memory timeline, as lines of text."""
    if not timeline or timeline.get("source") is None:
        reason = (timeline or {}).get("reason", "not built")
        return [f"Memory over the program: none ({reason})."]
    rows = [{**b, "bytes": human_bytes(b["bytes"]), "shape": "x".join(map(str, b["shape"] or [])) or "()"}
            for b in timeline["at_peak"][:top]]
    head = (f"Buffers live at the peak (instruction {timeline['peak_index']} of {timeline['instructions']}, "
            f"{human_bytes(timeline['peak_live_bytes'])} live; largest {len(rows)} of "
            f"{len(timeline['at_peak'])}):")
    return [head, format_table(rows, PEAK_COLUMNS), f"Note: {timeline['note']}"]


def format_run(result: dict) -> str:
    c, env, st, mem = result["config"], result["environment"], result["step_time_s"], result["memory"]
    head = (f"{c['model']} width={c['width']} batch={c['batch']} depth={c['depth']} {c['dtype']} "
            f"policy={c['policy']} objective={c['objective']}"
            + (f" seq={c['seq']}" if c["model"] in SEQ_MODELS else "")
            + (f" heads={c['heads']}" if c["model"] == "transformer" else "")
            + (f" save_names={','.join(c['save_names']) or '-'} offload_names="
               f"{','.join(c['offload_names']) or '-'}" if c["policy"] == "custom" else ""))
    lines = [head, (f"on {env['backend']} ({env['device_kind']}) x{env['device_count']}, jax "
                    f"{env['jax']}, flax {env['flax']}"), ""]
    lines.append(f"compile: lower {result['compile']['lower_s']:.3f} s, "
                 f"compile {result['compile']['compile_s']:.3f} s")
    if st:
        lines.append(f"step time: median {_fmt_time(st['median'])} (p25 {_fmt_time(st['p25'])}, "
                     f"p75 {_fmt_time(st['p75'])}, min {_fmt_time(st['min'])}, "
                     f"max {_fmt_time(st['max'])}; {st['repeats']} runs after {st['warmup']} warm-up)")
    if result["flops"]:
        rate = result["achieved_flops_per_s"]
        achieved = f", achieved {rate / 1e9:.2f} GFLOP/s" if rate else ""
        roof = result.get("roofline") or {}
        if roof.get("achieved_fraction"):
            achieved += (f" = {100 * roof['achieved_fraction']:.1f} % of the {roof['peak_source']} "
                         f"peak {roof['peak_flops_per_s'] / 1e9:.0f} GFLOP/s")
            if roof.get("arithmetic_intensity"):
                achieved += (f"; {roof['arithmetic_intensity']:.3g} FLOP/byte, {roof['bound']}-bound "
                             f"(copy bandwidth {roof['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s)")
        lines.append(f"flops: {result['flops']:.4g}{achieved}")
    lines.append("loss: none (objective grad returns no loss)" if result["loss"] is None
                 else f"loss: {result['loss']:.6g}")
    g = result["gradient_check"]
    loss_err = "" if g["loss_err"] is None else f"loss error {g['loss_err']:.3g}, "
    remat = ("remat applied" if g["remat_applied"] else "no remat") + (
        "" if g["remat_applied"] == g["remat_expected"] else " (NOT what the policy asks)")
    lines.append(f"gradient check vs {g['reference']}: {'ok' if g['ok'] else 'MISMATCH'} "
                 f"({loss_err}gradients max abs {g['grad_max_abs_err']:.3g}, max rel "
                 f"{g['grad_max_rel_err']:.3g}; {remat})")
    lines += [f"  {f}" for f in g["failures"]]
    if mem:
        lines.append(
            f"memory: peak {human_bytes(mem['peak_bytes'])} = argument "
            f"{human_bytes(mem['argument_bytes'])} + output {human_bytes(mem['output_bytes'])} - "
            f"alias {human_bytes(mem['alias_bytes'])} + temp {human_bytes(mem['temp_bytes'])} + code "
            f"{human_bytes(mem['generated_code_bytes'])}; XLA peak field "
            f"{human_bytes(mem['xla_peak_memory_bytes'] or 0)}"
            + (" (on CPU it leaves out temp)" if env["backend"] == "cpu" else ""))
    else:
        lines.append("memory: this backend gives no compiled memory analysis")
    if result.get("sharding"):
        lines += ["", *format_sharding(result["sharding"])]
    return "\n".join(lines) + "\n\n" + format_tables(result)


def format_sharding(sh: dict) -> list[str]:
    """The ``sharding`` section as lines: mesh, per-device memory and collectives by phase."""
    mem = sh["per_device"] or {}
    mesh = ",".join(f"{k}={v}" for k, v in sh["mesh"].items())
    lines = [f"mesh {mesh}: {sh['devices']} devices in {sh['processes']} process(es); per device: "
             f"peak {human_bytes(mem.get('peak_bytes', 0))}, parameters "
             f"{human_bytes(sh['param_bytes_per_device'])} of {human_bytes(sh['param_bytes_total'])}"]
    rows = [{"collective": k, **{p: f"{c['count']} ({human_bytes(c['bytes'])})" for p, c in ph.items()},
             "vs no_remat": "-" if sh["vs_no_remat"] is None else f"{sh['vs_no_remat'][k]:+d}"}
            for k, ph in sh["collectives"].items() if any(c["count"] for c in ph.values())]
    lines.append(format_table(rows, ["collective", "forward", "recomputed", "backward", "vs no_remat"]))
    return lines


COMPARE_COLUMNS = ["policy", "median", "95% interval", "peak", "same program as", "fastest", "pareto",
                   "excess dots", "excess flops", "jaxpr recomputed", "grad"]


def format_compare(result: dict) -> str:
    """``compare``'s result as text: one row per policy, then the verdicts."""
    c, m = result["config"], result["method"]
    rows = [{"policy": r["policy"], "median": _fmt_time(r["median_s"]),
             "95% interval": f"{_fmt_time(r['ci_low_s'])} .. {_fmt_time(r['ci_high_s'])}",
             "peak": "-" if r["peak_bytes"] is None else human_bytes(r["peak_bytes"]),
             "same program as": r["same_program_as"] or "-",
             "fastest": "yes" if r["fastest"] else "", "pareto": "yes" if r["pareto"] else "",
             "excess dots": "-" if r["excess_dots_vs_no_remat"] is None else r["excess_dots_vs_no_remat"],
             "excess flops": ("-" if r["excess_flops_vs_no_remat"] is None
                              else f"{r['excess_flops_vs_no_remat']:.4g}"),
             "jaxpr recomputed": "-" if r["dots_recomputed"] is None else r["dots_recomputed"],
             "grad": {True: "ok", False: "MISMATCH"}.get(r["grad_ok"], "-")}
            for r in result["rows"]]
    head = (f"{c['model']} width={c['width']} batch={c['batch']} depth={c['depth']} {c['dtype']} "
            f"objective={c['objective']}" + (f" seq={c['seq']}" if c["model"] in SEQ_MODELS else ""))
    lines = [head, f"timing: {m['rounds']} interleaved rounds x {m['calls_per_round']} calls per "
                   f"policy, order {m['order']}; interval: {m['interval']}", "",
             format_table(rows, COMPARE_COLUMNS), "",
             "excess dots/flops: in the compiled program, vs no_remat; jaxpr recomputed: dots the "
             "policy recomputes before XLA optimises", "", result["fastest_reason"],
             "Pareto front (time interval and peak memory): " + (", ".join(result["pareto"]) or "-")]
    lines += [f"failed: {f['policy']}: {f['error']}" for f in result.get("failed", [])]
    return "\n".join(lines)


def _policies_text(model: str | None = None) -> str:
    """The registry by group; with ``model``, its checkpoint names and what each recipe keeps."""
    width = max(map(len, POLICIES))
    pad = " " * (width + 2)
    lines = []
    if model is not None:
        lines += [f"Checkpoint names of {model}: {', '.join(names_of(model))}", ""]
    for group, title in GROUPS.items():
        lines.append(f"{title}:")
        for p in (p for p in POLICIES.values() if p.group == group):
            lines.append(f"{p.id.ljust(width)}  {p.description}")
            lines += [pad + line for line in p.code.splitlines()]
            if model is not None and (p.saves or p.offloads):
                keep = lambda names: ", ".join(n for n in names_of(model) if n in names) or "-"
                lacks = [n for n in (*p.saves, *p.offloads) if n not in names_of(model)]
                lines.append(f"{pad}in {model}: saves {keep(p.saves)}; offloads {keep(p.offloads)}"
                             + (f"; not in {model}: {', '.join(lacks)}" if lacks else ""))
        lines.append("")
    return "\n".join(lines).rstrip()


def _compare(args: argparse.Namespace) -> int:
    from remat_lab.program.backend import ExecutionError, enable_compilation_cache
    from remat_lab.studies.compare import compare_policies

    if getattr(args, "code", False):  # the snippet is one policy's: ask run or explain for it
        print("remat_lab: error: --code prints one policy's code: use it with run or explain.",
              file=sys.stderr)
        return 2
    try:
        config = _config_from(args)
        if not args.no_cache:
            enable_compilation_cache()
        result = compare_policies(config, args.policies, rounds=args.rounds, budget=args.memory_budget)
    except ConfigError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 2
    except ExecutionError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 1
    _record(result, "compare")
    print(json.dumps(result, indent=2) if args.json else format_compare(result))
    return 0


ADVISE_COLUMNS = ["policy", "max batch", "peak", "next batch (over by)", "probes", "step time",
                  "examples/s", "MFU", "HFU", "note"]


def _over(peak: int, doc: dict) -> str:
    """How far a peak is over the budget: ``'+24.0 KiB'``."""
    return "+" + human_bytes(peak - doc["budget_bytes"])


def format_advice(doc: dict) -> str:
    """``advise``'s document as text: one row per policy, then the recommendation."""
    c = doc["config"]
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"
    rows = [{"policy": r["policy"], "max batch": r["max_batch"],
             "peak": "-" if r["peak_bytes"] is None else human_bytes(r["peak_bytes"]),
             "next batch (over by)": ("-" if r["next_batch"] is None else
                                      f"{r['next_batch']} ({_over(r['next_peak_bytes'], doc)})"),
             "probes": len(r["probes"]),
             "step time": "-" if r["step_time_s"] is None else _fmt_time(r["step_time_s"]),
             "examples/s": "-" if r["examples_per_s"] is None else f"{r['examples_per_s']:,.0f}",
             "MFU": pct(r["mfu"]), "HFU": pct(r["hfu"]),
             "note": (f"same program as {r['same_program_as']}" if r.get("same_program_as")
                      else r["not_timed"] or ("" if r["max_batch"] else r["reason"]))}
            for r in doc["rows"]]
    head = (f"{c['model']} width={c['width']} depth={c['depth']} stack={c['stack']} {c['dtype']} "
            f"objective={c['objective']}" + (f" seq={c['seq']}" if c["model"] in SEQ_MODELS else "")
            + f"; budget {human_bytes(doc['budget_bytes'])} ({doc['budget_source']})")
    lines = [head, f"searched in {doc['search_s']:.1f} s by compiling only (XLA's compiled peak on "
                   "abstract inputs); " + ("timed at each policy's largest batch, interleaved"
                                           if doc["timed"] else "not timed"), "",
             format_table(rows, ADVISE_COLUMNS), ""]
    if doc["timed"] and doc.get("peak_flops_per_s"):
        lines.append(f"MFU / HFU: model (no_remat) / hardware flops per second over the peak of "
                     f"{doc['peak_flops_per_s'] / 1e9:.0f} GFLOP/s ({doc['peak_source']})")
    lines += [f"note: {n}" for n in doc.get("notes", [])]
    lines.append(("Recommended: " if doc["recommended"] else "") + doc["reason"] + ".")
    return "\n".join(lines)


def _advise(args: argparse.Namespace) -> int:
    from remat_lab.program.backend import ExecutionError, enable_compilation_cache
    from remat_lab.studies.advisor import advise

    try:
        config = RunConfig(model=args.model, width=args.width, seq=args.seq, heads=args.heads,
                           depth=args.depth, stack=args.stack, dtype=args.dtype,
                           objective=args.objective, repeats=args.repeats, seed=args.seed,
                           batch=1, policy="custom" if args.save_names or args.offload_names
                           else "no_remat", save_names=args.save_names,
                           offload_names=args.offload_names)
        if not args.no_cache:
            enable_compilation_cache()
        doc = advise(config, args.budget, policies=args.policies, timing=not args.no_time,
                     max_batch=args.max_batch, server_budget=args.memory_budget,
                     progress=(lambda m: print(m, file=sys.stderr, flush=True))
                     if sys.stderr.isatty() and not args.json else None)
    except ConfigError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 2
    except ExecutionError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else format_advice(doc))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    """Measure the roofs again (best of the old and new: load only ever makes them read low)."""
    from remat_lab.analysis import roofline

    roofs = roofline.recalibrate()
    if args.json:
        print(json.dumps(roofs, indent=2))
    else:
        print(f"peak {roofs['peak_flops_per_s'] / 1e9:.0f} GFLOP/s, copy bandwidth "
              f"{roofs['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s ({roofs['peak_source']}; "
              f"{roofs.get('peak_note', '')}); stored in {roofline.calibration_path()}")
    return 0


def _list_arg(kind):
    """Comma-separated values of one sweep axis, each parsed by ``kind``."""
    def parse(text: str) -> list:
        values = [kind(v.strip()) for v in text.split(",") if v.strip()]
        if not values:
            raise argparse.ArgumentTypeError("give at least one value")
        return list(dict.fromkeys(values))
    return parse


def _choice(name: str, allowed) -> object:
    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"unknown {name} {text[:40]!r}; choose from: "
                                             f"{', '.join(allowed)}")
        return text
    return parse


def _add_sweep_args(p: argparse.ArgumentParser) -> None:
    d = RunConfig()
    axes = {"models": (_choice("model", MODELS), d.model), "widths": (_int_arg("width"), d.width),
            "batches": (_int_arg("batch"), d.batch), "seqs": (_int_arg("seq"), d.seq),
            "depths": (_int_arg("depth"), d.depth), "stacks": (_choice("stack", STACKS), d.stack),
            "dtypes": (_choice("dtype", DTYPES), d.dtype),
            "policies": (_choice("policy", list(POLICIES)), DEFAULT_POLICY)}
    for flag, (kind, default) in axes.items():
        p.add_argument(f"--{flag}", type=_list_arg(kind), default=[default], metavar="A,B",
                       help=f"comma-separated (default: {default})")
    p.add_argument("--heads", type=_int_arg("heads"), default=d.heads)
    p.add_argument("--objective", choices=OBJECTIVES, default=d.objective)
    p.add_argument("--repeats", type=_int_arg("repeats"), default=d.repeats)
    p.add_argument("--warmup", type=_int_arg("warmup"), default=d.warmup)
    p.add_argument("--seed", type=_int_arg("seed"), default=d.seed)
    p.add_argument("--memory-budget", default=None, help="refuse configurations estimated above this")
    p.add_argument("--out", default=None, metavar="FILE.jsonl",
                   help="append one JSON line per configuration here (default: stdout); rerunning "
                        "with the same file skips the configurations it holds")
    p.add_argument("--retry-failed", action="store_true",
                   help="run again the configurations the file records as refused or failed")
    p.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")


def _add_history_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON document: the runs, newest first")
    p.add_argument("--limit", type=_rounds_arg, default=50, help="at most this many runs (1..1000)")
    p.add_argument("--model", choices=MODELS, default=None)
    p.add_argument("--policy", default=None)
    p.add_argument("--backend", default=None)
    p.add_argument("--share", type=_list_arg(int), default=None, metavar="ID,ID",
                   help="mark runs shared: a public deployment shows them to every visitor")
    p.add_argument("--unshare", type=_list_arg(int), default=None, metavar="ID,ID")
    p.add_argument("--delete", type=_list_arg(int), default=None, metavar="ID,ID")


def _record(doc: dict, kind: str) -> None:
    """Store a finished run in the history; a history that cannot be used is said, not fatal."""
    from remat_lab.store import history

    problem = history.try_record(doc, kind=kind, source="cli")
    if problem:
        print(f"remat_lab: warning: not recorded in the history: {problem}", file=sys.stderr)


def _sweep_line(row: dict) -> str:
    c, err = row["config"], row.get("error")
    head = f"{c.get('model')} w{c.get('width')} b{c.get('batch')} {c.get('policy')}"
    if err:
        return f"{head}: {err['kind']}: {err['message'][:160]}"
    st, mem = row.get("step_time_s") or {}, row.get("memory") or {}
    peak = human_bytes(mem["peak_bytes"]) if mem.get("peak_bytes") is not None else "-"
    return f"{head}: median {_fmt_time(st.get('median'))}, peak {peak}"


def _sweep(args: argparse.Namespace) -> int:
    """The grid, one JSON line per configuration, a progress bar on stderr; Ctrl-C keeps whole rows."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from remat_lab.program.backend import enable_compilation_cache, environment
    from remat_lab.studies import sweep
    from remat_lab.studies.experiment import run_experiment

    base = RunConfig(heads=args.heads, objective=args.objective, repeats=args.repeats,
                     warmup=args.warmup, seed=args.seed)
    grid = sweep.build_grid(base, model=args.models, width=args.widths, batch=args.batches,
                            seq=args.seqs, depth=args.depths, stack=args.stacks, dtype=args.dtypes,
                            policy=args.policies)
    skip: set[str] = set()
    try:
        resolve_budget(args.memory_budget)  # a bad --memory-budget is one error, not a row each
        if args.out:
            skip = sweep.done_keys(sweep.read_rows(args.out), args.retry_failed)
            sweep.repair(args.out)
        out = open(args.out, "a", encoding="utf-8") if args.out else sys.stdout
    except (ConfigError, sweep.SweepFileError) as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"remat_lab: error: cannot write {args.out}: {err.strerror}", file=sys.stderr)
        return 2
    todo = sum(sweep.config_key(c) not in skip for c in grid)
    if not args.no_cache:
        enable_compilation_cache()
    console = Console(stderr=True, soft_wrap=True)  # one line per message, also in logs
    console.print(f"sweep: {len(grid)} configurations, {len(grid) - todo} already in "
                  f"{args.out or 'the output'}, {todo} to run")
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeRemainingColumn(), console=console, disable=not todo)
    failed = done = 0
    # Ctrl-C: stop after the configuration in progress (a KeyboardInterrupt raised inside JAX can
    # be swallowed, e.g. in its garbage-collection callback); a second Ctrl-C stops at once.
    stop = []

    def on_interrupt(signum, frame):
        if stop:
            raise KeyboardInterrupt
        stop.append(signum)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        with bar:
            task = bar.add_task("sweep", total=todo)
            run = lambda cfg: run_experiment(cfg, budget=args.memory_budget)
            for outcome in sweep.run_grid(grid, run, skip=skip, environment=environment,
                                          write=lambda row: sweep.append_row(out, row)):
                if outcome.skipped:
                    continue
                done += 1
                failed += bool(outcome.row.get("error"))
                if not outcome.row.get("error"):
                    _record(outcome.row, "sweep")
                bar.console.print(f"[{done}/{todo}] {_sweep_line(outcome.row)}", markup=False,
                                  highlight=False)
                bar.advance(task)
                if stop:
                    raise KeyboardInterrupt
    except KeyboardInterrupt:
        console.print(f"sweep: interrupted after {done} of {todo}; every finished row is in "
                      f"{args.out or 'the output'}; run the same command again to resume")
        return 130
    finally:
        signal.signal(signal.SIGINT, previous)
        if out is not sys.stdout:
            out.close()
    console.print(f"sweep: done: ran {done}, of which {failed} refused or failed"
                  + (f"; {args.out} holds all {len(grid)} configurations" if args.out else ""))
    return 0


def _history(args: argparse.Namespace) -> int:
    from remat_lab.store import history

    try:
        changed = [(what, fn(ids)) for what, ids, fn in (
            ("shared", args.share, history.share),
            ("unshared", args.unshare, lambda ids: history.share(ids, False)),
            ("deleted", args.delete, history.delete)) if ids]
        runs = history.list_runs(limit=args.limit, model=args.model, policy=args.policy,
                                 backend=args.backend)
    except history.HistoryError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 1
    for what, n in changed:
        print(f"{what} {n} run{'' if n == 1 else 's'}", file=sys.stderr)
    if args.json:
        print(json.dumps({"path": str(history.db_path()), "runs": runs}, indent=2))
        return 0
    rows = [{**r, "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])),
             "median_ms": "-" if r["median_ms"] is None else f"{r['median_ms']:.4f}",
             "peak": "-" if r["peak_bytes"] is None else human_bytes(r["peak_bytes"]),
             "shared": "yes" if r["shared"] else "", "error": (r["error"] or "")[:60]} for r in runs]
    print(f"{history.db_path()}: {len(rows)} most recent run{'' if len(rows) == 1 else 's'}")
    print(format_table(rows, ["id", "created", "source", "kind", "model", "policy", "width", "batch",
                              "depth", "dtype", "backend", "median_ms", "peak", "shared", "error"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "policies":
        print(_policies_text(args.model))
        return 0
    if args.command == "history":
        return _history(args)
    try:  # before anything starts JAX: emulated devices, jax.distributed
        _setup_devices(args)
    except ConfigError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 2
    if getattr(args, "process_id", None):  # a multi-process run: only process 0 prints results
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of this process)
    from remat_lab.program.backend import ExecutionError, enable_compilation_cache
    from remat_lab.studies.experiment import run_experiment

    if args.command == "calibrate":
        return _calibrate(args)

    if args.command == "bench":
        from remat_lab.studies.bench import main as bench_main
        return bench_main(quick=args.quick, as_json=args.json)
    if args.command == "compare":
        return _compare(args)
    if args.command == "advise":
        return _advise(args)
    if args.command == "sweep":
        return _sweep(args)
    try:
        config = _config_from(args)
        if getattr(args, "code", False):
            from remat_lab.present.reproduce import reproduce_code
            print(reproduce_code(config), end="")
            return 0
        if not args.no_cache:
            enable_compilation_cache()
        with _quiet_if_distributed(args):
            result = run_experiment(config, budget=args.memory_budget, timing=args.command == "run")
    except ConfigError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 2
    except ExecutionError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 1
    texts = result.pop("texts")
    if args.command == "run":
        _record(result, "run")
    if args.command == "explain":
        result.pop("step_time_s")
        if args.json:
            if not args.no_jaxpr:
                result["jaxprs"] = {k: v for k, v in texts.items() if k != "compiled_hlo"}
            print(json.dumps(result, indent=2))
        else:
            print(format_tables(result))
            if not args.no_jaxpr:
                print("\nForward + residuals (vjp) jaxpr:\n" + texts["vjp_jaxpr"])
                print("\nStep (forward + backward) jaxpr:\n" + texts["step_jaxpr"])
        return 0
    print(json.dumps(result, indent=2) if args.json else format_run(result))
    return 0

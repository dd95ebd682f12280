"""Headless runs: ``python -m remat_lab run|explain|policies`` (and ``bench``).

Bad input exits with status 2 and one line on stderr; an XLA failure exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import sys

from .config import DTYPES, LIMITS, OBJECTIVES, ConfigError, RunConfig, human_bytes
from .models import MODELS
from .policies import DEFAULT_POLICY, POLICIES


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


def _add_config_args(p: argparse.ArgumentParser) -> None:
    d = RunConfig()
    p.add_argument("--model", choices=MODELS, default=d.model)
    p.add_argument("--width", type=_int_arg("width"), default=d.width, help="features D (1..16384)")
    p.add_argument("--batch", type=_int_arg("batch"), default=d.batch,
                   help="examples B; 0 = the seed's single vector x: (width,) (mlp only)")
    p.add_argument("--seq", type=_int_arg("seq"), default=d.seq, help="sequence length N (seq_mixer)")
    p.add_argument("--depth", type=_int_arg("depth"), default=d.depth, help="remat'd blocks (1..16)")
    p.add_argument("--dtype", choices=DTYPES, default=d.dtype)
    p.add_argument("--policy", choices=list(POLICIES), default=DEFAULT_POLICY, metavar="POLICY",
                   help=f"one of: {', '.join(POLICIES)}")
    p.add_argument("--objective", choices=OBJECTIVES, default=d.objective)
    p.add_argument("--repeats", type=_int_arg("repeats"), default=d.repeats)
    p.add_argument("--warmup", type=_int_arg("warmup"), default=d.warmup)
    p.add_argument("--seed", type=_int_arg("seed"), default=d.seed)
    p.add_argument("--memory-budget", default=None,
                   help="refuse configurations estimated above this (e.g. 2G); "
                        "default: half the backend's memory, or $REMAT_LAB_MEMORY_BUDGET")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m remat_lab", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_config_args(sub.add_parser("run", help="compile, time, size and dissect one configuration"))
    ex = sub.add_parser("explain", help="the residual and per-dot tables and jaxprs, no timing")
    _add_config_args(ex)
    ex.add_argument("--no-jaxpr", action="store_true", help="leave the jaxprs out of the output")
    sub.add_parser("policies", help="list the policy registry")
    bench = sub.add_parser("bench", help="benchmarks: timing fidelity, latency, sweep throughput")
    bench.add_argument("--quick", action="store_true", help="a smaller run (under 2 min on 2 cores)")
    bench.add_argument("--json", action="store_true")
    return parser


def _config_from(args: argparse.Namespace) -> RunConfig:
    keys = ("model", "width", "batch", "seq", "depth", "dtype", "policy", "objective", "repeats",
            "warmup", "seed")
    return RunConfig(**{k: getattr(args, k) for k in keys})


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


DOT_COLUMNS = ["index", "layer", "lhs_shape", "rhs_shape", "out_shape", "has_batch_dims",
               "policy_verdict", "saved", "offloaded", "recomputed", "recomputed_in_compiled"]
RESIDUAL_COLUMNS = ["index", "shape", "dtype", "bytes", "memory_kind", "kind", "layer", "source"]


def format_tables(result: dict) -> str:
    out = ["Per-dot table (forward pass):", format_table(result["dots"], DOT_COLUMNS)]
    notes = [f"  dot {d['index']} ({d['layer']}): {d['note']}" for d in result["dots"] if d["note"]]
    if notes:
        out += ["", "Dot notes:", *notes]
    out += ["", "Residuals (saved for the backward pass):",
            format_table(result["residuals"], RESIDUAL_COLUMNS)]
    t = result["totals"]
    out += ["", (f"Residual bytes: {human_bytes(t['residual_bytes'])} "
                 f"(host {human_bytes(t['residual_host_bytes'])}); dots saved {t['dots_saved']}, "
                 f"offloaded {t['dots_offloaded']}, recomputed {t['dots_recomputed']} "
                 f"({t['dots_recomputed_in_compiled']} in the compiled program)")]
    h = result["hlo"]
    out.append(f"Compiled HLO dots: {h['dot_count']} (forward {h['forward_dots']}, recomputed "
               f"{h['recomputed_dots']}, backward {h['backward_dots']})")
    out += [f"Note: {n}" for n in result["notes"]]
    return "\n".join(out)


def format_run(result: dict) -> str:
    c, env, st, mem = result["config"], result["environment"], result["step_time_s"], result["memory"]
    head = (f"{c['model']} width={c['width']} batch={c['batch']} depth={c['depth']} {c['dtype']} "
            f"policy={c['policy']} objective={c['objective']}"
            + (f" seq={c['seq']}" if c["model"] == "seq_mixer" else ""))
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
            achieved += (f" = {100 * roof['achieved_fraction']:.1f} % of peak "
                         f"{roof['peak_flops_per_s'] / 1e9:.0f} GFLOP/s ({roof['peak_source']})")
        lines.append(f"flops: {result['flops']:.4g}{achieved}")
    lines.append(f"loss: {result['loss']:.6g}")
    g = result["gradient_check"]
    lines.append(f"gradient check vs {g['reference']}: {'ok' if g['ok'] else 'MISMATCH'} "
                 f"(max abs {g['max_abs_err']:.3g}, max rel {g['max_rel_err']:.3g})")
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
    return "\n".join(lines) + "\n\n" + format_tables(result)


def _policies_text() -> str:
    width = max(map(len, POLICIES))
    return "\n".join(f"{p.id.ljust(width)}  {p.description}\n{' ' * width}  {p.code.splitlines()[0]}"
                     for p in POLICIES.values())


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "policies":
        print(_policies_text())
        return 0
    from .experiment import ExecutionError, enable_compilation_cache, run_experiment

    if args.command == "bench":
        from .bench import main as bench_main
        return bench_main(quick=args.quick, as_json=args.json)
    try:
        config = _config_from(args)
        if not args.no_cache:
            enable_compilation_cache()
        result = run_experiment(config, budget=args.memory_budget, timing=args.command == "run")
    except ConfigError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 2
    except ExecutionError as err:
        print(f"remat_lab: error: {err}", file=sys.stderr)
        return 1
    texts = result.pop("texts")
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

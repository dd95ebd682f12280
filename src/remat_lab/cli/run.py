"""The run and explain subcommands: one configuration compiled and dissected (run also times it).

``--compile-only`` (or a named ``--target``) compiles on abstract inputs, nothing allocated or run;
``--step train`` reports the whole training step's memory (``run_experiment``), while the timing,
the gradient check and the per-dot tables are the gradient step's.

Exit status of ``run``: 0 when the step ran and its gradients match the plain-``jax.numpy``
reference (or the check was not run: compile-only, a named target); 3 (``GRAD_MISMATCH``) when the
gradient check fails (MISMATCH: the document is still printed and recorded, and one line on stderr
says so); 2 for bad input and 1 for an XLA failure, as every subcommand.
"""

from __future__ import annotations

import argparse
import json
import sys

from remat_lab.cli.common import add_config_args, config_from, engine_errors, record
from remat_lab.cli.devices import quiet_if_distributed
from remat_lab.cli.format import fmt_time, format_table, format_tables
from remat_lab.config import flag_defaults, human_bytes, mfu_text
from remat_lab.model.models import SEQ_MODELS

GRAD_MISMATCH = 3  # exit status of run: the gradients do not match the reference (MISMATCH)
RUN_EPILOG = ("exit status: 0 ok; 3 the gradient check failed (MISMATCH; the result is still "
              "printed); 2 bad input; 1 XLA failure")


def add_parsers(sub) -> None:
    """``run`` and ``explain`` under the subcommands ``sub``."""
    run = sub.add_parser("run", help="compile, time, size and dissect one configuration",
                         epilog=RUN_EPILOG)
    add_config_args(run)
    ex = sub.add_parser("explain", help="the residual and per-dot tables and jaxprs, no timing")
    add_config_args(ex)
    for p in (run, ex):  # without flags: the app's opening configuration (config/defaults.py)
        p.set_defaults(**flag_defaults())
    ex.add_argument("--no-jaxpr", action="store_true", help="leave the jaxprs out of the output")


def main(args: argparse.Namespace) -> int:
    """Run or explain the configuration ``args`` describe; print the result (text or JSON)."""
    from remat_lab.program.backend import enable_compilation_cache
    from remat_lab.studies.experiment import run_experiment

    with engine_errors():
        config = config_from(args)
        if getattr(args, "code", False):
            from remat_lab.present.reproduce import reproduce_code
            print(reproduce_code(config), end="")
            return 0
        if not args.no_cache:
            enable_compilation_cache()
        with quiet_if_distributed(args):
            result = run_experiment(config, budget=args.memory_budget, timing=args.command == "run")
    texts = result.pop("texts")
    if args.command == "run":
        record(result, "run")
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
    return mismatch_status(result["gradient_check"])


def mismatch_status(check: dict | None) -> int:
    """``GRAD_MISMATCH`` (with one line on stderr) when the gradient check failed, else 0."""
    if not check or check.get("ok") is not False:  # passed, or not run (None)
        return 0
    first = (check.get("failures") or ["see gradient_check in the result"])[0]
    print(f"remat_lab: gradient check MISMATCH (exit status {GRAD_MISMATCH}): {first}", file=sys.stderr)
    return GRAD_MISMATCH


def _config_line(c: dict) -> str:
    """The configuration's headline: model, sizes, dtype, policy and what applies to the model."""
    head = (f"{c['model']} width={c['width']} batch={c['batch']} depth={c['depth']} {c['dtype']} "
            f"policy={c['policy']} objective={c['objective']}"
            + (f" seq={c['seq']}" if c["model"] in SEQ_MODELS else "")
            + (f" heads={c['heads']}" if c["model"] in ("transformer", "llm") else "")
            + (f" save_names={','.join(c['save_names']) or '-'} offload_names="
               f"{','.join(c['offload_names']) or '-'}" if c["policy"] == "custom" else ""))
    if c["model"] == "llm":
        head += (f" vocab={c.get('vocab')} kv_heads={c.get('kv_heads') or c['heads']}"
                 f" head_dim={c.get('head_dim') or c['width'] // c['heads']}"
                 f" mlp_dim={c.get('mlp_dim') or 4 * c['width']}"
                 f" tie_embeddings={c.get('tie_embeddings')}"
                 f" param_dtype={c.get('param_dtype') or c['dtype']}"
                 + (f" preset={c['preset']}" if c.get("preset") else ""))
    if c["model"] == "user":  # the user's block: its factory and input instead of the lab's sizes
        head = head.replace(f"width={c['width']} ", f"module={c.get('model_module')} input_shape="
                            f"{','.join(map(str, c.get('input_shape') or ()))} ")
    extra = [f"step={c['step']}" if c.get("step", "grad") != "grad" else "",
             f"microbatches={c['microbatches']}" if c.get("microbatches", 1) > 1 else "",
             "compile-only" if c.get("compile_only") else ""]
    return " ".join([head, *(e for e in extra if e)])


def _model_line(m: dict | None) -> list[str]:
    if not m:
        return []
    active = f", {m['active_parameters']:,} active a token" if m.get("active_parameters") else ""
    return [f"model: {m['parameters']:,} parameters{active} ({human_bytes(m['parameter_bytes'])}); "
            f"optimizer state {human_bytes(m['optimizer_state_bytes'])}"]


def format_run(result: dict) -> str:
    """``run``'s document as text: the configuration, compile, time, flops, gradients, memory, tables."""
    c, env, st, mem = result["config"], result["environment"], result["step_time_s"], result["memory"]
    lines = [_config_line(c), (f"on {env['backend']} ({env['device_kind']}) x{env['device_count']}, jax "
                    f"{env['jax']}, flax {env['flax']}"), ""]
    lines.append(f"compile: lower {result['compile']['lower_s']:.3f} s, "
                 f"compile {result['compile']['compile_s']:.3f} s")
    lines += _model_line(result.get("model"))
    if st:
        lines.append(f"step time: median {fmt_time(st['median'])} (p25 {fmt_time(st['p25'])}, "
                     f"p75 {fmt_time(st['p75'])}, min {fmt_time(st['min'])}, "
                     f"max {fmt_time(st['max'])}; {st['repeats']} runs after {st['warmup']} warm-up)")
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
    not_run = (result.get("timing") or {}).get("measured") is False
    lines.append("loss: not computed (nothing was run)" if not_run
                 else "loss: none (objective grad returns no loss)" if result["loss"] is None
                 else f"loss: {result['loss']:.6g}")
    g = result["gradient_check"]
    timing = result.get("timing") or {}
    if timing.get("measured") is False:  # compile-only: a named target, or --compile-only
        t = result.get("target")
        lines.insert(1, f"compiled for {t['name']} ({t['device_kind']}), not run" if t
                     else "compiled only: nothing allocated or run")
        est, pred = timing.get("bound_s", timing.get("estimate_s")), timing.get("predicted_s")
        lines.append(f"step time: not measured; predicted {fmt_time(pred)} "
                     f"({timing['prediction_basis']})" if pred else
                     f"step time: not measured; no prediction ({timing.get('prediction_basis')})")
        if mfu := mfu_text(timing):
            lines.append(f"MFU: {mfu}")
        over = bool(pred and est and est > pred)  # its memory term counts bytes kept on chip
        lines.append(f"roofline bound: {fmt_time(est)}{' (over the prediction)' if over else ' at least'} "
                     f"({timing['estimate_basis']})" if est else
                     f"roofline bound: none ({timing['estimate_basis']})")
        terms = timing.get("estimate") or {}
        if terms.get("collectives_dcn_s"):
            lines.append(f"collectives: {fmt_time(terms['collectives_ici_s'] or 0)} within slices or "
                         f"hosts, {fmt_time(terms['collectives_dcn_s'])} across them (at "
                         f"{terms['dcn_bytes_per_s'] / 1e9:g} GB/s a device"
                         + (f", the {net} network)" if (net := (result.get("target") or {}).get("network"))
                            else ")"))
        lines.append(f"gradient check: not run ({g['reason']})")
    elif g.get("ok") is None:  # skipped, with its reason
        lines.append(f"gradient check: skipped ({g['reason']})" if g.get("skipped") else g["reason"])
    else:
        loss_err = "" if g["loss_err"] is None else f"loss error {g['loss_err']:.3g}, "
        remat = ("remat applied" if g["remat_applied"] else "no remat") + (
            "" if g["remat_applied"] == g["remat_expected"] else " (NOT what the policy asks)")
        lines.append(f"gradient check vs {g['reference']}: {'ok' if g['ok'] else 'MISMATCH'} "
                     f"({loss_err}gradients max abs {g['grad_max_abs_err']:.3g}, max rel "
                     f"{g['grad_max_rel_err']:.3g}; {remat})")
        lines += [f"  {f}" for f in g["failures"]]
        if g.get("scope"):
            lines.append(f"  checked: {g['scope']}")
    if result.get("memory_measured") and result["memory_measured"].get("text"):
        lines.append(result["memory_measured"]["text"])
    if mem:
        lines.append(
            f"memory: peak {human_bytes(mem['peak_bytes'])} = argument "
            f"{human_bytes(mem['argument_bytes'])} + output {human_bytes(mem['output_bytes'])} - "
            f"alias {human_bytes(mem['alias_bytes'])} + temp {human_bytes(mem['temp_bytes'])} + code "
            f"{human_bytes(mem['generated_code_bytes'])}; XLA peak field "
            f"{human_bytes(mem['xla_peak_memory_bytes'] or 0)}"
            + (" (on CPU it leaves out temp)" if env["backend"] == "cpu" else ""))
        kinds = mem.get("by_kind") or {}
        if kinds:
            lines.append("memory by kind at the peak: " + ", ".join(
                f"{k.replace('_', ' ')} {human_bytes(v)}" for k, v in kinds.items() if k != "method"))
        if parts := mem.get("by_kind_other"):  # what other holds, as XLA's buffer assignment names it
            lines.append("  other holds: " + ", ".join(f"{k} {human_bytes(v)}" for k, v in parts.items()))
    else:
        lines.append("memory: this backend gives no compiled memory analysis")
    if result.get("sharding"):
        lines += ["", *format_sharding(result["sharding"])]
    return "\n".join(lines) + "\n\n" + format_tables(result)


def format_sharding(sh: dict) -> list[str]:
    """The ``sharding`` section as lines: mesh, per-device memory and collectives by phase."""
    mem = sh["per_device"] or {}
    mesh = sh.get("mesh_text") or ",".join(f"{k}={v}" for k, v in sh["mesh"].items())
    lines = [f"mesh {mesh}: {sh['devices']} devices in {sh['processes']} process(es)"
             + (f" over {sh['slices']} slices or hosts" if sh.get("slices", 1) > 1 else "") + "; per device: "
             f"peak {human_bytes(mem.get('peak_bytes', 0))}, parameters "
             f"{human_bytes(sh['param_bytes_per_device'])} of {human_bytes(sh['param_bytes_total'])}"]
    rows = [{"collective": k, **{p: f"{c['count']} ({human_bytes(c['bytes'])})" for p, c in ph.items()},
             "across slices": f"{sum(c.get('dcn_count', 0) for c in ph.values())} "
                              f"({human_bytes(sum(c.get('dcn_bytes', 0) for c in ph.values()))})",
             "vs no_remat": "-" if sh["vs_no_remat"] is None else f"{sh['vs_no_remat'][k]:+d}"}
            for k, ph in sh["collectives"].items() if any(c["count"] for c in ph.values())]
    cols = ["collective", "forward", "recomputed", "backward"]
    cols += ["across slices"] if sh.get("slices", 1) > 1 or any(
        c.get("dcn_count") for ph in sh["collectives"].values() for c in ph.values()) else []
    lines.append(format_table(rows, [*cols, "vs no_remat"]))
    return lines


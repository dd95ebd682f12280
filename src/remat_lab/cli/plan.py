"""The plan subcommand: the mesh, remat plan, batch split and offload of a whole run, compiled."""

from __future__ import annotations

import argparse
import json
import re
import signal
import threading

from remat_lab.cli.advise import progress_lines
from remat_lab.cli.common import (
    add_llm_args,
    add_model_args,
    config_from,
    count_arg,
    engine_errors,
    list_arg,
)
from remat_lab.config import TARGET_NAMES, ConfigError, human_bytes, human_count, human_seconds
from remat_lab.config.targets import MAX_TARGET_DEVICES


def _plans_arg(text: str) -> tuple[str, ...]:
    """``full,minimal_with_context;offload:decoder_layer_input,query_proj``: plans split by ``;``."""
    from remat_lab.config import POLICY_IDS, names_of
    from remat_lab.studies.plan.space import plan_fields

    out = tuple(p.strip() for p in text.split(";") if p.strip())
    names = set(names_of("llm"))
    for p in out:
        if p == "synthesized":  # each mesh's per-name plan by the estimate by hand
            continue
        try:
            fields = plan_fields(p)
        except ConfigError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        bad = [n for n in (*fields["save_names"], *fields["offload_names"]) if n not in names]
        if fields["policy"] not in POLICY_IDS or bad:
            raise argparse.ArgumentTypeError(
                f"plan {p[:60]!r}: give a named policy ({', '.join(POLICY_IDS[:4])}, ...) or "
                f"offload:NAMES / save:NAMES|offload:NAMES with names of {', '.join(sorted(names))}, or "
                "synthesized (each mesh's per-name plan by the estimate by hand, then compiled).")
    if not out:
        raise argparse.ArgumentTypeError("give at least one plan.")
    return out


def _tokens_arg(text: str) -> int:
    """A global batch in tokens: a whole number from 1 to 2**40."""
    value = int(text) if text.isascii() and text.isdigit() and len(text) <= 13 else 0
    if not 1 <= value <= 1 << 40:
        raise argparse.ArgumentTypeError(f"the global batch in tokens must be a whole number from 1 "
                                         f"to {1 << 40}, not {text[:40]!r}")
    return value


def _ray_arg(text: str) -> str:
    """A Ray cluster's address: ``auto``, or its head's ``HOST:PORT`` (``ray://HOST:PORT`` for Ray
    Client)."""
    if text == "auto" or re.fullmatch(r"(ray://)?[A-Za-z0-9][A-Za-z0-9.-]{0,252}:[0-9]{1,5}", text):
        return text
    raise argparse.ArgumentTypeError(f"--ray takes 'auto' or the cluster head's HOST:PORT (e.g. "
                                     f"10.0.0.2:6379 or ray://10.0.0.2:10001), not {text[:60]!r}")


def _also_arg(text: str) -> tuple[str, int, float | None]:
    """``h100:64`` or ``tpu-v5p:128:4.2``: an accelerator, its devices and optionally its price."""
    parts = text.split(":")
    try:
        target, devices = parts[0], int(parts[1])
        price = float(parts[2]) if len(parts) > 2 else None
    except (IndexError, ValueError):
        raise argparse.ArgumentTypeError(f"--also takes TARGET:DEVICES[:PRICE], e.g. h100:64 or "
                                         f"tpu-v5p:128:4.2; not {text[:40]!r}") from None
    named = [t for t in TARGET_NAMES if t != "local"]
    if (target not in named or not 1 <= devices <= MAX_TARGET_DEVICES or len(parts) > 3
            or (price is not None and not price > 0)):
        raise argparse.ArgumentTypeError(f"--also: a target of {', '.join(named)}, 1 to "
                                         f"{MAX_TARGET_DEVICES} devices and a positive price; "
                                         f"not {text[:40]!r}")
    return target, devices, price


def _price_arg(text: str) -> float:
    """A price in dollars: a positive number."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < 1e6:
        raise argparse.ArgumentTypeError(f"a price is a positive number of dollars, not {text[:40]!r}")
    return value


def _budget_arg(text: str) -> float:
    """Tokens: a number, or with a suffix K, M, B (or G) or T."""
    scale = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}.get(text[-1:].upper(), 1.0)
    try:
        value = float(text[:-1] if scale != 1.0 else text) * scale
    except ValueError:
        value = 0.0
    if not 1 <= value <= 1e18:
        raise argparse.ArgumentTypeError(f"a token budget is a number of tokens (1e12, 1T, 500B), "
                                         f"not {text[:40]!r}")
    return value


def add_parsers(sub) -> None:
    """``plan`` under the subcommands ``sub``."""
    p = sub.add_parser("plan", help="the whole run planned: mesh, remat plan, per-device batch, "
                                    "accumulation and optimizer offload, searched and compiled")
    add_model_args(p)
    add_llm_args(p)
    p.add_argument("--target", choices=TARGET_NAMES, required=True, metavar="TARGET",
                   help="the accelerator to plan for (see `targets`); compiled without it")
    p.add_argument("--target-devices", type=count_arg("target devices", MAX_TARGET_DEVICES),
                   required=True, metavar="N", help="its devices (all of them used)")
    p.add_argument("--network", default="", metavar="NAME",
                   help="the GPU hosts' network (h100: a3-mega, the default; a3-high; dgx-h100)")
    p.add_argument("--slices", type=count_arg("slices", 64), default=None, metavar="S",
                   help="TPU slices (or GPU hosts) the devices span (default: one TPU slice; GPUs "
                        "8 to a host)")
    p.add_argument("--global-batch-tokens", type=_tokens_arg, default=None,
                   metavar="T", help="tokens a step (a multiple of --seq); default: as large as fits")
    p.add_argument("--tensor", type=list_arg(int), default=None, metavar="1,4",
                   help="tensor-parallel sizes to try within a slice or host (default 1,4)")
    p.add_argument("--plans", type=_plans_arg, default=None, metavar="P;P",
                   help="remat plans, ';'-separated: named policies, offload:NAMES (or "
                        "save:NAMES|offload:NAMES), or synthesized (each mesh's per-name plan by the "
                        "estimate by hand, then compiled) (default: save_qkv_proj; "
                        "minimal_with_context; full; MaxText's v6e offload plan)")
    p.add_argument("--no-optimizer-offload", action="store_true",
                   help="do not consider AdamW's state in host memory")
    p.add_argument("--top", type=count_arg("top", 10), default=3, help="compiled plans to return")
    p.add_argument("--workers", type=count_arg("workers", 64, lo=0), default=None,
                   help="compiles side by side in worker processes (default: cores, memory allowing)")
    p.add_argument("--price-per-device-hour", type=_price_arg, default=None, metavar="USD",
                   help="the price of one device an hour (default: the target's sourced default in "
                        "config/targets.json, where it has one): each plan's cost per million tokens")
    p.add_argument("--token-budget", type=_budget_arg, default=None, metavar="TOKENS",
                   help="tokens to train on (1e12 or 1T): the days and dollars each plan takes for them")
    p.add_argument("--also", type=_also_arg, action="append", default=[], metavar="TARGET:N[:USD]",
                   help="plan the same model and global batch on another accelerator too, side by "
                        "side (N devices; USD: its price per device-hour); repeatable")
    p.add_argument("--ray", type=_ray_arg, default=None, metavar="ADDRESS",
                   help="run the compiles on this Ray cluster ('auto', or its head's HOST:PORT); "
                        "its nodes need the lab's requirements (the lab's code is shipped)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--no-cache", action="store_true", help="disable the persistent compile cache")


def _terminated(signum, frame) -> None:
    """SIGTERM ends ``plan`` as Ctrl-C does: the search's ``finally`` ends its compile workers."""
    raise SystemExit(128 + signum)


def main(args: argparse.Namespace) -> int:
    """Plan the run ``args`` describe; print it (or the JSON)."""
    from remat_lab.cli.common import given
    from remat_lab.studies.plan import DEFAULT_PLANS, DEFAULT_TENSOR, KNOBS, plan_across

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)
    with engine_errors():
        if "attention" not in given(args):
            args.attention = "flash"  # a pod-scale question: the blockwise kernel, as MaxText's runs
        args.step, args.mesh, args.policy = "train", f"fsdp={args.target_devices}", "full"
        args.batch, args.compile_only, args.warmup = args.target_devices, True, 0
        config = config_from(args)
        say = progress_lines()
        question = dict(global_batch_tokens=args.global_batch_tokens,
                        tensor=tuple(args.tensor or DEFAULT_TENSOR), plans=args.plans or DEFAULT_PLANS,
                        offload=not args.no_optimizer_offload,
                        top=args.top, workers=args.workers, cache=not args.no_cache, ray=args.ray)
        question["knobs_from_published"] = tuple(k for k in KNOBS if k not in given(args))
        doc = plan_across(config, args.also, price=args.price_per_device_hour,
                          budget_tokens=args.token_budget, progress=say, slices=args.slices, **question)
    print(json.dumps(doc, indent=2) if args.json else format_plan(doc))
    return 0


def _row(r: dict) -> str:
    tps, mfu = r.get("predicted_tokens_per_s_per_device"), r.get("predicted_mfu")
    cost = r.get("cost_per_million_tokens")
    return (f"{r['mesh']:<28} {r['plan_text'][:44]:<44} b{r['per_device_batch']:g} x{r['microbatches']}"
            f"{' +opt-offload' if r['optimizer_offload'] else '':<13} peak {human_bytes(r['peak_bytes']):>10}"
            f"  step {human_seconds(r['predicted_s'] or r['bound_s'] or 0)}  "
            + (f"{tps:,.0f} tok/s/dev" if tps else "-") + (f"  MFU {mfu:.1%} causal" if mfu else "")
            + (f", {full:.1%} full square" if (full := r.get("predicted_mfu_full_attention")) else "")
            + (f"  ${cost:.3f}/M tok" if cost else ""))


def format_plan(doc: dict) -> str:
    """The plan as text: the top plans compiled, the published row, the model's error, the method."""
    g = doc["global_batch_tokens"]
    lines = [f"{doc['config']['preset'] or 'llm'} on {doc['devices']} x {doc['target']} "
             f"({doc['slices']} slice{'s' if doc['slices'] > 1 else ''}), global batch "
             + (f"{g:,} tokens" if g else "as large as fits") + f"; HBM {human_bytes(doc['hbm_bytes'])}"]
    if doc.get("parameters"):
        active = doc.get("active_parameters")
        lines.append(f"model: {human_count(doc['parameters'])} parameters"
                     + (f", {human_count(active)} active a token" if active else ""))
    if not doc["plans"]:
        lines.append("No plan compiled fits.")
    for i, r in enumerate(doc["plans"], 1):
        lines.append(f"{i}. {_row(r)}")
    for p in doc["published_rows"]:
        same = [i for i, r in enumerate(doc["plans"], 1)  # one compile, listed once
                if r.get("same_as") == f"the published configuration {p['name']}"]
        lines.append(f"published {p['name']}: " + (p["error"] if "error" in p else
                                                    f"plan {same[0]} above (the same program)" if same
                                                    else _row(p)))
    lines += [published_sentence(doc)] if doc.get("against_published") else []
    e = doc["memory_model_error"]
    lines.append(f"{doc['candidates_predicted']} candidates predicted, {doc['candidates_compiled']} "
                 f"compiled in {doc['wall_s']:.0f} s; memory model error on "
                 f"{e['compiled_candidates']} held-out compiles: "
                 + (f"max {e['max']:.1%}, mean {e['mean']:.1%}" if e["max"] is not None else "none compiled"))
    h = doc.get("instant_error") or {}
    if h.get("max") is not None:
        lines.append(f"the estimate by hand made before any compile: off by up to {h['max']:.1%} (median "
                     f"{h['median']:.1%}) on the {h['compiled_candidates']} compiled candidates")
    r = doc.get("refinement_error") or {}
    if r.get("max") is not None:
        lines.append(f"before each family was measured on its own, the model was off by up to {r['max']:.1%} "
                     f"on the {r['compiled_candidates']} compiles that measured them (mean {r['mean']:.1%})")
    c = doc.get("cost") or {}
    if c:
        lines.append(("price: " + (f"${c['usd_per_device_hour']:.4g} a device-hour ({c['price_source']})"
                                   if c.get("usd_per_device_hour") else c["price_source"]))
                     + "".join(f"; plan {i}: {_budget(r['cost'])}" for i, r in enumerate(doc["plans"], 1)
                               if c.get("budget_tokens") and r.get("cost")))
    if doc["plans"]:
        lines += ["", "MaxText (the top plan):", doc["plans"][0]["maxtext_yaml"], "",
                  "The lab's compile of it:", doc["plans"][0]["run_command"]]
    if doc["left_out"]:
        lines += ["", "left out: " + "; ".join(doc["left_out"])]
    if doc.get("across"):
        lines += ["", "Side by side (each accelerator's best plan):"]
        for a in doc["across"]:
            b = a["best"]
            lines.append(f"  {a['devices']} x {a['target']}: " + ("no plan fits" if b is None else (
                f"{b['mesh']} {b['plan_text']} b{b['per_device_batch']:g}x{b['microbatches']}, step "
                f"{human_seconds(b['predicted_s'] or 0)}, {a['predicted_tokens_per_s_per_device']:,.0f} "
                f"tokens/s/device, {a['predicted_tokens_per_s']:,.0f} tokens/s in all"
                + (f", ${b['cost_per_million_tokens']:.3f} per million tokens"
                   if b.get("cost_per_million_tokens") else ", no price (type one: TARGET:N:USD)")
                + (f", {_budget(b['cost'])}" if (b.get("cost") or {}).get("days") else ""))))
    return "\n".join(lines)


def _budget(c: dict) -> str:
    """``1e12 tokens: 12.3 days, $4.56M``."""
    if c.get("days") is None:
        return "no cost without a price"
    return f"{c['budget_tokens']:.3g} tokens in {c['days']:,.1f} days for ${c['usd']:,.0f}"


def published_sentence(doc: dict) -> str:
    """The top plan against the published configuration, within the step prediction's stated error."""
    a = doc["against_published"]
    if a["same_program"]:
        return "the top plan IS the published configuration (the same program): it matches it"
    said = {"beats": "beats", "matches": "matches", "below": "is BELOW"}[a["verdict"]]
    return (f"the top plan {said} the published configuration: {a['ratio']:.3f}x its predicted tokens/s "
            f"per device, against the step prediction's stated error of {a['step_error']:.0%}")

"""The chip's catalogue: configurations measured on an attached TPU, beside the lab's deviceless answer.

Three steps, each appending to or rewriting ``benchmarks/chip/<target>.jsonl`` (one configuration a
line: ``name``, ``args`` (the ``run`` flags, without ``--target``), ``held_out``, ``measured``,
``deviceless``):

* ``measure`` (on the chip; ``benchmarks/chip/run_on_tpu.sh`` sets a TPU VM up and runs it): each
  configuration in its own process, so the allocator's ``peak_bytes_in_use`` is that program's
  alone: the program ``run`` compiles for it (``--step train``: the whole AdamW step, parameters and
  state donated; else the gradient step), its compiled memory (``costs.memory_report``) and flops
  (``costs.step_costs``), its step timed by the lab's harness (``program.timing``) and, for a
  gradient step, by a plain ``jax.jit`` loop in rounds interleaved with it (the harness checked);
  the median and quartiles of the lab's samples are the step;
* ``deviceless`` (here, on the pinned stack): ``run --target tpu-v5e --json`` for the same flags:
  the peak, the flops, the predicted step and the bound;
* ``recount``: each measured line's flops counted again from the chip's own program
  (``chip/hlo/NAME.hlo.txt.gz``, kept by ``measure``) and XLA's cost on the chip, by the lab's
  current counting (``costs.step_flops``); the count at the time is kept as ``flops_at_run``;
* ``fit``: ``benchmarks/tpu_step_model.py``'s MXU efficiency fitted to the configurations not held
  out (their measured step against the deviceless prediction's kernel time); ``--write`` stores it
  in ``config/targets.json`` as the target's ``step_model``.

    python benchmarks/chip_catalogue.py measure --out /tmp/chip     # on the TPU VM
    python benchmarks/chip_catalogue.py deviceless --measured /tmp/chip/measured.jsonl
    python benchmarks/chip_catalogue.py recount                       # after a counting fix
    python benchmarks/chip_catalogue.py report
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CATALOGUE = HERE / "chip" / "tpu-v5e.jsonl"

_BF16 = "--dtype bfloat16 --stack scan"
# (name, run flags, held out). Five models, seven policies, both steps, batches up to the chip's
# limit (the 15.75 GiB of one v5e). Held out: never used by the fit.
CONFIGS = [
    ("mlp_w4096_d8_b8192_dots", f"--model mlp --width 4096 --depth 8 --batch 8192 {_BF16} "
     "--policy dots_saveable", False),
    ("mlp_w4096_d8_b8192_nothing", f"--model mlp --width 4096 --depth 8 --batch 8192 {_BF16} "
     "--policy nothing_saveable", True),
    ("mlp_w4096_d8_b16384_noremat_train", f"--model mlp --width 4096 --depth 8 --batch 16384 {_BF16} "
     "--policy no_remat --step train", False),
    ("mlp_w8192_d4_b8192_dwnbd_train", f"--model mlp --width 8192 --depth 4 --batch 8192 {_BF16} "
     "--policy dots_with_no_batch_dims_saveable --step train", True),
    ("transformer_w1024_d8_s1024_b8_noremat", f"--model transformer --width 1024 --depth 8 --seq 1024 "
     f"--batch 8 --heads 16 {_BF16} --policy no_remat", False),
    ("transformer_w1024_d8_s1024_b16_nothing_train", f"--model transformer --width 1024 --depth 8 "
     f"--seq 1024 --batch 16 --heads 16 {_BF16} --policy nothing_saveable --step train", True),
    ("transformer_w2048_d4_s2048_b4_dots", f"--model transformer --width 2048 --depth 4 --seq 2048 "
     f"--batch 4 --heads 16 {_BF16} --policy dots_saveable", True),
    ("gpt2s_s1024_b4_minimal_train", "--preset gpt2-small --seq 1024 --batch 4 --policy minimal "
     "--step train", False),
    ("gpt2s_s1024_b16_nothing_train", "--preset gpt2-small --seq 1024 --batch 16 "
     "--policy nothing_saveable --step train", True),
    ("gpt2s_s1024_b8_full_grad", "--preset gpt2-small --seq 1024 --batch 8 --policy full", False),
    ("gpt2s_s1024_b32_full_train", "--preset gpt2-small --seq 1024 --batch 32 --policy full "
     "--step train", True),
    ("gpt2s_s1024_b16_qkv_train", "--preset gpt2-small --seq 1024 --batch 16 --policy save_qkv_proj "
     "--step train", False),
    ("llama1b_s2048_b1_qkv_grad", "--preset llama3.2-1b --seq 2048 --batch 1 --policy save_qkv_proj",
     False),
    ("llama1b_s2048_b2_full_grad", "--preset llama3.2-1b --seq 2048 --batch 2 --policy full", True),
    ("llm_w1024_d8_s2048_b4_minimal", "--model llm --width 1024 --depth 8 --heads 16 --seq 2048 "
     "--batch 4 --vocab 32000 --dtype bfloat16 --policy minimal", True),
    ("llm_w1024_d8_s2048_b8_nothing_train", "--model llm --width 1024 --depth 8 --heads 16 --seq 2048 "
     "--batch 8 --vocab 32000 --dtype bfloat16 --policy nothing_saveable --step train", False),
    ("gpt2s_s1024_b64_full_grad", "--preset gpt2-small --seq 1024 --batch 64 --policy full", False),
    ("llm_w2048_d4_s1024_b8_dots", "--model llm --width 2048 --depth 4 --heads 16 --seq 1024 "
     "--batch 8 --vocab 32000 --dtype bfloat16 --policy dots_saveable", True),
]


def _config(args: str):
    """The ``RunConfig`` that ``run ARGS`` builds (the CLI's own parser and checks)."""
    from remat_lab.cli import build_parser
    from remat_lab.cli.common import config_from

    return config_from(build_parser().parse_args(["run", *shlex.split(args)]))


def measure_one(name: str, args: str, out: Path, repeats: int, warmup: int, rounds: int = 3) -> dict:
    """One configuration on the attached chip (its own process: the allocator's peak is its own)."""
    import jax
    import numpy as np

    from remat_lab.analysis.costs import cost_of, memory_report, step_costs
    from remat_lab.program.step import build_problem, jit_program, program_args
    from remat_lab.program.timing import step_time_summary, time_keeping_output

    config = _config(args)
    stats0 = jax.devices()[0].memory_stats() or {}
    problem = build_problem(config)
    fn, fargs = jit_program(problem), program_args(problem)
    t0 = time.perf_counter()
    compiled = fn.lower(*fargs).compile()
    compile_s = time.perf_counter() - t0
    text = compiled.as_text()
    with gzip.open(out / f"{name}.hlo.txt.gz", "wt") as f:
        f.write(text)
    costs = step_costs(compiled, text)
    res = {"device_kind": jax.devices()[0].device_kind, "jax": jax.__version__,
           "date": datetime.date.today().isoformat(), "compile_s": compile_s,
           "compiled_peak_bytes": (memory_report(compiled) or {}).get("peak_bytes"),
           "memory": memory_report(compiled), "flops": costs["flops"],
           "flops_source": costs["source"], "xla_cost": cost_of(compiled)}
    stats1 = jax.devices()[0].memory_stats() or {}  # the arguments allocated, nothing run yet
    if config.step == "train":  # donated state: each call's output is the next call's input
        state = fargs
        samples = []
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            _, leaves, opt = compiled(*state)
            state = (leaves, opt, state[2])
            jax.block_until_ready(state)
            if i >= warmup:
                samples.append(time.perf_counter() - t0)
        res["harness"] = "the training step, its donated state threaded from call to call"
        samples = np.array(samples)
    else:  # the lab's harness and a plain jax.jit loop, in interleaved rounds
        plain = jax.jit(fn)  # a second executable of the same program
        jax.block_until_ready(plain(*fargs))
        lab, loop = [], []
        for _ in range(rounds):
            s, _ = time_keeping_output(compiled, fargs, warmup=warmup, repeats=repeats, keep=False)
            lab.extend(s)
            t0 = time.perf_counter()
            out_ = None
            for _ in range(repeats):  # one output alive at a time, as in the lab's harness
                out_ = None
                out_ = plain(*fargs)
            jax.block_until_ready(out_)
            loop.append((time.perf_counter() - t0) / repeats)
            del out_
        samples = np.array(lab)
        res["harness"] = "the lab's harness (program.timing.time_keeping_output)"
        res["plain_loop_s"] = {"median": float(np.median(loop)), "rounds": loop,
                               "method": f"jax.jit, {repeats} calls back to back, blocked once"}
    summary = step_time_summary(samples, warmup)
    res.update(step_s=summary["median"], step_p25=summary["p25"], step_p75=summary["p75"],
               samples=summary["samples"])
    stats = jax.devices()[0].memory_stats() or {}
    res["allocator_peak_bytes"] = stats.get("peak_bytes_in_use")
    res["allocator_bytes_limit"] = stats.get("bytes_limit")
    res["allocator_stats"] = {"start": stats0, "arguments_allocated": stats1, "after": stats}
    # in one process with others before it: the step's own peak only when it set a new one
    res["allocator_step_set_peak"] = stats.get("peak_bytes_in_use", 0) > stats1.get("peak_bytes_in_use", 0)
    return res


def _clear() -> None:
    """Forget every executable and array of the last configuration (one process for many)."""
    import gc

    import jax

    from remat_lab.program import step

    for f in vars(step).values():
        if hasattr(f, "cache_clear"):
            f.cache_clear()
    jax.clear_caches()
    gc.collect()


def measure(out: Path, only: list[str], repeats: int, warmup: int, limit_s: float,
            deadline_s: float, in_process: bool = False) -> None:
    """Every configuration (or ``only``) in its own process; one JSON line each, as they finish;
    none started after ``deadline_s`` (a device command's time is bounded)."""
    out.mkdir(parents=True, exist_ok=True)
    lines = out / "measured.jsonl"
    start = time.perf_counter()
    for name, args, held in CONFIGS:
        if only and name not in only:
            continue
        if time.perf_counter() - start > deadline_s:
            print(f"{name}: not started (past the {deadline_s:.0f} s deadline)", flush=True)
            continue
        if in_process:  # one process for all (a TPU process starts in ~20 s): peaks as differences
            t0 = time.perf_counter()
            try:
                measured = measure_one(name, args, out, repeats, warmup, rounds=2)
            except Exception as err:
                measured = {"error": f"{type(err).__name__}: {str(err)[:1500]}"}
            _clear()
            with lines.open("a") as f:
                f.write(json.dumps({"name": name, "args": args, "held_out": held,
                                    "measured": measured}, default=float) + "\n")
            print(f"{name}: {time.perf_counter() - t0:.1f} s, step {measured.get('step_s')}, "
                  f"{measured.get('error', '')[-300:]}", flush=True)
            continue
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "one", name, "--out", str(out), "--repeats", str(repeats),
               "--warmup", str(warmup)]
        env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit_s)
            got = proc.stdout.strip().splitlines()
            measured = json.loads(got[-1]) if proc.returncode == 0 and got else {
                "error": (proc.stderr or proc.stdout).strip()[-1500:]}
        except subprocess.TimeoutExpired:
            measured = {"error": f"over {limit_s:.0f} s"}
        row = {"name": name, "args": args, "held_out": held, "measured": measured}
        with lines.open("a") as f:
            f.write(json.dumps(row) + "\n")
        step = measured.get("step_s")
        print(f"{name}: {time.perf_counter() - t0:.1f} s, step {step}, "
              f"{measured.get('error', '')[-300:]}", flush=True)


HLO = HERE / "chip" / "hlo"  # the chip's compiled programs, one NAME.hlo.txt.gz each (from measure)


def recount() -> None:
    """Each measured line's flops from its chip program (``HLO``) and XLA's cost on the chip, by
    the current ``costs.step_flops``: a counting fix applies to the chip's figures as to the
    deviceless ones (the measured program is the same text)."""
    from remat_lab.analysis.costs import step_flops

    rows, kernels = {r["name"]: r for r in _read(CATALOGUE)}, _kernels()
    for name, row in rows.items():
        m, path = row["measured"], HLO / f"{name}.hlo.txt.gz"
        if "error" in m or not path.exists():
            continue
        with gzip.open(path, "rt") as f:
            flops = step_flops(m["xla_cost"]["flops"], f.read())
        m.setdefault("flops_at_run", m["flops"])
        m["flops"] = flops
        print(f"{name}: {m['flops_at_run']:.5e} -> {flops:.5e}", flush=True)
    _write(rows, kernels)


KERNELS = HERE / "chip" / "tpu-v5e-kernels.json.gz"
_ROW = ("kind", "direction", "dtype", "precision", "flops", "bytes", "runs")


def deviceless(measured: Path, target: str, only: list[str]) -> None:
    """The lab's deviceless answer on ``target`` beside each measured line, into the catalogue:
    the program ``run --target`` compiles (``advisor.search.probe``: the training step for
    ``--step train``), its peak, flops, bound and prediction; its kernels kept for ``fit``."""
    import jax

    from remat_lab.analysis.estimate import estimate_step
    from remat_lab.config import get_target
    from remat_lab.studies.advisor.search import probe

    rows = [json.loads(line) for line in measured.read_text().splitlines() if line.strip()]
    old = {r["name"]: r for r in _read(CATALOGUE)}
    kernels = _kernels()
    tgt = get_target(target)
    for row in rows:
        if only and row["name"] not in only:
            row = old.get(row["name"], row)
        elif "error" not in row["measured"]:
            t0 = time.perf_counter()
            config = _config(row["args"]).replace(target=target)
            found = probe(config)
            est = estimate_step(found["flops"], found.get("bytes_accessed"), tgt, config.dtype,
                                found.get("traffic"))
            ks = [[r[k] for k in _ROW] for r in found["kernels"] or []]
            kernels[row["name"]] = {"kernels": ks, "bound_s": est["estimate_s"],
                                    "compute_s": est.get("compute_s"),
                                    "transfers_s": (est.get("collectives_s") or 0.0)
                                    + (est.get("offload_s") or 0.0)}
            row["deviceless"] = {"jax": jax.__version__, "peak_bytes": found["peak_bytes"],
                                 "flops": found["flops"],
                                 "predicted_s": predicted(kernels[row["name"]], tgt, tgt.step_model),
                                 "bound_s": est["estimate_s"],
                                 "wall_s": round(time.perf_counter() - t0, 1)}
            print(_line(row), flush=True)
        old[row["name"]] = row
        _write(old, kernels)


def predicted(entry: dict, target, model: dict) -> float:
    """A program's step from its kernels at ``model``'s rates (``analysis/predict.py``'s model):
    the kernels one after another, never under the transfers nor the flops at the peak (the
    roofline's compute term, ``compute_s``; kept since 2026-12-07: an entry without it is below its
    kernels at any efficiency up to 1, the grid's)."""
    from remat_lab.analysis.predict import kernels_seconds

    rows = [dict(zip(_ROW, r)) for r in entry["kernels"]]
    return max(kernels_seconds(rows, target, model)["kernels_s"], entry["transfers_s"],
               entry.get("compute_s") or 0.0)


def _kernels() -> dict:
    if not KERNELS.exists():
        return {}
    with gzip.open(KERNELS, "rt") as f:
        return json.load(f)


def _write(rows: dict, kernels: dict) -> None:
    for row in rows.values():  # the step's own memory, from the statistics each line kept
        m = row["measured"]
        if "error" not in m and "allocator_how" not in m:
            m["allocator_process_peak_bytes"] = m.get("allocator_peak_bytes")
            m["allocator_peak_bytes"], m["allocator_how"] = step_memory(m)
    CATALOGUE.parent.mkdir(parents=True, exist_ok=True)
    order = [n for n, _, _ in CONFIGS]
    with CATALOGUE.open("w") as f:
        for name in sorted(rows, key=lambda n: order.index(n) if n in order else len(order)):
            r = rows[name]
            r["measured"] = {k: v for k, v in r["measured"].items()
                             if k not in ("samples", "loops", "allocator_stats", "memory")}
            f.write(json.dumps(r) + "\n")
    with gzip.open(KERNELS, "wt") as f:
        json.dump(kernels, f)


def fit(target_name: str, write: bool) -> dict:
    """The MXU efficiency (GEMMs and attention alike) and the HBM factor (the kernels' counted bytes
    over the spec bandwidth) that minimise the squared log ratio of predicted to measured step over
    the lines not held out; every line's ratio at them."""
    import math

    from remat_lab.config import get_target

    target, kernels = get_target(target_name), _kernels()
    rows = [r for r in _read(CATALOGUE) if r.get("deviceless") and r["name"] in kernels]
    model = lambda e, h: {"gemm_efficiency": e, "attention_forward_efficiency": e,
                          "attention_backward_efficiency": e, "hbm_efficiency": h}
    fitted = [r for r in rows if not r["held_out"]]
    loss = lambda e, h: sum(math.log(predicted(kernels[r["name"]], target, model(e, h))
                                     / r["measured"]["step_s"]) ** 2 for r in fitted)
    grid = [(e / 100, h / 100) for e in range(30, 101) for h in range(50, 401, 5)]  # the optimum inside it
    mxu, hbm = min(grid, key=lambda p: loss(*p))
    out = {"target": target_name, "mxu_efficiency": mxu, "hbm_efficiency": hbm,
           "fitted_on": [r["name"] for r in fitted], "rows": []}
    for r in rows:
        step = predicted(kernels[r["name"]], target, model(mxu, hbm))
        out["rows"].append({"name": r["name"], "held_out": r["held_out"],
                            "predicted_over_measured": round(step / r["measured"]["step_s"], 3)})
    if write:
        path = HERE.parent / "src" / "remat_lab" / "config" / "targets.json"
        text = path.read_text()
        doc = json.loads(text)
        old = next(t for t in doc["targets"] if t["name"] == target_name)["step_model"]
        new = {**model(mxu, hbm), "source": (
            f"fitted on a TPU v5e chip (benchmarks/chip_catalogue.py fit, "
            f"{datetime.date.today().isoformat()}): the MXU efficiency and the HBM factor (the "
            f"kernels' counted bytes over the spec bandwidth; above 1 where libtpu's kernels keep "
            f"more on chip than the count assumes) that minimise the squared log error of the "
            f"predicted step over the {len(fitted)} configurations of benchmarks/chip/"
            f"{target_name}.jsonl not held out; the held-out ones are predicted out of sample")}
        # the one target's entry rewritten in place, the file's layout kept
        start = text.index(f'"name": "{target_name}"')
        at = text.index('"step_model": {', start)
        end = text.index("}", at) + 1
        body = json.dumps(new, indent=1).replace("\n ", "\n    ").replace("\n}", "\n   }")
        path.write_text(text[:at] + '"step_model": ' + body + text[end:])
        assert json.loads(path.read_text()), old
        for r in _read(CATALOGUE):  # the catalogue's predictions at the fitted rates
            if r["name"] in kernels and r.get("deviceless"):
                r["deviceless"]["predicted_s"] = predicted(kernels[r["name"]], target, model(mxu, hbm))
                _replace(r)
    return out


def _replace(row: dict) -> None:
    rows = {r["name"]: r for r in _read(CATALOGUE)}
    rows[row["name"]] = row
    _write(rows, _kernels())


def step_memory(m: dict) -> tuple[int | None, str]:
    """The step's own device memory from the allocator's figures, and how it was read.

    On a TPU (JAX 0.10's runtime) ``peak_bytes_in_use`` counts buffers (arguments, outputs) and the
    program's temporaries are reserved apart (``bytes_reserved``): the step's memory is its buffers
    (the peak in use less what the process held beside its arguments) plus the reservation its run
    added. Lines measured without the full statistics have none (None)."""
    st = m.get("allocator_stats")
    args = (m.get("memory") or {}).get("argument_bytes") or 0
    if not st or "bytes_reserved" not in st.get("after", {}):
        return None, ("not read: measured before the lab read the TPU runtime's reservation for "
                      "the program's temporaries (bytes_reserved)")
    if m.get("plain_loop_s"):  # the plain loop's calls back to back: several outputs alive at once
        return None, ("not read: the plain jax.jit loop beside the lab's harness kept several "
                      "outputs in flight, so the allocator's peak is theirs, not one step's")
    before, after = st["arguments_allocated"], st["after"]
    other = max(0, before["bytes_in_use"] - args)
    if m.get("allocator_step_set_peak"):
        buffers, how = after["peak_bytes_in_use"] - other, "peak in use"
    else:  # an earlier program set the process's peak: the buffers in use after the step
        buffers, how = after["bytes_in_use"] - other, "in use after the step (the peak predates it)"
    reserved = after.get("bytes_reserved", 0) - before.get("bytes_reserved", 0)
    return buffers + reserved, (f"the step's buffers ({how}, less {other} bytes the process held "
                                f"beside its arguments) + the temporaries its run reserved "
                                f"({reserved} bytes, bytes_reserved)")


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] \
        if path.exists() else []


def _line(r: dict) -> str:
    m, d = r["measured"], r.get("deviceless") or {}
    if "error" in m:
        return f"{r['name']}: {m['error'][-200:]}"
    ratio = lambda a, b: f"{a / b:.3f}" if a and b else "-"
    return (f"{r['name']:48s} held={int(r['held_out'])} step {m['step_s'] * 1e3:8.2f} ms "
            f"pred/meas {ratio(d.get('predicted_s'), m['step_s'])} bound/meas "
            f"{ratio(d.get('bound_s'), m['step_s'])} peak "
            f"{ratio(d.get('peak_bytes'), m['compiled_peak_bytes'])}"
            f" flops {ratio(d.get('flops'), m['flops'])} alloc/compiled "
            f"{ratio(m.get('allocator_peak_bytes'), m['compiled_peak_bytes'])}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--out", type=Path, required=True)
    m.add_argument("--only", default="")
    m.add_argument("--repeats", type=int, default=10)
    m.add_argument("--warmup", type=int, default=3)
    m.add_argument("--limit-s", type=float, default=300)
    m.add_argument("--deadline-s", type=float, default=1e9)
    m.add_argument("--in-process", action="store_true",
                   help="every configuration in this process (allocator peaks as differences)")
    o = sub.add_parser("one")
    o.add_argument("name")
    o.add_argument("--out", type=Path, required=True)
    o.add_argument("--repeats", type=int, default=10)
    o.add_argument("--warmup", type=int, default=3)
    fp = sub.add_parser("fit")
    fp.add_argument("--target", default="tpu-v5e")
    fp.add_argument("--write", action="store_true", help="store the fit in config/targets.json")
    d = sub.add_parser("deviceless")
    d.add_argument("--measured", type=Path, required=True)
    d.add_argument("--target", default="tpu-v5e")
    d.add_argument("--only", default="")
    sub.add_parser("recount")
    sub.add_parser("report")
    a = p.parse_args()
    only = [n for n in getattr(a, "only", "").split(",") if n]
    if a.command == "measure":
        measure(a.out, only, a.repeats, a.warmup, a.limit_s, a.deadline_s, a.in_process)
    elif a.command == "one":
        args = dict((n, s) for n, s, _ in CONFIGS)[a.name]
        print(json.dumps(measure_one(a.name, args, a.out, a.repeats, a.warmup), default=float))
    elif a.command == "deviceless":
        deviceless(a.measured, a.target, only)
    elif a.command == "recount":
        recount()
    elif a.command == "fit":
        print(json.dumps(fit(a.target, a.write), indent=1))
    else:
        for r in _read(CATALOGUE):
            print(_line(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""On a real GPU: the lab's deviceless compile against the real one, measured steps and kernel rates.

Run where the GPU is (not in the test run; about 8 minutes on one H200):

    PYTHONPATH=src python benchmarks/device_truth.py --target h200 --out results/device

It writes, as it goes (so a run cut short keeps what it finished):

* ``rates.json``: bf16 / f32 matrix products at the shapes a Llama-style step runs (achieved
  FLOP/s, fraction of the target's peak), cuDNN and XLA causal attention forward and forward +
  backward (FLOP/s, causal flops), and a device-to-device copy (bytes read + written per second);
* ``<config>.json`` for each configuration, each in its own process (so the allocator's peak is
  the configuration's): the real compile's memory (``costs.memory_report``), the allocator's
  ``peak_bytes_in_use``, the measured step (median of ``--repeats`` after ``--warmup``), the
  lab's deviceless answer for the same configuration on ``--target`` (``run --target T
  --compile-only --json``'s peak, flops and roofline estimate), the roofline applied to the real
  program's text, and the profiler's per-kernel times (the largest 40 kernels by total time);
* ``<config>.hlo.txt``: the real compile's optimized HLO (for pricing its kernels one by one).

``--smoke`` runs tiny shapes (for checking the script on a CPU).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LLAMA2_7B = dict(preset="llama2-7b", seq=4096, batch=4, step="train", attention="flash",
                 loss_chunks=1)
CONFIGS = {
    # MaxText's A3 Llama 2 7B recipe per GPU (per-device batch 4, seq 4096, minimal_with_context,
    # cuDNN flash, layers unrolled), four of its 32 layers so one GPU holds the AdamW state.
    "llama2_7b_d4_loop_mwc": dict(LLAMA2_7B, depth=4, stack="loop", policy="minimal_with_context"),
    # A product-only program: what the GEMMs alone achieve.
    "mlp_8192_d8_bf16": dict(model="mlp", width=8192, depth=8, batch=16384, dtype="bfloat16",
                             stack="scan", policy="no_remat"),
    "llama2_7b_d4_loop_full": dict(LLAMA2_7B, depth=4, stack="loop", policy="full"),
    # MaxText's v6e Llama 3 8B recipe's shapes (seq 8192, vocabulary 128256), four layers.
    "llama3_8b_d4_scan_full": dict(preset="llama3-8b", depth=4, stack="scan", seq=8192, batch=2,
                                   step="train", attention="flash", loss_chunks=1, policy="full"),
    "llama2_7b_d4_scan_mwc": dict(LLAMA2_7B, depth=4, stack="scan", policy="minimal_with_context"),
    # Out of the calibration's sample: other recipes, shapes and policies.
    "llama3_8b_d2_loop_dots": dict(preset="llama3-8b", depth=2, stack="loop", seq=4096, batch=4,
                                   step="train", attention="flash", loss_chunks=1,
                                   policy="dots_saveable"),
    "mistral_7b_d4_loop_qkv": dict(preset="mistral-7b", depth=4, stack="loop", seq=4096, batch=2,
                                   step="train", attention="flash", loss_chunks=1,
                                   policy="save_qkv_proj"),
}
SMOKE = {
    "llm_tiny": dict(model="llm", width=256, depth=2, heads=4, seq=128, batch=4, vocab=512,
                     step="train", stack="loop", policy="minimal_with_context", attention="flash",
                     dtype="bfloat16"),
    "mlp_tiny": dict(model="mlp", width=256, depth=2, batch=256, dtype="bfloat16", stack="scan",
                     policy="no_remat"),
}


def _write(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=1, default=str))


def _time(fn, *args, n: int, warmup: int = 2) -> float:
    """Median seconds of ``fn(*args)``, each call ended by ``block_until_ready``."""
    import jax
    import numpy as np

    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def rates(out: Path, smoke: bool, peak_bf16: float, peak_tf32: float) -> None:
    """Matrix products, attention and a copy at the shapes a Llama step runs."""
    import jax
    import jax.numpy as jnp

    res = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__, "gemm": [],
           "attention": [], "copy": None}
    tokens = 256 if smoke else 16384
    d, f, v = (256, 512, 512) if smoke else (4096, 11008, 32000)
    shapes = [(tokens, d, d), (tokens, d, f), (tokens, f, d), (tokens, d, v), (d, tokens, d),
              (d, tokens, f), (f, tokens, d), (d, tokens, v)]
    shapes += [(s, s, s) for s in ((256, 512) if smoke else (1024, 2048, 4096, 8192, 16384))]
    shapes += [] if smoke else [(tokens, 4096, 14336), (tokens, 4096, 128256), (8192, 4096, 1024)]
    key = jax.random.PRNGKey(0)
    for dtype in ("bfloat16", "float32"):
        for m, k, n in shapes if dtype == "bfloat16" else shapes[:4]:
            a = jax.random.normal(key, (m, k), dtype)
            b = jax.random.normal(key, (k, n), dtype)
            fn = jax.jit(lambda a, b: a @ b)
            s = _time(fn, a, b, n=5 if smoke else 20)
            flops = 2.0 * m * k * n
            peak = peak_bf16 if dtype == "bfloat16" else peak_tf32
            res["gemm"].append({"m": m, "k": k, "n": n, "dtype": dtype, "s": s,
                                "flops_per_s": flops / s, "fraction_of_peak": flops / s / peak})
            del a, b
        _write(out / "rates.json", res)
    b_, t_, h_, hd = (2, 128, 4, 64) if smoke else (4, 4096, 32, 128)
    q = jax.random.normal(key, (b_, t_, h_, hd), jnp.bfloat16)
    causal_flops = 4.0 * b_ * h_ * hd * t_ * t_ / 2  # QK^T and PV over the causal half
    for impl in ("cudnn", "xla"):
        try:
            fwd = jax.jit(lambda q, k, v, i=impl: jax.nn.dot_product_attention(
                q, k, v, is_causal=True, implementation=i))
            both = jax.jit(jax.grad(lambda q, k, v, i=impl: jax.nn.dot_product_attention(
                q, k, v, is_causal=True, implementation=i).astype(jnp.float32).sum(),
                argnums=(0, 1, 2)))
            sf = _time(fwd, q, q, q, n=5 if smoke else 20)
            sb = _time(both, q, q, q, n=5 if smoke else 20)
            res["attention"].append({
                "implementation": impl, "batch": b_, "seq": t_, "heads": h_, "head_dim": hd,
                "forward_s": sf, "forward_flops_per_s": causal_flops / sf,
                "forward_backward_s": sb,
                # backward: 2.5x the forward's products (dQ, dK, dV, and the recomputed scores)
                "forward_backward_flops_per_s": 3.5 * causal_flops / sb})
        except Exception as err:  # cuDNN absent (CPU): say so
            res["attention"].append({"implementation": impl, "error": str(err).splitlines()[0]})
        _write(out / "rates.json", res)
    nbytes = (64 if smoke else 4096) * 2**20
    x = jnp.ones((nbytes // 4,), jnp.float32)
    s = _time(jax.jit(lambda x: x * 2.0), x, n=5 if smoke else 20)
    res["copy"] = {"bytes": nbytes, "s": s, "read_write_bytes_per_s": 2 * nbytes / s}
    _write(out / "rates.json", res)


def _kernels(trace_dir: str) -> list[dict]:
    """The profiler's GPU kernels, summed by name: count, total seconds, the XLA op they ran."""
    from jax.profiler import ProfileData

    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        return []
    data = ProfileData.from_file(files[0])
    kernels: dict[str, dict] = {}
    for plane in data.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            for ev in line.events:
                stats = {k: v for k, v in ev.stats}
                row = kernels.setdefault(ev.name, {"name": ev.name, "count": 0, "s": 0.0,
                                                   "line": line.name,
                                                   "hlo_op": str(stats.get("hlo_op", ""))})
                row["count"] += 1
                row["s"] += ev.duration_ns * 1e-9
    return sorted(kernels.values(), key=lambda r: -r["s"])


def one(name: str, fields: dict, target: str, out: Path, repeats: int, warmup: int) -> None:
    """One configuration: real compile, timing, profile; then the lab's deviceless answer."""
    import jax

    from remat_lab.analysis.costs import cost_of, memory_report
    from remat_lab.analysis.estimate import estimate_step
    from remat_lab.analysis.predict import predict_step
    from remat_lab.analysis.traffic import traffic_of
    from remat_lab.config import RunConfig, get_target
    from remat_lab.program.step import build_problem, jit_program, program_args
    from remat_lab.studies.experiment import run_experiment

    fields = dict(fields)
    preset = fields.pop("preset", None)
    config = RunConfig.from_preset(preset, **fields) if preset else RunConfig(**fields)
    res = {"name": name, "config": config.as_dict(), "device": jax.devices()[0].device_kind,
           "jax": jax.__version__}
    problem = build_problem(config)
    fn, args = jit_program(problem), program_args(problem)
    t0 = time.perf_counter()
    compiled = fn.lower(*args).compile()
    res["real_compile_s"] = time.perf_counter() - t0
    res["real_memory"] = memory_report(compiled)
    res["real_cost"] = cost_of(compiled)
    text = compiled.as_text()
    (out / f"{name}.hlo.txt").write_text(text)
    tgt = get_target(target)
    try:
        res["real_program_estimate"] = estimate_step(
            res["real_cost"]["flops"], None, tgt, config.dtype, traffic_of(text))
        pred = predict_step(tgt, res["real_program_estimate"], text=text)
        res["real_program_prediction"] = {k: v for k, v in pred.items() if k != "basis"}
    except Exception as err:
        res["real_program_estimate"] = {"error": repr(err)}
    train = config.step == "train"

    def step(state):
        if train:
            _, leaves, opt = compiled(*state)
            return leaves, opt, state[2]
        jax.block_until_ready(compiled(*state))  # the gradients: the inputs are ready already
        return state

    state = args
    samples = []
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        state = step(state)
        jax.block_until_ready(state)
        if i >= warmup:
            samples.append(time.perf_counter() - t0)
    samples.sort()
    res["step_s"] = {"median": samples[len(samples) // 2], "min": samples[0], "max": samples[-1],
                     "samples": samples}
    stats = jax.devices()[0].memory_stats() or {}
    res["allocator"] = {k: stats.get(k) for k in ("peak_bytes_in_use", "bytes_in_use",
                                                  "bytes_limit")}
    _write(out / f"{name}.json", res)
    try:
        with tempfile.TemporaryDirectory() as d:
            jax.profiler.start_trace(d)
            for _ in range(3):
                state = step(state)
            jax.block_until_ready(state)
            jax.profiler.stop_trace()
            kernels = _kernels(d)
        res["kernels_3_steps"] = kernels[:40]
        res["kernels_total_s"] = sum(k["s"] for k in kernels)
        res["kernel_count"] = len(kernels)
    except Exception as err:
        res["kernels_error"] = repr(err)
    _write(out / f"{name}.json", res)
    del state, args, problem
    t0 = time.perf_counter()
    try:
        lab = run_experiment(config.replace(target=target, compile_only=True), timing=False)
        res["deviceless"] = {"wall_s": time.perf_counter() - t0, "memory": lab["memory"],
                             "flops": lab["flops"], "timing": lab["timing"],
                             "baseline": lab.get("baseline")}
    except Exception as err:
        res["deviceless"] = {"error": repr(err)}
    _write(out / f"{name}.json", res)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="h200")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--only", default="", help="comma-separated configuration names")
    p.add_argument("--skip-rates", action="store_true")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    configs = SMOKE if args.smoke else CONFIGS
    if args.one:
        one(args.one, configs[args.one], args.target, args.out, args.repeats, args.warmup)
        return 0
    if not args.skip_rates:
        from remat_lab.config import get_target

        peaks = get_target(args.target).peak_flops
        t0 = time.perf_counter()
        try:
            rates(args.out, args.smoke, peaks["bfloat16"], peaks.get("tf32", peaks["float32"]))
        except Exception as err:
            print(f"rates failed: {err!r}", flush=True)
        print(f"rates: {time.perf_counter() - t0:.1f} s", flush=True)
    names = [n for n in (args.only.split(",") if args.only else configs) if n]
    for name in names:
        t0 = time.perf_counter()
        cmd = [sys.executable, __file__, "--one", name, "--target", args.target, "--out",
               str(args.out), "--repeats", str(args.repeats), "--warmup", str(args.warmup)]
        if args.smoke:
            cmd.append("--smoke")
        env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        rc = subprocess.run(cmd, env=env).returncode
        print(f"{name}: rc {rc}, {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

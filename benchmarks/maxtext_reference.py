"""MaxText's own compile of a published run beside the lab's program for it: per-device memory, side by side.

Not part of the test run (each compile is for 256 chips and takes minutes). For MaxText's
``llama3-8b-8192`` (``benchmarks/maxtext_trillium_model_configs.py``: v6e-256, FSDP over every chip,
``remat_policy: full``, flash attention, seq 8192) at the per-device batches asked for, it

1. compiles MaxText's train step with MaxText itself (``maxtext[tpu]==0.2.5`` in its own Python 3.12
   virtual environment, ``--setup`` makes it): ``python -m maxtext.trainers.pre_train.train_compile
   <MaxText's base.yml> model_name=llama3-8b compile_topology=v6e-256 ...`` under
   ``JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1``, and reads the memory analysis it prints
   (``Memory analysis: CompiledMemoryStats(...)``) or, where libtpu refuses the program, the
   temporaries its error names (``HLO temporaries (36.00G)``);
2. runs the lab's command for the same configuration (``python -m remat_lab run --preset llama3-8b
   --seq 8192 --batch <pdb x 256> --step train --target tpu-v6e --target-devices 256 --mesh fsdp=256
   --policy full --attention flash --loss-chunks 1 --compile-only --json``) and reads the same two
   figures from its document (or its error);
3. prints each batch's temporaries and peak per chip, the ratio lab / MaxText, and writes JSON.

MaxText's knobs are the benchmark file's, less those that need Google Cloud (``gcs_metrics``,
``dataset_path``, ``profiler``) and its run-time libtpu flags (``xla_flags``: a VMEM limit and
collective fusion for all-gathers, which the real run passes in ``LIBTPU_INIT_ARGS``), plus what a
deviceless compile needs: ``compile_topology``, ``compile_topology_num_slices=1``,
``skip_jax_distributed_system=true``. Both programs come from the same compiler (JAX 0.12.0.1,
libtpu 0.0.52). Usage::

    python benchmarks/maxtext_reference.py --setup          # once: the MaxText venv (large)
    python benchmarks/maxtext_reference.py --pdb 4,8,12 --out maxtext_reference.json

``--run NAME`` does the same for any catalogued TPU run (``python -m remat_lab published``): MaxText's
knobs are the catalogue's (MaxText's own names) with the benchmark file's remaining tuning parameters
(``TUNING``), its topology ``v6e-<devices>``; the lab's side is ``published --check NAME --json``.
``--libtpu-flags`` passes the run's run-time libtpu flags (``LIBTPU_FLAGS``, MaxText's
``benchmarks/xla_flags_library.py``) in ``LIBTPU_INIT_ARGS`` to MaxText's compile as well::

    python benchmarks/maxtext_reference.py --run llama3.1-8b-v6e-8 [--libtpu-flags]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

GIB = 2 ** 30
CHIPS = 256
VENV = Path.home() / ".cache" / "remat-lab" / "maxtext-venv"
MAXTEXT = "maxtext[tpu]==0.2.5"
# llama3-8b-8192's tuning_params (MaxText's benchmarks/maxtext_trillium_model_configs.py), less the
# Google Cloud ones; per_device_batch_size is each row's.
KNOBS = {"model_name": "llama3-8b", "ici_fsdp_parallelism": -1, "remat_policy": "full",
         "max_target_length": 8192, "attention": "flash", "use_iota_embed": "true",
         "dataset_type": "synthetic", "reuse_example_batch": 1, "enable_checkpointing": "false",
         "sa_block_q": 1024, "sa_block_q_dkv": 2048, "sa_block_q_dq": 2048}
DEVICELESS = {"compile_topology": "v6e-256", "compile_topology_num_slices": 1,
              "skip_jax_distributed_system": "true", "run_name": "remat_lab_reference"}
ENV = {"JAX_PLATFORMS": "cpu", "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
# Per catalogued run: the benchmark file's tuning parameters the catalogue leaves out (the splash
# kernel's other blocks; all at the run's 2048) and its run-time libtpu flags, less continuation
# fusion for all-gathers (CF_FOR_ALL_GATHER's three xla_tpu_enable_async_collective_fusion* flags):
# libtpu 0.0.52 refuses them on a v6e ("not supported/recommended on platforms other than TPU v5e").
_SPLASH_2048 = {k: 2048 for k in ("sa_block_kv_compute", "sa_block_q_dkv", "sa_block_kv_dkv",
                                   "sa_block_kv_dkv_compute", "sa_block_q_dq", "sa_block_kv_dq")}
_HOST_OFFLOAD = ("--xla_tpu_enable_all_experimental_scheduler_features=true"
                 " --xla_tpu_enable_scheduler_memory_pressure_tracking=true"
                 " --xla_tpu_host_transfer_overlap_limit=24"
                 " --xla_tpu_aggressive_opt_barrier_removal=ENABLED"
                 " --xla_lhs_prioritize_async_depth_over_stall=ENABLED"
                 " --xla_tpu_enable_ag_backward_pipelining=true"
                 " --xla_should_allow_loop_variant_parameter_in_chain=ENABLED"
                 " --xla_should_add_loop_invariant_op_in_chain=ENABLED"
                 " --xla_max_concurrent_host_send_recv=100"
                 " --xla_tpu_scheduler_percent_shared_memory_limit=100"
                 " --xla_latency_hiding_scheduler_rerun=2")
_RECIPE_FLAGS = ("--xla_tpu_scoped_vmem_limit_kib=98304"
                 " --xla_tpu_use_minor_sharding_for_major_trivial_input=true"
                 " --xla_tpu_relayout_group_size_threshold_for_reduce_scatter=1"
                 " --xla_tpu_assign_all_reduce_scatter_layout=true"
                 " --xla_tpu_enable_data_parallel_all_reduce_opt=true"
                 " --xla_tpu_data_parallel_opt_different_sized_ops=true"
                 " --xla_tpu_overlap_compute_collective_tc=true --xla_enable_async_all_gather=true"
                 " --xla_tpu_enable_async_collective_fusion_fuse_all_reduce=false"
                 " --xla_tpu_enable_sparse_core_collective_offload_all_reduce=true"
                 " --xla_tpu_enable_all_reduce_offload_tracing=true"
                 " --xla_tpu_use_tc_device_shape_on_sc=true --xla_sc_enable_instruction_fusion=false"
                 " --xla_sc_disjoint_spmem=false --xla_sc_disable_megacore_partitioning=true "
                 + _HOST_OFFLOAD)
_NO_COLLECTIVE_MATMUL = " --xla_jf_spmd_threshold_for_windowed_einsum_mib=1000000"
# mixtral_8x7b_dropped's flags: MOE_VMEM_LIMIT_FLAG, DATA_PARALLEL_OVERLAP and what libtpu 0.0.52
# takes of CF_FOR_ALL_GATHER on a v6e (its last two flags).
_MIXTRAL_FLAGS = ("--xla_tpu_scoped_vmem_limit_kib=81920 --xla_tpu_overlap_compute_collective_tc=true"
                  " --xla_enable_async_all_gather=true --xla_tpu_enable_data_parallel_all_reduce_opt=true"
                  " --xla_tpu_data_parallel_opt_different_sized_ops=true")
TUNING = {"llama3.1-8b-v6e-8": _SPLASH_2048, "llama3.1-8b-v6e-64": _SPLASH_2048,
          "mistral-7b-v6e-8": _SPLASH_2048}
LIBTPU_FLAGS = {"llama3.1-8b-v6e-8": _RECIPE_FLAGS + _NO_COLLECTIVE_MATMUL,
                "llama3.1-8b-v6e-64": _RECIPE_FLAGS,
                "mistral-7b-v6e-8": _RECIPE_FLAGS + _NO_COLLECTIVE_MATMUL,
                "mixtral-8x7b-v6e-256": _MIXTRAL_FLAGS}
COMMON = {"use_iota_embed": "true", "dataset_type": "synthetic", "reuse_example_batch": 1,
          "enable_checkpointing": "false"}
_STATS = re.compile(r"Memory analysis: CompiledMemoryStats\((.*?)\)")
_REFUSED = re.compile(r"HLO temporaries \(([\d.]+)([KMGT])\)")


def lab_command(pdb: int) -> list[str]:
    """The lab's command for ``llama3-8b-8192`` at per-device batch ``pdb``."""
    return [sys.executable, "-m", "remat_lab", "run", "--preset", "llama3-8b", "--seq", "8192",
            "--batch", str(pdb * CHIPS), "--step", "train", "--target", "tpu-v6e",
            "--target-devices", str(CHIPS), "--mesh", f"fsdp={CHIPS}", "--policy", "full",
            "--attention", "flash", "--loss-chunks", "1", "--compile-only", "--json"]


def maxtext_command(venv: Path, pdb: int) -> list[str]:
    """MaxText's ``train_compile`` for ``llama3-8b-8192`` at per-device batch ``pdb``."""
    return _train_compile(venv, {**KNOBS, "per_device_batch_size": pdb, **DEVICELESS})


def _train_compile(venv: Path, knobs: dict) -> list[str]:
    """MaxText's ``train_compile`` command over its own ``base.yml`` with ``knobs``."""
    python = str(venv / "bin" / "python")
    where = subprocess.run([python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    return [python, "-m", "maxtext.trainers.pre_train.train_compile",
            os.path.join(where, "configs", "base.yml"), *(f"{k}={v}" for k, v in knobs.items())]


def maxtext_run_command(venv: Path, run: dict) -> list[str]:
    """MaxText's ``train_compile`` for catalogued run ``run`` on its own topology."""
    knobs = {"model_name": run["model"], **COMMON,
             **{k: str(v).lower() if isinstance(v, bool) else v for k, v in run["knobs"].items()},
             **TUNING.get(run["name"], {}), **DEVICELESS,
             "compile_topology": f"{run['target'].removeprefix('tpu-')}-{run['devices']}",
             "compile_topology_num_slices": run.get("slices", 1)}
    return _train_compile(venv, knobs)


def from_lab_check(stdout: str, stderr: str) -> dict:
    """Temporaries, peak and fit from the lab's ``published --check NAME --json`` document."""
    if not stdout.strip():
        raise RuntimeError("the lab's check gave no document:\n" + stderr[-3000:])
    doc = json.loads(stdout)
    return {"temp_bytes": doc["temp_bytes"], "peak_bytes": doc.get("peak_bytes"), "fits": doc["fits"],
            "source": "libtpu's refusal" if doc.get("refused") else "compiled memory analysis"}


def check_run(args) -> int:
    """``--run NAME``: MaxText's compile of a catalogued run beside the lab's check of it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from remat_lab.config.published import RUNS

    run = RUNS[args.run]
    row: dict = {"run": args.run, "libtpu_flags": bool(args.libtpu_flags)}
    if not args.skip_maxtext:
        env = {**ENV, **({"LIBTPU_INIT_ARGS": LIBTPU_FLAGS.get(args.run, "")} if args.libtpu_flags else {})}
        cmd = maxtext_run_command(args.venv, run)
        done, secs = _run(cmd, env)
        row["maxtext"] = {**from_maxtext(done.stdout + done.stderr), "seconds": round(secs, 1),
                          "command": " ".join(cmd), "env": env}
    if not args.skip_lab:
        cmd = [sys.executable, "-m", "remat_lab", "published", "--check", args.run, "--json"]
        done, secs = _run(cmd)
        row["lab"] = {**from_lab_check(done.stdout, done.stderr), "seconds": round(secs, 1),
                      "command": " ".join(cmd[1:])}
    if "maxtext" in row and "lab" in row:
        row["temp_ratio"] = row["lab"]["temp_bytes"] / row["maxtext"]["temp_bytes"]
    mt, lab = row.get("maxtext", {}), row.get("lab", {})
    print(f"{args.run}: temp GiB  MaxText {gib(mt.get('temp_bytes'))} (fits: {mt.get('fits')})  lab "
          f"{gib(lab.get('temp_bytes'))} (fits: {lab.get('fits')})  ratio "
          f"{row.get('temp_ratio', float('nan')):.3f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(row, indent=2) + "\n")
    return 0


def refused_bytes(text: str) -> int | None:
    """The temporaries libtpu's refusal names ("... HLO temporaries (36.00G) exceeds ..."), or None."""
    m = _REFUSED.search(text)
    return None if not m else int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2)))


def from_maxtext(output: str) -> dict:
    """Temporaries and peak (argument + output - alias + temp + code, bytes) from MaxText's output."""
    m = _STATS.search(output)
    if m:
        stats = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}
        peak = (stats["argument_size_in_bytes"] + stats["output_size_in_bytes"]
                - stats["alias_size_in_bytes"] + stats["temp_size_in_bytes"]
                + stats["generated_code_size_in_bytes"])
        return {"temp_bytes": stats["temp_size_in_bytes"], "peak_bytes": peak, "fits": True,
                "source": "compiled memory analysis"}
    temp = refused_bytes(output)
    if temp is None:
        raise RuntimeError("MaxText printed neither a memory analysis nor libtpu's refusal:\n"
                           + output[-3000:])
    return {"temp_bytes": temp, "peak_bytes": None, "fits": False,
            "source": "libtpu's refusal (HLO temporaries, rounded to 0.01 GiB)"}


def from_lab(stdout: str, stderr: str) -> dict:
    """Temporaries and peak from the lab's ``run --json`` document, or from its refusal."""
    if stdout.strip():
        memory = json.loads(stdout)["memory"]
        return {"temp_bytes": memory["temp_bytes"], "peak_bytes": memory["peak_bytes"], "fits": True,
                "source": "compiled memory analysis"}
    temp = refused_bytes(stderr)
    if temp is None:
        raise RuntimeError("the lab gave neither a document nor libtpu's refusal:\n" + stderr[-3000:])
    return {"temp_bytes": temp, "peak_bytes": None, "fits": False,
            "source": "libtpu's refusal (HLO temporaries, rounded to 0.01 GiB)"}


def _run(cmd: list[str], env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
    return done, time.perf_counter() - t0


def setup(venv: Path) -> None:
    """MaxText's own Python 3.12 virtual environment (``maxtext[tpu]==0.2.5``: JAX 0.12.0.1,
    libtpu 0.0.52)."""
    if not (venv / "bin" / "python").exists():
        subprocess.run(["python3.12", "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", MAXTEXT], check=True)


def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pdb", default="4,8,12", help="per-device batches, comma-separated")
    p.add_argument("--venv", type=Path, default=VENV, help="MaxText's virtual environment")
    p.add_argument("--setup", action="store_true", help="make the MaxText venv, then stop")
    p.add_argument("--run", default="", help="a catalogued TPU run's name (published): compile it both ways")
    p.add_argument("--libtpu-flags", action="store_true",
                   help="--run: MaxText's compile with the run's libtpu flags")
    p.add_argument("--skip-maxtext", action="store_true")
    p.add_argument("--skip-lab", action="store_true")
    p.add_argument("--out", default="", help="write the rows as JSON here")
    args = p.parse_args()
    if args.setup:
        setup(args.venv)
        return 0
    if args.run:
        return check_run(args)
    rows = []
    for pdb in (int(x) for x in args.pdb.split(",")):
        row: dict = {"per_device_batch": pdb, "batch": pdb * CHIPS}
        if not args.skip_maxtext:
            cmd = maxtext_command(args.venv, pdb)
            done, secs = _run(cmd, ENV)
            row["maxtext"] = {**from_maxtext(done.stdout + done.stderr), "seconds": round(secs, 1),
                              "command": " ".join(f"{k}={v}" for k, v in ENV.items()) + " " + " ".join(cmd)}
        if not args.skip_lab:
            cmd = lab_command(pdb)
            done, secs = _run(cmd)
            row["lab"] = {**from_lab(done.stdout, done.stderr), "seconds": round(secs, 1),
                          "command": " ".join(cmd[1:])}
        if "maxtext" in row and "lab" in row:
            row["temp_ratio"] = row["lab"]["temp_bytes"] / row["maxtext"]["temp_bytes"]
        rows.append(row)
        mt, lab = row.get("maxtext", {}), row.get("lab", {})
        print(f"pdb {pdb:>3}: temp GiB  MaxText {gib(mt.get('temp_bytes'))}  lab "
              f"{gib(lab.get('temp_bytes'))}  ratio {row.get('temp_ratio', float('nan')):.3f};  "
              f"peak GiB  MaxText {gib(mt.get('peak_bytes'))}  lab {gib(lab.get('peak_bytes'))}",
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"run": "llama3-8b-8192", "target": "v6e-256",
                                              "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

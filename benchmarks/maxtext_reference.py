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
    python = str(venv / "bin" / "python")
    where = subprocess.run([python, "-c", "import maxtext, os; print(os.path.dirname(maxtext.__file__))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    knobs = {**KNOBS, "per_device_batch_size": pdb, **DEVICELESS}
    return [python, "-m", "maxtext.trainers.pre_train.train_compile",
            os.path.join(where, "configs", "base.yml"), *(f"{k}={v}" for k, v in knobs.items())]


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
    p.add_argument("--skip-maxtext", action="store_true")
    p.add_argument("--skip-lab", action="store_true")
    p.add_argument("--out", default="", help="write the rows as JSON here")
    args = p.parse_args()
    if args.setup:
        setup(args.venv)
        return 0
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

"""Programs read and never run are compiled with LLVM's optimisation off: what the lab reads is unchanged.

The truth is a second compile of the same lowering with XLA's defaults: the optimized HLO text
and every field of the memory analysis must be identical (on a GPU every instruction: the test
run's autotuning is off, which may write other tiles in a fusion's backend_config), on the local CPU
and on a named GPU and TPU target (compile-only devices); the advisor's probe must read the default
compile's figures.
A run in a process with none of the test run's XLA flags (XLA's own defaults, as users compile) is
checked against them too.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from remat_lab.analysis import hlo
from remat_lab.analysis.costs import memory_report, program_flops
from remat_lab.config import RunConfig
from remat_lab.program.analysis_compile import ANALYSIS_ONLY, compile_for_analysis
from remat_lab.studies.advisor import search as advisor_search

CASES = [
    RunConfig(model="transformer", width=64, seq=32, heads=4, depth=3, stack="scan", batch=4,
              policy="dots_saveable"),
    RunConfig(model="transformer", width=64, seq=32, heads=4, depth=2, stack="loop", batch=4,
              policy="offload_dot_with_no_batch_dims"),
    RunConfig(model="mlp", width=128, depth=3, stack="loop", batch=16, policy="nothing_saveable"),
    RunConfig(model="llm", width=64, depth=2, heads=4, seq=16, vocab=256, batch=2, step="train",
              policy="minimal"),
    RunConfig(model="mlp", width=64, depth=2, stack="scan", batch=8, policy="dots_saveable",
              target="h100"),
    RunConfig(model="mlp", width=64, depth=2, stack="scan", batch=8, policy="dots_saveable",
              target="tpu-v5e"),
]


# XLA's own defaults (its DebugOptions), given explicitly: the test run turns LLVM's optimisation off
# for every compile through XLA_FLAGS (tests/conftest.py), and the truth here is what users compile.
XLA_DEFAULTS = {"xla_backend_optimization_level": 3, "xla_llvm_disable_expensive_passes": False,
                "xla_gpu_autotune_level": 4}


def _instructions(text):
    # The test run's GPU autotuning is off (tests/conftest.py): it may pick other tiles for a fusion,
    # written in its backend_config and nowhere else; every instruction, shape and operand must match.
    return re.sub(r'(, backend_config=.*$|fingerprint_before_lhs="[0-9a-f]+")', "", text, flags=re.M)


def _default(lowered):
    return lowered.compile(compiler_options=XLA_DEFAULTS)


@pytest.mark.parametrize("config", CASES, ids=lambda c: f"{c.target}-{c.model}-{c.stack}-{c.step}")
def test_read_only_compile_reads_what_the_default_compile_reads(config):
    _, lowered = advisor_search._lowered(config)
    default = _default(lowered)
    read_only = compile_for_analysis(lowered)
    if config.target == "h100":
        assert _instructions(read_only.as_text()) == _instructions(default.as_text())
    else:
        assert read_only.as_text() == default.as_text()
    assert memory_report(read_only) == memory_report(default)
    assert program_flops(read_only, read_only.as_text())[:2] == program_flops(default, default.as_text())[:2]


def test_the_options_are_llvms_only():
    # Anything else could change the HLO passes or the buffer assignment the lab reads.
    assert set(ANALYSIS_ONLY) == {"xla_backend_optimization_level", "xla_llvm_disable_expensive_passes"}


def test_a_probe_reads_the_default_compiles_peak():
    config = CASES[0]
    advisor_search.clear_cache()
    got = advisor_search.probe(config)
    _, lowered = advisor_search._lowered(config)
    default = memory_report(_default(lowered))
    assert got["peak_bytes"] == default["peak_bytes"]
    assert got["memory"]["temp_bytes"] == default["temp_bytes"]


def test_a_run_with_xlas_own_cpu_defaults_reads_what_xla_compiles(tmp_path):
    """The CLI's ``run`` in a process with none of the test run's XLA flags (XLA's CPU defaults, as
    users compile): its memory fields, flop count and program fingerprint
    are those of the same program compiled here with XLA's defaults given explicitly."""
    config = RunConfig(model="transformer", width=32, seq=16, heads=2, depth=2, stack="scan", batch=2,
                       policy="dots_saveable")
    ours = os.environ["REMAT_LAB_TEST_XLA_FLAGS"].split()  # the test run's (tests/conftest.py)
    assert set(ours) <= set(os.environ["XLA_FLAGS"].split())
    flags = " ".join(f for f in os.environ["XLA_FLAGS"].split() if f not in ours)
    env = {**os.environ, "XLA_FLAGS": flags, "REMAT_LAB_CACHE_DIR": str(tmp_path)}
    argv = [sys.executable, "-m", "remat_lab", "run", "--model", "transformer", "--width", "32",
            "--seq", "16", "--heads", "2", "--depth", "2", "--stack", "scan", "--batch", "2",
            "--policy", "dots_saveable", "--repeats", "1", "--warmup", "0", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    _, lowered = advisor_search._lowered(config)
    truth = lowered.compile(compiler_options=XLA_DEFAULTS)
    text = truth.as_text()
    memory = memory_report(truth)
    assert {k: doc["memory"][k] for k in memory} == memory
    assert doc["flops"] == program_flops(truth, text)[0]
    assert doc["hlo"]["fingerprint"] == hlo.fingerprint(text)


def test_without_a_gpu_the_one_shot_all_reduce_kernel_is_off_and_changes_nothing_read():
    """Importing the lab without a local GPU turns XLA's one-shot all-reduce kernel off in
    ``XLA_FLAGS`` (its LLVM code kills a deviceless compile over 8 H100 hosts); the truth that this
    changes nothing the lab reads is the same two-host program compiled with the kernel on."""
    import glob

    if glob.glob("/dev/nvidia[0-9]*"):
        pytest.skip("a GPU is attached here: the lab leaves XLA's kernel choice alone")
    assert "--xla_gpu_unsupported_use_all_reduce_one_shot_kernel=false" in os.environ["XLA_FLAGS"]
    config = RunConfig(model="llm", width=32, depth=1, heads=2, kv_heads=1, seq=16, batch=16,
                       vocab=64, mlp_dim=64, step="train", policy="full", dtype="bfloat16",
                       target="h100", target_devices=16, mesh="dcn_data=2,fsdp=8")
    _, lowered = advisor_search._lowered(config)
    off = lowered.compile()
    on = lowered.compile(compiler_options={"xla_gpu_unsupported_use_all_reduce_one_shot_kernel": True})
    assert "all-reduce" in off.as_text()  # the program has all-reduces for the kernel to emit
    assert off.as_text() == on.as_text()
    assert memory_report(off) == memory_report(on)


def test_finishing_past_hbm_changes_nothing_a_fitting_tpu_program_compiles_to():
    """libtpu's ``xla_tpu_no_crash_on_oom`` (``compile_past_hbm``: how a published run libtpu refuses
    for HBM is still predicted) only lets a compile over the chip's HBM finish: a program that fits
    compiles to the same optimized text, memory and flops with it as without."""
    from remat_lab.program.analysis_compile import compile_past_hbm

    _, lowered = advisor_search._lowered(CASES[-1])
    plain, past = compile_for_analysis(lowered), compile_past_hbm(lowered)
    assert past.as_text() == plain.as_text()
    assert memory_report(past) == memory_report(plain)
    assert program_flops(past, past.as_text())[:2] == program_flops(plain, plain.as_text())[:2]

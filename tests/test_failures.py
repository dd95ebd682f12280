"""Failures named for what they are: each kind its own sentence and exit status (CLI) and its own
error class (the worker's reply), "a smaller configuration" only where that is the cure.

XLA's errors are raised as the real ``jax.errors.JaxRuntimeError`` with XLA's own wording, and one
is libtpu's real refusal: a tiny program compiled for a v5e chip with 1 MiB of HBM
(``xla_tpu_max_hbm_size_mib``), whose message carries libtpu's code ``E1000 CompileTimeHbmOom``.
"""

from __future__ import annotations

import signal

import jax
import pytest
from jax._src.linear_util import StoreException
from jax.errors import JaxRuntimeError

from remat_lab.cli import main
from remat_lab.program import failures
from remat_lab.serve import in_worker
from remat_lab.studies import experiment

EXPLAIN = ["explain", "--width", "24", "--batch", "2", "--no-jaxpr", "--no-cache"]
SMALLER = "lower width, batch, seq or depth"


def _raising(err: BaseException):
    def compile_(*args, **kwargs):
        raise err
    return compile_


def _cli(monkeypatch, capsys, err: BaseException, argv=EXPLAIN) -> tuple[int, str]:
    with monkeypatch.context() as mp:
        mp.setattr(jax.stages.Lowered, "compile", _raising(err))
        status = main(argv)
    said = capsys.readouterr().err
    assert "Traceback" not in said and len(said.strip().splitlines()) == 1, said
    return status, said


def test_a_race_in_the_lab_is_the_labs_bug_not_a_smaller_configuration(monkeypatch, capsys):
    """JAX's StoreException (issue 46's race) is the lab's bug: status 70, no size advice."""
    status, said = _cli(monkeypatch, capsys, StoreException("Store occupied"))
    assert status == 70
    assert "from a bug in the lab and not your configuration: StoreException: Store occupied" in said
    assert "smaller" not in said.lower() and "XLA failed" not in said
    assert "(at " in said and ".py:" in said  # where in the lab's code


def test_an_error_outside_any_compile_is_the_labs_bug_too(monkeypatch, capsys):
    def broken(*args, **kwargs):
        return {}["flops"]
    monkeypatch.setattr(experiment, "run_experiment", broken)
    status = main(EXPLAIN)
    said = capsys.readouterr().err
    assert status == 70 and "Traceback" not in said, said
    assert "Remat Lab failed while running explain, from a bug in the lab" in said
    assert "KeyError: 'flops'" in said and "test_failures.py" not in said


def test_xlas_own_error_is_quoted_with_no_size_advice(monkeypatch, capsys):
    err = JaxRuntimeError("INTERNAL: Mosaic failed to compile TPU kernel: unsupported shape.\n"
                          "The MLIR operation involved: tpu.matmul")
    status, said = _cli(monkeypatch, capsys, err)
    assert status == 5
    assert ("XLA failed while compiling with its own error, not a lack of memory: INTERNAL: Mosaic "
            "failed to compile TPU kernel: unsupported shape.") in said
    assert "tpu.matmul" not in said  # the first line only
    assert "A smaller configuration will not cure this" in said and SMALLER not in said


def test_device_out_of_memory_says_the_cure(monkeypatch, capsys):
    err = JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.00TiB.")
    status, said = _cli(monkeypatch, capsys, err)
    assert status == 3
    assert "XLA failed while compiling: RESOURCE_EXHAUSTED: Out of memory" in said
    assert f"The device ran out of memory: {SMALLER}" in said


@pytest.mark.parametrize("err", [MemoryError(), JaxRuntimeError("INTERNAL: std::bad_alloc")],
                         ids=["MemoryError", "bad_alloc"])
def test_host_out_of_memory_is_this_machines(monkeypatch, capsys, err):
    status, said = _cli(monkeypatch, capsys, err)
    assert status == 4
    assert "This machine's memory ran out while compiling" in said
    assert "the CPU device's buffers live there too" in said  # a local CPU run: its own cure


def test_host_out_of_memory_compiling_for_a_target_is_not_the_devices(monkeypatch, capsys):
    argv = ["run", "--target", "tpu-v5e", "--width", "64", "--batch", "4", "--no-cache"]
    status, said = _cli(monkeypatch, capsys, MemoryError(), argv)
    assert status == 4 and "not the device's, so the configuration may still fit its device" in said


def test_libtpus_real_refusal_names_its_code_and_the_cure(monkeypatch, capsys):
    """A real libtpu compile under a 1 MiB HBM cap: its status, first line and E1000 code."""
    real = jax.stages.Lowered.compile

    def capped(self, compiler_options=None, **kwargs):
        return real(self, compiler_options={**(compiler_options or {}), "xla_tpu_max_hbm_size_mib": 1},
                    **kwargs)
    monkeypatch.setattr(jax.stages.Lowered, "compile", capped)
    status = main(["run", "--target", "tpu-v5e", "--width", "512", "--batch", "512", "--depth", "2",
                   "--no-cache"])
    said = capsys.readouterr().err
    assert status == 3, said
    line = said.strip().splitlines()[-1]
    assert line.startswith("remat_lab: error: XLA failed while compiling for tpu-v5e: "
                           "RESOURCE_EXHAUSTED: Ran out of memory"), line
    assert "(error E1000 CompileTimeHbmOom)" in line and f"The device ran out of memory: {SMALLER}" in line
    assert "openxla.org" not in line  # XLA's second line is left out


def test_the_worker_replies_with_the_kind_and_the_pool_rebuilds_it():
    """The app's path: ``error_reply`` names the class; the pool raises that class again."""
    cases = {StoreException("Store occupied"): "LabBug",
             failures.compiler_error("compiling", JaxRuntimeError("INTERNAL: x")): "CompilerError",
             failures.host_oom("compiling", MemoryError()): "HostOutOfMemory",
             failures.DeviceOutOfMemory("XLA failed: RESOURCE_EXHAUSTED"): "DeviceOutOfMemory"}
    for err, name in cases.items():
        kind, text = in_worker.error_reply(err)
        assert kind == name and issubclass(getattr(failures, kind), failures.ExecutionError)
    kind, text = in_worker.error_reply(KeyError("x"))
    assert kind == "LabBug" and "from a bug in the lab" in text and "KeyError: 'x'" in text


def test_a_worker_crashing_in_native_code_is_not_said_to_be_stopped_from_outside():
    from remat_lab.serve import deaths

    said = deaths.message(-signal.SIGSEGV, 1 << 30, 0, 0)
    assert "crashed (SIGSEGV) in native code" in said and "from outside" not in said
    assert "a smaller configuration is no cure" in said
    exited = deaths.message(1, 1 << 30, 0, 0)
    assert "exit code 1" in exited and "a bug in the lab" in exited and "smaller" not in exited

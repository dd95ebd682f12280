"""The roofline: calibration cached per machine, reports never above the roofs; no timing targets."""

from __future__ import annotations

import datetime
import json
import math
import os
import time

import jax
import numpy as np
import pytest

from remat_lab.analysis import roofline
from remat_lab.config import RunConfig
from remat_lab.program.step import build_problem, make_step

FAKE = {"peak_flops_per_s": 1e11, "bandwidth_bytes_per_s": 1e10}


def _finite_positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def real_roofs(tmp_path_factory):
    """One real calibration for the module, in its own cache directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REMAT_LAB_CACHE_DIR", str(tmp_path_factory.mktemp("calibration")))
        roofline.clear_cache()
        yield roofline.calibrate()
    roofline.clear_cache()


@pytest.fixture
def iso(tmp_path, monkeypatch):
    """A fresh cache directory and no in-process calibration."""
    monkeypatch.setenv("REMAT_LAB_CACHE_DIR", str(tmp_path))
    roofline.clear_cache()
    yield tmp_path
    roofline.clear_cache()


@pytest.fixture
def measured(monkeypatch):
    """Replace the measurement by a counter returning ``FAKE`` (or the queued figures)."""
    calls = []
    queue: list[dict] = []

    def fake(backend):
        calls.append(backend)
        figures = queue.pop(0) if queue else FAKE
        return {**figures, "details": {"fake": True}}

    monkeypatch.setattr(roofline, "_measure", fake)
    fake.calls, fake.queue = calls, queue
    return fake


# ---------------------------------------------------------------- calibration


def test_calibration_gives_positive_finite_roofs(real_roofs):
    roofs = real_roofs
    assert roofs["peak_source"] == "calibrated"
    assert _finite_positive(roofs["peak_flops_per_s"])
    assert _finite_positive(roofs["bandwidth_bytes_per_s"])
    assert roofs["peak_note"].startswith("calibrated")
    assert roofs["machine"] == roofline.machine_identity()
    assert datetime.datetime.fromisoformat(roofs["measured_at"]).tzinfo is not None
    d = roofs["details"]
    assert d["matmul"]["peak_flops_per_s"] == roofs["peak_flops_per_s"]
    assert all(_finite_positive(v) for v in d["matmul"]["flops_per_s_by_size"].values())
    assert d["copy"]["bytes"] >= 64 * 2**20
    stored = json.loads((roofline.calibration_path()).read_text())
    assert [e["peak_flops_per_s"] for e in stored["calibrations"].values()] == [
        roofs["peak_flops_per_s"]]


def test_machine_identity_names_the_machine():
    ident = roofline.machine_identity()
    assert set(ident) >= {"backend", "device_kind", "cpu_model", "physical_cores", "usable_cores",
                          "jax", "matmul_precision"}
    assert ident["jax"] == jax.__version__ and ident["backend"] == jax.default_backend()
    assert 1 <= ident["usable_cores"] <= (os.cpu_count() or 1)


def test_calibration_is_measured_once_then_reused(iso, measured):
    first = roofline.calibrate()
    second = roofline.calibrate()
    assert len(measured.calls) == 1
    assert first["details"]["cache"] == "measured" and second["details"]["cache"] == "memory"
    roofline.clear_cache()  # a new process: the file answers
    third = roofline.calibrate()
    assert len(measured.calls) == 1 and third["details"]["cache"] == "file"
    for key in ("peak_flops_per_s", "bandwidth_bytes_per_s", "measured_at", "machine"):
        assert third[key] == first[key]
    assert (iso / roofline.CALIBRATION_FILE).is_file()


def test_callers_cannot_change_the_cached_calibration(iso, measured):
    roofline.calibrate()["peak_flops_per_s"] = -1.0
    assert roofline.calibrate()["peak_flops_per_s"] == FAKE["peak_flops_per_s"]


def test_force_measures_again(iso, measured):
    roofline.calibrate()
    measured.queue.append({"peak_flops_per_s": 3e11, "bandwidth_bytes_per_s": 2e10})
    again = roofline.calibrate(force=True)
    assert len(measured.calls) == 2 and again["peak_flops_per_s"] == 3e11
    roofline.clear_cache()
    assert roofline.calibrate()["peak_flops_per_s"] == 3e11  # the file was replaced too


def test_another_machine_in_the_file_is_measured_anew(iso, measured):
    ident = roofline.machine_identity()
    other = {**ident, "cpu_model": "some other CPU", "usable_cores": ident["usable_cores"] + 7}
    entry = {**FAKE, "peak_flops_per_s": 9e15, "peak_source": "calibrated", "peak_note": "x",
             "machine": other, "measured_at": "2020-01-01T00:00:00+00:00", "details": {}}
    # Under its own key, and under this machine's key (an edited or colliding entry).
    doc = {"format": roofline.FILE_FORMAT, "calibrations": {
        roofline._identity_key(other): entry, roofline._identity_key(ident): entry}}
    (iso / roofline.CALIBRATION_FILE).write_text(json.dumps(doc))
    roofs = roofline.calibrate()
    assert len(measured.calls) == 1 and roofs["peak_flops_per_s"] == FAKE["peak_flops_per_s"]
    assert roofs["machine"] == ident
    stored = json.loads((iso / roofline.CALIBRATION_FILE).read_text())["calibrations"]
    assert stored[roofline._identity_key(ident)]["machine"] == ident
    assert stored[roofline._identity_key(other)]["machine"] == other  # the other machine is kept


@pytest.mark.parametrize("text", ["not json", "[]", '{"format": 99, "calibrations": {}}',
                                  '{"format": 1, "calibrations": []}'])
def test_a_malformed_file_is_measured_anew(iso, measured, text):
    (iso / roofline.CALIBRATION_FILE).write_text(text)
    assert roofline.calibrate()["peak_source"] == "calibrated"
    assert len(measured.calls) == 1


def test_the_file_lives_in_the_compile_cache_directory(tmp_path, monkeypatch):
    monkeypatch.delenv("REMAT_LAB_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert roofline.calibration_path() == tmp_path / "remat_lab" / "jax" / "calibration.json"
    monkeypatch.setenv("REMAT_LAB_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert roofline.calibration_path() == tmp_path / "elsewhere" / "calibration.json"


def test_a_failed_measurement_falls_back_to_the_spec_sheet(iso, monkeypatch):
    def broken(backend):
        raise RuntimeError("no device")

    monkeypatch.setattr(roofline, "_measure", broken)
    roofs = roofline.calibrate()
    assert roofs["peak_source"] == "spec" and "no device" in roofs["details"]["calibration_error"]
    assert not (iso / roofline.CALIBRATION_FILE).exists()
    report = roofline.roofline_report(1e9, 1e8, 1e-2)
    assert report["peak_source"] == "spec"
    assert report["achieved_fraction"] is None or report["achieved_fraction"] <= 1.0


def test_peak_flops_wrapper(iso, measured):
    peak, how = roofline.peak_flops()
    assert peak == FAKE["peak_flops_per_s"] and how.startswith("calibrated")


# ---------------------------------------------------------------- spec sheet and notes


def _gpu_identity(kind: str, precision: str = "default") -> dict:
    return {"backend": "gpu", "device_kind": kind, "cpu_model": "x", "physical_cores": 1,
            "usable_cores": 1, "jax": jax.__version__, "matmul_precision": precision}


def test_gpu_spec_sheet_is_tf32_at_the_default_precision():
    spec = roofline.spec_roofs(_gpu_identity("NVIDIA H100 80GB HBM3"))
    assert spec["peak_source"] == "spec" and spec["peak_flops_per_s"] == 494.7e12
    assert "TF32" in spec["peak_note"] and spec["bandwidth_bytes_per_s"] == 3.35e12
    assert roofline.spec_roofs(_gpu_identity("NVIDIA H100", "highest"))["peak_flops_per_s"] == 67e12
    assert roofline.spec_roofs(_gpu_identity("Tesla V100-SXM2"))["peak_flops_per_s"] == 15.7e12
    assert roofline.spec_roofs(_gpu_identity("NVIDIA A100-SXM4-40GB"))["peak_flops_per_s"] == 156e12
    assert roofline.spec_roofs(_gpu_identity("Mystery GPU"))["peak_flops_per_s"] is None


def test_calibrated_gpu_note_says_tf32():
    assert "TF32" in roofline._peak_note(_gpu_identity("NVIDIA H200"))
    assert "TF32" not in roofline._peak_note(_gpu_identity("NVIDIA H200", "highest"))


# ---------------------------------------------------------------- physical cores


def test_physical_cores_between_one_and_logical():
    n = roofline.physical_core_count()
    assert isinstance(n, int) and 1 <= n <= (os.cpu_count() or 1)


def test_physical_cores_from_cpuinfo_text():
    blocks = [f"processor\t: {i}\nphysical id\t: {i // 4}\ncore id\t\t: {(i % 4) // 2}\n"
              for i in range(8)]  # 2 sockets x 2 cores x 2 threads
    assert roofline._physical_from_cpuinfo("\n".join(blocks)) == 4
    assert roofline._physical_from_cpuinfo("processor\t: 0\nmodel name\t: x\n") is None
    assert roofline._physical_from_cpuinfo("") is None


# ---------------------------------------------------------------- the report

KEYS = {"peak_flops_per_s", "peak_source", "peak_note", "bandwidth_bytes_per_s", "ridge_intensity",
        "flops", "bytes_accessed", "median_s", "arithmetic_intensity", "achieved_flops_per_s",
        "attainable_flops_per_s", "bound", "achieved_fraction", "fraction_of_attainable",
        "calibrated_at", "stale_calibration", "above_memory_roof", "notes"}


def test_report_compute_and_memory_bound(iso, measured):
    # ridge = 1e11 / 1e10 = 10 FLOP/byte
    compute = roofline.roofline_report(1e9, 1e7, 0.1)  # intensity 100, 10 GFLOP/s
    assert set(compute) == KEYS
    assert compute["arithmetic_intensity"] == pytest.approx(100)
    assert compute["ridge_intensity"] == pytest.approx(10)
    assert compute["bound"] == "compute"
    assert compute["attainable_flops_per_s"] == pytest.approx(1e11)
    assert compute["achieved_flops_per_s"] == pytest.approx(1e10)
    assert compute["achieved_fraction"] == pytest.approx(0.1)
    assert compute["fraction_of_attainable"] == pytest.approx(0.1)
    memory = roofline.roofline_report(1e9, 1e9, 0.5)  # intensity 1 -> roof 1e10, 2 GFLOP/s
    assert memory["bound"] == "memory"
    assert memory["attainable_flops_per_s"] == pytest.approx(1e10)
    assert memory["achieved_fraction"] == pytest.approx(0.02)
    assert memory["fraction_of_attainable"] == pytest.approx(0.2)
    assert not memory["stale_calibration"] and not memory["above_memory_roof"]
    assert json.loads(json.dumps(memory)) == memory
    assert len(measured.calls) == 1


def test_report_above_the_peak_recalibrates_once_and_reports_a_calibration_error(iso, measured):
    roofline.calibrate()
    report = roofline.roofline_report(2e11 * 0.01, 1e6, 0.01)  # 2x the peak
    assert len(measured.calls) == 2  # measured again once
    # Not capped: a fraction over 1 measures the peak's error, and a note names it so.
    assert report["achieved_fraction"] == pytest.approx(2.0)
    assert report["fraction_of_attainable"] == 1.0  # the memory roof's cap is another matter
    assert report["stale_calibration"] is True
    assert any(n.startswith("calibration error") for n in report["notes"])
    assert report["achieved_flops_per_s"] == pytest.approx(2e11)  # the rate itself is kept
    again = roofline.roofline_report(2e11 * 0.01, 1e6, 0.01)
    assert len(measured.calls) == 2  # once per process
    assert again["achieved_fraction"] == pytest.approx(2.0) and again["stale_calibration"] is True


def test_a_calibration_under_load_never_lowers_the_stored_peak(iso, measured):
    roofline.calibrate()  # 1e11 stored
    measured.queue.append({"peak_flops_per_s": 2e10, "bandwidth_bytes_per_s": 1e9})  # a busy machine
    again = roofline.calibrate(force=True)
    assert len(measured.calls) == 2
    assert again["peak_flops_per_s"] == FAKE["peak_flops_per_s"]
    assert again["bandwidth_bytes_per_s"] == FAKE["bandwidth_bytes_per_s"]
    assert again["details"]["measured_now"]["peak_flops_per_s"] == 2e10  # what was measured, kept
    roofline.clear_cache()  # a new process reads the file: still the higher figure
    assert roofline.calibrate()["peak_flops_per_s"] == FAKE["peak_flops_per_s"]
    measured.queue.append({"peak_flops_per_s": 1e10, "bandwidth_bytes_per_s": 1e9})
    assert roofline.recalibrate()["peak_flops_per_s"] == FAKE["peak_flops_per_s"]


def test_a_recalibration_that_catches_up_is_not_stale(iso, measured):
    roofline.calibrate()
    measured.queue.append({"peak_flops_per_s": 1e12, "bandwidth_bytes_per_s": 5e9})
    report = roofline.roofline_report(2e9, 1e6, 0.01)  # 2e11 > 1e11
    assert len(measured.calls) == 2
    assert report["peak_flops_per_s"] == 1e12 and report["achieved_fraction"] == pytest.approx(0.2)
    assert report["stale_calibration"] is False
    # Each roof keeps the higher of the old and new figures; the file holds the merged one.
    assert report["bandwidth_bytes_per_s"] == FAKE["bandwidth_bytes_per_s"]
    roofline.clear_cache()
    assert roofline.calibrate()["peak_flops_per_s"] == 1e12


def test_above_the_memory_roof_is_capped_and_flagged(iso, measured):
    report = roofline.roofline_report(1e9, 1e9, 0.01)  # intensity 1: roof 1e10, achieved 1e11
    assert report["bound"] == "memory" and report["achieved_fraction"] == pytest.approx(1.0)
    assert report["fraction_of_attainable"] == 1.0 and report["above_memory_roof"] is True
    assert report["stale_calibration"] is False


@pytest.mark.parametrize("flops,nbytes,median", [
    (None, None, None), (1e9, None, 1e-3), (None, 1e6, 1e-3), (1e9, 1e6, None),
    (0, -1, float("nan")), ("x", [], 0.0)])
def test_missing_inputs_give_none_fields(iso, measured, flops, nbytes, median):
    report = roofline.roofline_report(flops, nbytes, median)
    assert set(report) == KEYS and report["peak_flops_per_s"] == FAKE["peak_flops_per_s"]
    if not (flops and median and isinstance(flops, float) and isinstance(median, float)):
        assert report["achieved_flops_per_s"] is None and report["achieved_fraction"] is None
    if not (nbytes and isinstance(nbytes, float) and isinstance(flops, float)):
        assert report["arithmetic_intensity"] is None and report["bound"] is None
        assert report["fraction_of_attainable"] is None
    assert report["fraction_of_attainable"] is None or 0 < report["fraction_of_attainable"] <= 1
    frac = report["achieved_fraction"]  # over 1 only as a named calibration error, never capped
    assert frac is None or 0 < frac <= 1 or report["stale_calibration"]


def test_xla_cost_reads_flops_and_bytes():
    x = np.ones((64, 32), np.float32)
    compiled = jax.jit(lambda a: a @ a.T).lower(x).compile()
    cost = roofline.xla_cost(compiled)
    assert cost["flops"] == pytest.approx(2 * 64 * 64 * 32, rel=0.1)
    assert _finite_positive(cost["bytes_accessed"])

    class NoCost:
        def cost_analysis(self):
            raise NotImplementedError

    assert roofline.xla_cost(NoCost()) == {"flops": None, "bytes_accessed": None}


def test_fraction_at_most_one_on_the_bench_size(real_roofs):
    """The bench's default step (width 512, batch 256), compiled and timed without the engine."""
    problem = build_problem(RunConfig(width=512, batch=256))
    compiled = jax.jit(make_step(problem)).trace(*problem.args).lower().compile()
    cost = roofline.xla_cost(compiled)
    for _ in range(3):
        jax.block_until_ready(compiled(*problem.args))
    samples = []
    for _ in range(15):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*problem.args))
        samples.append(time.perf_counter() - t0)
    report = roofline.roofline_report(cost["flops"], cost["bytes_accessed"], float(np.median(samples)))
    assert report["peak_source"] == "calibrated"
    assert 0 < report["achieved_fraction"] <= 1
    assert 0 < report["fraction_of_attainable"] <= 1
    assert report["bound"] in ("compute", "memory")


def test_physical_cores_from_sysfs(tmp_path):
    for cpu, siblings in enumerate(["0-1", "0-1", "2-3", "2-3", "4"]):
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_cpus_list").write_text(siblings + "\n")
    assert roofline._physical_from_sysfs(tmp_path) == 3
    assert roofline._physical_from_sysfs(tmp_path / "missing") is None


def test_cli_calibrate_measures_again_and_keeps_the_higher_figures(iso, measured, capsys):
    """``python -m remat_lab calibrate``: a busy machine reads low, so a new measurement never
    lowers a stored roof."""
    import json

    from remat_lab.cli import main

    first = roofline.calibrate()
    low = {"peak_flops_per_s": first["peak_flops_per_s"] / 2,
           "bandwidth_bytes_per_s": first["bandwidth_bytes_per_s"] * 2}
    measured.queue.append(low)
    assert main(["calibrate", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["peak_flops_per_s"] == first["peak_flops_per_s"]  # the old, higher peak is kept
    assert doc["bandwidth_bytes_per_s"] == low["bandwidth_bytes_per_s"]  # the new, higher one
    assert len(measured.calls) == 2

"""Answers a user can act on: run's exit status on a gradient MISMATCH, and an honest Pareto front."""

from __future__ import annotations

import json

import pytest

from remat_lab.cli import main
from remat_lab.cli import run as run_cli
from remat_lab.studies import compare

TINY = ["--width", "16", "--batch", "4", "--repeats", "1", "--warmup", "0", "--no-cache"]


# ---------------------------------------------------------------- run's exit status


def test_run_exits_3_when_the_gradient_check_fails(monkeypatch, capsys):
    from remat_lab.studies import device_checks  # the run's check, fitted to the device

    real = device_checks.check_gradients
    monkeypatch.setattr(device_checks, "check_gradients",
                        lambda *a, **k: {**real(*a, **k), "ok": False,
                                         "failures": ["w0: injected mismatch"]})
    status = main(["run", *TINY, "--json"])
    out, err = capsys.readouterr()
    assert status == run_cli.GRAD_MISMATCH == 3
    assert json.loads(out)["gradient_check"]["ok"] is False  # the document is still printed
    assert "MISMATCH" in err and "injected mismatch" in err


def test_run_exits_0_when_the_gradient_check_passes(capsys):
    assert main(["run", *TINY, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gradient_check"]["ok"] is True


def test_exit_status_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "3 the gradient check failed" in " ".join(capsys.readouterr().out.split())


def test_mismatch_status_ignores_a_check_that_was_not_run():
    assert run_cli.mismatch_status({"ok": None, "reason": "compile-only"}) == 0
    assert run_cli.mismatch_status(None) == 0
    assert run_cli.mismatch_status({"ok": True}) == 0


# ---------------------------------------------------------------- the Pareto front (no JAX)


def _row(policy, low, high, peak=100, fingerprint=None):
    return {"policy": policy, "median_s": (low + high) / 2, "ci_low_s": low, "ci_high_s": high,
            "peak_bytes": peak, "fingerprint": fingerprint}


def test_no_front_on_memory_alone_when_every_time_interval_overlaps():
    out = compare.rank([_row("a", 1.0, 2.0, peak=300 * 1024), _row("b", 1.5, 2.5, peak=100 * 1024),
                        _row("c", 1.2, 1.8, peak=100 * 1024)])
    assert out["pareto"] == []
    assert out["pareto_reason"] == ("No Pareto front: the step times are indistinguishable (every "
                                    "95 % interval overlaps every other); the smallest peak is "
                                    "100.0 KiB, of b and c.")


def test_a_front_once_two_programs_separate_in_time():
    rows = [_row("fast_big", 1.0, 1.1, peak=300), _row("slow_small", 2.0, 2.1, peak=100),
            _row("slow_big", 3.0, 3.1, peak=300)]
    out = compare.rank(rows)
    assert out["pareto"] == ["fast_big", "slow_small"]
    assert out["pareto_reason"].startswith("Pareto front: fast_big and slow_small: ")


def test_one_program_has_no_front_and_its_policies_are_named_together():
    out = compare.rank([_row("x", 1.0, 1.1, fingerprint="f"), _row("y", 2.0, 2.1, fingerprint="f")])
    assert out["pareto"] == [] and "only one compiled program" in out["pareto_reason"]
    # A shared program on the front: all its policies are on it, named as one program.
    out = compare.rank([_row("x", 1.0, 1.1, peak=50, fingerprint="f"),
                        _row("y", 1.0, 1.1, peak=50, fingerprint="f"), _row("z", 2.0, 2.1)])
    assert out["pareto"] == ["x", "y"] and "x (= y)" in out["pareto_reason"]


def test_no_front_without_memory_figures_says_so():
    out = compare.rank([_row("a", 1, 2, peak=None), _row("b", 1.5, 2.5, peak=None)])
    assert out["pareto"] == [] and out["pareto_reason"].endswith("gives no peak memory.")


def test_pareto_chart_draws_one_point_per_compiled_program():
    import pandas as pd

    from remat_lab.present import charts

    df = pd.DataFrame({"policy": ["no_remat", "dots_saveable", "dots_with_no_batch_dims_saveable"],
                       "median_ms": [1.0, 2.0, 2.2], "peak_mib": [3.0, 1.0, 1.0],
                       "ci_low_ms": [0.9, 1.9, 2.0], "ci_high_ms": [1.1, 2.1, 2.4],
                       "same_program_as": [None, None, "dots_saveable"]})
    fig = charts.make_pareto_figure(df, pd.Series([True, True, True]))
    names = [t.name for t in fig.data]
    assert names == ["no_remat", "dots_saveable =<br>dots_with_no_batch_dims_saveable", "Pareto front"]
    shared = fig.data[1]
    assert shared.y[0] == pytest.approx(2.1)  # the median of the program's medians
    assert shared.error_y.array[0] == pytest.approx(0.3)
    assert shared.error_y.arrayminus[0] == pytest.approx(0.2)
    assert len(fig.data[-1].x) == 2  # two programs ringed, not three policies
    assert fig.layout.legend.yref == "container" and fig.layout.legend.yanchor == "bottom"
    assert fig.layout.margin.b >= 64 + 22 * 4  # four legend lines below the axis title


def test_colour_bar_labels_keep_apart_and_log_ticks_do_not_touch():
    import numpy as np

    from remat_lab.present import run_charts, study_charts

    ticks = study_charts._colorbar_ticks(np.log2(34.6), 46 * 3 + 20)
    zs = sorted(np.log2(ticks))
    per_unit = (46 * 3 + 20) / (2 * np.log2(34.6))
    assert 1.0 in ticks and all((b - a) * per_unit >= study_charts.COLORBAR_GAP_PX
                                for a, b in zip(zs, zs[1:]))
    assert study_charts._colorbar_ticks(np.log2(1.5), 46 * 8 + 20) == [0.67, 1.0, 1.5]
    widths = [8, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096]
    kept = run_charts.log_ticks(widths)
    assert kept[0] == 8 and 24 not in kept and len(kept) < len(widths)
    assert run_charts.log_ticks([16, 24]) == [16, 24]


# ---------------------------------------------------------------- notes that name the program itself


def test_no_remat_is_not_said_to_be_the_same_as_itself(capsys):
    assert main(["run", *TINY, "--policy", "no_remat"]) == 0
    out = capsys.readouterr().out
    assert "same as no_remat's" not in out and "same compiled program as no_remat" not in out
    from remat_lab.analysis.notes import program_notes
    from remat_lab.config import RunConfig

    same = {"identical_to": "no_remat", "excess_dots_vs_no_remat": 0}
    other = program_notes(RunConfig(policy="nothing_saveable"), [], same, "cpu")
    assert any("same as no_remat's" in n for n in other)  # another policy is still told
    assert not program_notes(RunConfig(policy="no_remat"), [], same, "cpu")

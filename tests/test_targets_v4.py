"""TPU v4's figures are per compile-only device, which is one TensorCore: half a chip (issue 30)."""

from __future__ import annotations

import pytest

from remat_lab.analysis.estimate import estimate_step
from remat_lab.config import get_target

# Google Cloud's TPU v4 page, per chip of two TensorCores: 275 TFLOP/s bf16, 32 GiB HBM2 at 1200 GB/s.
CHIP_BF16, CHIP_HBM, CHIP_BW = 275e12, 32 << 30, 1.2e12


def test_v4_figures_are_one_tensorcore_s_half_a_chip():
    """``tests/test_tpu_memory.py`` shows a compile-only v4 device is one TensorCore (two per
    chip, each compiled against half the chip's HBM); every per-device figure is that half."""
    t = get_target("tpu-v4")
    assert 2 * t.memory_bytes == CHIP_HBM
    assert 2 * t.peak_flops["bfloat16"] == CHIP_BF16
    assert 2 * t.bandwidth_bytes_per_s == CHIP_BW
    assert t.peak_flops["float32"] == pytest.approx(t.peak_flops["bfloat16"] / 3)
    assert "TensorCore" in t.source and "per TensorCore" in t.source


def test_a_v4_estimate_prices_one_device_at_one_tensorcores_rate():
    """The same bf16 product on one v4 device takes twice a whole chip's time: compute at 137.5
    TFLOP/s, and memory at 600 GB/s."""
    t = get_target("tpu-v4")
    flops, moved = 2.0 * 8192**3, 3 * 8192**2 * 2
    traffic = {"products": [{"dtype": "bf16", "precision": "DEFAULT", "flops": flops}],
               "memory_bytes": moved, "to_host_bytes": 0, "from_host_bytes": 0, "collectives": {}}
    est = estimate_step(flops, None, t, "bfloat16", traffic)
    assert est["compute_s"] == pytest.approx(2 * flops / CHIP_BF16, rel=1e-12)
    assert est["memory_s"] == pytest.approx(2 * moved / CHIP_BW, rel=1e-12)
    assert est["bound"] == "compute"

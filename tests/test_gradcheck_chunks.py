"""The gradient check compares leaves chunk by chunk: the verdict does not depend on the chunk size."""

import numpy as np
import pytest

from remat_lab.analysis import gradcheck, gradcheck_bounds


@pytest.mark.parametrize("chunk", [7, 1 << 18])
def test_chunked_leaf_errors_match_whole_leaf_numbers(monkeypatch, chunk):
    monkeypatch.setattr(gradcheck_bounds, "CHUNK", chunk)
    rng = np.random.default_rng(0)
    r = rng.standard_normal((33, 17)).astype(np.float32)
    u = gradcheck.UNIT_ROUNDOFF["float32"]
    ok = gradcheck._leaf_errors("w", r, r, 2 * u, u, u, 0.0)
    assert ok == (0.0, float(np.max(np.abs(r))), [])
    g = r.copy()
    g[20, 3] *= 1.01  # one entry 1 % off: out of bound, found where it is
    worst, scale, failures = gradcheck._leaf_errors("w", g, r, 2 * u, u, u, 0.0)
    assert worst == pytest.approx(abs(float(g[20, 3]) - float(r[20, 3])))
    assert failures and failures[0].startswith("w: 1 of 561 entries out of bound, worst at (20, 3)")
    scaled = gradcheck._leaf_errors("w", r * np.float32(1.0001), r, 2 * u, 1.0, u, 0.0)[2]
    assert any("scaled by 1.0001" in f for f in scaled)  # the leaf-wide test, summed over chunks
    g[0, 0] = np.nan
    assert gradcheck._leaf_errors("w", g, r, 2 * u, u, u, 0.0)[2] == ["w: 1 non-finite entries"]

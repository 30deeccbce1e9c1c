"""Comparison against a reference peer (PyTorch), shared by the parity test modules."""
from __future__ import annotations

import numpy as np

TOL = {"float32": 1e-4, "float64": 1e-7}


def assert_close(actual, expected, dtype: str, what: str, tol: float | None = None,
                 scale_floor: float = 1e-6) -> None:
    """|a - e| <= tol |e| + tol max|e| elementwise: 1e-4 (float32) / 1e-7 (float64) relative
    by default; the absolute term keeps near-zero elements from demanding exact equality."""
    tol = TOL[dtype] if tol is None else tol
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != the reference's {e.shape}"
    assert np.all(np.isfinite(e)), f"{what}: the reference gave non-finite values"
    scale = max(float(np.abs(e).max()) if e.size else 0.0, scale_floor)
    np.testing.assert_allclose(a, e, rtol=tol, atol=tol * scale, err_msg=what)

"""Caffe's fillers that PyTorch has no counterpart of, against their definitions: bilinear
(the upsampling kernel), positive_unitball, and the sparse gaussian."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.errors import UserError
from toolkit.weights import fill


def test_bilinear_is_the_upsampling_kernel():
    w = fill({"type": "bilinear"}, (2, 3, 4, 4), "float32", 1, 1, np.random.default_rng(0))
    line = np.array([0.25, 0.75, 0.75, 0.25], np.float32)      # k 4: f 2, c 0.75
    assert w.shape == (2, 3, 4, 4) and np.array_equal(w[1, 2], np.outer(line, line))
    odd = fill({"type": "bilinear"}, (1, 1, 3, 3), "float64", 1, 1, np.random.default_rng(0))[0, 0]
    np.testing.assert_allclose(odd, np.outer([0.25, 0.75, 0.75], [0.25, 0.75, 0.75]))   # k 3: f 2, c 0.75
    with pytest.raises(UserError, match="square 4-D kernel"):
        fill({"type": "bilinear"}, (2, 3, 4, 5), "float32", 1, 1, np.random.default_rng(0))


def test_positive_unitball_rows_sum_to_one():
    w = fill({"type": "positive_unitball"}, (5, 3, 2, 2), "float64", 1, 1, np.random.default_rng(1))
    assert (w >= 0).all() and np.allclose(w.reshape(5, -1).sum(axis=1), 1.0)


def test_a_sparse_gaussian_keeps_about_sparse_over_outputs():
    w = fill({"type": "gaussian", "std": 1.0, "sparse": 10}, (100, 400), "float64", 1, 1, np.random.default_rng(2))
    assert abs((w != 0).mean() - 0.1) < 0.01

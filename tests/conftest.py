"""Shared test fixtures: seeded random generators and the path of the repository.

Plans run the numpy kernels in the suite unless TOOLKIT_NATIVE is set (``make test-native``
runs everything through the generated kernels): compiling a native unit for each of the
suite's thousands of one-off plans would take most of its time budget. tests/runtime/
test_native.py runs every op case and every zoo net both ways and compares them.
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TOOLKIT_NATIVE", "0")

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def pytest_collection_modifyitems(config, items):
    try:
        import cupy  # noqa: F401
        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs a CUDA GPU with cupy (run on a GPU machine)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)

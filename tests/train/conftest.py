"""Fixtures of the training tests: a small net and its data set in the test's folder."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.train.train_helpers import RESUME_NET, SOFTREG_NET, make_data


@pytest.fixture
def resume_net(tmp_path) -> Path:
    make_data(tmp_path)
    path = tmp_path / "net.yaml"
    path.write_text(RESUME_NET)
    return path


@pytest.fixture
def softreg_net(tmp_path) -> Path:
    make_data(tmp_path)
    path = tmp_path / "softreg.yaml"
    path.write_text(SOFTREG_NET)
    return path

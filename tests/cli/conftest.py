"""Fixtures the command-line tests share: ``tiny``, a valid small net with matching weights and
an input, written once per test module (``cli_tiny_net.py``)."""
from __future__ import annotations

import pytest
from cli_tiny_net import tiny_files


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A valid small net with matching weights (both formats) and a 5-row input."""
    return tiny_files(tmp_path_factory.mktemp("tiny"))

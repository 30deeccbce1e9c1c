"""The tier a test runs in reaches it: the folders tests/tiers.py names run the generated C
kernels, in this process and in the commands it starts, also on pytest-xdist's workers (which
inherit the numpy default the session's first process sets)."""
from __future__ import annotations

import os

import pytest

from toolkit import settings


def test_a_native_folder_runs_the_generated_kernels():
    if "TOOLKIT_TEST_NATIVE_DEFAULTED" not in os.environ:
        pytest.skip("TOOLKIT_NATIVE was given to pytest: every test runs as it says")
    assert os.environ["TOOLKIT_NATIVE"] == "1" and settings.current().native

"""Shared test fixtures, and the set-up of every test session.

The suite's own kernel cache: ``TOOLKIT_CACHE`` is set to a temporary folder of the session (one
for all of pytest-xdist's workers) before anything imports toolkit, so the kernels it compiles
(and any zoo file a test fetches without a cache of its own, and matplotlib's font list) never
land in the user's cache; child processes inherit it, and a kernel is compiled once per session.
The folder is removed at the end.

The tiers of tests/tiers.py: tests in its ``NATIVE_FOLDERS`` (less ``NUMPY_KERNELS``) run the
generated C kernels, the rest the numpy kernels, unless TOOLKIT_NATIVE is given to pytest (``make
test-native`` runs every test native, ``make test-fast`` none); the tests its ``FAST`` lists are
marked ``fast``.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

# One cache for the whole session, pytest-xdist's workers included: a kernel one worker compiled
# the other loads (units are written under a temporary name and renamed, so two processes never
# see half of one). The process that made the folder removes it.
_SHARED = "TOOLKIT_TEST_SESSION_CACHE"
_OWNS_CACHE = _SHARED not in os.environ
_SESSION_CACHE = tempfile.mkdtemp(prefix="toolkit-test-cache-") if _OWNS_CACHE else os.environ[_SHARED]
os.environ[_SHARED] = os.environ["TOOLKIT_CACHE"] = _SESSION_CACHE
# matplotlib (the graph and curve plots) keeps its font list in the user's cache folder otherwise
os.environ.setdefault("MPLCONFIGDIR", os.path.join(_SESSION_CACHE, "matplotlib"))
# Given means given to pytest, not the default this file set: pytest-xdist's workers inherit the
# environment of the process that started them, this default included, and must not take it for
# a choice (they would run every test on the numpy kernels).
_DEFAULTED = "TOOLKIT_TEST_NATIVE_DEFAULTED"
NATIVE_GIVEN = os.environ.get("TOOLKIT_NATIVE", "").strip() != "" and _DEFAULTED not in os.environ
if not NATIVE_GIVEN:
    os.environ["TOOLKIT_NATIVE"] = "0"
    os.environ[_DEFAULTED] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests.tiers import FAST, NATIVE_FOLDERS, NOT_FAST, NUMPY_KERNELS, listed  # noqa: E402
from toolkit import settings  # noqa: E402

# The process's settings are read from its environment once and kept (toolkit/settings.py): read
# them now, with the defaults above, before a test in a native folder sets TOOLKIT_NATIVE=1 for
# its child processes. Read first inside that test, the native switch would be the process's
# own from then on, and the numpy-tier tests after it in this process would run native kernels.
settings.current()

ROOT = Path(__file__).resolve().parents[1]

# Where the environment forbids writing bytecode (PYTHONDONTWRITEBYTECODE, as container images
# often set), every process the suite starts (hundreds of `toolkit` commands, ranks, servers,
# the documentation's examples) would compile the repository's modules from source again, a
# quarter of a command's start. The suite's processes write their bytecode into the session's
# cache instead (PYTHONPYCACHEPREFIX), never into the checkout, and it goes with the cache.
if _OWNS_CACHE and sys.dont_write_bytecode:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(_SESSION_CACHE, "bytecode")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


@pytest.fixture(autouse=True)
def kernels_of_the_folder(request, monkeypatch):
    """The generated C kernels for a test in NATIVE_FOLDERS: in this process through the settings,
    in the child processes it starts through the environment."""
    folder = request.node.path.relative_to(ROOT / "tests").parts[0]
    if NATIVE_GIVEN or folder not in NATIVE_FOLDERS or listed(request.node.nodeid, NUMPY_KERNELS):
        yield
        return
    monkeypatch.setenv("TOOLKIT_NATIVE", "1")
    with settings.use(native=True):
        yield
    # what comes back after the block is the numpy default, not this test's variable: else every
    # numpy-tier test after this one in the process would run native kernels
    assert not settings.current().native, "the native switch outlived its test (settings read too late)"


@pytest.hookimpl(tryfirst=True)           # before -m reads the marks
def pytest_collection_modifyitems(config, items):
    fast = pytest.mark.fast
    for item in items:
        if listed(item.nodeid, FAST) and not listed(item.nodeid, NOT_FAST):
            item.add_marker(fast)
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
    # the longer variants run when asked for (make test-slow: -m slow), not in the whole suite,
    # which stays inside CI's time on two cores
    if "slow" not in (config.option.markexpr or ""):
        later = pytest.mark.skip(reason="a longer variant: run with -m slow (make test-slow)")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(later)


def pytest_unconfigure(config):
    if _OWNS_CACHE:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)

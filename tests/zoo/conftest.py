"""Fixtures of the zoo tests: an isolated cache (the user's is never touched), the shipped lenet
published under another name, and a loopback HTTP server serving it."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from zoo_helpers import LENET, NAME, start_server

from toolkit import settings


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "cache"
    # the environment for the child processes some tests start, the settings for this one
    monkeypatch.setenv("TOOLKIT_CACHE", str(cache))
    monkeypatch.delenv("TOOLKIT_ZOO", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")      # loopback never goes through a proxy
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    with settings.use(cache=cache, zoo=()):
        yield cache


@pytest.fixture(scope="session")
def published_template(tmp_path_factory) -> Path:
    """A zoo folder with zoo/lenet published as NAME (publishing measures the metric once)."""
    from toolkit.zoo.publish import publish
    src = tmp_path_factory.mktemp("src")
    for f in ("net.yaml", "model.safetensors"):
        shutil.copy(LENET / f, src / f)
    folder = tmp_path_factory.mktemp("zoo") / "published"
    publish(src, folder, name=NAME, licence="BSD-2-Clause", task="image classification (10 digits, 8×8 pixels)")
    return folder


@pytest.fixture
def published(published_template, tmp_path) -> Path:
    """A fresh copy of the published folder that a test may change."""
    folder = tmp_path / "published"
    shutil.copytree(published_template, folder)
    return folder


@pytest.fixture
def server(published):
    """The published folder served on 127.0.0.1 (a free port), shut down after the test."""
    s = start_server(published)
    yield s
    s.stop()

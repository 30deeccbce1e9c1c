"""The version is written in one place, toolkit/version.py: pyproject.toml reads it from there
(``dynamic = ["version"]``), so the installed distribution's metadata, ``toolkit --version``, the
server and the zoo's model cards all name the same version."""
from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

from toolkit.cli import build_parser
from toolkit.version import __version__

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_pyproject_reads_the_version_from_toolkit_version():
    project = PYPROJECT["project"]
    assert "version" not in project, "pyproject.toml writes a version of its own: read toolkit/version.py instead"
    assert "version" in project.get("dynamic", [])
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "toolkit.version.__version__"}


def test_the_installed_metadata_names_the_version_of_toolkit_version():
    name = PYPROJECT["project"]["name"]
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"the distribution {name!r} is not installed: pip install -e .")
    assert installed == __version__, (
        f"installed metadata says {installed}, toolkit/version.py {__version__}: reinstall (pip install -e .)")


def test_toolkit_version_prints_it(capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"toolkit {__version__}"


def test_the_distribution_name_is_its_own_and_the_command_and_import_stay_toolkit():
    # 'toolkit' on the public package index is an unrelated project: this one is published as
    # yamlnet-toolkit, and installs the `toolkit` package and the `toolkit` command
    project = PYPROJECT["project"]
    assert project["name"] == "yamlnet-toolkit"
    assert project["scripts"] == {"toolkit": "toolkit.cli:main"}
    assert "toolkit*" in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    assert importlib.metadata.distribution(project["name"]).read_text("entry_points.txt").split() == [
        "[console_scripts]", "toolkit", "=", "toolkit.cli:main"]

"""The documentation site's generated references (docs/hooks/reference.py): the layer catalog
covers every layer type and the command line every command, and an undescribed layer parameter or
option stops them, naming it. The generators are called directly: no MkDocs needed here (`make
docs` builds the site itself, strict)."""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Literal, get_args

import pytest
import yaml
from pydantic import Field

from layers import LAYERS, LayerDef
from schemas.base import LayerBase
from toolkit.cli import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


class DescribedParams(LayerBase):
    """A layer for the test.

    - ``size``: how many
    """
    type: Literal["Described"]
    size: int = 3
    scale: float = Field(2.0, description="what each value is multiplied by")


class UndescribedParams(LayerBase):
    type: Literal["Undescribed"]
    size: int = 3


def _layers(*models):
    """A catalog of the given parameter models, as layers.LAYERS holds the real ones."""
    names = [get_args(model.model_fields["type"].annotation)[0] for model in models]
    return {name: LayerDef(name, model, None) for name, model in zip(names, models)}


def test_the_catalog_has_every_layer_type_of_the_code():
    page = reference.layer_catalog()
    assert len(LAYERS) > 50
    for name in LAYERS:
        assert f"\n## {name}\n" in page, name


def test_a_parameter_is_described_from_its_field_or_its_models_docstring():
    page = reference.layer_catalog(_layers(DescribedParams), known=set())
    assert "| `size` | int | `3` | how many |" in page
    assert "| `scale` | float | `2.0` | what each value is multiplied by |" in page


def test_a_layer_parameter_without_a_description_fails_naming_it():
    with pytest.raises(reference.DriftError, match=r"layer Undescribed\.size: no description"):
        reference.layer_catalog(_layers(DescribedParams, UndescribedParams), known=set())


def test_the_list_of_parameters_awaiting_a_description_only_shrinks():
    stale = {"layer Described.size"}          # it has a description: the line must go
    with pytest.raises(reference.DriftError, match=r"layer Described\.size: listed in undocumented.txt"):
        reference.layer_catalog(_layers(DescribedParams), known=stale)


def test_the_command_line_has_every_command_of_the_parser():
    page = reference.command_line()
    for command in COMMANDS:
        assert f"\n## `toolkit {command.name}" in page, command.name
        for action in command.actions:
            assert f"\n## `toolkit {command.name} {action.name}`\n" in page, action.name
    assert "| `--out` | run folder (default runs/NAME" in page


def test_an_option_without_help_fails_naming_it():
    parser = argparse.ArgumentParser(prog="toolkit")
    run = parser.add_subparsers().add_parser("run", help="runs")
    run.add_argument("--fast", action="store_true", help="go faster")
    run.add_argument("--trace", action="store_true")
    with pytest.raises(reference.DriftError, match=r"flag toolkit run --trace: no description"):
        reference.command_line(parser, known=set())
    assert "| `--fast` | go faster |" in reference.command_line(parser, known={"flag toolkit run --trace"})


def test_the_code_as_it_stands_passes_and_every_nav_page_exists():
    reference.layer_catalog(), reference.command_line(build_parser())
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    generated = {reference.LAYER_PAGE, reference.COMMAND_PAGE}

    def pages(nav):
        for entry in nav:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]
    for page in pages(config["nav"]):
        assert page in generated or (ROOT / "docs" / page).is_file(), page

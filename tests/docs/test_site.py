"""The documentation site's generated pages (docs/hooks/): the layer catalog covers every layer
type and the command line every command (reference.py), the optimiser's page every stage of the
pass pipeline and every simplify rule (passes.py), the settings page every knob and the changelog
CHANGELOG.md (generated_pages.py); an undescribed layer parameter, option, pass, rule or setting
stops them, naming it. The generators are called directly: no MkDocs needed here (`make docs`
builds the site itself, strict)."""
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

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_{name}", ROOT / "docs" / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


passes = _hook("passes")
generated_pages = _hook("generated_pages")


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
    generated = {reference.LAYER_PAGE, reference.COMMAND_PAGE, passes.PAGE, generated_pages.SETTINGS_PAGE,
                 generated_pages.CHANGELOG_PAGE}

    def pages(nav):
        for entry in nav:
            for value in entry.values():
                yield from pages(value) if isinstance(value, list) else [value]
    for page in pages(config["nav"]):
        assert page in generated or (ROOT / "docs" / page).is_file(), page


# ---------------------------------------------------------------------------------------------
# the optimiser's page (docs/hooks/passes.py)

def test_the_passes_page_lists_every_stage_in_order_with_its_docstring():
    from toolkit.passes.pipeline import PIPELINE, PLAN_SWITCHES, pass_names
    from toolkit.passes.simplify import RULES
    page = passes.passes_page()
    rows = [line.split(" | ")[1] for line in page.splitlines() if line.startswith("| ") and "](#" in line]
    assert rows == [f"[`{stage.name}`](#{stage.name})" for stage in PIPELINE]
    for number, stage in enumerate(PIPELINE, 1):
        assert f"\n### {stage.name}\n" in page, stage.name
        assert f"| {number} | [`{stage.name}`]" in page
    assert "a `transfer` node wherever a node reads a value that lives on another device" in page.replace("A `", "a `")
    for rule in {r for rules in RULES.values() for r in rules}:
        assert f"| `{rule.__name__}` |" in page, rule.__name__
    assert "| `mul_by_zero_integer` | `mul` | x \\* 0 -> 0 for integer x." in page
    for switch in PLAN_SWITCHES:
        assert f"| `{switch.name}` |" in page
    assert len(pass_names()) == len(PIPELINE) + len(PLAN_SWITCHES)


def _documented(graph, ctx):
    """Does what a pass does."""
    return False


def _undocumented(graph, ctx):
    return False


def test_a_pass_without_a_docstring_fails_naming_it():
    from toolkit.passes.pipeline import Stage
    pipeline = [Stage("tidy_up", _documented, "tidies"), Stage("mystery_pass", _undocumented, "does things")]
    with pytest.raises(passes.DriftError, match=r"pass mystery_pass \(.*_undocumented\): no docstring") as caught:
        passes.passes_page(pipeline=pipeline, rules={}, switches=[])
    assert "tidy_up" not in str(caught.value)
    page = passes.passes_page(pipeline=pipeline[:1], rules={"mul": [_documented]}, switches=[])
    assert "\n### tidy_up\n" in page and "Does what a pass does." in page


def test_a_simplify_rule_without_a_docstring_fails_naming_it():
    with pytest.raises(passes.DriftError, match=r"simplify rule _undocumented .*: no docstring"):
        passes.passes_page(pipeline=[], rules={"add": [_undocumented]}, switches=[])


# ---------------------------------------------------------------------------------------------
# the settings page and the changelog (docs/hooks/generated_pages.py)

def test_the_settings_page_has_every_knob():
    from toolkit import settings
    page = generated_pages.settings_page()
    assert page == settings.markdown()
    for knob in settings.KNOBS:
        assert f"| `{knob.name}` | `{knob.variable}` |" in page


def test_a_setting_without_a_description_fails_naming_it():
    import dataclasses

    from toolkit import settings
    blank = dataclasses.replace(settings.KNOBS[0], help=" ")
    with pytest.raises(generated_pages.DriftError, match=rf"setting {blank.variable} \({blank.name}\): no description"):
        generated_pages.settings_page([*settings.KNOBS[1:], blank])


def test_the_changelog_page_is_changelog_md_with_its_links_made_the_sites(tmp_path):
    page = generated_pages.changelog_page()
    assert page.startswith("# Changelog") and "## [Unreleased]" in page and "## [0.1.0]" in page
    changelog = tmp_path / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\nSee [the contract](docs/spec.md#7-the-python-api) and [x](README.md).\n")
    assert generated_pages.changelog_page(changelog) == (
        "# Changelog\n\nSee [the contract](spec.md#7-the-python-api) and [x](README.md).\n")

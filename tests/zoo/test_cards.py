"""Model cards: the front matter's schema with every problem at its README line, writing keeps
the body, and ``zoo:NAME`` from the shipped zoo (files checked against the card)."""
from __future__ import annotations

import shutil
import textwrap

import pytest
from zoo_helpers import LENET, ROOT, run

from toolkit.errors import SpecError, UserError
from toolkit.zoo import resolve as resolve_module
from toolkit.zoo.card import parse_card, read_card, render_card, write_card
from toolkit.zoo.resolve import is_zoo_ref, model_name, resolve

SHA = "ab" * 32
GOOD = f"""\
---
name: tiny
description: A small model
task: image classification
data: builtin:digits
metric: {{name: accuracy, value: 0.5}}
licence: BSD-2-Clause
config: {{file: net.yaml, sha256: {SHA}, bytes: 10}}
weights:
  - {{file: model.safetensors, sha256: {SHA}, bytes: 20}}
reproduce: toolkit train zoo:tiny
toolkit_version: 0.1.0
---

# tiny

Some prose.
"""


def card_dir(tmp_path, text: str):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "README.md").write_text(textwrap.dedent(text))
    return folder


def error_lines(result) -> list[str]:
    assert result.status == 2 and "Traceback" not in result.err, result.err
    return [line for line in result.err.splitlines() if line.strip()]


def test_a_good_card_parses_and_round_trips(tmp_path):
    card, body = parse_card(GOOD, "README.md", expect_name="tiny")
    assert card.metric.tolerance == 0.001 and card.metric.split == "test"
    assert [f.file for f in card.files] == ["net.yaml", "model.safetensors"]
    assert body == "\n# tiny\n\nSome prose.\n"
    path = tmp_path / "README.md"
    write_card(path, card, body)
    again, body_again = read_card(path)
    assert again == card and body_again == body
    assert path.read_text().endswith("---\n\n# tiny\n\nSome prose.\n")
    assert "metric: {name: accuracy, value: 0.5, split: test, tolerance: 0.001}\n" in render_card(card, body)


def test_schema_problems_are_reported_at_their_readme_lines(tmp_path):
    text = (GOOD.replace("licence: BSD-2-Clause", "licens: BSD-2-Clause")
                .replace("value: 0.5}", "value: high}")
                .replace(f"sha256: {SHA}, bytes: 20", "sha256: 12ab, bytes: 20")
                .replace("task: image classification\n", ""))
    folder = card_dir(tmp_path, text)
    readme = folder / "README.md"
    lines = error_lines(run("zoo", "verify", folder))
    assert lines == [
        f"{readme}:2:1: error: card: missing required key 'task'",
        f"{readme}:5:33: error: card: bad 'value': input should be a valid number, unable to parse string as a number",
        f"{readme}:6:1: error: card: unknown key 'licens'; did you mean 'licence'?",     # not also 'missing'
        f"{readme}:9:39: error: card: bad 'sha256': string should match pattern '^[0-9a-f]{{64}}$'",
    ], lines


def test_missing_keys_are_one_line_per_mapping():
    with pytest.raises(SpecError) as e:
        parse_card("---\nname: tiny\nmetric: {value: 1}\n---\n", "README.md")
    assert str(e.value).splitlines() == [
        "README.md:2:1: error: card: missing required keys 'description', 'task', 'data', 'licence', 'config', "
        "'weights', 'reproduce', 'toolkit_version'",
        "README.md:3:9: error: card: 'metric' is missing required key 'name'",
    ]


def test_file_names_stay_inside_the_model_folder(tmp_path):
    for bad in ("../model.safetensors", "sub/model.safetensors", ".hidden"):
        with pytest.raises(SpecError) as e:
            parse_card(GOOD.replace("file: model.safetensors", f"file: {bad}"), "README.md")
        assert str(e.value).startswith("README.md:10:12: error: card: bad 'file': string should match pattern")
    with pytest.raises(SpecError, match="README.md:2:7: error: card: bad 'name'"):
        parse_card(GOOD.replace("name: tiny", "name: ../tiny"), "README.md")
    with pytest.raises(SpecError, match="file net.yaml is listed twice"):
        parse_card(GOOD.replace("file: model.safetensors", "file: net.yaml"), "README.md")


@pytest.mark.parametrize("text, message", [
    ("# tiny\n\nno front matter\n", "1:1: error: a model card starts with a '---' line"),
    ("---\nname: tiny\n", "1:1: error: the front matter that opens here is not closed by a '---' line"),
    ("---\nname: tiny\ntask: [unclosed\n---\n", "4:1: error: YAML syntax"),
    ("---\n- a list\n---\n", "2:1: error: the front matter must be a mapping"),
])
def test_malformed_front_matter(tmp_path, text, message):
    folder = card_dir(tmp_path, text)
    lines = error_lines(run("zoo", "verify", folder))
    assert lines[0].startswith(f"{folder / 'README.md'}:{message}"), lines


def test_a_card_names_its_folder():
    with pytest.raises(SpecError, match=r"README.md:2:7: error: the card's name 'tiny' differs "
                                        r"from its folder's name 'other'"):
        parse_card(GOOD, "README.md", expect_name="other")


def test_shipped_models_resolve_in_place():
    model = resolve("zoo:lenet")
    assert (model.name, model.source, model.dir) == ("lenet", "shipped", LENET)
    assert model.net == LENET / "net.yaml" and model.weights == LENET / "model.safetensors"
    assert model.card.metric.value == 0.986072
    assert resolve("lenet", need_weights=False).weights is None
    assert is_zoo_ref("zoo:lenet") and not is_zoo_ref("zoo/lenet/net.yaml")
    with pytest.raises(UserError, match="not a zoo model name"):
        model_name("zoo:../lenet")
    r = run("zoo", "get", "lenett")
    assert error_lines(r) == ["error: zoo:lenett: no model named 'lenett' in the shipped zoo (branchnet, gru_digits, "
                              "lenet, mlp, resnet, transformer_digits); no other source is configured "
                              "(--source or TOOLKIT_ZOO); did you mean 'lenet'?"]


def test_a_shipped_file_that_differs_from_its_card_is_an_error(tmp_path, monkeypatch):
    zoo = tmp_path / "zoo"
    shutil.copytree(LENET, zoo / "lenet")
    net = zoo / "lenet" / "net.yaml"
    net.write_text(net.read_text().replace("num_output: 64", "num_output: 65"))
    monkeypatch.setattr(resolve_module, "shipped_zoo_dir", lambda: zoo)
    with pytest.raises(UserError) as e:
        resolve("zoo:lenet")
    message = str(e.value)
    assert message.startswith(f"error: zoo:lenet: {net}: sha256 is ")
    assert f"run `toolkit zoo publish {zoo / 'lenet'} --to {zoo}` or update the sha256 and bytes in" in message


def test_zoo_show_and_list_the_shipped_zoo():
    r = run("zoo", "show", "zoo:resnet")
    assert r.status == 0, r.err
    assert r.out.startswith("zoo:resnet  from shipped\n")
    assert "  metric:      accuracy 0.988858 on the test split (tolerance 0.001)\n" in r.out
    assert "shipped with the toolkit, used in place" in r.out and "# resnet: a small residual net" in r.out
    r = run("zoo", "list")
    assert r.status == 0 and r.err == ""
    assert [line.split()[0] for line in r.out.splitlines()] == ["NAME", "branchnet", "gru_digits", "lenet", "mlp",
                                                                "resnet", "transformer_digits"]


def test_the_shipped_cards_are_listed_with_the_repository_zoo():
    assert resolve_module.shipped_zoo_dir() == ROOT / "zoo"

"""``toolkit compile --place auto``: the placer's choice written as the layers' device: keys
(--emit), shown by --explain and --json, asked for by a net file's ``placement: auto``; its
refusals are one line and exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_helpers import expect_error, run_cli

from toolkit.backend.devices import parse_device

ROOT = Path(__file__).resolve().parents[2]
BRANCHNET = ROOT / "zoo" / "branchnet" / "net.yaml"
LAYERS = ["hidden", "hidden_relu", "branch_relu", "act_relu", "branch_tanh", "act_tanh", "branch_sigmoid",
          "act_sigmoid", "branch_elu", "act_elu", "joined", "classifier", "prob"]


def _devices(path: Path) -> dict[str, str]:
    return {layer["name"]: layer.get("device") for layer in yaml.safe_load(path.read_text())["layers"]}


def test_the_placers_choice_is_written_as_device_keys_and_the_file_trains(tmp_path):
    placed = tmp_path / "placed.yaml"
    r = run_cli("compile", BRANCHNET, "--place", "auto", "--devices", "cpu,cpu:1", "--batch", "16",
                "--emit", placed, "--explain")
    assert r.status == 0, r.err
    chosen = _devices(placed)
    assert {chosen[layer] for layer in LAYERS} <= {"cpu", "cpu:1"}
    assert chosen["loss"] is None                # not in the infer phase placed
    assert "placement over cpu, cpu:1 (" in r.out and "by the measured model" in r.out
    assert "one node at a time" in r.out
    trained = run_cli("train", placed, "--set", "train.max_iter=2", "--out", tmp_path / "run")
    assert trained.status == 0, trained.err
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_the_placers_prediction_agrees_with_the_plans_own_prediction():
    # the placer simulates the graph's nodes; compile --explain's prediction (placement/predict.py)
    # simulates the built plan's steps with the same measurements
    r = run_cli("compile", BRANCHNET, "--place", "auto", "--batch", "16", "--json", "--explain")
    assert r.status == 0, r.err
    report = json.loads(r.out)
    assert report["placement"]["devices"] == ["cpu", "cpu:1"]       # the default devices
    assert report["placement"]["predicted_ms"] == pytest.approx(report["predicted"]["ms"], rel=0.05)
    # and it is never worse by the model than every layer on one device
    one = run_cli("compile", BRANCHNET, "--batch", "16", "--json", "--explain")
    assert report["placement"]["predicted_ms"] <= json.loads(one.out)["predicted"]["ms"] * 1.05


def test_one_device_elsewhere_places_every_layer_there_and_trains_the_same_weights(tmp_path):
    placed = tmp_path / "placed.yaml"
    r = run_cli("compile", BRANCHNET, "--place", "auto", "--devices", "cpu:1", "--emit", placed)
    assert r.status == 0, r.err
    assert all(_devices(placed)[layer] == "cpu:1" for layer in LAYERS)
    for name, net in (("one", BRANCHNET), ("placed", placed)):
        assert run_cli("train", net, "--set", "train.max_iter=3", "--out", tmp_path / name).status == 0
    one, split = (tmp_path / name / "model.safetensors" for name in ("one", "placed"))
    assert one.read_bytes() == split.read_bytes()


def test_a_net_files_placement_auto_places_at_compile_time(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text(BRANCHNET.read_text() + "placement: auto\n")
    placed = tmp_path / "placed.yaml"
    r = run_cli("compile", net, "--devices", "cpu:1", "--emit", placed, "--explain")
    assert r.status == 0, r.err
    assert "placement over cpu:1" in r.out
    text = placed.read_text()
    assert "placement" not in text and _devices(placed)["classifier"] == "cpu:1"
    assert run_cli("check", placed).status == 0
    # and without placement: auto, --devices alone is refused
    expect_error(run_cli("compile", BRANCHNET, "--devices", "cpu,cpu:1"), "--devices", "--place auto")


@pytest.mark.parametrize("args,words", [
    (["--place", "auto", "--devices", "cpu,tpu"], ["unknown device 'tpu'"]),
    (["--emit", "out.yaml"], ["--emit", "--place auto"]),
    (["--place", "auto", "--devices", "cpu,cpu"], ["named twice"]),
    (["--place", "auto", "--devices", ","], ["at least one device"]),
])
def test_bad_placement_input_is_one_line(tmp_path, args, words):
    expect_error(run_cli("compile", BRANCHNET, *args), *words)


def test_an_emit_path_that_is_a_folder_is_one_line(tmp_path):
    expect_error(run_cli("compile", BRANCHNET, "--place", "auto", "--emit", tmp_path), "--emit", "a folder")
    expect_error(run_cli("compile", BRANCHNET, "--place", "auto", "--emit", tmp_path / "no" / "x.yaml"), "no folder")


def test_a_gpu_missing_here_is_one_line():
    try:
        parse_device("gpu").check_exists()
    except Exception:
        expect_error(run_cli("compile", BRANCHNET, "--place", "auto", "--devices", "cpu,gpu"), "gpu")
    else:
        pytest.skip("this machine has a GPU")


def test_the_train_step_is_placed_with_its_loss(tmp_path):
    placed = tmp_path / "placed.yaml"
    r = run_cli("compile", BRANCHNET, "--phase", "train", "--place", "auto", "--devices", "cpu:1", "--emit", placed)
    assert r.status == 0, r.err
    chosen = _devices(placed)
    assert chosen["loss"] == "cpu:1" and chosen["classifier"] == "cpu:1"
    assert chosen["prob"] is None and chosen["accuracy"] is None          # not in the train step

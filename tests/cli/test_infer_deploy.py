"""A trained model deployed as it was trained: the run folder records what the data said (an
image folder's class names, a CSV's columns and label column) in input.json; `toolkit infer`
applies the net's input transform, reads a CSV of training data with its label column left out,
takes several files after one --input and --set, and writes CSV with each row's file name and
class name."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from tests.train.train_helpers import cli, sets
from toolkit.training.data import load_digits

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    """LeNet trained on an image folder of the digits (subfolders named by class)."""
    from PIL import Image
    root = tmp_path_factory.mktemp("images")
    x, y = load_digits()
    for i in range(400):
        folder = root / "train" / NAMES[y[i]]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray((x[i, 0] * 15).astype(np.uint8)).save(folder / f"{i:04d}.png")
    (root / "new").mkdir()
    for i in range(400, 420):
        Image.fromarray((x[i, 0] * 15).astype(np.uint8)).save(root / "new" / f"{i:04d}.png")
    net = root / "net.yaml"
    net.write_text((ROOT / "zoo" / "lenet" / "net.yaml").read_text()
                   .replace('source: "builtin:digits"', f"source: {root / 'train'}")
                   .replace("scale: 0.0625", "scale: 0.00392157"))
    r = cli("train", net, "--out", root / "run", *sets(train__max_iter=300, train__test_interval=1000))
    assert r.status == 0, r.err
    return root, y[400:420]


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_an_image_folder_run_records_its_classes_and_infer_names_them(image_run, tmp_path):
    root, truth = image_run
    run = root / "run"
    about = json.loads((run / "input.json").read_text())
    assert about["classes"] == sorted(NAMES)
    assert about["image"] == {"input": "data", "height": 8, "width": 8, "channels": 1, "colour": "grey"}
    out = tmp_path / "preds.csv"
    r = cli("infer", run / "net.yaml", "--weights", run / "model.safetensors", "--input", root / "new",
            "--output", out)
    assert r.status == 0, r.err
    assert "inputs are transformed as in training: data: x * 0.00392157" in r.err
    rows = _rows(out)
    assert [row["file"] for row in rows] == [f"{i:04d}.png" for i in range(400, 420)]
    assert list(rows[0]) == ["file", "prob_class", "prob_name", "prob_score"]
    # the class index is the sorted subfolder's, and its name says which digit it is
    assert all(row["prob_name"] == sorted(NAMES)[int(row["prob_class"])] for row in rows)
    right = np.mean([row["prob_name"] == NAMES[t] for row, t in zip(rows, truth)])
    assert right >= 0.9, rows
    # without the transform the net sees pixels 255 times too large: other scores
    raw = tmp_path / "raw.csv"
    assert cli("infer", run / "net.yaml", "--weights", run / "model.safetensors", "--input", root / "new",
               "--output", raw, "--no-transform").status == 0
    assert max(abs(float(a["prob_score"]) - float(b["prob_score"])) for a, b in zip(rows, _rows(raw))) > 1e-2


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("table")
    x, y = load_digits()
    header = ",".join([f"p{i}" for i in range(64)] + ["digit"])
    for name, rows in (("train.csv", range(600)), ("new.csv", range(600, 610))):
        lines = [header] + [",".join(str(int(v)) for v in x[i].ravel()) + f",{y[i]}" for i in rows]
        (root / name).write_text("\n".join(lines) + "\n")
    net = root / "mlp.yaml"
    net.write_text((ROOT / "zoo" / "mlp" / "net.yaml").read_text().replace("builtin:digits", str(root / "train.csv"))
                   .replace("label: {shape: [N], dtype: int64}", "digit: {shape: [N], dtype: int64}")
                   .replace("[ip3, label]", "[ip3, digit]"))
    r = cli("train", net, "--out", root / "run", *sets(train__max_iter=200, train__test_interval=1000))
    assert r.status == 0, r.err
    return root, y[600:610]


def test_a_csv_with_its_label_column_and_several_files_after_one_input(csv_run, tmp_path):
    root, truth = csv_run
    run = root / "run"
    about = json.loads((run / "input.json").read_text())
    assert about["label_column"] == "digit" and about["columns"][:2] == ["p0", "p1"] and len(about["columns"]) == 65
    out = tmp_path / "p.csv"
    r = cli("infer", run / "net.yaml", "--weights", run / "model.safetensors",
            "--input", root / "new.csv", root / "new.csv", "--output", out)
    assert r.status == 0, r.err
    rows = _rows(out)
    assert [row["row"] for row in rows] == [str(i) for i in range(20)]
    got = [int(row["prob_class"]) for row in rows]
    assert got[:10] == got[10:] and np.mean(np.array(got[:10]) == truth) >= 0.8


def test_infer_set_changes_the_net(csv_run):
    root, _ = csv_run
    run = root / "run"
    r = cli("infer", run / "net.yaml", "--weights", run / "model.safetensors", "--input", root / "new.csv",
            "--set", "layers.ip3.num_output=5")
    assert r.status == 2
    assert any("weight 'ip3.weight' of layer 'ip3' has shape [10, 64] in the file, the net needs [5, 64]" in e
               for e in r.errors), r.err


def test_a_csv_output_of_the_wrong_shape_is_refused(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros((2, 1, 8, 8), np.float32))
    r = cli("infer", "zoo:lenet", "--input", tmp_path / "x.npy", "--output", tmp_path / "o.txt")
    assert r.status == 2 and r.errors == [f"error: --output {tmp_path / 'o.txt'}: use a .npz, .npy or .csv file name"]

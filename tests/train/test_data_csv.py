"""``toolkit data --out FILE.csv``: the split as a CSV that reads back exactly, trains a net as
its ``train.data.source`` and feeds ``toolkit infer`` as the .npz of the same split does; what a
CSV cannot hold is one line, exit status 2."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.bounded import ROOT
from tests.train.train_helpers import cli
from toolkit.errors import UserError
from toolkit.training.data import load_source

LENET = ROOT / "zoo" / "lenet" / "net.yaml"
# sequences of different lengths: no one row per example (refused before the data is read)
SEQUENCES = """name: seq
inputs:
  data: {shape: [N, T, 3]}
  label: {shape: [N], dtype: int64}
layers:
  - {name: rec, type: GRU, bottom: data, top: h, num_output: 5, return_sequence: false}
  - {name: fc, type: InnerProduct, bottom: h, top: fc, num_output: 3}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
train:
  data: {source: seqs.npz, lengths: lengths, batch_size: 6, test_fraction: 0.5}
"""


@pytest.fixture(scope="module")
def split(tmp_path_factory):
    """lenet's test split written by the same command as .csv and as .npz."""
    root = tmp_path_factory.mktemp("split")
    for name in ("digits.csv", "digits.npz"):
        r = cli("data", LENET, "--split", "test", "--out", root / name)
        assert r.status == 0 and r.out == f"wrote {root / name}: 359 examples of data, label\n", r.err
    return root


def test_the_csv_reads_back_equal_to_the_npz(split):
    lines = (split / "digits.csv").read_text().splitlines()
    assert lines[0].split(",") == [f"data_{i}" for i in range(64)] + ["label"] and len(lines) == 360
    with np.load(split / "digits.npz") as npz:
        data, label = npz["data"], npz["label"]
    inputs = {"data": _Input(np.float32), "label": _Input(np.int64)}
    back = load_source(str(split / "digits.csv"), inputs)           # as train.data.source reads it
    assert back["data"].dtype == np.float32 and back["label"].dtype == np.int64
    np.testing.assert_array_equal(back["data"], data.reshape(359, 64))
    np.testing.assert_array_equal(back["label"], label)


def test_float32_values_come_back_bit_for_bit(tmp_path):
    from toolkit.commands.data_csv import write_csv_split
    x = np.random.default_rng(0).standard_normal((50, 2, 3)).astype(np.float32) * np.float32(1e-30)
    x[0, 0, 0], x[1, 0, 0] = np.float32(0.1), np.finfo(np.float32).max
    y = np.arange(50, dtype=np.int64)
    write_csv_split(str(tmp_path / "t.csv"), {"x": x, "y": y}, "y")
    back = load_source(str(tmp_path / "t.csv"), {"x": _Input(np.float32), "y": _Input(np.int64)})
    assert back["x"].tobytes() == x.reshape(50, 6).tobytes() and back["y"].tolist() == y.tolist()


def test_a_net_trains_from_the_csv(split, tmp_path):
    r = cli("train", LENET, "--out", tmp_path / "run", "--set", f"train.data.source={split / 'digits.csv'}",
            "--set", "train.max_iter=3", "--set", "train.test_interval=1000")
    assert r.status == 0, r.err
    assert (tmp_path / "run" / "model.safetensors").is_file()
    about = json.loads((tmp_path / "run" / "input.json").read_text())
    assert about["label_column"] == "label" and len(about["columns"]) == 65


def test_infer_gives_the_same_probabilities_from_the_csv_as_from_the_npz(split):
    probs = {}
    for name in ("digits.csv", "digits.npz"):
        out = split / f"prob-{name}.npz"
        r = cli("infer", "zoo:lenet", "--input", split / name, "--output", out)
        assert r.status == 0, r.err
        with np.load(out) as f:
            probs[name] = f["prob"]
    assert probs["digits.csv"].shape == (359, 10)
    np.testing.assert_array_equal(probs["digits.csv"], probs["digits.npz"])


def test_what_a_csv_cannot_hold_is_refused(tmp_path):
    from toolkit.commands.data_csv import csv_label
    out, net = tmp_path / "seq.csv", tmp_path / "seq.yaml"
    net.write_text(SEQUENCES)
    r = cli("data", net, "--out", out)
    assert r.status == 2 and r.err.splitlines() == [
        f"error: --out {out}: the net's sequences have lengths (train.data.lengths: lengths), which a CSV of one "
        "row per example cannot hold; use .npz"], r.err
    r = cli("data", LENET, "--out", tmp_path / "d.txt")
    assert r.status == 2 and r.err.splitlines() == [f"error: --out {tmp_path / 'd.txt'}: use a .npz or .csv file name"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seq.yaml"]
    label = np.zeros(2, np.int64)
    with pytest.raises(UserError, match=r"^error: --out o.csv: array 'data' holds bool values, not numbers"):
        csv_label("o.csv", {"data": np.zeros((2, 3), bool), "label": label})
    two_features = r"a CSV holds one feature array and one integer label per example, as .* this split has a, b, label;"
    with pytest.raises(UserError, match=two_features):
        csv_label("o.csv", {"a": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.float32), "label": label})
    with pytest.raises(UserError, match=r"beyond 2\^53"):
        csv_label("o.csv", {"data": np.zeros((2, 3), np.float32), "label": np.array([0, 2 ** 60])})


def test_the_csv_never_replaces_an_input(split):
    source = split / "digits.csv"
    before = source.read_bytes()
    r = cli("data", LENET, "--set", f"train.data.source={source}", "--out", source)
    assert r.status == 2 and len(r.err.splitlines()) == 1 and "an output never replaces an input" in r.err, r.err
    assert source.read_bytes() == before


class _Input:
    """The part of a net's input declaration that the data loaders read."""

    def __init__(self, dtype):
        self.dtype = np.dtype(dtype).name

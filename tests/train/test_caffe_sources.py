"""Caffe's data sources as train.data sources, read a batch at a time: an LMDB of Datum records,
an image list and HDF5. Each trains LeNet to exactly the weights the same examples give from an
.npz (the same order, split and transform), and hostile records are refused by name."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from tests.train.caffe_records import datum, varint
from tests.train.train_helpers import cli, sets
from toolkit.training.data import load_digits

ROOT = Path(__file__).resolve().parents[2]
LENET = (ROOT / "zoo" / "lenet" / "net.yaml").read_text()
N = 300


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits()
    return x[:N], y[:N]


def _train(tmp_path, source: str, name: str, *extra) -> dict:
    net = tmp_path / f"{name}.yaml"
    net.write_text(LENET.replace('source: "builtin:digits"', f"source: {source}"))
    r = cli("train", net, "--out", tmp_path / name, *sets(train__max_iter=12, train__test_interval=6), *extra)
    assert r.status == 0, r.err
    return load_file(str(tmp_path / name / "model.safetensors"))


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def test_an_lmdb_of_datums_trains_as_the_same_npz(tmp_path, digits):
    lmdb = pytest.importorskip("lmdb", reason="the caffe extra (lmdb) reads LMDB sources")
    x, y = digits
    np.savez(tmp_path / "digits.npz", data=x, label=y)
    env = lmdb.open(str(tmp_path / "digits_lmdb"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(N):
            txn.put(f"{i:08d}".encode(), datum(x[i], int(y[i])))
    env.close()
    _same(_train(tmp_path, "digits.npz", "npz"), _train(tmp_path, "digits_lmdb", "lmdb"))


def test_an_image_list_trains_as_the_same_npz(tmp_path, digits):
    from PIL import Image
    x, y = digits
    np.savez(tmp_path / "digits.npz", data=x, label=y)
    (tmp_path / "images").mkdir()
    lines = []
    for i in range(N):
        Image.fromarray(x[i, 0].astype(np.uint8)).save(tmp_path / "images" / f"{i}.png")
        lines.append(f"{i}.png {y[i]}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    _same(_train(tmp_path, "digits.npz", "npz"),
          _train(tmp_path, "list.txt", "list", "--set", "train.data.root_folder=images"))


def test_hdf5_files_listed_train_as_the_same_npz(tmp_path, digits):
    h5py = pytest.importorskip("h5py", reason="the caffe extra (h5py) reads HDF5 sources")
    x, y = digits
    np.savez(tmp_path / "digits.npz", data=x, label=y)
    for part, rows in (("a", slice(0, 100)), ("b", slice(100, N))):
        with h5py.File(tmp_path / f"{part}.h5", "w") as f:
            f["data"], f["label"] = x[rows], y[rows]
    (tmp_path / "h5.txt").write_text("a.h5\nb.h5\n")
    _same(_train(tmp_path, "digits.npz", "npz"), _train(tmp_path, "h5.txt", "h5"))


def test_a_record_whose_size_lies_is_refused(tmp_path, digits):
    lmdb = pytest.importorskip("lmdb", reason="the caffe extra (lmdb) reads LMDB sources")
    x, y = digits
    env = lmdb.open(str(tmp_path / "bad_lmdb"), map_size=1 << 24)
    with env.begin(write=True) as txn:
        lie = datum(x[0], 1).replace(b"\x18" + varint(8), b"\x18" + varint(9), 1)   # width 9, 64 bytes
        txn.put(b"0", lie)
    env.close()
    net = tmp_path / "bad.yaml"
    net.write_text(LENET.replace('source: "builtin:digits"', "source: bad_lmdb"))
    r = cli("train", net, "--out", tmp_path / "o", *sets(train__max_iter=1))
    assert r.status == 2 and "Traceback" not in r.err
    assert any("says 1 x 8 x 9 but holds 64 bytes" in e for e in r.errors), r.err


def test_a_leveldb_of_datums_trains_as_the_same_npz(tmp_path, digits):
    plyvel = pytest.importorskip("plyvel", reason="the caffe extra (plyvel) reads LevelDB sources")
    x, y = digits
    np.savez(tmp_path / "digits.npz", data=x, label=y)
    db = plyvel.DB(str(tmp_path / "digits_leveldb"), create_if_missing=True)
    for i in range(N):
        db.put(f"{i:08d}".encode(), datum(x[i], int(y[i])))
    db.close()
    _same(_train(tmp_path, "digits.npz", "npz"), _train(tmp_path, "digits_leveldb", "leveldb"))

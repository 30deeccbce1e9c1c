"""Training data: the sources (builtin:digits, .npz, a folder of .npy, CSV, an image folder),
their checks against the net's inputs (through the ``toolkit`` command: exit 2 and a message
naming the array and the shapes), the input transforms, the split and the batch order."""
from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pytest

from toolkit.cli import main
from toolkit.frontend import Net
from toolkit.frontend.spec import parse_overrides
from toolkit.training.data import BatchOrder, Dataset, load_digits, split, transform
from toolkit.training.feeding import load_data, train_spec

NET = """\
name: dnet
inputs:
  data: {{shape: {shape}, dtype: float32}}
  label: {{shape: [N], dtype: int64}}
layers:
  - {{name: ip1, type: InnerProduct, bottom: data, top: ip1, num_output: 3}}
  - {{name: loss, type: SoftmaxWithLoss, bottom: [ip1, label], top: loss}}
train:
  data: {{source: "{source}", test_fraction: 0.0, batch_size: 4, shuffle: false}}
  max_iter: 2
  display: 100
"""


def write_net(folder: Path, source: str, shape: str = "[N, 4]") -> Path:
    path = folder / "net.yaml"
    path.write_text(NET.format(source=source, shape=shape))
    return path


def data_of(net_path: Path, *overrides):
    net = Net.load(str(net_path), parse_overrides(list(overrides)))
    return load_data(net, train_spec(net))


def cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in args])
    return status, out.getvalue(), err.getvalue()


def train_error(net_path: Path, tmp_path: Path, *extra) -> str:
    """Trains expecting a data error: exit 2, one 'error:' line, no traceback; returns the line."""
    status, _out, err = cli("train", net_path, "--out", tmp_path / "run", *extra)
    assert status == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def blobs(n: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, n).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# builtin:digits
# ---------------------------------------------------------------------------------------------

def test_builtin_digits():
    x, y = load_digits()
    assert x.shape == (1797, 1, 8, 8) and x.dtype == np.float32
    assert y.shape == (1797,) and y.dtype == np.int64
    assert np.bincount(y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert y[:10].tolist() == list(range(10))
    assert x[0, 0, 0].tolist() == [0, 0, 5, 13, 9, 1, 0, 0]
    assert x.min() == 0 and x.max() == 16 and np.array_equal(x, np.round(x))
    assert float(x.sum(dtype=np.float64)) == 561718.0


@pytest.mark.parametrize("shape", ["[N, 1, 8, 8]", "[N, 64]"])
def test_digits_feed_images_or_vectors_split_and_scaled(tmp_path, shape):
    net = write_net(tmp_path, "builtin:digits", shape)
    train, test = data_of(net, "train.data.test_fraction=0.2", "train.data.scale=0.0625", "train.seed=5")
    assert len(train) == 1438 and len(test) == 359
    want = (1, 8, 8) if "8" in shape else (64,)
    assert train.arrays["data"].shape == (1438,) + want and test.arrays["data"].shape == (359,) + want
    assert train.arrays["data"].dtype == np.float32 and train.arrays["label"].dtype == np.int64
    assert train.arrays["data"].max() == 1.0                       # 16 * 0.0625
    # the two halves are the whole set: every digit's pixels appear once
    x, y = load_digits()
    both = np.concatenate([train.arrays["data"], test.arrays["data"]]).reshape(1797, 64) * 16
    key = lambda a: sorted(map(bytes, a.astype(np.float32)))          # noqa: E731
    assert key(both) == key(x.reshape(1797, 64))
    assert np.bincount(np.concatenate([train.arrays["label"], test.arrays["label"]])).tolist() == \
        np.bincount(y).tolist()


def write_sequence_net(folder: Path, width: int) -> Path:
    """[N, T, width] read token by token, pooled over T."""
    path = write_net(folder, "builtin:digits", f"[N, T, {width}]")
    path.write_text(path.read_text().replace(
        "top: ip1, num_output: 3}", "top: tok, num_output: 3, axis: 2}\n"
        "  - {name: perm, type: Permute, bottom: tok, top: tp, order: [0, 2, 1]}\n"
        "  - {name: pool, type: Reduction, bottom: tp, top: ip1, operation: mean, axis: 2}"))
    return path


def test_digits_feed_a_sequence_of_symbolic_length_as_rows(tmp_path):
    """[N, T, 8]: each example's 64 values are T=8 tokens of 8, as a fixed [N, 8, 8] takes them."""
    train, _ = data_of(write_sequence_net(tmp_path, 8), "train.data.test_fraction=0.2")
    assert train.arrays["data"].shape == (1438, 8, 8)
    x, _ = load_digits()
    assert set(map(bytes, train.arrays["data"].reshape(1438, 64))) <= set(map(bytes, x.reshape(1797, 64)))


def test_a_sequence_the_examples_cannot_fill_is_one_error(tmp_path):
    line = train_error(write_sequence_net(tmp_path, 7), tmp_path)
    assert "array 'data' has examples of shape [1, 8, 8], which no Tx7 holds" in line


# ---------------------------------------------------------------------------------------------
# files: .npz, a folder of .npy, CSV, an image folder
# ---------------------------------------------------------------------------------------------

def test_npz_source_casts_and_ignores_extra_arrays(tmp_path):
    x, y = blobs()
    np.savez(tmp_path / "d.npz", data=x.astype(np.float64), label=y.astype(np.int32), other=np.zeros(3))
    train, test = data_of(write_net(tmp_path, "d.npz"))
    assert test is None
    assert train.arrays["data"].dtype == np.float32 and np.array_equal(train.arrays["data"], x)
    assert train.arrays["label"].dtype == np.int64 and np.array_equal(train.arrays["label"], y)
    assert set(train.arrays) == {"data", "label"}
    # labels stored as whole floats are fine
    np.savez(tmp_path / "d.npz", data=x, label=y.astype(np.float32))
    train, _ = data_of(write_net(tmp_path, "d.npz"))
    assert train.arrays["label"].dtype == np.int64 and np.array_equal(train.arrays["label"], y)


def test_npy_folder_source(tmp_path):
    x, y = blobs(7)
    (tmp_path / "arrays").mkdir()
    np.save(tmp_path / "arrays" / "data.npy", x.reshape(7, 2, 2))     # same size per example: reshaped
    np.save(tmp_path / "arrays" / "label.npy", y)
    train, _ = data_of(write_net(tmp_path, "arrays"))
    assert np.array_equal(train.arrays["data"], x) and np.array_equal(train.arrays["label"], y)


def test_csv_with_a_header_naming_the_label_column(tmp_path):
    x, y = blobs(5)
    x = np.round(x, 3)
    rows = ["label,f0,f1,f2,f3"] + [",".join([str(int(label))] + [repr(float(v)) for v in r]) for r, label in zip(x, y)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n")
    train, _ = data_of(write_net(tmp_path, "d.csv"))
    assert np.array_equal(train.arrays["label"], y)
    assert np.array_equal(train.arrays["data"], x.astype(np.float32))


def test_csv_without_a_header_has_the_label_last(tmp_path):
    x, y = blobs(6)
    x = np.round(x, 3)
    rows = [",".join([repr(float(v)) for v in r] + [str(int(label))]) for r, label in zip(x, y)]
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n\n")
    train, _ = data_of(write_net(tmp_path, "d.csv"))
    assert np.array_equal(train.arrays["label"], y)
    assert np.array_equal(train.arrays["data"], x.astype(np.float32))
    # a header that does not name the label input: still the last column
    (tmp_path / "h.csv").write_text("a,b,c,d,target\n" + "\n".join(rows) + "\n")
    train, _ = data_of(write_net(tmp_path, "h.csv"))
    assert np.array_equal(train.arrays["label"], y)


def _png(path: Path, pixels: np.ndarray) -> None:
    from PIL import Image
    Image.fromarray(pixels.astype(np.uint8)).save(path)


def test_grey_image_folder(tmp_path):
    pytest.importorskip("PIL", reason="image folders need pillow")
    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    made = {}
    for cls in ("b_dog", "a_cat", "c_eel"):            # class index = sorted folder order
        (root / cls).mkdir(parents=True)
        for k in range(2):
            img = rng.integers(0, 256, (4, 4))
            _png(root / cls / f"{k}.png", img)
            made[(cls, k)] = img
    (root / "a_cat" / "notes.txt").write_text("not an image")   # skipped
    train, _ = data_of(write_net(tmp_path, "images", "[N, 1, 4, 4]"))
    assert train.arrays["data"].shape == (6, 1, 4, 4)
    assert train.arrays["label"].tolist() == [0, 0, 1, 1, 2, 2]
    order = [("a_cat", 0), ("a_cat", 1), ("b_dog", 0), ("b_dog", 1), ("c_eel", 0), ("c_eel", 1)]
    for row, key in enumerate(order):
        assert np.array_equal(train.arrays["data"][row, 0], made[key].astype(np.float32)), key


def test_rgb_image_folder_is_channels_first_and_resized(tmp_path):
    pytest.importorskip("PIL", reason="image folders need pillow")
    root = tmp_path / "images"
    (root / "x").mkdir(parents=True)
    (root / "y").mkdir(parents=True)
    rgb = np.arange(2 * 3 * 3).reshape(2, 3, 3) * 9          # H 2, W 3, RGB
    _png(root / "x" / "a.png", rgb)
    _png(root / "y" / "b.png", np.full((6, 8, 3), 77))       # resized to 2 x 3: stays 77
    train, _ = data_of(write_net(tmp_path, "images", "[N, 3, 2, 3]"))
    assert train.arrays["data"].shape == (2, 3, 2, 3)
    assert np.array_equal(train.arrays["data"][0], rgb.transpose(2, 0, 1).astype(np.float32))
    assert np.all(train.arrays["data"][1] == 77)
    assert train.arrays["label"].tolist() == [0, 1]


# ---------------------------------------------------------------------------------------------
# mismatched data: exit 2 through the command, naming the array and the shapes
# ---------------------------------------------------------------------------------------------

def _npz(tmp_path, **arrays) -> Path:
    np.savez(tmp_path / "d.npz", **arrays)
    return write_net(tmp_path, "d.npz")


def test_wrong_per_example_shape(tmp_path):
    x, y = blobs()
    line = train_error(_npz(tmp_path, data=np.zeros((10, 5), np.float32), label=y), tmp_path)
    assert "'data'" in line and "[5]" in line and "[4]" in line


def test_missing_array(tmp_path):
    x, _ = blobs()
    line = train_error(_npz(tmp_path, data=x), tmp_path)
    assert "no array 'label'" in line and "it has: data" in line


@pytest.mark.parametrize("label", [[0.5, 1, 2, 0, 1, 2, 0, 1, 2, 0],
                                   [np.inf, 1, 2, 0, 1, 2, 0, 1, 2, 0],
                                   [np.nan, 1, 2, 0, 1, 2, 0, 1, 2, 0]])
def test_non_integer_labels(tmp_path, label):
    x, _ = blobs()
    line = train_error(_npz(tmp_path, data=x, label=np.array(label)), tmp_path)
    assert "'label'" in line and "non-integers" in line


def test_non_numeric_arrays(tmp_path):
    x, y = blobs()
    line = train_error(_npz(tmp_path, data=x, label=np.array(list("abcdefghij"))), tmp_path)
    assert "'label'" in line and "not numbers" in line
    line = train_error(_npz(tmp_path, data=x.astype(np.complex64), label=y), tmp_path)
    assert "'data'" in line and "not numbers" in line


def test_different_lengths(tmp_path):
    x, y = blobs()
    line = train_error(_npz(tmp_path, data=x, label=y[:9]), tmp_path)
    assert "different numbers of examples" in line and "data 10" in line and "label 9" in line


def test_labels_out_of_range_for_the_loss(tmp_path):
    x, y = blobs()
    y[3] = 7                                               # the net has 3 classes
    line = train_error(_npz(tmp_path, data=x, label=y), tmp_path)
    assert "label 7" in line and "3 classes" in line


def test_pickled_npz_is_refused(tmp_path):
    x, y = blobs()
    np.savez(tmp_path / "d.npz", data=np.array([object()] * 10, dtype=object), label=y)
    line = train_error(write_net(tmp_path, "d.npz"), tmp_path)
    assert "d.npz" in line and "array 'data' holds pickled objects, which are refused" in line


@pytest.mark.parametrize("text, expect", [
    ("a,b,c,d,label\n1,2,3,4,0.5\n1,2,3,4,1\n", "label column 'label' holds non-integers"),
    ("1,2,3,4,0\n1,2,x,4,1\n", "non-numeric value in the CSV (line 2: "),
    ("1,2,3,4,0\n1,2,3,1\n", "different numbers of columns (line 2 has 4, the first row has 5)"),
    ("a,b,c,d,label\n1,2,3,4\n", "different numbers of columns (line 2 has 4, the header has 5)"),
    ("a,b,c,d,label\n", "has a header but no data rows"),
    ("", "the CSV file is empty"),
    ("1,2,3,0\n1,2,3,1\n", "[3]"),                          # 3 features for an input of 4
])
def test_bad_csv(tmp_path, text, expect):
    (tmp_path / "d.csv").write_text(text)
    line = train_error(write_net(tmp_path, "d.csv"), tmp_path)
    assert expect in line and "d.csv" in line


def test_bad_sources(tmp_path):
    assert "no such file or folder" in train_error(write_net(tmp_path, "missing.npz"), tmp_path)
    assert "unknown builtin" in train_error(write_net(tmp_path, "builtin:mnist"), tmp_path)
    (tmp_path / "d.dat").write_text("1 2 3")
    assert "d.dat: unsupported data format '.dat'" in train_error(write_net(tmp_path, "d.dat"), tmp_path)
    # a .txt is Caffe's image list: PATH LABEL lines
    (tmp_path / "d.txt").write_text("a.png x\n")
    assert "d.txt:1: expected 'PATH LABEL', the label a whole number" in \
        train_error(write_net(tmp_path, "d.txt", "[N, 1, 4, 4]"), tmp_path)
    (tmp_path / "e.txt").write_text("missing.png 3\n")
    assert "missing.png" in train_error(write_net(tmp_path, "e.txt", "[N, 1, 4, 4]"), tmp_path)
    (tmp_path / "empty").mkdir()
    assert "subfolder per class" in train_error(write_net(tmp_path, "empty", "[N, 1, 4, 4]"), tmp_path)


def test_unreadable_image(tmp_path):
    pytest.importorskip("PIL", reason="image folders need pillow")
    (tmp_path / "images" / "a").mkdir(parents=True)
    (tmp_path / "images" / "a" / "bad.png").write_bytes(b"\x89PNG not really")
    line = train_error(write_net(tmp_path, "images", "[N, 1, 4, 4]"), tmp_path)
    assert "bad.png" in line and "not a readable image" in line


def test_data_errors_also_stop_toolkit_test(tmp_path):
    x, y = blobs()
    net = _npz(tmp_path, data=np.zeros((10, 5), np.float32), label=y)
    np.savez(tmp_path / "w.npz", **{"ip1.weight": np.zeros((3, 4), np.float32), "ip1.bias": np.zeros(3, np.float32)})
    status, _out, err = cli("test", net, "--weights", tmp_path / "w.npz", "--set", "train.data.test_fraction=0.5")
    assert status == 2 and "'data'" in err and "[5]" in err and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# transforms, split, batch order
# ---------------------------------------------------------------------------------------------

def _Spec(scale=None, mean=None):
    from schemas.train import DataSpec
    return DataSpec(scale=scale, mean=mean)


class _Input:
    def __init__(self, dtype):
        self.dtype = dtype


def test_transform_scale_and_mean():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (5, 3, 2, 2)).astype(np.uint8)
    y = np.arange(5, dtype=np.int64)
    inputs = {"data": _Input("float32"), "label": _Input("int64")}
    arrays = {"data": x, "label": y}
    out = transform(arrays, inputs, _Spec(scale=1 / 255), "float32")
    assert out["data"].dtype == np.float32
    assert np.array_equal(out["data"], x.astype(np.float32) * np.float32(1 / 255))
    assert out["label"] is y                                    # labels are never transformed
    out = transform(arrays, inputs, _Spec(scale=0.5, mean=100), "float32")
    assert np.array_equal(out["data"], (x.astype(np.float32) - 100) * np.float32(0.5))
    # a list mean is per channel (axis 1), as Caffe's mean_value
    out = transform(arrays, inputs, _Spec(mean=[10, 20, 30]), "float32")
    want = x.astype(np.float32) - np.array([10, 20, 30], np.float32).reshape(1, 3, 1, 1)
    assert np.array_equal(out["data"], want)
    assert out["data"][:, 1].mean() == pytest.approx(x[:, 1].mean() - 20, rel=1e-6)
    out = transform(arrays, inputs, _Spec(), "float64")
    assert out["data"].dtype == np.float64 and np.array_equal(out["data"], x)


def test_transforms_through_the_net_file(tmp_path):
    x, y = blobs()
    np.savez(tmp_path / "d.npz", data=x, label=y)
    train, _ = data_of(write_net(tmp_path, "d.npz"), "train.data.mean=[1, 2, 3, 4]", "train.data.scale=2")
    assert np.array_equal(train.arrays["data"], (x - np.array([1, 2, 3, 4], np.float32)) * np.float32(2))


@pytest.mark.parametrize("n, fraction", [(100, 0.2), (7, 0.25), (1797, 0.2), (10, 0.01)])
def test_split_sizes_and_determinism(n, fraction):
    ds = Dataset({"data": np.arange(n, dtype=np.float32)[:, None], "label": np.arange(n)})
    train, test = split(ds, fraction, seed=0)
    n_test = max(1, int(round(n * fraction)))
    assert len(test) == n_test and len(train) == n - n_test
    ids_train, ids_test = train.arrays["label"], test.arrays["label"]
    assert np.intersect1d(ids_train, ids_test).size == 0
    assert sorted(np.concatenate([ids_train, ids_test]).tolist()) == list(range(n))
    assert np.all(np.diff(ids_train) > 0) and np.all(np.diff(ids_test) > 0)   # kept in file order
    assert np.array_equal(train.arrays["data"][:, 0], ids_train.astype(np.float32))  # rows stay together
    again_train, again_test = split(ds, fraction, seed=0)
    assert np.array_equal(again_test.arrays["label"], ids_test)
    if n_test > 1:
        other = [split(ds, fraction, seed=s)[1].arrays["label"] for s in (1, 2, 3)]
        assert any(not np.array_equal(o, ids_test) for o in other)


def test_no_split_without_a_fraction():
    ds = Dataset({"label": np.arange(5)})
    train, test = split(ds, 0.0, seed=0)
    assert test is None and train is ds


@pytest.mark.parametrize("n, batch, shuffle", [(45, 8, True), (64, 8, True), (10, 3, False), (5, 16, True)])
def test_batch_order_covers_each_example_once_per_epoch(n, batch, shuffle):
    order = BatchOrder(n, batch, shuffle, seed=11)
    per_epoch = -(-n // batch)
    assert order.per_epoch == per_epoch
    epochs = []
    for e in range(3):
        rows = [order.rows(e * per_epoch + k) for k in range(per_epoch)]
        assert [len(r) for r in rows] == [batch] * (per_epoch - 1) + [n - batch * (per_epoch - 1)]
        flat = np.concatenate(rows)
        assert sorted(flat.tolist()) == list(range(n))
        epochs.append(flat)
    if shuffle and n > 2:
        assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
        assert not np.array_equal(epochs[0], np.arange(n))
    if not shuffle:
        assert all(np.array_equal(e, np.arange(n)) for e in epochs)


def test_batch_order_is_a_function_of_seed_and_iteration():
    """What exact resume rests on: a fresh order, asked out of sequence, gives the same rows."""
    a = BatchOrder(45, 8, True, seed=3)
    seq = [a.rows(i).tolist() for i in range(30)]
    b = BatchOrder(45, 8, True, seed=3)
    for i in (17, 3, 29, 0, 12, 12, 6):
        assert b.rows(i).tolist() == seq[i], i
    c = BatchOrder(45, 8, True, seed=4)
    assert [c.rows(i).tolist() for i in range(6)] != seq[:6]

"""HDF5 and image-list sources that try to read what they must not, or claim what they do not
hold: a dataset whose external storage names another file (a secret, a FIFO), a virtual dataset
or an external link, a file of 2 kB claiming 10^12 rows or an example of 10^10 values, a 0-d
dataset, an HDF5 file or an image-list entry that is a FIFO. Each ends within seconds in one
`error:` line, exit 2, in bounded memory, before a byte of another file is read."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.bounded import ROOT, run_toolkit

h5py = pytest.importorskip("h5py", reason="the caffe extra (h5py) reads HDF5 sources")

LENET = (ROOT / "zoo" / "lenet" / "net.yaml").read_text()
MEMORY_MB = 1000
ROW = (1, 8, 8)                       # LeNet's input here: [N, 1, 8, 8] digits


def train_on(tmp_path, source: str):
    net = tmp_path / "net.yaml"
    net.write_text(LENET.replace('source: "builtin:digits"', f"source: {source}"))
    return run_toolkit("train", "net.yaml", "--out", "run", "--set", "train.max_iter=2",
                       "--set", "train.test_interval=2", memory_mb=MEMORY_MB, timeout=30, cwd=tmp_path)


def refused(r, said: str) -> None:
    assert r.status == 2 and len(r.lines) == 1 and r.lines[0] == f"error: {said}", r.err
    assert r.seconds < 30


def write(path, **datasets) -> None:
    """An HDF5 file: a name -> an array, or -> (shape, dtype, keyword arguments of create_dataset)."""
    with h5py.File(path, "w") as f:
        for name, spec in datasets.items():
            if isinstance(spec, tuple):
                shape, dtype, kwargs = spec
                f.create_dataset(name, shape=shape, dtype=dtype, **kwargs)
            else:
                f.create_dataset(name, data=spec)


LABELS = np.zeros(4, np.int64)


def test_a_whole_file_trains(tmp_path):
    rng = np.random.default_rng(0)
    write(tmp_path / "ok.h5", data=rng.random((40,) + ROW, dtype=np.float32) * 16,
          label=rng.integers(0, 10, 40).astype(np.int64))
    r = train_on(tmp_path, "ok.h5")
    assert r.status == 0, r.err


def test_external_storage_naming_another_file_is_refused_unread(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.full(4 * 64, 7, np.float32).tobytes())
    write(tmp_path / "ext.h5", label=LABELS,
          data=((4,) + ROW, "f4", {"external": [(str(secret), 0, 4 * 64 * 4)]}))
    refused(train_on(tmp_path, "ext.h5"), "ext.h5: dataset 'data' uses external storage: its data would be read "
                                          "from a file it names; a source's datasets must be held in the file itself")
    assert not (tmp_path / "run" / "model.safetensors").exists()


def test_external_storage_on_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    write(tmp_path / "ext.h5", label=LABELS,
          data=((4,) + ROW, "f4", {"external": [(str(tmp_path / "pipe"), 0, 4 * 64 * 4)]}))
    r = train_on(tmp_path, "ext.h5")
    assert r.status == 2 and "dataset 'data' uses external storage" in r.err and len(r.lines) == 1, r.err


def test_an_external_link_and_a_virtual_dataset_are_refused(tmp_path):
    write(tmp_path / "other.h5", data=np.zeros((4,) + ROW, np.float32))
    with h5py.File(tmp_path / "link.h5", "w") as f:
        f["data"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "data")
        f.create_dataset("label", data=LABELS)
    r = train_on(tmp_path, "link.h5")
    refused(r, f"link.h5: dataset 'data' is a link into another file ({tmp_path / 'other.h5'}); a source's "
               "datasets must be held in the file itself")
    layout = h5py.VirtualLayout(shape=(4,) + ROW, dtype="f4")
    layout[:] = h5py.VirtualSource(str(tmp_path / "other.h5"), "data", shape=(4,) + ROW)
    with h5py.File(tmp_path / "virtual.h5", "w") as f:
        f.create_virtual_dataset("data", layout)
        f.create_dataset("label", data=LABELS)
    refused(train_on(tmp_path, "virtual.h5"), "virtual.h5: dataset 'data' is a virtual dataset, read from other "
                                               "files; a source's datasets must be held in the file itself")


def test_a_small_file_claiming_a_trillion_rows_is_refused(tmp_path):
    write(tmp_path / "big.h5", data=((10 ** 12,) + ROW, "f4", {"chunks": (1,) + ROW}),
          label=((10 ** 12,), "i8", {"chunks": (1000,)}))
    assert (tmp_path / "big.h5").stat().st_size < 4096
    refused(train_on(tmp_path, "big.h5"), "big.h5: dataset 'data' claims 1,000,000,000,000 rows (232.8 TiB) but "
                                          "the file holds the data of only part of them (the rest were never written)")


def test_an_example_of_ten_billion_values_is_refused(tmp_path):
    write(tmp_path / "wide.h5", data=((4, 10 ** 10), "f4", {"chunks": (1, 1000)}), label=LABELS)
    r = train_on(tmp_path, "wide.h5")
    assert r.status == 2 and len(r.lines) == 1, r.err
    assert r.lines[0].startswith("error: wide.h5: dataset 'data': one example is 37.3 GiB, more than the "), r.err


def test_a_contiguous_dataset_never_written_is_refused(tmp_path):
    write(tmp_path / "empty.h5", data=((10 ** 6,) + ROW, "f4", {}), label=((10 ** 6,), "i8", {}))
    refused(train_on(tmp_path, "empty.h5"), "empty.h5: dataset 'data' claims 1,000,000 rows (244.1 MiB) but the "
                                            "file holds the data of only part of them (the rest were never written)")


def test_a_0d_dataset_is_refused(tmp_path):
    write(tmp_path / "scalar.h5", data=np.float32(1), label=np.int64(1))
    refused(train_on(tmp_path, "scalar.h5"), "scalar.h5: dataset 'data' is a single value (0-d); a source's "
                                             "datasets hold one row per example")


def test_an_hdf5_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "pipe.h5")
    refused(train_on(tmp_path, "pipe.h5"), "pipe.h5: is not a regular file (it is a FIFO)")


def test_an_image_list_entry_that_is_a_fifo_is_refused_at_once(tmp_path):
    from PIL import Image
    for i in range(3):
        Image.fromarray(np.full((8, 8), 40 * i, np.uint8)).save(tmp_path / f"{i}.png")
    os.mkfifo(tmp_path / "pipe.png")
    (tmp_path / "list.txt").write_text("0.png 1\n1.png 2\n2.png 3\npipe.png 4\n")
    r = train_on(tmp_path, "list.txt")
    # images are read a batch at a time: the progress of the batches before it may come first
    assert r.status == 2 and r.lines[-1] == "error: pipe.png: is not a regular file (it is a FIFO)", r.err
    assert [line for line in r.lines if "error" in line] == r.lines[-1:] and r.seconds < 30


def test_a_list_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "list.txt")
    refused(train_on(tmp_path, "list.txt"), "list.txt: is not a regular file (it is a FIFO)")

"""Files that claim more than they hold, or more than the machine can hold, through the real
command line: each refused in one line before anything of the claimed size is allocated (or,
for ``toolkit infer``, read a range of rows at a time), under an address-space limit that the
old readers broke, and in bounded time."""
from __future__ import annotations

import os
import struct
import zipfile

import numpy as np
import pytest

from tests.bounded import ROOT, run_toolkit

LIMIT_MB = 400          # the toolkit runs LeNet in about 300 MB of address space
MIB = 1 << 20


def npy_header(shape, descr="<f4") -> bytes:
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    text += " " * ((64 - (10 + len(text) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode()


def zeros_member(path, key: str, shape, descr="<f4") -> None:
    """An .npz whose compressed member ``key`` really holds ``shape`` of zeros, written in pieces
    (a gigabyte of zeros compresses to a megabyte)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as archive:
        with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
            member.write(npy_header(shape, descr))
            left, piece = int(np.prod(shape)) * np.dtype(descr).itemsize, bytes(16 * MIB)
            while left > 0:
                member.write(piece[:min(left, len(piece))])
                left -= len(piece)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bombs")
    zeros_member(folder / "rows.npz", "x", (32768, 4096))                 # 512 MiB, 0.5 MB on disk
    zeros_member(folder / "data.npz", "data", (MIB, 1, 8, 8))             # 256 MiB of digits
    zeros_member(folder / "weights.npz", "conv1.weight", (64 * MIB,))      # 256 MiB, a wrong shape
    np.savez(folder / "none.npz")                                          # the sum has no weights
    (folder / "sum.yaml").write_text("name: sum\ninputs:\n  x: {shape: [N, 4096], dtype: float32}\nlayers:\n"
                                     "  - {name: total, type: Reduction, bottom: x, top: total, axis: 1}\n")
    return folder


def test_a_compressed_input_is_read_a_range_of_rows_at_a_time(bombs, tmp_path):
    assert os.path.getsize(bombs / "rows.npz") < MIB
    r = run_toolkit("infer", bombs / "sum.yaml", "--weights", bombs / "none.npz", "--input", f"x={bombs / 'rows.npz'}",
                    "--output", tmp_path / "o.npz", memory_mb=LIMIT_MB, timeout=120)
    assert r.status == 0, r.err
    total = np.load(tmp_path / "o.npz")["total"]
    assert total.shape == (32768,) and not total.any()


def test_training_data_bigger_than_memory_is_refused_before_it_is_read(bombs, tmp_path):
    r = run_toolkit("train", ROOT / "zoo" / "lenet" / "net.yaml", "--out", tmp_path / "run",
                    "--set", f"train.data.source={bombs / 'data.npz'}", memory_mb=LIMIT_MB, timeout=30)
    assert r.status == 2 and len(r.lines) == 1, r.err
    assert r.lines[0].startswith(f"error: {bombs / 'data.npz'}: array 'data' is 256.0 MiB (shape [1048576, 1, 8, 8], "
                                 "float32), more than the ") and r.lines[0].endswith(" of memory available")


def test_weights_are_checked_against_the_net_before_any_array_is_read(bombs, tmp_path):
    r = run_toolkit("test", ROOT / "zoo" / "lenet" / "net.yaml", "--weights", bombs / "weights.npz",
                    memory_mb=LIMIT_MB, timeout=30)
    assert r.status == 2 and r.seconds < 20, r.err
    assert any(line.startswith(f"error: {bombs / 'weights.npz'}: weight 'conv1.weight' of layer 'conv1' has "
                               "shape [67108864] in the file, the net needs [16, 1, 3, 3]") for line in r.lines), r.err


@pytest.mark.parametrize("shape,says", [
    ((10 ** 12, 1, 8, 8), "its header claims 256000000000000 bytes of data, only 256 follow"),
    ((-5, 1, 8, 8), "its header claims a negative dimension (shape [-5, 1, 8, 8])"),
])
def test_npy_headers_that_claim_too_much_or_nonsense(tmp_path, shape, says):
    path = tmp_path / "x.npy"
    path.write_bytes(npy_header(shape) + bytes(256))
    r = run_toolkit("infer", "zoo:lenet", "--input", path, memory_mb=LIMIT_MB, timeout=30)
    assert r.status == 2 and r.lines == [f"error: {path}: not a readable .npy file ({says})"], r.err


def test_an_image_is_held_to_a_pixel_limit_from_its_header(tmp_path):
    from PIL import Image
    Image.MAX_IMAGE_PIXELS = None
    Image.new("1", (20000, 20000)).save(tmp_path / "huge.png", optimize=True)      # 48 kB on disk
    Image.new("L", (120, 100)).save(tmp_path / "small.png")
    r = run_toolkit("infer", "zoo:lenet", "--input", tmp_path / "huge.png", memory_mb=LIMIT_MB, timeout=30)
    errors = [line for line in r.lines if line.startswith("error:")]
    assert r.status == 2 and errors == [
        f"error: {tmp_path / 'huge.png'}: an image of 20000 x 20000 pixels (400,000,000), over the limit of "
        "89,478,485 (set TOOLKIT_MAX_IMAGE_PIXELS to raise it)"], r.err
    lowered = run_toolkit("infer", "zoo:lenet", "--input", tmp_path / "small.png",
                          env={"TOOLKIT_MAX_IMAGE_PIXELS": "10000"})
    assert lowered.status == 2 and "120 x 100 pixels (12,000), over the limit of 10,000" in lowered.err
    raised = run_toolkit("infer", "zoo:lenet", "--input", tmp_path / "small.png",
                         env={"TOOLKIT_MAX_IMAGE_PIXELS": "12000"})
    assert raised.status == 0, raised.err


@pytest.mark.parametrize("suffix", [".npy", ".npz", ".csv", ".png"])
def test_a_fifo_given_as_an_input_is_refused_at_once(tmp_path, suffix):
    path = tmp_path / f"pipe{suffix}"
    os.mkfifo(path)
    r = run_toolkit("infer", "zoo:lenet", "--input", path, timeout=30)
    assert r.status == 2 and r.lines == [f"error: {path}: is not a regular file (it is a FIFO)"], r.err


def test_a_device_or_fifo_as_training_data_or_weights_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "pipe.csv")
    r = run_toolkit("train", ROOT / "zoo" / "lenet" / "net.yaml", "--out", tmp_path / "run",
                    "--set", f"train.data.source={tmp_path / 'pipe.csv'}", timeout=30)
    assert r.status == 2 and r.lines == [f"error: {tmp_path / 'pipe.csv'}: is not a regular file (it is a FIFO)"]
    os.mkfifo(tmp_path / "pipe.safetensors")
    r = run_toolkit("test", ROOT / "zoo" / "lenet" / "net.yaml", "--weights", tmp_path / "pipe.safetensors",
                    timeout=30)
    assert r.status == 2 and r.lines == [f"error: {tmp_path / 'pipe.safetensors'}: "
                                         "is not a regular file (it is a FIFO)"]

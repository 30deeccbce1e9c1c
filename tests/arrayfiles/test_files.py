"""toolkit.arrayfiles' checks before any reader reads: the file is there and not a folder, a
suffix its caller has no reader for, and the magic bytes of .npy and .npz files."""
from __future__ import annotations

import numpy as np
import pytest

from toolkit.arrayfiles import check_file, unsupported_format
from toolkit.arrayfiles.files import Where, check_magic
from toolkit.errors import UserError


def test_check_file(tmp_path):
    (tmp_path / "f.npy").write_bytes(b"")
    check_file(str(tmp_path / "f.npy"))
    with pytest.raises(UserError, match=r"error: .*/nope.npy: no such file$"):
        check_file(str(tmp_path / "nope.npy"))
    with pytest.raises(UserError, match=r"error: .*/: is a folder, not a file$"):
        check_file(str(tmp_path) + "/")


def test_unsupported_format_names_the_suffix_and_the_choices():
    assert str(unsupported_format("w.bin", "weights", ".safetensors or .npz")) == (
        "error: w.bin: unsupported weights format '.bin' (use .safetensors or .npz)")


@pytest.mark.parametrize("kind, head, reason", [
    (".npy", b"", "no .npy header"),
    (".npy", b"PK\x03\x04rest", "it is an .npz archive"),
    (".npz", b"\x93NUMPY\x01\x00", "it is an .npy array"),
    (".npz", b"\x00" * 40, "not a zip archive"),
])
def test_check_magic(tmp_path, kind, head, reason):
    path = tmp_path / f"f{kind}"
    path.write_bytes(head)
    with pytest.raises(UserError) as e:
        check_magic(str(path), kind)
    assert str(e.value) == f"error: {path}: not a readable {kind} file ({reason})"


def test_magic_that_fits_passes(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(2))
    np.savez(tmp_path / "a.npz", a=np.zeros(2))
    np.savez(tmp_path / "e.npz")                               # an empty archive has its own magic
    for name in ("a.npy", "a.npz", "e.npz"):
        check_magic(str(tmp_path / name), name[-4:])


def test_where_maps_reading_errors_to_one_line():
    where = Where("w.npz", ".npz", "conv1.weight")
    with pytest.raises(UserError) as e, where.reading():
        raise ValueError("bad header\nsecond line")
    assert str(e.value) == "error: w.npz: not a readable .npz file (array 'conv1.weight': bad header)"
    assert str(where.pickled()) == ("error: w.npz: array 'conv1.weight' holds pickled objects, which are refused "
                                    "(they can run code)")
    assert str(Where("x.npy", ".npy").pickled()) == (
        "error: x.npy: holds pickled objects, which are refused (they can run code)")

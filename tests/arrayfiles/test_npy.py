"""toolkit.arrayfiles' .npy and .npz readers against real files: whole and by row ranges, stored
and compressed members, and every refusal as one UserError naming the file (and the array)."""
from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from toolkit.arrayfiles import load_npy, load_npz, open_npy, open_npz
from toolkit.arrayfiles.files import Where
from toolkit.arrayfiles.npy import FileRows, MemberRows, read_header
from toolkit.arrayfiles.rows import WholeRows
from toolkit.errors import UserError


def refusal(read, path) -> str:
    with pytest.raises(UserError) as e:
        read(str(path))
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"error: {path}: "), message
    return message


def npy_bytes(arr: np.ndarray, **kw) -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array(f, arr, **kw)
    return f.getvalue()


@pytest.fixture
def x():
    return np.random.default_rng(0).random((7, 3, 2), dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------

def test_an_npy_is_read_by_row_ranges_and_whole(tmp_path, x):
    np.save(tmp_path / "x.npy", x)
    rows = open_npy(str(tmp_path / "x.npy"))
    assert isinstance(rows, FileRows) and rows.rows == 7 and rows.row_shape == (3, 2) and rows.dtype == np.float32
    assert rows.file is None                                    # nothing read before it is asked for
    np.testing.assert_array_equal(rows.read(5, 7), x[5:7])
    np.testing.assert_array_equal(rows.read(0, 3), x[0:3])      # out of order: positioned reads
    assert rows.read(4, 4).shape == (0, 3, 2)
    rows.close()
    np.testing.assert_array_equal(load_npy(str(tmp_path / "x.npy")), x)


@pytest.mark.parametrize("arr", [np.float64(2.5), np.asfortranarray(np.arange(12.0).reshape(3, 4)),
                                 np.zeros((0, 5), np.int16), np.array([1, 2, 3], ">i4"),
                                 np.zeros(4, [("a", "<f4"), ("b", "<i2")])],
                         ids=["0-d", "fortran", "no rows", "big-endian", "structured"])
def test_npy_layouts_read_as_numpy_reads_them(tmp_path, arr):
    np.save(tmp_path / "a.npy", arr)
    got = load_npy(str(tmp_path / "a.npy"))
    want = np.load(tmp_path / "a.npy")
    assert got.shape == want.shape and got.dtype == want.dtype and got.flags.f_contiguous == want.flags.f_contiguous
    np.testing.assert_array_equal(got, want)
    kind = WholeRows if arr.ndim == 0 or arr.flags.f_contiguous and not arr.flags.c_contiguous else FileRows
    assert isinstance(open_npy(str(tmp_path / "a.npy")), kind)


def test_stored_members_by_row_ranges_compressed_ones_in_order(tmp_path, x):
    """A stored member is read by positioned reads; a compressed one is decompressed in order, a
    range at a time, starting again for a range before the last one (neither is read whole)."""
    y = np.arange(7)
    np.savez(tmp_path / "s.npz", x=x, y=y, scalar=np.float32(3))
    np.savez_compressed(tmp_path / "c.npz", x=x, y=y)
    stored, compressed = open_npz(str(tmp_path / "s.npz")), open_npz(str(tmp_path / "c.npz"))
    assert list(stored) == ["x", "y", "scalar"] and list(compressed) == ["x", "y"]
    assert isinstance(stored["x"], FileRows) and isinstance(stored["scalar"], WholeRows)
    assert isinstance(compressed["x"], MemberRows) and compressed["x"].member is None   # nothing read yet
    for members in (stored, compressed):
        np.testing.assert_array_equal(members["x"].read(2, 6), x[2:6])
        np.testing.assert_array_equal(members["x"].read(0, 3), x[0:3])      # before the last: again
        np.testing.assert_array_equal(members["x"].read(5, 7), x[5:7])      # after: skips ahead
        np.testing.assert_array_equal(members["y"].read(0, 7), y)
    for rows in (*stored.values(), *compressed.values()):
        rows.close()
    whole = load_npz(str(tmp_path / "s.npz"))
    assert whole["scalar"] == 3 and whole["scalar"].shape == ()
    np.testing.assert_array_equal(whole["x"], x)
    np.testing.assert_array_equal(load_npz(str(tmp_path / "c.npz"))["y"], y)


def test_an_empty_archive_has_no_arrays(tmp_path):
    np.savez(tmp_path / "e.npz")
    assert load_npz(str(tmp_path / "e.npz")) == {}


def test_the_header_is_the_claim_read_before_anything_is_allocated(tmp_path):
    # a header claiming 8 TB of float64 in front of 10 bytes: refused from the header alone
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    path = tmp_path / "huge.npy"
    path.write_bytes(f.getvalue() + bytes(10))
    with open(path, "rb") as fp:
        header = read_header(fp, len(f.getvalue()) + 10 ** 13, Where(str(path), ".npy"))
        assert header.shape == (10**12,) and header.nbytes == 8 * 10**12 and header.size == len(f.getvalue())
        fp.seek(0)
        with pytest.raises(UserError, match="its header claims 8000000000000 bytes of data, only 10 follow"):
            read_header(fp, path.stat().st_size, Where(str(path), ".npy"))
    assert refusal(load_npy, path).endswith("only 10 follow)")


# ---------------------------------------------------------------------------------------------
# refusals
# ---------------------------------------------------------------------------------------------

class _Payload:
    """Unpickling it would create a file: the proof that nothing was unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_pickled_npy_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "code_ran"
    np.save(tmp_path / "p.npy", np.array([_Payload(marker)] * 3, dtype=object), allow_pickle=True)
    for read in (load_npy, open_npy):
        assert refusal(read, tmp_path / "p.npy").endswith(
            "p.npy: holds pickled objects, which are refused (they can run code)")
    assert not marker.exists()


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_a_pickled_npz_member_is_refused_naming_it(tmp_path, save):
    marker = tmp_path / "code_ran"
    save(tmp_path / "p.npz", ok=np.zeros(2), bad=np.array([_Payload(marker)], dtype=object))
    for read in (load_npz, open_npz):
        assert refusal(read, tmp_path / "p.npz").endswith(
            "p.npz: array 'bad' holds pickled objects, which are refused (they can run code)")
    assert not marker.exists()


def test_a_truncated_npy(tmp_path, x):
    data = npy_bytes(x)
    (tmp_path / "t.npy").write_bytes(data[:-100])
    held = x.nbytes - 100
    for read in (load_npy, open_npy):
        assert refusal(read, tmp_path / "t.npy").endswith(
            f"t.npy: not a readable .npy file (its header claims {x.nbytes} bytes of data, only {held} follow)")
    (tmp_path / "h.npy").write_bytes(data[:30])                     # inside the header
    assert "not a readable .npy file (EOF: reading array header" in refusal(load_npy, tmp_path / "h.npy")


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_an_npz_member_shorter_than_its_header_claims(tmp_path, x, compression):
    with zipfile.ZipFile(tmp_path / "t.npz", "w", compression) as archive:
        archive.writestr("x.npy", npy_bytes(x)[:-8])
    held = x.nbytes - 8
    assert refusal(load_npz, tmp_path / "t.npz").endswith(
        f"t.npz: not a readable .npz file (array 'x': its header claims {x.nbytes} bytes of data, only {held} follow)")


def test_random_bytes_and_the_wrong_kind_of_file(tmp_path, x):
    (tmp_path / "r.npz").write_bytes(np.random.default_rng(1).bytes(500))
    assert refusal(load_npz, tmp_path / "r.npz").endswith("r.npz: not a readable .npz file (not a zip archive)")
    (tmp_path / "r.npy").write_bytes(np.random.default_rng(2).bytes(500))
    assert refusal(load_npy, tmp_path / "r.npy").endswith("r.npy: not a readable .npy file (no .npy header)")
    np.save(tmp_path / "a.npy", x)
    (tmp_path / "a.npz").write_bytes((tmp_path / "a.npy").read_bytes())
    assert refusal(load_npz, tmp_path / "a.npz").endswith("a.npz: not a readable .npz file (it is an .npy array)")
    np.savez(tmp_path / "z.npz", x=x)
    (tmp_path / "z.npy").write_bytes((tmp_path / "z.npz").read_bytes())
    assert refusal(load_npy, tmp_path / "z.npy").endswith("z.npy: not a readable .npy file (it is an .npz archive)")


def test_a_truncated_archive(tmp_path, x):
    np.savez(tmp_path / "z.npz", x=x)
    data = (tmp_path / "z.npz").read_bytes()
    (tmp_path / "t.npz").write_bytes(data[: len(data) // 2])
    assert "t.npz: not a readable .npz file (" in refusal(load_npz, tmp_path / "t.npz")


def test_an_archive_member_that_is_not_an_array(tmp_path):
    with zipfile.ZipFile(tmp_path / "n.npz", "w") as archive:
        archive.writestr("notes.txt", "hello")
    assert refusal(load_npz, tmp_path / "n.npz").endswith(
        "n.npz: not a readable .npz file (member 'notes.txt' is not an .npy array)")


def test_an_npy_format_version_numpy_has_no_public_reader_for(tmp_path, x):
    (tmp_path / "v3.npy").write_bytes(npy_bytes(x, version=(3, 0)))
    assert refusal(load_npy, tmp_path / "v3.npy").endswith(
        "v3.npy: not a readable .npy file (unsupported .npy format version 3.0)")


def test_a_file_that_shrinks_while_its_rows_are_read(tmp_path, x):
    np.save(tmp_path / "x.npy", x)
    rows = open_npy(str(tmp_path / "x.npy"))
    data = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(data[: len(data) - 3 * x[0].nbytes])     # the last 3 rows gone
    with pytest.raises(UserError, match=r"x.npy: not a readable .npy file \(it ends inside row 4\)$"):
        rows.read(2, 7)
    rows.close()


def test_missing_files_and_folders(tmp_path):
    assert refusal(load_npy, tmp_path / "no.npy").endswith("no.npy: no such file")
    (tmp_path / "d.npz").mkdir()
    assert refusal(load_npz, tmp_path / "d.npz").endswith("d.npz: is a folder, not a file")

"""Arrays in .npy files and .npz archives, pickles refused. Each array's header is read, and its
claim checked, before anything of its size is allocated: against the file (no more data than
it holds) and, for an array read whole, against the memory available. C-ordered rows are then
read a range at a time: by positioned reads, or in order from a compressed member."""
from __future__ import annotations

import math
import os
import struct
import zipfile
from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from .files import Where, check_file, check_fits, check_magic
from .rows import Rows, WholeRows

_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}
# bytes asked of a file at a time: a zip member's readinto copies all it is asked for at once
_PIECE = 1 << 24


@dataclass(frozen=True)
class ArrayHeader:
    """What an .npy header claims, and its own length (where the data starts)."""
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool
    size: int

    @property
    def nbytes(self) -> int:
        return self.dtype.itemsize * math.prod(self.shape)


def read_header(fp, held: int, where: Where) -> ArrayHeader:
    """The header of the .npy at the start of ``fp`` (an .npy file or an .npz member ``held``
    bytes long, header included). Every array is opened through here, so that what it claims is
    known before anything of that size is allocated: pickles are refused here, and so is a claim
    of more data than the file holds."""
    with where.reading():
        version = np.lib.format.read_magic(fp)
        read = _HEADER_READERS.get(version)
        if read is None:
            raise where.unreadable(f"unsupported .npy format version {version[0]}.{version[1]}")
        shape, fortran, dtype = read(fp)
        header = ArrayHeader(tuple(shape), dtype, fortran, fp.tell())
    if dtype.hasobject:
        raise where.pickled()
    if any(d < 0 for d in header.shape):
        raise where.unreadable(f"its header claims a negative dimension (shape [{', '.join(map(str, header.shape))}])")
    if header.size + header.nbytes > held:
        raise _short(where, header.nbytes, held - header.size)
    return header


def _short(where: Where, claimed: int, held: int) -> UserError:
    return where.unreadable(f"its header claims {claimed} bytes of data, only {held} follow")


def _fill(fp, out: np.ndarray) -> int:
    """Reads ``out``'s bytes from ``fp``, a piece at a time; returns how many came (fewer when the
    file ends first)."""
    if not out.nbytes:
        return 0
    view = memoryview(out.reshape(-1).view(np.uint8))
    got = 0
    while got < len(view):
        n = fp.readinto(view[got: got + _PIECE])
        if not n:
            break
        got += n
    return got


def _read_whole(fp, header: ArrayHeader, where: Where) -> np.ndarray:
    """The data after ``header`` in ``fp``, as one array (numpy's own layout for Fortran order:
    the transpose's C order)."""
    check_fits(where, header.shape, header.dtype, header.nbytes)
    arr = np.ndarray(header.shape[::-1] if header.fortran else header.shape, header.dtype)
    got = _fill(fp, arr)
    if got != arr.nbytes:
        raise _short(where, arr.nbytes, got)
    return arr.T if header.fortran else arr


class _FileBackedRows(Rows):
    """Rows that stay in their file until asked for: read whole only after checking they fit."""
    where: Where

    def read_all(self) -> np.ndarray:
        shape = (self.rows,) + tuple(self.row_shape)
        check_fits(self.where, shape, self.dtype, self.dtype.itemsize * math.prod(shape))
        return self.read(0, self.rows)


class FileRows(_FileBackedRows):
    """A C-ordered array stored at ``offset`` in a file (an .npy, or a stored .npz member).
    Rows come through positioned reads into a fresh array, not through a memory map: every
    page a map has touched counts in the process's resident memory until it is unmapped, so
    reading a 60 MB file through one grows RSS by 60 MB; reads keep only the chunk."""

    def __init__(self, where: Where, header: ArrayHeader, offset: int):
        self.where, self.offset = where, offset
        self.rows, self.row_shape, self.dtype = header.shape[0], header.shape[1:], header.dtype
        self.row_bytes = header.dtype.itemsize * math.prod(self.row_shape)
        self.file = None

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start,) + self.row_shape, self.dtype)
        if out.nbytes:
            with self.where.reading():
                if self.file is None:
                    self.file = open(self.where.path, "rb")
                self.file.seek(self.offset + start * self.row_bytes)
                got = _fill(self.file, out)
            if got != out.nbytes:           # the file shrank since its header was read
                raise self.where.unreadable(f"it ends inside row {start + got // self.row_bytes}")
        return out

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class MemberRows(_FileBackedRows):
    """A C-ordered array in a compressed .npz member, which cannot be read from the middle: its
    rows are decompressed in order, a range at a time (a read that starts before the last one
    ended starts the member again), and only the rows asked for are held."""

    def __init__(self, where: Where, header: ArrayHeader, name: str):
        self.where, self.name, self.header_size = where, name, header.size
        self.rows, self.row_shape, self.dtype = header.shape[0], header.shape[1:], header.dtype
        self.row_bytes = header.dtype.itemsize * math.prod(self.row_shape)
        self.archive = self.member = None
        self.position = 0                   # rows of the member read so far

    def _restart(self) -> None:
        self.close()
        self.archive = zipfile.ZipFile(self.where.path)
        self.member = self.archive.open(self.name)
        self.member.read(self.header_size)
        self.position = 0

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start,) + self.row_shape, self.dtype)
        with self.where.reading():
            if self.member is None or start < self.position:
                self._restart()
            skip = (start - self.position) * self.row_bytes
            while skip > 0:
                passed = len(self.member.read(min(skip, _PIECE)))
                if not passed:
                    break
                skip -= passed
            got = _fill(self.member, out)
        if got != out.nbytes:
            raise self.where.unreadable(f"it ends inside row {start + got // max(self.row_bytes, 1)}")
        self.position = stop
        return out

    def close(self) -> None:
        for handle in (self.member, self.archive):
            if handle is not None:
                handle.close()
        self.archive = self.member = None


def open_npy(path: str) -> Rows:
    """An .npy's rows: C-ordered ones read a range at a time when asked, a 0-d or Fortran-ordered
    array read whole now."""
    check_file(path)
    check_magic(path, ".npy")
    where = Where(path, ".npy")
    with where.reading(), open(path, "rb") as f:
        header = read_header(f, os.fstat(f.fileno()).st_size, where)
        if header.shape and not header.fortran:
            return FileRows(where, header, header.size)
        return WholeRows(_read_whole(f, header, where))


def open_npz(path: str) -> dict[str, Rows]:
    """An .npz's arrays by name, each header read and checked, no data read yet: a stored member
    (np.savez) is read a range of rows at a time straight from the archive, a compressed one
    (np.savez_compressed) in order; a 0-d or Fortran-ordered one is read whole now."""
    check_file(path)
    check_magic(path, ".npz")
    with Where(path, ".npz").reading(), zipfile.ZipFile(path) as archive:
        return {info.filename[:-len(".npy")]: _open_member(path, archive, info) for info in archive.infolist()}


def _open_member(path: str, archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Rows:
    if not info.filename.endswith(".npy"):
        raise Where(path, ".npz").unreadable(f"member '{info.filename}' is not an .npy array")
    where = Where(path, ".npz", info.filename[:-len(".npy")])
    if info.flag_bits & 0x1:
        raise where.unreadable("it is encrypted")
    with where.reading(), archive.open(info) as member:
        header = read_header(member, info.file_size, where)
        if header.shape and not header.fortran:
            if info.compress_type == zipfile.ZIP_STORED:
                return FileRows(where, header, _data_offset(path, info) + header.size)
            return MemberRows(where, header, info.filename)
        return WholeRows(_read_whole(member, header, where))


def _data_offset(path: str, info: zipfile.ZipInfo) -> int:
    """Where a stored member's bytes start in the archive: after its local header, whose name and
    extra field may differ in length from the central directory's (archive.open checked it)."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        local = f.read(30)
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return info.header_offset + 30 + name_len + extra_len


def load_npy(path: str) -> np.ndarray:
    return _read_all(open_npy(path))


def load_npz(path: str) -> dict[str, np.ndarray]:
    return {key: _read_all(rows) for key, rows in open_npz(path).items()}


def _read_all(rows: Rows) -> np.ndarray:
    try:
        return rows.read_all()
    finally:
        rows.close()

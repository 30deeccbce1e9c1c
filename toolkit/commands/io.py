"""Reading input arrays and writing output arrays for the commands (npy / npz, pickle refused).

Inputs are opened as streams (``open_inputs``): an .npy, a stored .npz member, a CSV and a
folder of images are read a range of rows at a time, so that an input far larger than memory
runs through ``toolkit infer`` chunk by chunk; ``read_inputs`` reads them whole."""
from __future__ import annotations

import contextlib
import struct
import zipfile
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from ..errors import UserError
from ..fileio import atomic_write


def _check_array_file(path: str) -> None:
    """The mistakes found before numpy reads anything: no file, a wrong suffix, no npy/zip header."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{path}: no such file")
    if p.suffix not in (".npy", ".npz"):
        raise UserError(f"{path}: unsupported input format '{p.suffix}' (use .npy, .npz, .csv or an image)")
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    # np.load takes anything that is neither .npy nor zip for a pickle: say what it really is
    if not head.startswith((b"\x93NUMPY", b"PK\x03\x04", b"PK\x05\x06")):
        raise UserError(f"{path}: not a readable {p.suffix} file (no .npy or .npz header)")


@contextlib.contextmanager
def _numpy_reading(path: str, kind: str):
    """numpy's errors while reading ``path`` as one line each: pickled objects refused, anything
    else unreadable as ``kind`` (.npy / .npz)."""
    try:
        yield
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise UserError(f"{path}: holds pickled objects, which are refused (they can run code)") from None
        raise UserError(f"{path}: not a readable {kind} file ({e})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(f"{path}: not a readable {kind} file ({e})") from None


def _load_array_file(path: str) -> dict[str, np.ndarray] | np.ndarray:
    kind = Path(path).suffix
    _check_array_file(path)
    with _numpy_reading(path, kind):
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                return {k: data[k] for k in data.files}
        return data


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def _check_image_input(path: str, example_shape: tuple) -> None:
    if len(example_shape) != 3 or not all(isinstance(d, int) for d in example_shape) or example_shape[0] not in (1, 3):
        raise UserError(f"{path}: an image feeds an input shaped [N, 1 or 3, H, W] with fixed sizes")


def _read_image(path: str, example_shape: tuple) -> np.ndarray:
    """One image as a batch of one, converted and resized to the input's [C, H, W] (C 1 or 3)."""
    _check_image_input(path, example_shape)
    c, h, w = example_shape
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(path) as img:
            arr = np.asarray(img.convert("L" if c == 1 else "RGB").resize((w, h)), dtype=np.float32)
    except (UnidentifiedImageError, OSError) as e:
        raise UserError(f"{path}: not a readable image ({e})") from None
    return (arr[None] if c == 1 else arr.transpose(2, 0, 1))[None]


# ---------------------------------------------------------------------------------------------
# Pieces: one file's rows, read a range at a time
# ---------------------------------------------------------------------------------------------

class _Piece:
    """The rows of one file. ``rows`` is None for an array without a batch axis (0-d), which
    is read whole. ``row_shape`` and ``dtype`` are those of what ``read`` returns."""
    rows: int | None
    row_shape: tuple
    dtype: np.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _Whole(_Piece):
    """An array already in memory (a compressed .npz member, a 0-d or Fortran-ordered array)."""

    def __init__(self, arr: np.ndarray):
        self.arr = np.asarray(arr)
        self.rows = self.arr.shape[0] if self.arr.ndim else None
        self.row_shape, self.dtype = self.arr.shape[1:], self.arr.dtype

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.arr if self.rows is None else self.arr[start:stop]


class _FileRows(_Piece):
    """A C-ordered array stored at ``offset`` in a file (an .npy, or a stored .npz member).
    Rows come through positioned reads into a fresh array, not through a memory map: every
    page a map has touched counts in the process's resident memory until it is unmapped, so
    reading a 60 MB file through one grows RSS by 60 MB; reads keep only the chunk."""

    def __init__(self, path: str, shape: tuple, dtype: np.dtype, offset: int, what: str):
        self.path, self.offset, self.what = path, offset, what
        self.rows, self.row_shape, self.dtype = shape[0], tuple(shape[1:]), dtype
        self.row_bytes = dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64))
        self.file = None

    def read(self, start: int, stop: int) -> np.ndarray:
        out = np.empty((stop - start,) + self.row_shape, self.dtype)
        nbytes = out.nbytes
        if nbytes:
            if self.file is None:
                self.file = open(self.path, "rb")
            self.file.seek(self.offset + start * self.row_bytes)
            got = self.file.readinto(out.reshape(-1).view(np.uint8))
            if got != nbytes:
                raise UserError(f"{self.what}: not a readable {Path(self.path).suffix} file (it ends inside row "
                                f"{start + got // self.row_bytes})")
        return out

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _open_npy(path: str) -> _Piece:
    """An .npy's header read through numpy (np.load with mmap_mode: no pickle, nothing read);
    its rows are then read a range at a time."""
    _check_array_file(path)
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        if "python objects" in str(e).lower():
            raise UserError(f"{path}: holds pickled objects, which are refused (they can run code)") from None
        mapped = None
    if isinstance(mapped, np.memmap) and mapped.ndim and mapped.flags.c_contiguous:
        piece = _FileRows(path, mapped.shape, mapped.dtype, mapped.offset, path)
        del mapped                                   # nothing of it was touched
        return piece
    if isinstance(mapped, np.lib.npyio.NpzFile):
        mapped.close()
        raise UserError(f"{path}: not a readable .npy file (it is an .npz archive)")
    # 0-d, Fortran-ordered, or what a map cannot read: whole, with _load_array_file's words
    return _Whole(_load_array_file(path))


def _open_npz(path: str) -> dict[str, _Piece]:
    """An .npz's members by name. A stored member (np.savez) is read a range of rows at a time
    straight from the archive; a compressed one (np.savez_compressed) cannot be read from the
    middle, so it is read whole when the archive is opened."""
    _check_array_file(path)
    try:
        data = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(f"{path}: not a readable .npz file ({e})") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise UserError(f"{path}: not a readable .npz file (it is an .npy array)")
    with data:
        return {key: _npz_member(path, data, key) for key in data.files}


def _npz_member(path: str, data, key: str) -> _Piece:
    name = key + ".npy"
    try:
        info = data.zip.getinfo(name)
    except KeyError:
        info = None
    if info is not None and info.compress_type == zipfile.ZIP_STORED and not info.flag_bits & 0x1:
        try:
            with data.zip.open(info) as member:
                version = np.lib.format.read_magic(member)
                read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                               (2, 0): np.lib.format.read_array_header_2_0}.get(version)
                shape, fortran, dtype = read_header(member) if read_header else ((), True, None)
                header_len = member.tell()
            if shape and not fortran and not dtype.hasobject:
                with open(path, "rb") as f:
                    f.seek(info.header_offset)
                    local = f.read(30)
                if local[:4] == b"PK\x03\x04":
                    name_len, extra_len = struct.unpack("<HH", local[26:30])
                    start = info.header_offset + 30 + name_len + extra_len
                    if header_len + dtype.itemsize * int(np.prod(shape, dtype=np.int64)) <= info.file_size:
                        return _FileRows(path, shape, dtype, start + header_len, f"{path} (array '{key}')")
        except (ValueError, OSError, EOFError, zipfile.BadZipFile):
            pass                  # read whole below, which says what is wrong in the usual words
    with _numpy_reading(path, ".npz"):
        return _Whole(data[key])


class _CsvRows(_Piece):
    """A numeric CSV's rows as float32, a first row that is not numbers being a header. One
    pass at opening counts the rows and checks the columns; ``read`` then goes through the file
    in order (a read that does not start where the last ended starts the file again)."""

    def __init__(self, path: str, example: tuple):
        import csv
        self.path, self.example, self.csv = path, example, csv
        self.header, rows, widths = False, 0, set()
        try:
            with open(path, newline="") as f:
                first = True
                for r in csv.reader(f):
                    if not r:
                        continue
                    if first:
                        first = False
                        try:
                            [float(x) for x in r]
                        except ValueError:
                            self.header = True
                            continue
                    rows += 1
                    widths.add(len(r))
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise UserError(f"{path}: not a readable CSV file ({e})") from None
        if not rows:
            raise UserError(f"{path}: the CSV file has no data rows")
        if len(widths) != 1:
            raise UserError(f"{path}: the CSV rows have different numbers of columns")
        self.rows, (self.columns,) = rows, widths
        self.row_shape = _fit_examples(np.empty((0, self.columns), np.float32), example, path).shape[1:]
        self.dtype = np.dtype(np.float32)
        self.file = self.reader = None
        self.pos = 0

    def _restart(self) -> None:
        self.close()
        self.file = open(self.path, newline="")
        self.reader = (r for r in self.csv.reader(self.file) if r)
        if self.header:
            next(self.reader)
        self.pos = 0

    def read(self, start: int, stop: int) -> np.ndarray:
        try:
            if self.reader is None or start < self.pos:
                self._restart()
            for _ in range(start - self.pos):
                next(self.reader)
            rows = [next(self.reader) for _ in range(stop - start)]
        except (OSError, UnicodeDecodeError, self.csv.Error, StopIteration) as e:
            raise UserError(f"{self.path}: not a readable CSV file ({str(e) or 'it changed while being read'})") from None
        self.pos = stop
        try:
            arr = np.array([[float(x) for x in r] for r in rows], dtype=np.float32).reshape(len(rows), self.columns)
        except ValueError as e:
            raise UserError(f"{self.path}: non-numeric value in the CSV ({e})") from None
        return _fit_examples(arr, self.example, self.path)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = self.reader = None


class _ImageRows(_Piece):
    """Image files, one row each, read only when their rows are."""

    def __init__(self, paths: list[str], example: tuple):
        self.paths, self.example = paths, example
        self.rows, self.row_shape, self.dtype = len(paths), tuple(example), np.dtype(np.float32)

    def read(self, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return np.empty((0,) + self.row_shape, np.float32)
        return np.concatenate([_read_image(p, self.example) for p in self.paths[start:stop]])


def _image_folder(path: str, example: tuple) -> _ImageRows:
    """A folder of images, in the order of their names (files of other kinds and hidden ones skipped)."""
    _check_image_input(path, example)
    try:
        paths = sorted(str(p) for p in Path(path).iterdir()
                       if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".") and p.is_file())
    except OSError as e:
        raise UserError(f"{path}: cannot read the folder ({e.strerror})") from None
    if not paths:
        raise UserError(f"{path}: the folder has no image files ({', '.join(IMAGE_SUFFIXES)})")
    return _ImageRows(paths, example)


# ---------------------------------------------------------------------------------------------
# Inputs: the pieces of each input, stacked along the batch, read in step
# ---------------------------------------------------------------------------------------------

class _InputRows:
    """One input: its pieces (several CSVs or images stacked, or one array) as one row range."""

    def __init__(self, pieces: list[tuple[_Piece, str]]):
        self.pieces = pieces           # (piece, the path it came from)

    @property
    def rows(self) -> int | None:
        if any(p.rows is None for p, _ in self.pieces):
            return None
        return sum(p.rows for p, _ in self.pieces)

    @property
    def shape(self) -> tuple:
        piece = self.pieces[0][0]
        return piece.row_shape if self.rows is None else (self.rows,) + tuple(piece.row_shape)

    def read(self, start: int, stop: int) -> np.ndarray:
        if self.rows is None:
            return self.pieces[0][0].read(0, 0)
        parts, base = [], 0
        for piece, _ in self.pieces:
            lo, hi = max(start - base, 0), min(stop - base, piece.rows)
            if lo < hi:
                parts.append(piece.read(lo, hi))
            base += piece.rows
        if not parts:
            return self.pieces[0][0].read(0, 0)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


class InputStream:
    """The inputs of a run, read together a range of rows at a time (``chunks``) or whole
    (``read_all``). Close it (or use ``with``) to close the files it holds open."""

    def __init__(self, inputs: dict[str, _InputRows]):
        self.inputs = inputs

    def __enter__(self) -> "InputStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for rows in self.inputs.values():
            for piece, _ in rows.pieces:
                piece.close()

    def shapes(self) -> dict[str, tuple]:
        """Each input's whole shape (rows first), as read_inputs would give it."""
        return {name: rows.shape for name, rows in self.inputs.items()}

    def dtypes(self) -> dict[str, np.dtype]:
        return {name: rows.pieces[0][0].dtype for name, rows in self.inputs.items()}

    @property
    def rows(self) -> int | None:
        """The rows every input has (checked by ``check_rows``); None if some input has no batch axis."""
        counts = [r.rows for r in self.inputs.values()]
        return None if not counts or None in counts else max(counts)

    def check_rows(self) -> None:
        """Inputs read in step must have as many rows each."""
        counts = {name: r.rows for name, r in self.inputs.items()}
        if len(set(counts.values())) > 1:
            said = ", ".join(f"'{name}' {n} ({', '.join(dict.fromkeys(p for _, p in self.inputs[name].pieces))})"
                             for name, n in counts.items())
            raise UserError(f"the inputs have different numbers of rows: {said}; they are read row by row "
                            "together, so they must match")

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        return {name: rows.read(start, stop) for name, rows in self.inputs.items()}

    def read_all(self) -> dict[str, np.ndarray]:
        return {name: rows.read(0, rows.rows or 0) for name, rows in self.inputs.items()}

    def chunks(self, size: int | None) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        """(rows, arrays) for ``size`` rows at a time, in step across the inputs; everything at once
        when ``size`` is None or some input has no batch axis. An input without rows still gives
        one (empty) chunk, so that the run says what is wrong with it."""
        total = self.rows
        if size is None or total is None:
            yield (total or 0), self.read_all()
            return
        self.check_rows()
        start = 0
        while start < total or start == 0:
            stop = min(start + size, total)
            yield stop - start, self.read(start, stop)
            if stop == total:
                return
            start = stop


def open_inputs(specs: list[str], needed: list[str], all_inputs: list[str],
                shapes: dict[str, tuple] | None = None) -> InputStream:
    """``[NAME=]FILE`` items -> an InputStream of the needed inputs. An unnamed file goes to the
    only needed input; an .npz gives arrays by name (arrays for inputs this phase does not use are
    ignored); a folder gives its images in the order of their names. Images and CSV rows are
    stacked along the batch when the same input is given several times; their examples take the
    input's shape when the sizes agree (a 64-column row feeds [N, 1, 8, 8]). Headers and names are
    checked here; rows are read when asked for."""
    shapes = shapes or {}
    arrays: dict[str, _InputRows] = {}
    stacked: dict[str, list[tuple[_Piece, str]]] = {}
    opened: list[_Piece] = []
    try:
        for spec in specs:
            name, sep, path = spec.partition("=")
            if not sep:
                name, path = "", spec
            suffix = Path(path).suffix.lower()
            if suffix == ".npz" and not Path(path).is_dir():
                loaded = _open_npz(path)
                opened.extend(loaded.values())
                if name:
                    if name not in loaded:
                        raise UserError(f"{path}: has no array '{name}' (it has: {', '.join(loaded) or 'none'})")
                    loaded = {name: loaded[name]}
                for key, piece in loaded.items():
                    if key not in all_inputs:
                        raise UserError(f"{path}: array '{key}' matches no input of the net "
                                        f"(inputs: {', '.join(all_inputs)})")
                    if key in needed:
                        if key in arrays or key in stacked:
                            raise UserError(f"--input {spec}: input '{key}' is given twice")
                        arrays[key] = _InputRows([(piece, path)])
                continue
            if not name:
                if len(needed) != 1:
                    raise UserError(f"{path}: say which input it is (NAME={path}); the net needs "
                                    f"{', '.join(needed)}")
                name = needed[0]
            if name not in all_inputs:
                raise UserError(f"--input {spec}: the net has no input '{name}' (inputs: {', '.join(all_inputs)})")
            if name not in needed:
                continue
            folder = Path(path).is_dir()
            if not folder and not Path(path).is_file():
                raise UserError(f"{path}: no such file")
            example = tuple(shapes.get(name, ())[1:])
            if folder or suffix == ".csv" or suffix in IMAGE_SUFFIXES:
                if name in arrays:
                    raise UserError(f"--input {spec}: input '{name}' is given twice")
                if folder:
                    piece = _image_folder(path, example)
                elif suffix == ".csv":
                    piece = _CsvRows(path, example)
                else:
                    _check_image_input(path, example)
                    piece = _ImageRows([path], example)
                opened.append(piece)
                earlier = stacked.setdefault(name, [])
                if earlier and tuple(earlier[0][0].row_shape) != tuple(piece.row_shape):
                    raise UserError(f"--input {spec}: its examples have shape {list(piece.row_shape)}, the ones "
                                    f"before it for input '{name}' {list(earlier[0][0].row_shape)}")
                earlier.append((piece, path))
                continue
            if name in arrays or name in stacked:
                raise UserError(f"--input {spec}: input '{name}' is given twice")
            piece = _open_npy(path)      # a suffix other than .npy is refused there, in the usual words
            opened.append(piece)
            arrays[name] = _InputRows([(piece, path)])
        for name, pieces in stacked.items():
            arrays[name] = _InputRows(pieces)
        missing = [n for n in needed if n not in arrays]
        if missing:
            raise UserError(f"no array given for input {', '.join(repr(m) for m in missing)}")
    except BaseException:
        for piece in opened:
            piece.close()
        raise
    return InputStream({n: arrays[n] for n in arrays})


def read_inputs(specs: list[str], needed: list[str], all_inputs: list[str],
                shapes: dict[str, tuple] | None = None) -> dict[str, np.ndarray]:
    """``[NAME=]FILE`` items -> whole arrays by input name (see ``open_inputs``)."""
    with open_inputs(specs, needed, all_inputs, shapes) as stream:
        return stream.read_all()


def _fit_examples(arr: np.ndarray, example: tuple, path: str) -> np.ndarray:
    if not example or not all(isinstance(d, int) for d in example) or tuple(arr.shape[1:]) == example:
        return arr
    if int(np.prod(arr.shape[1:])) != int(np.prod(example)):
        raise UserError(f"{path}: examples of shape {list(arr.shape[1:])} do not fit the input's {list(example)}")
    return arr.reshape((arr.shape[0],) + example)


def check_output_path(path: str, outputs: list[str] | None = None) -> None:
    """The --output mistakes that can be found before anything runs (``outputs``: the output
    names, once known)."""
    target = Path(path)
    if target.suffix not in (".npz", ".npy"):
        raise UserError(f"--output {path}: use a .npz or .npy file name")
    if outputs is not None and target.suffix == ".npy" and len(outputs) != 1:
        raise UserError(f"--output {path}: a .npy file holds one array, the net has {len(outputs)} outputs "
                        f"({', '.join(outputs)}); use .npz")
    if not target.parent.exists():
        raise UserError(f"--output {path}: folder {target.parent} does not exist")


def write_outputs(path: str, outputs: Mapping[str, np.ndarray]) -> None:
    """Atomic write of .npz (keyed by output name) or .npy (exactly one output)."""
    target = Path(path)
    check_output_path(path, list(outputs))

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            if target.suffix == ".npy":
                np.save(f, next(iter(outputs.values())))
            else:
                np.savez(f, **outputs)
    atomic_write(target, write)

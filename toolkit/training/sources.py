"""Caffe's data sources as train.data sources, read a batch at a time rather than loaded whole:

- an LMDB of ``Datum`` records (a folder holding ``data.mdb``: Caffe's ``Data`` layer), through
  the ``lmdb`` package, or a LevelDB of them (a folder holding ``CURRENT``), through ``plyvel``
  (one process at a time: LevelDB locks its folder); encoded records (JPEG, PNG) are decoded by
  Pillow, raw ones are [C, H, W] bytes or floats, both in Caffe's channel order (BGR for colour
  images);
- an image list (a ``.txt`` of ``PATH LABEL`` lines: Caffe's ``ImageData``), paths relative to
  ``root_folder`` (else the list's folder), images resized to the input (or, with crop_size, to
  new_height x new_width) as the image folder source does;
- HDF5 (``.h5``/``.hdf5``, or a ``.txt`` listing them: Caffe's ``HDF5Data``), datasets named after
  the net's inputs, through ``h5py``; each dataset's data held in its own file (``_hdf5_dataset``:
  external storage, virtual datasets and external links, which read other files, are refused)
  and every row it claims stored there, so that a small file cannot claim terabytes.

``lmdb`` and ``h5py`` are the ``caffe`` extra, imported when such a source is opened. A source
says how many examples it has and reads any rows asked for (sorted, each once); nothing is
trusted about its own size: a record's dimensions are checked against its bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..arrayfiles import decode_image, read_image
from ..errors import UserError
from ..fileio import check_regular
from ..hostmem import human_bytes, too_big
from ..ir.graph import FLOAT_DTYPES

MAX_LIST_LINES = 50_000_000
# Caffe's labels are int32 (Datum.label, ImageData's int): one past them is refused where it is read
LABEL_RANGE = (-(1 << 31), (1 << 31) - 1)
_LEVELDBS: dict = {}


@dataclass
class LazyDataset:
    """``rows`` examples, read by ``read(sorted unique rows) -> {name: array}``."""
    rows: int
    read: Callable[[np.ndarray], dict]

    def __len__(self) -> int:
        return self.rows

    def take(self, rows) -> dict[str, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        unique, inverse = np.unique(rows, return_inverse=True)
        got = self.read(unique)
        return {k: v[inverse] for k, v in got.items()}

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """Every example at once (what `toolkit data` exports)."""
        return self.take(np.arange(self.rows))


@dataclass
class Mapped:
    """A dataset whose batches pass through ``fn`` (a check and cast, a transform, a crop)."""
    base: object
    fn: Callable[[dict], dict]

    def __len__(self) -> int:
        return len(self.base)

    def take(self, rows) -> dict[str, np.ndarray]:
        return self.fn(self.base.take(rows))

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self.take(np.arange(len(self)))


@dataclass
class Subset:
    base: object
    indices: np.ndarray

    def __len__(self) -> int:
        return len(self.indices)

    def take(self, rows) -> dict[str, np.ndarray]:
        return self.base.take(self.indices[np.asarray(rows, dtype=np.int64)])

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self.take(np.arange(len(self)))


def kind_of(path: Path) -> str | None:
    """Which of these sources a path is, or None."""
    if path.is_dir() and (path / "data.mdb").is_file():
        return "lmdb"
    if path.is_dir() and (path / "CURRENT").is_file():
        return "leveldb"
    if path.suffix.lower() in (".h5", ".hdf5"):
        return "hdf5"
    if path.suffix.lower() == ".txt" and path.exists() and not path.is_dir():
        check_regular(path)              # a list that is a FIFO is said to be one, not a format
        first = next((line.strip() for line in _lines(path) if line.strip()), "")
        return "hdf5" if first.lower().endswith((".h5", ".hdf5")) else "image_list"
    return None


def _lines(path: Path):
    with open(path, encoding="utf-8", errors="strict") as f:
        for i, line in enumerate(f):
            if i >= MAX_LIST_LINES:
                raise UserError(f"{path}: more than {MAX_LIST_LINES:,} lines")
            yield line


def open_lazy(kind: str, path: Path, inputs: dict, data_spec) -> LazyDataset:
    return {"lmdb": _lmdb, "leveldb": _leveldb, "hdf5": _hdf5, "image_list": _image_list}[kind](path, inputs, data_spec)


def _roles(inputs: dict) -> tuple[str, str | None]:
    floats = [n for n, s in inputs.items() if s.dtype in FLOAT_DTYPES]
    ints = [n for n, s in inputs.items() if s.dtype not in FLOAT_DTYPES]
    if len(floats) != 1 or len(ints) > 1:
        raise UserError("this data source gives features and labels, so the net needs one float input and at most "
                        f"one integer input (it has: {', '.join(inputs)})")
    return floats[0], (ints[0] if ints else None)


def _image_shape(inputs: dict, features: str, data_spec, path: Path) -> tuple[int, int, int]:
    """(C, H, W) images are read at: the input's, or new_height x new_width before a crop."""
    shape = inputs[features].shape
    if len(shape) != 4 or not all(isinstance(d, int) for d in shape[1:]) or shape[1] not in (1, 3):
        raise UserError(f"{path}: images feed an input shaped [N, 1 or 3, H, W]; input '{features}' is {list(shape)}")
    if data_spec.crop_size:
        if not (data_spec.new_height and data_spec.new_width):
            raise UserError(f"{path}: with crop_size, give the size images are read at: train.data.new_height and "
                            "new_width (Caffe's ImageData resizes to them, then crops)")
        return shape[1], data_spec.new_height, data_spec.new_width
    return shape[1], shape[2], shape[3]


def _image_list(path: Path, inputs: dict, data_spec) -> LazyDataset:
    features, label = _roles(inputs)
    root = Path(data_spec.root_folder) if data_spec.root_folder else path.parent
    if not root.is_absolute() and data_spec.root_folder:
        root = path.parent / root
    files, labels = [], []
    for number, line in enumerate(_lines(path), start=1):
        parts = line.split()
        if not parts:
            continue
        labels.append(_list_label(parts[-1], f"{path}:{number}", line))
        files.append(str(root / " ".join(parts[:-1])))
    if not files:
        raise UserError(f"{path}: an image list with no images")
    layout = _image_shape(inputs, features, data_spec, path)
    label_array = np.asarray(labels, dtype=np.int64)

    def read(rows: np.ndarray) -> dict:
        out = {features: np.stack([read_image(files[r], layout) for r in rows]) if len(rows) else
               np.empty((0,) + layout, np.float32)}
        if label:
            out[label] = label_array[rows]
        return out
    return LazyDataset(len(files), read)


def _list_label(text: str, where: str, line: str) -> int:
    # the digits are checked before int(): past 4,300 of them int() fails in its own words
    digits = text[1:] if text[:1] in "+-" else text
    if not (digits.isascii() and digits.isdigit()):
        raise UserError(f"{where}: expected 'PATH LABEL', the label a whole number: {line.strip()!r}")
    value = int(text) if len(digits) <= 20 else None
    if value is None or not LABEL_RANGE[0] <= value <= LABEL_RANGE[1]:
        shown = text if len(text) <= 24 else f"{text[:12]}...({len(digits)} digits)"
        raise UserError(f"{where}: the label {shown} is not a 32-bit integer (Caffe's labels are int32)")
    return value


def _hdf5(path: Path, inputs: dict, data_spec) -> LazyDataset:
    try:
        import h5py
    except ImportError:
        raise UserError("an HDF5 source needs h5py: pip install 'yamlnet-toolkit[caffe]'") from None
    files = [path] if path.suffix.lower() in (".h5", ".hdf5") else \
        [Path(line.strip()) if Path(line.strip()).is_absolute() else path.parent / line.strip()
         for line in _lines(path) if line.strip()]
    handles, counts = [], []
    for f in files:
        check_regular(f)                  # HDF5's own open of a FIFO would wait for a writer
        try:
            handle = h5py.File(f, "r")
        except OSError as e:
            raise UserError(f"{f}: not a readable HDF5 file ({e})") from None
        missing = [n for n in inputs if n not in handle]
        if missing:
            raise UserError(f"{f}: no dataset {', '.join(map(repr, missing))} for the net's inputs "
                            f"(it has: {', '.join(handle.keys())})")
        sizes = {n: _hdf5_dataset(h5py, handle, n, f).shape[0] for n in inputs}
        if len(set(sizes.values())) != 1:
            raise UserError(f"{f}: the datasets have different numbers of rows: {sizes}")
        handles.append(handle)
        counts.append(next(iter(sizes.values())))
    starts = np.cumsum([0] + counts, dtype=np.int64)
    why = too_big(int(starts[-1]) * 16)           # the row order and its inverse: 8 bytes a row each
    if why:
        raise UserError(f"{path}: {int(starts[-1]):,} rows, whose order alone needs {why}")

    def read(rows: np.ndarray) -> dict:
        parts: dict[str, list] = {n: [] for n in inputs}
        for i, handle in enumerate(handles):
            mine = rows[(rows >= starts[i]) & (rows < starts[i + 1])] - starts[i]
            if len(mine):
                for n in inputs:
                    parts[n].append(np.asarray(handle[n][mine]))
        return {n: np.concatenate(v) if v else np.empty((0,), np.float32) for n, v in parts.items()}
    return LazyDataset(int(starts[-1]), read)


def _hdf5_dataset(h5py, handle, name: str, file: Path):
    """The dataset ``name`` of an HDF5 file, refused unless its data is numbers held in that file
    itself, every row of it. HDF5 lets a dataset read its bytes from another file (external
    storage: any file, a FIFO, /etc/passwd; a virtual dataset; an external link): a training
    source reads the files it is given, nothing they name. And a dataset claims its shape: rows
    never written read as the fill value, so a file of 2 kB can claim 10^12 rows; only rows whose
    bytes the file holds are counted as examples."""
    where = f"{file}: dataset '{name}'"
    link = handle.get(name, getlink=True)
    if isinstance(link, h5py.ExternalLink):
        raise UserError(f"{where} is a link into another file ({link.filename}); a source's datasets must be "
                        "held in the file itself")
    dataset = handle[name]
    if not isinstance(dataset, h5py.Dataset):
        raise UserError(f"{where} is a group, not a dataset")
    if dataset.is_virtual:
        raise UserError(f"{where} is a virtual dataset, read from other files; a source's datasets must be held "
                        "in the file itself")
    if dataset.id.get_create_plist().get_external_count():
        raise UserError(f"{where} uses external storage: its data would be read from a file it names; a source's "
                        "datasets must be held in the file itself")
    if dataset.dtype.kind not in "biuf":
        raise UserError(f"{where} holds {dataset.dtype}, not numbers")
    if not dataset.shape:
        raise UserError(f"{where} is a single value (0-d); a source's datasets hold one row per example")
    claimed = int(np.prod(dataset.shape, dtype=object)) * dataset.dtype.itemsize
    row = claimed // dataset.shape[0] if dataset.shape[0] else 0
    why = too_big(row)
    if why:
        raise UserError(f"{where}: one example is {human_bytes(row)}, {why}")
    if dataset.chunks is not None:
        why = too_big(int(np.prod(dataset.chunks, dtype=object)) * dataset.dtype.itemsize)
        if why:
            raise UserError(f"{where}: its chunks are read whole, and one is {why}")
        expected = int(np.prod([-(-n // c) for n, c in zip(dataset.shape, dataset.chunks)], dtype=object))
        held = dataset.id.get_num_chunks() if expected else 0
    else:
        expected, held = claimed, dataset.id.get_storage_size()
    if held < expected:
        raise UserError(f"{where} claims {dataset.shape[0]:,} rows ({human_bytes(claimed)}) but the file holds "
                        "the data of only part of them (the rest were never written)")
    return dataset


# Caffe's Datum (caffe.proto): channels 1, height 2, width 3, data 4, label 5, float_data 6, encoded 7
DATUM_FIELDS = {1: "channels", 2: "height", 3: "width", 4: "data", 5: "label", 6: "float_data", 7: "encoded"}


def parse_datum(raw: bytes) -> dict:
    """A Datum's fields, read by protobuf's wire format (the fields are few and fixed)."""
    out: dict = {"float_data": []}
    pos, end = 0, len(raw)

    def varint():
        nonlocal pos
        shift = value = 0
        while True:
            if pos >= end or shift > 63:
                raise ValueError("a truncated varint")
            byte = raw[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
    while pos < end:
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            value = varint()
            if field in DATUM_FIELDS:
                out[DATUM_FIELDS[field]] = value
        elif wire == 2:
            length = varint()
            if pos + length > end:
                raise ValueError("a field longer than the record")
            chunk = raw[pos:pos + length]
            pos += length
            if field == 4:
                out["data"] = chunk
            elif field == 6:
                out["float_data"].extend(np.frombuffer(chunk, "<f4").tolist())
        elif wire == 5:
            if pos + 4 > end:
                raise ValueError("a truncated float")
            if field == 6:
                out["float_data"].append(float(np.frombuffer(raw[pos:pos + 4], "<f4")[0]))
            pos += 4
        elif wire == 1:
            pos += 8
        else:
            raise ValueError(f"wire type {wire}")
    if out.get("label", 0) >= 1 << 63:                # int32 as a varint: a negative one sign-extended to 64 bits
        out["label"] -= 1 << 64
    if not LABEL_RANGE[0] <= out.get("label", 0) <= LABEL_RANGE[1]:
        raise ValueError(f"a label of {out['label']}, past Datum.label's int32")
    return out


def _datum_array(datum: dict, where: str) -> np.ndarray:
    """A record's [C, H, W] floats; ``where`` names the database and the record."""
    c, h, w = (int(datum.get(k, 0)) for k in ("channels", "height", "width"))
    if datum.get("encoded"):
        def prepare(image) -> np.ndarray:
            array = np.asarray(image.convert("RGB" if c == 3 else "L"), dtype=np.float32)
            array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)[::-1]    # RGB -> Caffe's BGR
            return np.ascontiguousarray(array)
        return decode_image(datum.get("data", b""), where, prepare)
    count = c * h * w
    if datum.get("data"):
        if len(datum["data"]) != count:
            raise UserError(f"{where} says {c} x {h} x {w} but holds {len(datum['data'])} bytes")
        return np.frombuffer(datum["data"], np.uint8).astype(np.float32).reshape(c, h, w)
    if len(datum["float_data"]) != count:
        raise UserError(f"{where} says {c} x {h} x {w} but holds {len(datum['float_data'])} floats")
    return np.asarray(datum["float_data"], np.float32).reshape(c, h, w)


def _lmdb(path: Path, inputs: dict, data_spec) -> LazyDataset:
    try:
        import lmdb
    except ImportError:
        raise UserError("an LMDB source needs lmdb: pip install 'yamlnet-toolkit[caffe]'") from None
    try:
        env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, max_readers=16)
    except lmdb.Error as e:
        raise UserError(f"{path}: not a readable LMDB ({e})") from None
    with env.begin() as txn:
        keys = [key for key, _ in txn.cursor()]

    def get(key: bytes) -> bytes:
        with env.begin() as txn:
            return txn.get(key)
    return _datums(path, inputs, keys, get)


def _datums(path: Path, inputs: dict, keys: list, get: Callable[[bytes], bytes]) -> LazyDataset:
    """A key-value store of Datum records, read a batch at a time by ``get(key)``."""
    features, label = _roles(inputs)
    if not keys:
        raise UserError(f"{path}: a database with no records")

    def record(r: int) -> tuple[np.ndarray, int]:
        where = f"{path}: record {keys[r]!r}"
        try:
            datum = parse_datum(get(keys[r]))
        except ValueError as e:
            raise UserError(f"{where} is not a Caffe Datum ({e})") from None
        return _datum_array(datum, where), datum.get("label", 0)
    # every record has the first one's shape, as Caffe's Data layer has them (its top is shaped by
    # the first); checked per record, since batches are stacked and a database is read in parts
    shape = record(0)[0].shape

    def read(rows: np.ndarray) -> dict:
        images, labels = [], []
        for r in rows:
            image, number = record(r)
            if image.shape != shape:
                raise UserError(f"{path}: record {keys[r]!r} is {' x '.join(map(str, image.shape))} but the first "
                                f"record ({keys[0]!r}) is {' x '.join(map(str, shape))}; a database's records "
                                "share one shape")
            images.append(image)
            labels.append(number)
        out = {features: np.stack(images) if images else np.empty((0,), np.float32)}
        if label:
            out[label] = np.asarray(labels, dtype=np.int64)
        return out
    return LazyDataset(len(keys), read)


def _leveldb(path: Path, inputs: dict, data_spec) -> LazyDataset:
    try:
        import plyvel
    except ImportError:
        raise UserError("a LevelDB source needs plyvel: pip install 'yamlnet-toolkit[caffe]'") from None
    key = str(path.resolve())
    db = _LEVELDBS.get(key)               # LevelDB locks its folder: one handle per process
    if db is None:
        try:
            db = _LEVELDBS[key] = plyvel.DB(str(path), create_if_missing=False)
        except (plyvel.Error, OSError) as e:
            raise UserError(f"{path}: not a readable LevelDB ({e}; LevelDB lets one process open it at a time)") \
                from None
    keys = [key for key in db.iterator(include_value=False)]
    return _datums(path, inputs, keys, db.get)


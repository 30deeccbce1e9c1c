"""Training data: sources (builtin:digits, .npz, a folder of .npy, CSV, an image folder), the
train/test split, input transforms, and the seeded batch order.

Every source yields arrays keyed by the net's input names, one row per example. Arrays are
checked against the net's inputs (per-example shape and kind) with errors naming the array.
The order of epoch e is a permutation drawn from (seed, e), so iteration i alone says which
examples it sees: resuming needs no data-loader state.
"""
from __future__ import annotations

import gzip
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from ..arrayfiles import (
    IMAGE_SUFFIXES,
    CsvRows,
    image_files,
    image_layout,
    list_folder,
    load_npy,
    load_npz,
    read_image,
    unsupported_format,
)
from ..arrayfiles.images import read_decoded
from ..arrayfiles.transform import Steps
from ..errors import UserError
from ..frontend.train_checks import image_inputs
from ..ir.graph import FLOAT_DTYPES

DATASETS = Path(__file__).parent / "datasets"
# beside a run's (and a published model's) net.yaml: describe_source's findings, for deployment
INPUT_FILE = "input.json"
MAX_INPUT_FILE_BYTES = 4 << 20        # room for a labels file's names (arrayfiles.labels bounds them)


@dataclass
class Dataset:
    arrays: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def take(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return {k: v[rows] for k, v in self.arrays.items()}


def _roles(inputs: dict) -> tuple[str, str]:
    """(features input, label input) for sources that carry images and labels."""
    floats = [n for n, s in inputs.items() if s.dtype in FLOAT_DTYPES]
    ints = [n for n, s in inputs.items() if s.dtype not in FLOAT_DTYPES]
    if len(floats) != 1 or len(ints) != 1:
        raise UserError("this data source gives features and labels, so the net needs exactly one float input "
                        f"and one integer input (it has: {', '.join(inputs)})")
    return floats[0], ints[0]


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 8x8 digits (pixels 0..16) as [n, 1, 8, 8] float32 and their int64 labels."""
    with gzip.open(DATASETS / "digits.csv.gz", "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    return table[:, :64].reshape(-1, 1, 8, 8), table[:, 64].astype(np.int64)


def _load_npy_folder(path: Path, inputs: dict) -> dict[str, np.ndarray]:
    files = {name: path / f"{name}.npy" for name in inputs}
    return {name: load_npy(str(f)) for name, f in files.items() if f.is_file()}


def _load_csv(path: Path, inputs: dict) -> dict[str, np.ndarray]:
    """Numeric CSV: the label column is the one named after the integer input (header row), or
    the last column; the other columns are the features, in order."""
    features, label = _roles(inputs)
    table = CsvRows(str(path), np.float64)
    try:
        values = table.read_all()
    finally:
        table.close()
    header = table.header
    label_col = header.index(label) if header and label in header else table.columns - 1
    y = values[:, label_col]
    x = np.delete(values, label_col, axis=1)
    if not np.all(np.isfinite(y) & (y == np.round(y))):
        raise UserError(f"{path}: the label column '{header[label_col] if header else label_col}' holds non-integers")
    return {features: x.astype(np.float32), label: y.astype(np.int64)}


def _load_image_folder(path: Path, inputs: dict) -> dict[str, np.ndarray]:
    """One subfolder per class (sorted names are the class indices); images resized to the input's H x W."""
    features, label = _roles(inputs)
    layout = image_layout(str(path), features, inputs[features].shape)
    classes = [d for d in list_folder(str(path)) if d.is_dir()]
    if not classes:
        raise UserError(f"{path}: an image folder needs one subfolder per class")
    xs, ys = [], []
    for index, folder in enumerate(classes):
        for f in image_files(str(folder)):
            xs.append(read_image(f, layout))
            ys.append(index)
    if not xs:
        raise UserError(f"{path}: the class subfolders have no image files ({', '.join(IMAGE_SUFFIXES)})")
    return {features: np.stack(xs), label: np.array(ys, dtype=np.int64)}


def load_source(source: str, inputs: dict, base: Path | None = None) -> dict[str, np.ndarray]:
    if source == "builtin:digits":
        features, label = _roles(inputs)
        x, y = load_digits()
        return {features: x, label: y}
    if source.startswith("builtin:"):
        raise UserError(f"unknown builtin data set '{source}' (available: builtin:digits)")
    path = Path(source)
    if base is not None and not path.is_absolute() and not path.exists():
        path = base / path
    if not path.exists():
        raise UserError(f"data source {source}: no such file or folder")
    from .sources import kind_of, open_lazy
    kind = kind_of(path)
    if kind is not None:                          # a Caffe source, read whole (publishing bundles it)
        from schemas.train import DataSpec
        lazy = open_lazy(kind, path, inputs, DataSpec())
        return lazy.arrays
    if path.is_dir():
        npy = _load_npy_folder(path, inputs)
        return npy if npy else _load_image_folder(path, inputs)
    if path.suffix == ".npz":
        return load_npz(str(path))
    if path.suffix == ".csv":
        return _load_csv(path, inputs)
    raise unsupported_format(source, "data", "builtin:digits, .npz, .csv, a folder of .npy files or an image folder")


def describe_source(source: str, inputs: dict, base: Path | None = None) -> dict:
    """What deployment needs to know of a training source beyond the transform: the class names
    of an image folder (its sorted subfolders, which are the label indices), the column names of
    a CSV with a header and which one is the label. Empty for other sources."""
    if source.startswith("builtin:"):
        return {}
    path = Path(source)
    if base is not None and not path.is_absolute() and not path.exists():
        path = base / path
    if path.is_dir() and not _load_npy_folder_names(path, inputs):
        features, _label = _roles(inputs)
        about: dict = {"classes": [d.name for d in list_folder(str(path)) if d.is_dir()]}
        shape = inputs[features].shape
        if len(shape) == 4:          # how image files become the input: resized, and grey or RGB
            about["image"] = {"input": features, "height": shape[2], "width": shape[3], "channels": shape[1],
                              "colour": {1: "grey", 3: "rgb"}.get(shape[1], f"{shape[1]} channels")}
        return about
    if path.suffix == ".csv" and path.is_file():
        table = CsvRows(str(path), np.float64)
        table.close()
        if table.header:
            _features, label = _roles(inputs)
            label_col = table.header.index(label) if label in table.header else table.columns - 1
            return {"columns": table.header, "label_column": table.header[label_col]}
    return {}


def recorded_input(net_file: str) -> dict:
    """The input.json beside a net file (a run folder's or a published model's), checked; {}
    where there is none."""
    import json

    from ..fileio import read_regular
    path = Path(net_file).parent / INPUT_FILE
    if not path.is_file():
        return {}
    try:
        about = json.loads(read_regular(str(path), MAX_INPUT_FILE_BYTES, "input description"))
    except (ValueError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a JSON input description ({e})") from None
    if not isinstance(about, dict):
        raise UserError(f"{path}: not a JSON object")
    for key in ("classes", "columns"):
        value = about.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise UserError(f"{path}: '{key}' is not a list of names")
    if about.get("label_column") is not None and not isinstance(about["label_column"], str):
        raise UserError(f"{path}: 'label_column' is not a name")
    if about.get("classes") is not None:
        from ..arrayfiles.labels import check_names
        check_names(about["classes"], f"{path}: 'classes'")
    return about


def _load_npy_folder_names(path: Path, inputs: dict) -> list[str]:
    return [name for name in inputs if (path / f"{name}.npy").is_file()]


def fit_to_inputs(arrays: dict[str, np.ndarray], inputs: dict, source: str, crop_size: int | None = None) -> Dataset:
    """Check and cast arrays to the net's inputs. An array whose per-example size equals the
    input's is reshaped to it (so 8x8 digits feed a [N, 64] input). With ``crop_size``, image
    inputs' examples may be larger than the input (the crop takes the input's size)."""
    out = {}
    images = set(image_inputs(inputs)) if crop_size else set()
    for name, spec in inputs.items():
        if name not in arrays:
            raise UserError(f"data source {source}: no array '{name}' for the net's input '{name}' "
                            f"(it has: {', '.join(arrays) or 'nothing'})")
        arr = np.asarray(arrays[name])
        want = spec.shape[1:]
        fixed = all(isinstance(d, int) for d in want)
        if arr.ndim == 0:
            raise UserError(f"data source {source}: array '{name}' is a single number, not one row per example")
        if name in images and arr.ndim == 4 and arr.shape[1] == want[0] and min(arr.shape[2:]) >= crop_size:
            pass                               # cropped to the input's size per batch
        elif fixed and tuple(arr.shape[1:]) != tuple(want):
            if int(np.prod(arr.shape[1:])) == int(np.prod(want)):
                arr = arr.reshape((arr.shape[0],) + tuple(want))
            else:
                raise UserError(f"data source {source}: array '{name}' has examples of shape {list(arr.shape[1:])}, "
                                f"the net's input '{name}' needs {list(want)}")
        elif not fixed and arr.ndim != 1 + len(want) and sum(not isinstance(d, int) for d in want) == 1:
            # one symbolic dim (a sequence length T): the examples' size gives it, as a fixed
            # input's does its shape (8x8 digits feed [N, T, 8] as 8 rows of 8)
            known = int(np.prod([d for d in want if isinstance(d, int)]))
            if int(np.prod(arr.shape[1:])) % known:
                raise UserError(f"data source {source}: array '{name}' has examples of shape {list(arr.shape[1:])}, "
                                f"which no {'x'.join(str(d) for d in want)} holds")
            arr = arr.reshape((arr.shape[0],) + tuple(d if isinstance(d, int) else -1 for d in want))
        if arr.dtype.kind not in "fiub":
            raise UserError(f"data source {source}: array '{name}' has dtype {arr.dtype}, not numbers")
        if spec.dtype not in FLOAT_DTYPES:
            if arr.dtype.kind == "f" and not np.all(np.isfinite(arr) & (arr == np.round(arr))):
                raise UserError(f"data source {source}: array '{name}' holds non-integers, the input is {spec.dtype}")
            arr = arr.astype(spec.dtype)
        out[name] = arr
    lengths = {k: len(v) for k, v in out.items()}
    if len(set(lengths.values())) != 1:
        raise UserError(f"data source {source}: arrays have different numbers of examples: "
                        + ", ".join(f"{k} {n}" for k, n in lengths.items()))
    if not next(iter(lengths.values())):
        raise UserError(f"data source {source}: no examples")
    return Dataset(out)


@dataclass
class InputTransform:
    """The net's input transform, declared once: its top-level ``transform`` (a preset and keys)
    or its ``train.data``'s (Caffe's transform_param), as ``Steps`` per float input (docs/spec.md
    section 3). ``toolkit infer``, ``toolkit serve``, ``toolkit.load`` and training's test passes
    apply it through this one entry point: ``__call__`` on arrays, ``image_reader`` for image
    files, ``prepare_image`` for an image already decoded."""
    inputs: dict                 # the net's input specs
    steps: dict                  # input name -> Steps
    source: str                  # where it is declared, in words

    @classmethod
    def of(cls, net) -> "InputTransform | None":
        """The net's transform, or None where it declares none."""
        spec = net.spec
        base = Path(net.file).parent
        declared = getattr(spec, "transform", None)
        if declared is not None:
            values, source = declared.resolved(), "the net's transform"
            where = "transform"
        else:
            data = spec.train.data if spec.train else None
            if data is None or all(getattr(data, k) is None for k in ("scale", "mean", "mean_value", "mean_file",
                                                                        "crop_size")):
                return None
            values = {"scale": data.scale, "mean": data.mean if data.mean is not None else data.mean_value,
                      "mean_file": data.mean_file, "crop_size": data.crop_size}
            if data.new_height and data.new_width:     # an image list's images are resized so before the crop
                values["resize"] = [data.new_height, data.new_width]
            values, source, where = {k: v for k, v in values.items() if v is not None}, "the net's train.data", \
                "train.data"
        floats = [n for n, s in spec.inputs.items() if s.dtype in FLOAT_DTYPES]
        names = values.pop("inputs", None) or floats
        if not names:
            return None                  # no float input: nothing to transform
        for name in names:
            if name not in floats:
                raise UserError(f"{net.file}: {where}.inputs names '{name}', which is not one of the net's float "
                                f"inputs ({', '.join(floats) or 'none'})")
        mean = values.get("mean")
        if values.get("mean_file") is not None:
            mean = np.squeeze(mean_of(SimpleNamespace(mean_file=values["mean_file"]), base), 0)
        steps = {}
        for name in names:
            shape = spec.inputs[name].shape
            crop = values.get("crop_size")
            if crop is None and values.get("resize") is not None and len(shape) == 4 \
                    and all(isinstance(d, int) for d in shape[2:]):
                crop = [shape[2], shape[3]]          # after a resize, the centre crop of the input's size
            steps[name] = Steps(channel_order=values.get("channel_order", "rgb"), resize=_size(values.get("resize")),
                                interpolation=values.get("interpolation", "bilinear"), crop=_size(crop, pair=True),
                                crop_offset=values.get("crop_offset", "floor"), raw_scale=values.get("raw_scale"),
                                mean=mean, std=values.get("std"), scale=values.get("scale"))
        return cls(spec.inputs, steps, source)

    @property
    def applies_to(self) -> list[str]:
        return list(self.steps)

    @property
    def heading(self) -> str:
        """How the commands introduce it: training's transform, or a deploy net's own."""
        return "as in training" if self.source == "the net's train.data" else "as the net declares"

    def __call__(self, arrays: dict[str, np.ndarray], dtype: str | None = None, crop: bool = True
                 ) -> dict[str, np.ndarray]:
        """The tensor steps on each transformed input (RGB, raw values) -> the net's inputs, in
        ``dtype`` (default: a float array's own, else the input's). ``crop`` False leaves the
        centre crop out (training crops at random)."""
        out = dict(arrays)
        for name, steps in self.steps.items():
            if name in arrays:
                arr = np.asarray(arrays[name])
                kind = dtype or (str(arr.dtype) if arr.dtype.kind == "f" else self.inputs[name].dtype)
                out[name] = (steps if crop else replace(steps, crop=None))(arr, kind, name)
        return out

    def shapes(self, shapes: dict[str, tuple]) -> dict[str, tuple]:
        """Input shapes as the transform leaves them (an array larger than the crop, cropped)."""
        out = dict(shapes)
        for name, steps in self.steps.items():
            shape = shapes.get(name)
            if steps.crop and shape is not None and len(shape) == 4 and all(isinstance(d, int) for d in shape[2:]) \
                    and shape[2] >= steps.crop[0] and shape[3] >= steps.crop[1]:
                out[name] = tuple(shape[:2]) + steps.crop
        return out

    def image_reader(self, name: str, layout: tuple[int, int, int]):
        """(the [C, H, W] an image file for input ``name`` of ``layout`` is read as, the reader:
        path -> that array: decoded, resized and centre-cropped), or (layout, None) to warp it."""
        steps = self.steps.get(name)
        if steps is None:
            return layout, None
        c, h, w = layout

        def read(path: str) -> np.ndarray:
            return read_decoded(path, lambda img: steps.prepare_image(img, c, (h, w), path))
        return (c,) + tuple(steps.image_size((h, w))), read

    def prepare_image(self, name: str, img, where: str) -> np.ndarray:
        """A decoded PIL image for input ``name`` -> [C, H, W] as an image file is read (before
        the tensor steps, which ``__call__`` applies to the stacked batch)."""
        c, h, w = self.inputs[name].shape[1:]
        steps = self.steps.get(name, Steps())
        return steps.prepare_image(img, c, (h, w), where)

    def record(self) -> dict:
        """The transform as plain data: the ONNX export's nodes and metadata."""
        return {"inputs": list(self.steps), "steps": {name: s.record() for name, s in self.steps.items()},
                "source": self.source}

    def describe(self) -> str:
        texts = {name: s.describe() for name, s in self.steps.items()}
        if len(set(texts.values())) == 1:
            return f"{', '.join(texts)}: {next(iter(texts.values()))} ({self.source})"
        return "; ".join(f"{name}: {text}" for name, text in texts.items()) + f" ({self.source})"


def _size(value, pair: bool = False):
    """A size from a net file (a number or [H, W]) as Steps takes it: a pair, or the number for a
    shorter-side resize."""
    if value is None:
        return None
    if isinstance(value, int):
        return (value, value) if pair else value
    return (int(value[0]), int(value[1]))


def data_files(net) -> list[tuple[str, str]]:
    """The files of the net's train.data sources, where training may read them (as given, and
    beside the net file that names them), as (what, path) pairs: no output may replace them."""
    data = net.spec.train.data if net.spec.train is not None else None
    found = []
    for key in ("source", "test_source"):
        named = getattr(data, key, None) if data is not None else None
        if named and not named.startswith("builtin:"):
            found += [(f"train.data.{key}", named), (f"train.data.{key}", str(data_folder(net, key) / named))]
    return found


def mean_path(named: str, base: Path | None) -> Path:
    """Where a net's ``mean_file`` is: beside the net (``base``, its folder) unless absolute;
    never the current folder first, where another mean of that name would be used silently."""
    path = Path(named)
    return path if base is None or path.is_absolute() else Path(base) / path


def mean_declared(net) -> tuple[tuple[str, ...], str] | None:
    """(the key that names the net's mean image file, the name as written), or None."""
    declared = getattr(net.spec, "transform", None)
    if declared is not None and declared.mean_file is not None:
        return ("transform", "mean_file"), declared.mean_file
    if declared is None and net.spec.train is not None and net.spec.train.data.mean_file is not None:
        return ("train", "data", "mean_file"), net.spec.train.data.mean_file
    return None


def mean_file_of(net) -> Path | None:
    """The mean image file the net names (as ``mean_of`` finds it: beside the net), or None."""
    found = mean_declared(net)
    return None if found is None else mean_path(found[1], Path(net.file).parent)


def carried_name(named: str) -> str:
    """The plain file name a mean image travels under in a run or a published model folder: its
    own name where that is one, else "mean.npy"."""
    import re
    name = Path(named).name
    return name if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*", name) else "mean.npy"


def data_folder(net, key: str) -> Path:
    """The folder of the file that wrote ``train.data.KEY``: a relative data path in a base file
    is relative to that base, as its ``base:`` paths are."""
    return Path(net.positions.locate(("train", "data", key), prefer_key=False).file).parent


def mean_of(data_spec, base: Path | None = None, ndim: int = 4):
    """The mean subtracted from float inputs, shaped to broadcast over [N, C, ...]: a number, one
    value per channel (``mean`` as a list, or ``mean_value``), or a mean image [C, H, W]
    (``mean_file``, an .npy, relative to the net file); None without one."""
    if data_spec.mean_file is not None:
        path = mean_path(data_spec.mean_file, base)
        if not path.is_file():
            raise UserError(f"train.data.mean_file {data_spec.mean_file}: no such file")
        image = np.asarray(load_npy(str(path)), dtype=np.float64)
        if image.ndim != 3:
            raise UserError(f"train.data.mean_file {data_spec.mean_file}: a mean image is [C, H, W], this one is "
                            f"{list(image.shape)}")
        return image[None]
    values = data_spec.mean_value if data_spec.mean_value is not None else data_spec.mean
    if values is None:
        return None
    mean = np.asarray(values, dtype=np.float64)
    if mean.ndim == 1 and ndim >= 2:
        mean = mean.reshape((1, -1) + (1,) * (ndim - 2))
    return mean


def transform(arrays: dict[str, np.ndarray], inputs: dict, data_spec, dtype: str,
              base: Path | None = None) -> dict[str, np.ndarray]:
    """Caffe's input transform on float inputs: (x - mean) * scale, then the net's dtype (the
    crop and mirror come after, per batch: ``augment``)."""
    out = {}
    for name, arr in arrays.items():
        if name in inputs and inputs[name].dtype in FLOAT_DTYPES:      # not the lengths
            arr = arr.astype(dtype if dtype else inputs[name].dtype)
            mean = mean_of(data_spec, base, arr.ndim)
            if mean is not None:
                try:
                    arr = arr - mean.astype(arr.dtype)
                except ValueError:
                    raise UserError(f"the mean of train.data has shape {list(mean.shape[1:]) or 'a number'}, "
                                    f"input '{name}' has examples of shape {list(arr.shape[1:])}") from None
            if data_spec.scale is not None:
                arr = arr * np.asarray(data_spec.scale, dtype=arr.dtype)
        out[name] = arr
    return out


def center_crop(arr: np.ndarray, size: int) -> np.ndarray:
    """The centre size x size of [N, C, H, W] (Caffe's test-time crop: offsets (H - size) // 2)."""
    h, w = arr.shape[2:]
    if (h, w) == (size, size):
        return arr
    top, left = (h - size) // 2, (w - size) // 2
    return np.ascontiguousarray(arr[:, :, top:top + size, left:left + size])


def augment(arrays: dict[str, np.ndarray], inputs: dict, data_spec, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A training batch's random crop (one offset per example, as Caffe draws them) and random
    left-right mirror (each example with probability 1/2), from ``rng``."""
    size, mirror = data_spec.crop_size, data_spec.mirror
    out = dict(arrays)
    for name in image_inputs(inputs):
        arr = arrays[name]
        n, c, h, w = arr.shape
        if size is None and not mirror:
            continue
        size_h, size_w = (size, size) if size is not None else (h, w)
        tops = rng.integers(0, h - size_h + 1, n) if size is not None else np.zeros(n, int)
        lefts = rng.integers(0, w - size_w + 1, n) if size is not None else np.zeros(n, int)
        flips = rng.random(n) < 0.5 if mirror else np.zeros(n, bool)
        batch = np.empty((n, c, size_h, size_w), arr.dtype)
        for k in range(n):
            piece = arr[k, :, tops[k]:tops[k] + size_h, lefts[k]:lefts[k] + size_w]
            batch[k] = piece[:, :, ::-1] if flips[k] else piece
        out[name] = batch
    return out


def split(dataset, fraction: float, seed: int):
    """A seeded shuffled split: the last ``fraction`` of a permutation is the test set (of a
    dataset read a batch at a time, as index subsets, nothing read)."""
    if not fraction:
        return dataset, None
    order = np.random.default_rng([seed, 7919]).permutation(len(dataset))
    n_test = max(1, int(round(len(dataset) * fraction)))
    train_rows, test_rows = np.sort(order[n_test:]), np.sort(order[:n_test])
    if not isinstance(dataset, Dataset):
        from .sources import Subset
        return Subset(dataset, train_rows), Subset(dataset, test_rows)
    return Dataset(dataset.take(train_rows)), Dataset(dataset.take(test_rows))


class BatchOrder:
    """Which rows iteration i reads: epochs of ceil(n / batch) iterations, the last one short."""

    def __init__(self, n: int, batch: int, shuffle: bool, seed: int):
        self.n, self.batch, self.shuffle, self.seed = n, batch, shuffle, seed
        self.per_epoch = -(-n // batch)
        self._cache: tuple[int, np.ndarray] | None = None

    def epoch_order(self, epoch: int) -> np.ndarray:
        if self._cache and self._cache[0] == epoch:
            return self._cache[1]
        order = (np.random.default_rng([self.seed, epoch]).permutation(self.n) if self.shuffle
                 else np.arange(self.n))
        self._cache = (epoch, order)
        return order

    def rows(self, i: int) -> np.ndarray:
        epoch, k = divmod(i, self.per_epoch)
        return self.epoch_order(epoch)[k * self.batch: (k + 1) * self.batch]

"""Reading input arrays and writing output arrays for the commands (npy / npz, pickle refused)."""
from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Mapping

import numpy as np

from ..errors import UserError
from ..fileio import atomic_write


def _load_array_file(path: str) -> dict[str, np.ndarray] | np.ndarray:
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
    try:
        data = np.load(path, allow_pickle=False)
    except ValueError as e:
        if "pickle" in str(e).lower():
            raise UserError(f"{path}: holds pickled objects, which are refused (they can run code)") from None
        raise UserError(f"{path}: not a readable {p.suffix} file ({e})") from None
    except (OSError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(f"{path}: not a readable {p.suffix} file ({e})") from None
    if isinstance(data, np.lib.npyio.NpzFile):
        with data:
            try:
                return {k: data[k] for k in data.files}
            except ValueError as e:
                raise UserError(f"{path}: holds pickled objects, which are refused ({e})") from None
    return data


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def _read_csv(path: str) -> np.ndarray:
    """A numeric CSV as [rows, columns] float32; a first row that is not numbers is a header."""
    import csv
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.reader(f) if r]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not a readable CSV file ({e})") from None
    if rows:
        try:
            [float(x) for x in rows[0]]
        except ValueError:
            rows = rows[1:]
    if not rows:
        raise UserError(f"{path}: the CSV file has no data rows")
    if len({len(r) for r in rows}) != 1:
        raise UserError(f"{path}: the CSV rows have different numbers of columns")
    try:
        return np.array([[float(x) for x in r] for r in rows], dtype=np.float32)
    except ValueError as e:
        raise UserError(f"{path}: non-numeric value in the CSV ({e})") from None


def _read_image(path: str, example_shape: tuple) -> np.ndarray:
    """One image as a batch of one, converted and resized to the input's [C, H, W] (C 1 or 3)."""
    if len(example_shape) != 3 or not all(isinstance(d, int) for d in example_shape) or example_shape[0] not in (1, 3):
        raise UserError(f"{path}: an image feeds an input shaped [N, 1 or 3, H, W] with fixed sizes")
    c, h, w = example_shape
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(path) as img:
            arr = np.asarray(img.convert("L" if c == 1 else "RGB").resize((w, h)), dtype=np.float32)
    except (UnidentifiedImageError, OSError) as e:
        raise UserError(f"{path}: not a readable image ({e})") from None
    return (arr[None] if c == 1 else arr.transpose(2, 0, 1))[None]


def read_inputs(specs: list[str], needed: list[str], all_inputs: list[str],
                shapes: dict[str, tuple] | None = None) -> dict[str, np.ndarray]:
    """``[NAME=]FILE`` items -> arrays by input name. An unnamed file goes to the only needed
    input; an .npz gives arrays by name (arrays for inputs this phase does not use are ignored).
    Images and CSV rows are stacked along the batch when the same input is given several times;
    their examples take the input's shape when the sizes agree (a 64-column row feeds [N, 1, 8, 8])."""
    shapes = shapes or {}
    arrays: dict[str, np.ndarray] = {}
    stacked: dict[str, list[np.ndarray]] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        suffix = Path(path).suffix.lower()
        if suffix == ".npz":
            loaded = _load_array_file(path)
            if name:
                if name not in loaded:
                    raise UserError(f"{path}: has no array '{name}' (it has: {', '.join(loaded) or 'none'})")
                loaded = {name: loaded[name]}
            for key, arr in loaded.items():
                if key not in all_inputs:
                    raise UserError(f"{path}: array '{key}' matches no input of the net "
                                    f"(inputs: {', '.join(all_inputs)})")
                if key in needed:
                    if key in arrays or key in stacked:
                        raise UserError(f"--input {spec}: input '{key}' is given twice")
                    arrays[key] = arr
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
        if not Path(path).is_file():
            raise UserError(f"{path}: no such file")
        example = tuple(shapes.get(name, ())[1:])
        if suffix == ".csv" or suffix in IMAGE_SUFFIXES:
            if name in arrays:
                raise UserError(f"--input {spec}: input '{name}' is given twice")
            piece = _read_csv(path) if suffix == ".csv" else _read_image(path, example)
            stacked.setdefault(name, []).append(_fit_examples(piece, example, path))
            continue
        if name in arrays or name in stacked:
            raise UserError(f"--input {spec}: input '{name}' is given twice")
        arrays[name] = _load_array_file(path)
    for name, pieces in stacked.items():
        arrays[name] = np.concatenate(pieces)
    missing = [n for n in needed if n not in arrays]
    if missing:
        raise UserError(f"no array given for input {', '.join(repr(m) for m in missing)}")
    return arrays


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

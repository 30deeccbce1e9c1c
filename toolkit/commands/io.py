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
        raise UserError(f"{path}: unsupported input format '{p.suffix}' (use .npy or .npz)")
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


def read_inputs(specs: list[str], needed: list[str], all_inputs: list[str]) -> dict[str, np.ndarray]:
    """``[NAME=]FILE`` items -> arrays by input name. An unnamed .npy goes to the only needed
    input; an .npz gives arrays by name (arrays for inputs this phase does not use are ignored)."""
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        loaded = _load_array_file(path)
        if isinstance(loaded, dict):
            if name:
                if name not in loaded:
                    raise UserError(f"{path}: has no array '{name}' (it has: {', '.join(loaded) or 'none'})")
                loaded = {name: loaded[name]}
            for key, arr in loaded.items():
                if key not in all_inputs:
                    raise UserError(f"{path}: array '{key}' matches no input of the net "
                                    f"(inputs: {', '.join(all_inputs)})")
                if key in needed:
                    arrays[key] = arr
            continue
        if not name:
            if len(needed) != 1:
                raise UserError(f"{path}: say which input it is (NAME={path}); the net needs "
                                f"{', '.join(needed)}")
            name = needed[0]
        if name not in all_inputs:
            raise UserError(f"--input {spec}: the net has no input '{name}' (inputs: {', '.join(all_inputs)})")
        if name in needed:
            arrays[name] = loaded
    missing = [n for n in needed if n not in arrays]
    if missing:
        raise UserError(f"no array given for input {', '.join(repr(m) for m in missing)}")
    return arrays


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

"""ONNX model files read within bounds: the ModelProto (older opsets brought to 13 by ONNX's
version converter) with the tensors it keeps in data files beside it read in (external.py), its
initializers as arrays, kept while the model and its data files are unchanged. Nothing here knows
the graph: layers/onnx converts the nodes; this is what the weights loader, the net-file writer
and the converter share."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ...errors import UserError
from ...fileio import check_regular, read_regular
from ..prototext import undecodable_field
from .external import DataFile, inline_external_data, type_name  # noqa: F401  (type_name: netfile's too)

MAX_MODEL_BYTES = (2 << 30) - 1          # protobuf's own limit on one message
MIN_OPSET = 13


def symbol_name(raw: str) -> str:
    """An ONNX dim_param as a dimension symbol: letters, digits and underscores."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", raw).strip("_") or "d"
    return name if not name[0].isdigit() else f"d{name}"


def read_model(path: str):
    """The ModelProto at ``path``, read whole within protobuf's limit, every tensor's data in it."""
    return read_model_and_data(path)[0]


def read_model_and_data(path: str) -> tuple[object, tuple[DataFile, ...]]:
    """The ModelProto at ``path`` with the tensors it keeps in other files read in (each file
    checked to be a regular file in the model's folder, each size before it is read), and those
    files."""
    try:
        import onnx
    except ImportError:
        raise UserError("reading ONNX models needs the onnx package: pip install 'yamlnet-toolkit[onnx]'") from None
    raw = read_regular(path, MAX_MODEL_BYTES, "ONNX model")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(raw)
    except Exception as e:           # protobuf's DecodeError and its kin
        raise UserError(f"{path}: not a readable ONNX model ({e})") from None
    if not model.HasField("graph") or not model.graph.output:
        raise UserError(f"{path}: not an ONNX model (no graph, or a graph with no output)")
    undecodable = undecodable_field(model)
    if undecodable is not None:
        raise UserError(f"{path}: not a readable ONNX model ({undecodable} is not UTF-8 text)")
    return model, inline_external_data(model, path)


def _upgraded(model, path: str, opset: int):
    """A model of an older opset converted to opset 13 by ONNX's version converter (what the
    importer's op rules are written for)."""
    from onnx import version_converter
    try:
        return version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:           # the converter's own complaint
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path}: opset {opset}, which ONNX's version converter cannot bring to opset {MIN_OPSET} "
                        f"({first[:200]})") from None


def default_opset(model) -> int:
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return versions[0] if versions else 1


@dataclass
class Loaded:
    """A model file read once: the ModelProto (at opset 13 or later), its opset, its initializers,
    and the data files beside it that its tensors were read from (locations relative to its folder)."""
    model: object
    opset: int
    arrays: dict[str, np.ndarray]
    data_files: tuple[DataFile, ...] = ()


_LOADED: dict[tuple, Loaded] = {}


def loaded_model(path: str) -> Loaded:
    """The model at ``path``, kept while the file and its data files are unchanged (a net lowers
    its ONNX layer once per phase, and its weights are read from the same file)."""
    import os
    stat = check_regular(path)
    key = (os.path.realpath(path), stat.st_mtime_ns, stat.st_size)
    if key not in _LOADED or not _unchanged(_LOADED[key].data_files, path):
        model, data_files = read_model_and_data(path)
        loaded = opened(model, path)
        loaded.data_files = data_files
        _LOADED.clear()                # one model at a time: they can be large
        _LOADED[key] = loaded
    return _LOADED[key]


def _unchanged(data_files: tuple[DataFile, ...], path: str) -> bool:
    import os
    folder = os.path.dirname(os.path.abspath(path))
    for f in data_files:
        try:
            st = os.stat(os.path.join(folder, f.location), follow_symlinks=False)
        except OSError:
            return False
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != (f.device, f.inode, f.size, f.mtime_ns):
            return False
    return True


def opened(model, path: str) -> Loaded:
    """A ModelProto at opset 13 or later (older ones converted) with its initializers as arrays."""
    from onnx import numpy_helper
    opset = default_opset(model)
    if opset < MIN_OPSET:
        model, opset = _upgraded(model, path, opset), MIN_OPSET
    arrays = {}
    for init in model.graph.initializer:
        try:
            arrays[init.name] = numpy_helper.to_array(init)
        except Exception as e:         # numpy_helper's complaint about the tensor
            raise UserError(f"{path}: initializer '{init.name}' cannot be read ({e})") from None
    # a transform that toolkit export wrote as nodes in front becomes the net's (netfile.net_dict)
    from .transform import strip_input_transform
    strip_input_transform(model, arrays)
    return Loaded(model, opset, arrays)


def model_inputs(model) -> list:
    """The inputs a caller feeds: the graph's inputs that are not initializers."""
    init = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in init]

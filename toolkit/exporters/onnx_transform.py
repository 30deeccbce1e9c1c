"""An input transform's tensor steps as ONNX nodes at the front of an exported model.

The steps come as plain data, one record per input (``toolkit.arrayfiles.transform.Steps.record``:
channel order, centre crop, raw scale, mean, std, scale); the image-file steps (decode, resize)
have no tensor counterpart and stay with whoever reads the files. The nodes compute what
``Steps.__call__`` computes, in the same order and dtype: the channel order as a Gather on axis 1,
the centre crop as a Slice whose start is computed from the input's run-time Shape (so the batch
and the image's height and width stay dynamic), then Mul, Sub, Div, Mul by constants.

Every node is named under ``PREFIX`` + the input's name, so that an import can tell them from the
net's own nodes and read them back as the net's transform (``toolkit.importers.onnx``).
"""
from __future__ import annotations

import numpy as np

from ..onnxtypes import ONNX_TYPE_NUMBER

PREFIX = "toolkit.input_transform/"
METADATA_KEY = "toolkit.input_transform"


def crop_shape(record: dict) -> tuple[int, int] | None:
    crop = record.get("crop")
    return (int(crop[0]), int(crop[1])) if crop else None


def mean_image_size(record: dict) -> tuple[int, int] | None:
    """(H, W) of a mean image [C, H, W], which fixes the size of what it is subtracted from."""
    mean = record.get("mean")
    arr = np.asarray(mean, dtype=np.float64) if mean is not None else None
    return tuple(int(d) for d in arr.shape[1:]) if arr is not None and arr.ndim == 3 else None


def raw_dims(input_name: str, shape: list, record: dict) -> list:
    """The model input's dims where the transform crops: height and width dynamic, named after the
    input; a mean image's size where there is one."""
    if crop_shape(record) is None or len(shape) != 4:
        return shape
    return list(shape[:2]) + list(mean_image_size(record) or (f"{input_name}_height", f"{input_name}_width"))


def transform_nodes(input_name: str, record: dict, dtype: str, initializer, fresh) -> tuple[list, str]:
    """(the nodes, the name of the transformed value) of ``record``'s steps on the graph input
    ``input_name``. ``initializer(array, hint) -> name`` adds a constant; ``fresh(hint) -> name``
    gives an unused value name."""
    from onnx import helper
    nodes: list = []
    base = PREFIX + input_name

    def node(op: str, inputs: list[str], hint: str, **attrs) -> str:
        out = fresh(f"{base}/{hint}")
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(value, hint: str, kind=None) -> str:
        return initializer(np.asarray(value, dtype=kind or dtype), f"{base}/const_{hint}")

    x = input_name
    if record.get("channel_order") == "bgr":
        x = node("Gather", [x, const([2, 1, 0], "bgr_order", np.int64)], "bgr", axis=1)
    crop = crop_shape(record)
    if crop is not None:
        x = _center_crop(node, const, x, crop, record.get("crop_offset", "floor"), mean_image_size(record))
    if record.get("raw_scale") is not None:
        x = node("Mul", [x, const(record["raw_scale"], "raw_scale")], "raw_scale")
    if record.get("mean") is not None:
        x = node("Sub", [x, const(_per_channel(record["mean"], crop, record.get("crop_offset", "floor")), "mean")],
                 "mean")
    if record.get("std") is not None:
        x = node("Div", [x, const(_per_channel(record["std"], None, "floor"), "std")], "std")
    if record.get("scale") is not None:
        x = node("Mul", [x, const(record["scale"], "scale")], "scale")
    return nodes, x


def _center_crop(node, const, x: str, crop: tuple[int, int], rule: str, static: tuple[int, int] | None) -> str:
    """Slice [H, W] -> crop at the centre: start (size - crop) // 2 (floor) or round((size - crop)
    / 2) half to even (ONNX's Round is half to even, as Python's round), from the run-time shape,
    or from ``static``, the input's fixed size."""
    if static is not None:
        start = [_offset(size, c, rule) for size, c in zip(static, crop)]
        return node("Slice", [x, const(start, "start", np.int64), const([s + c for s, c in zip(start, crop)], "end",
                                                                          np.int64), const([2, 3], "axes", np.int64)],
                    "crop")
    shape = node("Shape", [x], "shape")
    sizes = node("Slice", [shape, const([2], "axis_h", np.int64), const([4], "axis_end", np.int64)], "hw")
    spare = node("Sub", [sizes, const(list(crop), "crop", np.int64)], "spare")
    if rule == "round":
        half = node("Div", [node("Cast", [spare], "spare_f", to=ONNX_TYPE_NUMBER["float64"]),
                            const([2.0, 2.0], "two", np.float64)], "half")
        start = node("Cast", [node("Round", [half], "rounded")], "start", to=ONNX_TYPE_NUMBER["int64"])
    else:
        start = node("Div", [spare, const([2, 2], "two_i", np.int64)], "start")    # spare >= 0: floor
    end = node("Add", [start, const(list(crop), "crop_size", np.int64)], "end")
    return node("Slice", [x, start, end, const([2, 3], "axes", np.int64)], "crop")


def _per_channel(values, crop, rule: str) -> np.ndarray:
    """A number as it is, one value per channel as [1, C, 1, 1], an image [C, H, W] as [1, C, H, W]
    centre-cropped to the crop (as ``Steps`` crops a mean image to what it is subtracted from)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim == 1:
        return arr.reshape(1, -1, 1, 1)
    if arr.ndim == 3:
        if crop is not None and arr.shape[1:] != tuple(crop):
            (h, w), (ch, cw) = arr.shape[1:], crop
            top, left = _offset(h, ch, rule), _offset(w, cw, rule)
            arr = arr[:, top:top + ch, left:left + cw]
        return arr[None]
    return arr


def _offset(total: int, size: int, rule: str) -> int:
    return int(round((total - size) / 2.0)) if rule == "round" else (total - size) // 2

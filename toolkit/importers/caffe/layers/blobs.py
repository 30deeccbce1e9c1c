"""Caffe's blobs as arrays: a BlobProto's values in its shape, and a binaryproto file the
prototxt names (a mean image, an infogain matrix)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ....errors import Location
from ....fileio import read_regular
from .base import Context


def blob_array(blob, loc: Location, ctx: Context, name: str, said: str | None = None) -> np.ndarray | None:
    """The blob's values in its shape; a shape that is not the values' is a Problem, saying
    ``said`` (by default, the caffemodel's blob of layer ``name``)."""
    said = said or f"caffemodel: a weight blob of layer '{name}'"
    dims = [int(d) for d in blob.shape.dim] if blob.HasField("shape") else \
        [d for d in (blob.num, blob.channels, blob.height, blob.width)]
    values = blob.double_data if len(blob.double_data) else blob.data
    if any(d < 0 for d in dims):
        ctx.error(f"{said} says shape {dims}: a dimension is negative", loc)
        return None
    count = math.prod(dims)             # Python ints; an empty shape is a scalar: one value (Caffe's)
    if count != len(values):
        ctx.error(f"{said} says shape {dims} ({count:,} value{'s' * (count != 1)}) but holds {len(values):,}", loc)
        return None
    return np.asarray(values, dtype=np.float32).reshape(dims)


def read_blob_file(given: str, loc: Location, ctx: Context, what: str) -> tuple[np.ndarray | None, bool]:
    """(the array, True) of a binaryproto BlobProto named in the prototxt, looked for as given
    and beside the prototxt (Caffe's paths are relative to where caffe ran); (None, False) where
    it is not here, (None, True) after an error."""
    from ..proto import classes
    found = next((c for c in (Path(given), Path(ctx.file).parent / given) if c.is_file()), None)
    if found is None:
        return None, False
    blob = classes()["BlobProto"]()
    ctx.read.append(str(found))
    try:
        blob.ParseFromString(read_regular(str(found), MAX_BLOB_FILE_BYTES, "binaryproto"))
    except Exception as e:            # protobuf's DecodeError and its kin
        ctx.error(f"{what} {given}: not a readable binaryproto ({e})", loc)
        return None, True
    return blob_array(blob, loc, ctx, what, f"{what} {given}: its blob"), True


MAX_BLOB_FILE_BYTES = (2 << 30) - 1            # protobuf's own limit on one message

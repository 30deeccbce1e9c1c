"""Caffe's Datum records written by hand (protobuf's wire format, no protobuf needed), for the
tests of LMDB and LevelDB sources and of hostile records."""
from __future__ import annotations

import numpy as np


def varint(v: int) -> bytes:
    """protobuf's base-128 varint of ``v`` (a negative as its 64-bit two's complement)."""
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = v & 0x7F
        v >>= 7
        if v:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def datum(image: np.ndarray, label: int) -> bytes:
    """A Caffe Datum (channels 1, height 2, width 3, data 4, label 5) of a uint8 [C, H, W] image."""
    c, h, w = image.shape
    data = image.astype(np.uint8).tobytes()
    return (b"\x08" + varint(c) + b"\x10" + varint(h) + b"\x18" + varint(w)
            + b"\x22" + varint(len(data)) + data + b"\x28" + varint(label))

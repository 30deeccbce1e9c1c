"""Decode Deep Compression's packed SqueezeNet (songhan/SqueezeNet-Deep-Compression,
``compressed_SqueezeNet.net``, 0.66 MB) into an ordinary Caffe ``.caffemodel`` that
``toolkit import caffe --weights`` reads: real ImageNet-trained weights small enough to keep in a
repository snapshot.

The packed file, as its authors' decode script reads it (reimplemented here with numpy alone):

- a header of one little-endian uint32 per weighted layer: how many entries that layer stores.
  The weighted layers are the prototxt's layers whose name holds ``conv`` (or ``fc`` / ``ip``),
  in the file's order;
- then, per layer: its codebook (float32; 256 values for a convolution, 8-bit codes; 16 for an
  inner product, 4-bit codes), its bias (float32, one per output), its codes (one byte each, or two
  4-bit codes a byte, the first in the low nibble), and its gaps (two 4-bit gaps a byte, the first
  in the low nibble);
- an entry lands ``gap + 1`` places after the previous one (the first at ``gap``), in the weight
  blob's flat C order; a place no entry names holds code 0. A run of zeros longer than a 4-bit gap
  is bridged by entries whose code is 0 (the codebook's 0.0), which is why they are "entries" and
  not "non-zeros".

Run: ``python benchmarks/deep_compression.py SqueezeNet_deploy.prototxt compressed_SqueezeNet.net
--out squeezenet.caffemodel``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolkit.errors import UserError  # noqa: E402
from toolkit.importers.caffe.net import read_prototxt  # noqa: E402
from toolkit.importers.caffe.proto import classes  # noqa: E402

# the layers whose blobs the packed file holds, and their code widths (bits)
CODE_BITS = {"Convolution": 8, "InnerProduct": 4}
WEIGHTED_NAME_PARTS = ("conv", "fc", "ip")
SHAPE_KEEPING = {"ReLU", "Dropout", "LRN", "BatchNorm", "Scale", "Softmax"}


def _pair(param, name: str, default: int) -> tuple[int, int]:
    """A Caffe kernel/stride/pad value: ``name`` (one or two values) or ``name_h``/``name_w``."""
    values = [int(v) for v in param.values(name)]
    h = param.value(f"{name}_h", None)
    if h is not None:
        return int(h), int(param.value(f"{name}_w"))
    if not values:
        return default, default
    return (values[0], values[-1])


def weighted_layers(prototxt: str) -> list[tuple[str, str, tuple[int, ...], int]]:
    """(name, type, weight blob shape, bias length) of each layer the packed file holds, in order.

    Channel counts are followed through the net (convolutions set them, concatenations add them,
    the element-wise layers keep them); only what SqueezeNet-like nets use is followed."""
    net = read_prototxt(prototxt)
    dims = [int(v) for v in net.values("input_dim")]
    channels: dict[str, int] = {}
    if dims:
        channels[str(net.values("input")[0]) if net.values("input") else "data"] = dims[1]
    for shape_field in net.all("input_shape"):
        channels[str(net.values("input")[0])] = int(shape_field.value.values("dim")[1])
    out = []
    for layer in [f.value for f in net.all("layer")]:
        kind, name = str(layer.value("type")), str(layer.value("name"))
        bottoms, tops = [str(b) for b in layer.values("bottom")], [str(t) for t in layer.values("top")]
        if kind == "Input":
            channels[tops[0]] = int(layer.value("input_param").value("shape").values("dim")[1])
            continue
        if kind == "Concat":
            channels[tops[0]] = sum(channels[b] for b in bottoms)
            continue
        if kind in ("Convolution", "InnerProduct"):
            param = layer.value("convolution_param" if kind == "Convolution" else "inner_product_param")
            outputs = int(param.value("num_output"))
            if kind == "Convolution":
                kh, kw = _pair(param, "kernel_size", 1)
                group = int(param.value("group", 1))
                shape: tuple[int, ...] = (outputs, channels[bottoms[0]] // group, kh, kw)
            else:
                raise UserError(f"{prototxt}: layer '{name}': inner products need the input's spatial size,"
                                " which this decoder does not follow")
            channels[tops[0]] = outputs
            if any(part in name for part in WEIGHTED_NAME_PARTS):
                out.append((name, kind, shape, outputs))
            continue
        if kind in SHAPE_KEEPING or kind == "Pooling":
            channels[tops[0]] = channels[bottoms[0]]
            continue
        raise UserError(f"{prototxt}: layer '{name}' of type {kind}: not followed by this decoder")
    return out


def _nibbles(stream: np.ndarray, count: int) -> np.ndarray:
    """``count`` 4-bit values packed two a byte, the first in the low nibble."""
    both = np.empty(stream.size * 2, np.uint8)
    both[0::2] = stream & 0x0F
    both[1::2] = stream >> 4
    return both[:count]


def decode_layer(raw: memoryview, at: int, entries: int, bits: int, shape: tuple[int, ...], outputs: int):
    """One layer's (weights, bias) from ``raw`` at byte ``at``, and the byte after it."""
    def take(dtype, count):
        nonlocal at
        size = np.dtype(dtype).itemsize * count
        if at + size > len(raw):
            raise UserError("the packed file ends inside a layer: not this prototxt's file")
        values = np.frombuffer(raw, dtype=dtype, count=count, offset=at)
        at += size
        return values
    codebook = take("<f4", 2 ** bits).astype(np.float32)
    bias = take("<f4", outputs).astype(np.float32)
    per_byte = 8 // bits
    codes = take(np.uint8, (entries + per_byte - 1) // per_byte)
    codes = codes[:entries] if bits == 8 else _nibbles(codes, entries)
    gaps = _nibbles(take(np.uint8, (entries + 1) // 2), entries)
    places = np.cumsum(gaps.astype(np.int64) + 1) - 1
    size = int(np.prod(shape))
    if entries and places[-1] >= size:
        raise UserError(f"a layer's entries run past its {size} weights: not this prototxt's file")
    flat = np.zeros(size, np.uint8)
    flat[places] = codes
    return codebook[flat].reshape(shape), bias, at


def decode(prototxt: str, packed: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each weighted layer's (weights, bias), Caffe's layouts, by layer name."""
    layers = weighted_layers(prototxt)
    raw = memoryview(Path(packed).read_bytes())
    header = 4 * len(layers)
    if len(raw) < header:
        raise UserError(f"{packed}: shorter than its header")
    counts = np.frombuffer(raw, dtype="<u4", count=len(layers))
    at, out = header, {}
    for (name, kind, shape, outputs), entries in zip(layers, counts):
        weights, bias, at = decode_layer(raw, at, int(entries), CODE_BITS[kind], shape, outputs)
        out[name] = (weights, bias)
    if at != len(raw):
        raise UserError(f"{packed}: {len(raw) - at} bytes left over after the last layer: not this prototxt's file")
    return out


def caffemodel_bytes(layers: dict[str, tuple[np.ndarray, np.ndarray]], kinds: dict[str, str]) -> bytes:
    """A NetParameter holding each layer's two blobs, serialised."""
    net = classes()["NetParameter"]()
    for name, (weights, bias) in layers.items():
        layer = net.layer.add(name=name, type=kinds[name])
        for array in (weights, bias):
            blob = layer.blobs.add()
            blob.shape.dim.extend(array.shape)
            blob.data.extend(array.ravel().tolist())
    return net.SerializeToString()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prototxt", help="the deploy prototxt the packed file was made for")
    ap.add_argument("packed", help="compressed_SqueezeNet.net")
    ap.add_argument("--out", required=True, help="the .caffemodel to write")
    args = ap.parse_args(argv)
    try:
        layers = decode(args.prototxt, args.packed)
    except UserError as e:
        print(e, file=sys.stderr)             # its problems already begin "error:"
        return 2
    except OSError as e:
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    kinds = {name: kind for name, kind, _, _ in weighted_layers(args.prototxt)}
    Path(args.out).write_bytes(caffemodel_bytes(layers, kinds))
    total = sum(w.size for w, _ in layers.values())
    zeros = sum(int((w == 0).sum()) for w, _ in layers.values())
    print(f"{len(layers)} layers, {total} weights ({zeros / total:.0%} zero) -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

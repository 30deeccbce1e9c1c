"""Training on sequences of different lengths: a source of examples padded to one length T, or
stored back to back, each with its real length (``train.data.lengths``: the source's array of
lengths; or ``train.data.padding_value``: where an example's padding begins), fed a batch at a time padded
only up to the batch's bucket (the net file's ``buckets`` for T, else the batch's longest example),
with the lengths in the graph's lengths input: the layers then keep the padding out of attention,
recurrent states, reductions and the loss (layers/padded.py), as PyTorch's packed sequences do.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import UserError
from ..frontend.train_checks import sequence_dims, sequence_problem
from ..hostmem import human_bytes, too_big
from ..ir.binding import lengths_input


def sequence_symbol(inputs: dict) -> str:
    """The one symbolic dimension of the net's inputs besides the batch (their T); a net file
    without one is refused when read (frontend/train_checks.py), a Net built otherwise here."""
    why = sequence_problem(inputs)
    if why is not None:
        raise UserError(why)
    return sequence_dims(inputs)[1][0]


def uses_lengths(data_spec) -> bool:
    return data_spec.lengths is not None or data_spec.padding_value is not None


def bucketed_dimensions(net) -> frozenset[str]:
    """The bucketed dimension the train and test graphs are lowered with: T where the data has lengths."""
    spec = net.spec.train
    if spec is None or not uses_lengths(spec.data):
        return frozenset()
    return frozenset({sequence_symbol(net.spec.inputs)})


def _axes(inputs: dict, symbol: str) -> dict[str, list[int]]:
    return {name: [a for a, d in enumerate(s.shape) if d == symbol] for name, s in inputs.items()}


def unpack_ragged(raw: dict[str, np.ndarray], data_spec, inputs: dict, source: str) -> dict[str, np.ndarray]:
    """Sequences stored back to back (npz holds no ragged arrays without pickled objects): an
    input's array of sum(lengths) steps, [sum, ...] for an input [N, T, ...], is padded with
    zeros into [M, max(lengths), ...], example i its lengths[i] steps in order."""
    if data_spec.lengths is None or data_spec.lengths not in raw:
        return raw
    symbol = sequence_symbol(inputs)
    lengths = np.asarray(raw[data_spec.lengths])
    if lengths.ndim != 1 or lengths.dtype.kind not in "iu" or lengths.size == 0 or lengths.min() < 1:
        return raw                                   # attach_lengths says what is wrong
    total = int(lengths.sum(dtype=object))           # Python ints: an int64 sum can wrap to any value
    longest = int(lengths.max())
    out = dict(raw)
    for name, spec in inputs.items():
        arr = raw.get(name)
        if arr is None or list(spec.shape[:2]) != [spec.shape[0], symbol] or arr.ndim != len(spec.shape) - 1 \
                or arr.shape[0] != total or arr.shape[0] == lengths.size:
            continue
        # a few long sequences among many short ones pad every example to the longest: bounded
        # by the memory this process may use before anything of that size is allocated
        nbytes = lengths.size * longest * math.prod(arr.shape[1:]) * arr.dtype.itemsize
        why = too_big(nbytes)
        if why is not None:
            raise UserError(f"data source {source}: its {lengths.size:,} sequences of '{name}' padded to the longest "
                            f"({longest:,} steps) take {human_bytes(nbytes)}, {why}")
        padded = np.zeros((lengths.size, longest) + arr.shape[1:], arr.dtype)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        for i, (start, n) in enumerate(zip(starts, lengths)):
            padded[i, :n] = arr[start: start + n]
        out[name] = padded
    return out


def attach_lengths(arrays: dict[str, np.ndarray], raw: dict[str, np.ndarray], data_spec, inputs: dict,
                   source: str) -> dict[str, np.ndarray]:
    """``arrays`` (fitted to the inputs) with each example's length under the lengths input,
    read from the source's array ``data_spec.lengths`` or found from ``padding_value``."""
    symbol = sequence_symbol(inputs)
    axes = _axes(inputs, symbol)
    padded = {name: arr.shape[axes[name][0]] for name, arr in arrays.items() if axes.get(name)}
    if not padded:
        raise UserError(f"data source {source}: no input has the dimension {symbol}")
    if len(set(padded.values())) != 1:
        raise UserError(f"data source {source}: the arrays along {symbol} differ in length: "
                        + ", ".join(f"{k} {v}" for k, v in padded.items()))
    longest = next(iter(padded.values()))
    rows = len(next(iter(arrays.values())))
    if data_spec.lengths is not None:
        if data_spec.lengths not in raw:
            raise UserError(f"data source {source}: no array '{data_spec.lengths}' of lengths (train.data.lengths; "
                            f"it has: {', '.join(raw)})")
        lengths = np.asarray(raw[data_spec.lengths])
        if lengths.shape != (rows,) or lengths.dtype.kind not in "iu" and not (
                lengths.dtype.kind == "f" and np.all(lengths == np.round(lengths))):
            raise UserError(f"data source {source}: '{data_spec.lengths}' must hold one whole number per example "
                            f"({rows}), got shape {list(lengths.shape)} {lengths.dtype}")
    else:
        lengths = _lengths_from_padding(arrays, axes, data_spec.padding_value)
    lengths = lengths.astype(np.int64)
    bad = np.flatnonzero((lengths < 1) | (lengths > longest))
    if bad.size:
        raise UserError(f"data source {source}: example {int(bad[0])} has length {int(lengths[bad[0]])}; lengths "
                        f"must be from 1 to the arrays' {symbol}={longest}")
    return {**arrays, lengths_input(symbol): lengths}


def _lengths_from_padding(arrays: dict, axes: dict, value) -> np.ndarray:
    """Each example's length: one past its last step where some float input differs from
    ``value`` (a step of padding is ``value`` in every feature); at least 1."""
    lengths = None
    for name, arr in arrays.items():
        if not axes.get(name) or arr.dtype.kind != "f":
            continue
        a = axes[name][0]
        steps = np.moveaxis(arr, a, 1).reshape(arr.shape[0], arr.shape[a], -1)
        real = np.any(steps != value, axis=2)
        last = np.where(real.any(axis=1), real.shape[1] - np.argmax(real[:, ::-1], axis=1), 1)
        lengths = last if lengths is None else np.maximum(lengths, last)
    if lengths is None:
        raise UserError("train.data.padding_value needs a float input with the sequence dimension")
    return lengths


class BucketedBatches:
    """A dataset whose batches come cut (or padded with zeros) along T to the smallest bucket that
    holds the batch's longest example, or to that example's length without buckets."""

    def __init__(self, base, inputs: dict, buckets: tuple[int, ...]):
        self.base = base
        self.symbol = sequence_symbol(inputs)
        self.axes = _axes(inputs, self.symbol)
        self.buckets = tuple(sorted(buckets))
        self.key = lengths_input(self.symbol)

    def __len__(self) -> int:
        return len(self.base)

    def size_for(self, longest: int) -> int:
        return next((g for g in self.buckets if g >= longest), longest)

    def take(self, rows) -> dict[str, np.ndarray]:
        batch = self.base.take(rows)
        size = self.size_for(int(batch[self.key].max()))
        out = {}
        for name, arr in batch.items():
            for a in self.axes.get(name, []):
                have = arr.shape[a]
                if have > size:
                    arr = arr[(slice(None),) * a + (slice(0, size),)]      # a view: no copy per batch
                elif have < size:
                    widths = [(0, 0)] * arr.ndim
                    widths[a] = (0, size - have)
                    arr = np.pad(arr, widths)
            out[name] = arr
        return out

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        return self.take(np.arange(len(self)))


def train_bucket_sizes(net) -> tuple[int, ...]:
    """The net file's buckets for the sequence dimension (``buckets: {T: [...]}``), or none."""
    buckets = net.spec.buckets or {}
    symbol = sequence_symbol(net.spec.inputs)
    return tuple(buckets.get(symbol, ()))


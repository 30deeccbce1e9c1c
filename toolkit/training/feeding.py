"""Data feeding for training and evaluation: a net's train and test sets read from its
``train.data`` source, shaped for its inputs, transformed as training feeds them, and cut into
the batch of one iteration (a rank's share of it, augmented by a generator of (seed, i) alone).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import UserError
from ..frontend import Net
from ..frontend.resolver import zoo_data
from ..frontend.train_checks import image_inputs
from ..ir.graph import FLOAT_DTYPES, Graph
from ..optim.data_parallel import DIST_WEIGHT, ROW_MASK
from .data import (
    Dataset,
    InputTransform,
    augment,
    center_crop,
    data_folder,
    fit_to_inputs,
    load_source,
    split,
    transform,
)
from .sequences import BucketedBatches, attach_lengths, train_bucket_sizes, unpack_ragged, uses_lengths
from .sources import Mapped, open_lazy
from .sources import kind_of as lazy_kind


def net_dtype(net: Net) -> str:
    for spec in net.spec.inputs.values():
        if spec.dtype in FLOAT_DTYPES:
            return spec.dtype
    return "float32"


def train_spec(net: Net):
    from schemas.train import TrainSpec
    return net.spec.train or TrainSpec()


def load_data(net: Net, spec, transformed: bool = True) -> tuple[Dataset, Dataset | None]:
    """Train and test sets, shaped for the net's inputs and (``transformed``) with the input
    transform applied, as training feeds them."""
    inputs = net.spec.inputs
    data_spec = spec.data
    source = data_spec.source
    crop = data_spec.crop_size      # the image inputs' size: checked when the net was read
    full = _open_data(net, "source", source, data_spec, crop)
    if data_spec.test_source:
        train_set = full
        test_set = _open_data(net, "test_source", data_spec.test_source, data_spec, crop)
    else:
        train_set, test_set = split(full, data_spec.test_fraction, spec.seed)
    if uses_lengths(data_spec):               # each batch cut to its bucket along T
        sizes = train_bucket_sizes(net)
        train_set = BucketedBatches(train_set, inputs, sizes)
        test_set = BucketedBatches(test_set, inputs, sizes) if test_set is not None else None
    if not transformed:
        return train_set, test_set
    fed = batch_transform(net, spec)
    return as_fed(train_set, fed, test=False), (as_fed(test_set, fed, test=True) if test_set is not None else None)


def batch_transform(net: Net, spec):
    """``fed(arrays, test)``: a batch of a source as the net is fed it: train.data's transform,
    then a top-level transform's tensor steps (its centre crop in test passes only: a training
    batch is cropped at random, if at all, by augment), and in a test pass the centre crop."""
    inputs = net.spec.inputs
    data_spec = spec.data
    crop = data_spec.crop_size
    dtype = net_dtype(net)
    base = Path(net.file).parent
    declared = InputTransform.of(net) if getattr(net.spec, "transform", None) is not None else None

    def fed(arrays: dict, test: bool) -> dict:
        arrays = transform(arrays, inputs, data_spec, dtype, base)
        if declared is not None:
            arrays = declared(arrays, dtype, crop=test)
        if test and crop is not None:           # test: the centre, as Caffe's TEST phase crops
            arrays = {k: center_crop(v, crop) if k in image_inputs(inputs) else v for k, v in arrays.items()}
        return arrays
    return fed


def as_fed(dataset, fed, test: bool):
    """``dataset`` with ``fed`` applied: at once when it is in memory, else to each batch as read."""
    if isinstance(dataset, Dataset):
        return Dataset(fed(dataset.arrays, test))
    return Mapped(dataset, lambda arrays: fed(arrays, test))


def _open_data(net: Net, key: str, source: str, data_spec, crop):
    """A source as a Dataset, in memory, or, for Caffe's LMDB, image list and HDF5 sources, one
    read a batch at a time (checked on its first example, each batch cast as it is read)."""
    inputs = net.spec.inputs
    if not source.startswith("builtin:"):
        zoo_data(net, key)
    path = Path(source)
    folder = data_folder(net, key)
    if not source.startswith("builtin:") and not path.is_absolute() and not path.exists():
        path = folder / path
    kind = None if source.startswith("builtin:") else lazy_kind(path)
    if kind is None:
        raw = load_source(source, inputs, folder)
        if uses_lengths(data_spec):
            raw = unpack_ragged(raw, data_spec, inputs, source)
        fitted = fit_to_inputs(raw, inputs, source, crop)
        if uses_lengths(data_spec):
            fitted = Dataset(attach_lengths(fitted.arrays, raw, data_spec, inputs, source))
        return fitted
    if uses_lengths(data_spec):
        raise UserError(f"train.data.lengths and padding_value need a source read whole (.npz, a folder of "
                        f".npy, CSV), not {source}")
    lazy = open_lazy(kind, path, inputs, data_spec)
    fit_to_inputs(lazy.take([0]), inputs, source, crop)          # the shapes and kinds, said up front
    return Mapped(lazy, lambda arrays: fit_to_inputs(arrays, inputs, source, crop).arrays)


def rank_rows(rows: np.ndarray, rank: int, batch_size: int) -> tuple[np.ndarray, float]:
    """A rank's rows [r*B, (r+1)*B) of a global batch, and its share of the objective. A rank
    left without rows by a short last batch runs one placeholder row that weighs nothing (and
    is masked out of global BatchNorm statistics)."""
    mine = rows[rank * batch_size: (rank + 1) * batch_size]
    if len(mine) == 0:
        return rows[:1], 0.0
    return mine, len(mine) / len(rows)


def iteration_feed(train_set, rows: np.ndarray, net: Net, spec, i: int, graph: Graph,
                   weight: float | None = None) -> dict[str, np.ndarray]:
    """The arrays of iteration ``i``'s batch that ``graph`` reads; ``weight``: this rank's share
    of the objective in a data-parallel step."""
    batch = train_set.take(rows)
    data = spec.data
    if data.crop_size is not None or data.mirror:
        # the crop offsets and flips of iteration i come from (seed, i) alone: resume stays exact
        batch = augment(batch, net.spec.inputs, data, np.random.default_rng([spec.seed, 1013, i]))
    feed = {k: v for k, v in batch.items() if k in graph.inputs}
    if weight is not None:
        feed[DIST_WEIGHT] = np.asarray(weight, dtype=graph.inputs[DIST_WEIGHT].dtype)
        if ROW_MASK in graph.inputs:       # a placeholder row (weight 0) is masked out
            feed[ROW_MASK] = np.full(len(rows), float(weight > 0), dtype=graph.inputs[ROW_MASK].dtype)
    return feed

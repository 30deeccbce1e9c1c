"""``zoo:NAME`` in a net file, as the net itself or as a base: the front end knows the syntax; the
model zoo, which finds the model's files, sits above it and hands the front end a resolver
(``toolkit/zoo/resolve.py``'s ``resolve``) through ``Net.load``."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from ..errors import UserError

ZOO_PREFIX = "zoo:"


class ZooModelFiles(Protocol):
    name: str
    net: Path                   # the model's net file
    weights: Path | None        # its default weights, when asked for


class Resolver(Protocol):
    def __call__(self, ref: str, *, need_weights: bool, need_data: bool = False) -> ZooModelFiles: ...


def zoo_model(resolve: Resolver | None, ref: str, need_weights: bool = False,
              need_data: bool = False) -> ZooModelFiles:
    """The files of ``zoo:NAME`` through ``resolve``: its net, and its default weights
    (``need_weights``) or the training data it bundles (``need_data``), each fetched when first
    needed; a UserError where no resolver was given."""
    if resolve is None:
        raise UserError(f"{ref}: a zoo: name needs the model zoo to find it (load the net with "
                        "toolkit.zoo.resolve.load_net, as the commands do)")
    if need_data:                # asked only then: a resolver of a net without data need not know it
        return resolve(ref, need_weights=need_weights, need_data=True)
    return resolve(ref, need_weights=need_weights)


def zoo_data(net, key: str) -> None:
    """Where ``train.data.KEY`` is written in a zoo model's net (``zoo:NAME``, or a base), the
    data that model bundles beside it is fetched into the cache and checked, the first time a
    run reads it: the net alone is fetched when it is loaded, the data only when it is read."""
    written = net.positions.locate(("train", "data", key), prefer_key=False).file
    ref = net.zoo_files.get(os.path.realpath(written)) if written else None
    if ref is not None:
        zoo_model(net.resolve, ref, need_data=True)

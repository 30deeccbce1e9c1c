"""``zoo:NAME`` in a net file, as the net itself or as a base: the front end knows the syntax; the
model zoo, which finds the model's files, sits above it and hands the front end a resolver
(``toolkit/zoo/resolve.py``'s ``resolve``) through ``Net.load``."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from ..errors import UserError

ZOO_PREFIX = "zoo:"


class ZooModelFiles(Protocol):
    name: str
    net: Path                   # the model's net file
    weights: Path | None        # its default weights, when asked for


class Resolver(Protocol):
    def __call__(self, ref: str, *, need_weights: bool) -> ZooModelFiles: ...


def zoo_model(resolve: Resolver | None, ref: str, need_weights: bool = False) -> ZooModelFiles:
    """The files of ``zoo:NAME`` through ``resolve``; a UserError where none was given."""
    if resolve is None:
        raise UserError(f"{ref}: a zoo: name needs the model zoo to find it (load the net with "
                        "toolkit.zoo.resolve.load_net, as the commands do)")
    return resolve(ref, need_weights=need_weights)

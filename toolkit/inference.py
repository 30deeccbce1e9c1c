"""The infer phase of a net made ready to run, in the steps that ``toolkit infer``, ``toolkit
serve`` and ``toolkit.load`` share: the device and dtype checked, the net read (``zoo:NAME``
too), its weights loaded, then frozen into the optimised graph, which a session runs over the
batch buckets."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np

from .backend.devices import Device
from .backend.options import check_device, resolve_dtype
from .compile import disabled_passes, optimize
from .frontend import Net
from .ir.graph import Graph
from .passes.pipeline import memory_reuse
from .runtime.session import InferSession, split_buckets
from .zoo.resolve import load_net


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass
class InferPhase:
    net: Net
    graph: Graph                  # the infer graph as lowered: its inputs and outputs are the model's
    device: Device
    dtype: str | None
    disable: tuple[str, ...]

    def load_weights(self, given: str | None, allow_missing: bool = False,
                     flag: str = "--weights") -> dict[str, np.ndarray]:
        """``given``, else a zoo model's published weights, checked against the net."""
        return self.net.load_weights(self.net.default_weights(given, flag=flag), allow_missing=allow_missing,
                                     dtype=self.dtype, say=_to_stderr)

    def session(self, weights: dict[str, np.ndarray],
                buckets: "Iterable[int] | Mapping[str, Iterable[int]] | None" = None) -> InferSession:
        """The graph optimised with ``weights`` frozen in, run by a session over ``buckets``: the
        batch's sizes, or sizes per symbolic dimension (buckets over a sequence length lower the
        graph with the lengths its layers mask the padding by); None: the net file's ``buckets``,
        else the default buckets. The frozen arrays are taken out of ``weights``: the graph owns
        them from now on."""
        spec = buckets if buckets is not None else self.net.spec.buckets
        if isinstance(spec, Mapping) or spec is None:
            batch, dim_buckets = split_buckets(self.graph, spec)
        else:
            batch, dim_buckets = tuple(spec), {}
        graph = self.net.graph("infer", self.dtype, bucketed=frozenset(dim_buckets)) if dim_buckets else self.graph
        graph = optimize(graph, self.disable, weights, self.device, consume_weights=True)
        return InferSession(graph, weights, self.device, batch, reuse_memory=memory_reuse(self.disable),
                            dim_buckets=dim_buckets)


def infer_phase(net: "str | Net", device: Device | str, dtype: str | None = None, disable: Iterable[str] = (),
                no_optimize: bool = False, overrides=()) -> InferPhase:
    """``net`` (a file, ``zoo:NAME`` or a loaded Net, with ``--set`` overrides for a file) for
    ``device`` and ``dtype``, each checked first."""
    device = check_device(device)
    dtype = resolve_dtype(dtype, device)
    loaded = load_net(net, overrides) if isinstance(net, str) else net
    passes = disabled_passes(loaded, tuple(disable), no_optimize)
    return InferPhase(loaded, loaded.graph("infer", dtype), device, dtype, passes)

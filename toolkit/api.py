"""The Python API (docs/spec.md section 7): ``toolkit.load(net, weights=..., device=...)`` gives a Model
whose ``infer(**arrays)`` runs the infer phase through the batch buckets (docs/spec.md section 5).

It validates and compiles as `toolkit infer` does and raises ``toolkit.UserError`` with the
message the command would print. A Model is safe to share between threads: its session runs one
batch at a time (the bucket plans share one arena), and every output is an array of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .errors import UserError
from .runtime.session import DEFAULT_BUCKETS, InferSession


@dataclass(frozen=True)
class TensorInfo:
    """An input or output of the infer phase: a name, a dtype, a shape with None for symbolic
    dimensions (the batch first), and those dimensions' names."""
    name: str
    dtype: str
    shape: tuple[int | None, ...]
    symbols: tuple[str | None, ...]


class Model:
    """A compiled infer phase with its weights frozen in. Use ``toolkit.load`` to make one."""

    def __init__(self, net, session: InferSession, inputs: list[TensorInfo], outputs: list[TensorInfo]):
        self.net = net
        self.name = net.spec.name
        self.session = session
        self.inputs = inputs
        self.outputs = outputs

    @property
    def device(self) -> str:
        return self.session.device.name

    @property
    def buckets(self) -> tuple[int, ...]:
        return self.session.buckets

    def infer(self, arrays: Mapping[str, np.ndarray] | None = None, /, **named: np.ndarray) -> dict[str, np.ndarray]:
        """{output name: numpy array} for inputs given by name (``infer(data=x)``) or as a dict;
        any batch size (cut into the buckets). Safe to call from several threads at once."""
        given = {**(arrays or {}), **named}
        unknown = sorted(set(given) - {t.name for t in self.inputs})
        if unknown:
            names = ", ".join(t.name for t in self.inputs)
            raise UserError(f"net '{self.name}' has no input {', '.join(map(repr, unknown))} (its inputs: {names})")
        return self.session.run(given)

    def warm(self, **example: np.ndarray) -> int:
        """Compile every bucket now (and run it once), so that no call waits for a compile.
        Returns the number of plans built; ``example`` gives sizes of other symbolic dimensions."""
        return self.session.warm(example or None)

    def __repr__(self) -> str:
        return f"<toolkit.Model {self.name!r} on {self.device}, buckets {list(self.buckets)}>"


def tensor_infos(values: Mapping) -> list[TensorInfo]:
    from .ir.dims import Sym
    out = []
    for name, v in values.items():
        if name.startswith("@"):
            continue
        shape = tuple(d if isinstance(d, int) else None for d in v.shape)
        symbols = tuple(None if isinstance(d, int) else (str(d) if isinstance(d, Sym) else None) for d in v.shape)
        out.append(TensorInfo(name, str(v.dtype), shape, symbols))
    return out


def load(net: str, weights: str | None = None, device: str = "cpu", dtype: str | None = None,
         buckets: Sequence[int] | None = None, warm: bool = False, disable: Sequence[str] = (),
         optimize_graph: bool = True, allow_missing: bool = False) -> Model:
    """A net file or ``zoo:NAME`` with its weights (default for a zoo model: its published
    weights), compiled for ``device`` ("cpu", "gpu", "cpu:N", "gpu:N"). ``buckets``: the batch
    sizes compiled (default 1, 2, 4, ..., 64); ``warm``: compile them all now."""
    from .inference import infer_phase

    sizes = tuple(DEFAULT_BUCKETS if buckets is None else buckets)
    if not sizes or any(not isinstance(b, (int, np.integer)) or b < 1 for b in sizes):
        raise UserError(f"buckets must be positive integers, got {list(sizes)}")
    phase = infer_phase(net, device, dtype, disable, not optimize_graph)
    loaded = phase.load_weights(weights, allow_missing=allow_missing, flag="weights")
    inputs, outputs = tensor_infos(phase.graph.inputs), tensor_infos(phase.graph.outputs)
    model = Model(phase.net, phase.session(loaded, (int(b) for b in sizes)), inputs, outputs)
    if warm:
        model.warm()
    return model

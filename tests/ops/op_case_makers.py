"""The op table's case type and its makers: ``Case`` (an op, its attributes, a maker of random
inputs, an independent reference), ``case_adder`` (a table's ``case``), and the helpers the tables'
makers and references share (random arrays, PyTorch conversions, a vector-Jacobian product).
The cases themselves are in ``op_cases_math.py`` and ``op_cases_conv_pool_fused.py``; all of them,
and the helpers that run one, are ``op_cases.py``."""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from toolkit.backend.registry import load_device

load_device("cpu")
torch.set_num_threads(1)


# -- helpers for makers and references ------------------------------------------------------
def uni(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, shape)


def away(rng, shape, margin=0.2, hi=1.5):
    """Random values with |x| in [margin, hi]: at least ``margin`` away from a kink at 0."""
    return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(margin, hi, shape)


def positive(rng, shape, lo=0.5, hi=2.0):
    return rng.uniform(lo, hi, shape)


def distinct(rng, shape, step=0.05):
    """Pairwise distinct values (gaps >= step): no ties for max and max pooling."""
    n = int(np.prod(shape))
    return (rng.permutation(n).reshape(shape) - n / 2) * step


def labels(rng, shape, classes, dtype=np.int64):
    return rng.integers(0, classes, size=shape).astype(dtype)


def tt(a, grad=False):
    t = torch.from_numpy(np.array(a, dtype=np.float64))
    return t.requires_grad_(grad)


def tl(a):
    return torch.from_numpy(np.asarray(a).astype(np.int64))


def tn(t):
    return t.detach().numpy()


def vjp(fn, args, g, index=0):
    """Gradient of sum(fn(*args) * g) with respect to args[index] (PyTorch autograd, float64)."""
    ts = [tt(a, grad=(i == index)) for i, a in enumerate(args)]
    out = fn(*ts)
    out.backward(tt(g))
    return tn(ts[index].grad)


# -- the table -------------------------------------------------------------------------------
@dataclass
class Case:
    op: str
    id: str
    make: Callable[[np.random.Generator], list[np.ndarray]]   # float64 / int arrays
    ref: Callable[..., np.ndarray] | None                      # independent reference, float64 in
    attrs: dict | Callable[[str], dict] = field(default_factory=dict)
    grad: bool = True            # gradient test when the op has a rule and float inputs
    random: bool = False         # impure op: statistical checks instead of a reference

    def attrs_for(self, dtype: str) -> dict:
        return self.attrs(dtype) if callable(self.attrs) else dict(self.attrs)

    def inputs(self, dtype: str) -> list[np.ndarray]:
        rng = np.random.default_rng(zlib.crc32(self.id.encode()))
        arrays = [np.array(a) for a in self.make(rng)]
        return [a.astype(dtype) if a.dtype.kind == "f" else a for a in arrays]

    def __str__(self):
        return self.id


def case_adder(cases: list[Case]) -> Callable:
    """``case(op, id, make, ref, attrs=None, **kw)``, which appends the case ``op-id`` to ``cases``."""
    def case(op, id, make, ref, attrs=None, **kw):
        cases.append(Case(op, f"{op}-{id}", make, ref, attrs if attrs is not None else {}, **kw))
    return case

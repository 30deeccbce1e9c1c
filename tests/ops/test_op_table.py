"""One table of cases drives the generic tests of every primitive op in ``OPS``.

Each case names an op, its attributes, a maker of random inputs (one shape set per case; every op
has several cases) and an independent reference written here (numpy expressions, explicit loops
or PyTorch), never the op's own ``.reference``. From the table:

* forward: a one-node graph run by the reference interpreter and by a compiled Plan, in float32
  and float64, against the independent reference;
* gradient: loss = sum(op(x...) * r), differentiated by ``toolkit.autodiff.differentiate``,
  against central finite differences of the independent reference (float64), and the Plan's
  gradient against the interpreter's;
* coverage of OPS by the table, registry self-checks (kernels, grad rules, layer lowerings) and
  in-place kernels against out-of-place runs.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from toolkit.ops.autodiff import differentiate
from toolkit.ir.graph import Graph, TensorType, Value
from toolkit.backend.devices import CPU
from toolkit.backend.registry import KERNELS, KernelContext, load_device
from toolkit.ops import OPS, Builder
from toolkit.ops.fused import make_step
from toolkit.ops.interpreter import interpret
from toolkit.runtime.plan import Plan, RuntimeState

load_device("cpu")
torch.set_num_threads(1)

DTYPES = ("float32", "float64")
TOL = {"float32": 1e-5, "float64": 1e-12}


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


CASES: list[Case] = []


def case(op, id, make, ref, attrs=None, **kw):
    CASES.append(Case(op, f"{op}-{id}", make, ref, attrs if attrs is not None else {}, **kw))


# binary broadcasting arithmetic: same shape, row/column broadcast, rank promotion, 0-d, odd sizes
BINARY_SHAPES = [((3, 4), (3, 4)), ((3, 4), (4,)), ((5, 1, 3), (1, 2, 1)), ((2, 3), ()), ((1,), (7, 5))]
for name, fn in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply)]:
    for sa, sb in BINARY_SHAPES:
        case(name, f"{sa}x{sb}", lambda r, sa=sa, sb=sb: [uni(r, sa), uni(r, sb)], lambda a, b, fn=fn: fn(a, b))
for sa, sb in BINARY_SHAPES:
    case("div", f"{sa}x{sb}", lambda r, sa=sa, sb=sb: [uni(r, sa), away(r, sb, 0.5)], lambda a, b: a / b)


for sa, sb in [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 3), (4, 1)), ((5,), ())]:
    def _mk(r, sa=sa, sb=sb):
        full = np.broadcast_shapes(sa, sb)
        b = uni(r, sb)
        a = uni(r, sa)
        for _ in range(100):   # redraw a until it is 0.1 away from b everywhere (no ties)
            if np.abs(np.broadcast_to(a, full) - np.broadcast_to(b, full)).min() >= 0.1:
                return [a, b]
            a = uni(r, sa, -2, 2)
        a = uni(r, sa, 2, 3)   # fallback: all of a above all of b
        return [a, b]
    case("maximum", f"{sa}x{sb}", _mk, lambda a, b: np.where(a > b, a, b))

for sa, sb in [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 3), ())]:
    def _mk(r, sa=sa, sb=sb):
        a = uni(r, sa)
        b = uni(r, sb)
        full = np.broadcast_shapes(sa, sb)
        if np.abs(np.broadcast_to(a, full) - np.broadcast_to(b, full)).min() < 1e-3:
            a = a + 0.5
        return [a, b]
    case("ge_mask", f"{sa}x{sb}", _mk, lambda a, b: (a >= b) * 1.0)
# ties go to 1 (>=): exact equality forward check, no gradient (ties are the kink)
case("ge_mask", "ties", lambda r: [np.array([1.0, 2.0, 3.0, -1.0]), np.array([1.0, 3.0, 2.0, -1.0])],
     lambda a, b: np.array([1.0, 0.0, 1.0, 1.0]), grad=False)

# unary math
UNARY_SHAPES = [(7,), (3, 5), (2, 3, 4)]
for s in UNARY_SHAPES:
    case("neg", str(s), lambda r, s=s: [uni(r, s)], lambda x: -x)
    case("exp", str(s), lambda r, s=s: [uni(r, s, -3, 3)], lambda x: tn(torch.exp(tt(x))))
    case("log", str(s), lambda r, s=s: [positive(r, s, 0.1, 5)], lambda x: tn(torch.log(tt(x))))
    case("abs", str(s), lambda r, s=s: [away(r, s)], lambda x: np.where(x < 0, -x, x))
    case("sign", str(s), lambda r, s=s: [away(r, s)], lambda x: (x > 0) * 1.0 - (x < 0) * 1.0)
    case("sqrt", str(s), lambda r, s=s: [positive(r, s, 0.1, 4)], lambda x: x ** 0.5)
    case("rsqrt", str(s), lambda r, s=s: [positive(r, s, 0.1, 4)], lambda x: 1.0 / x ** 0.5)
    case("square", str(s), lambda r, s=s: [uni(r, s, -2, 2)], lambda x: x * x)
case("sign", "zero", lambda r: [np.array([0.0, -0.0, 2.0, -3.0])], lambda x: np.array([0.0, 0.0, 1.0, -1.0]),
     grad=False)
case("abs", "0d", lambda r: [np.array(-1.25)], lambda x: np.where(x < 0, -x, x))

# activations and their gradient helpers (helpers take g first, then x or y)
for s in [(7,), (3, 5), (2, 3, 2, 3)]:
    case("relu", str(s), lambda r, s=s: [away(r, s)], lambda x: np.where(x > 0, x, 0.0))
    case("relu_grad", str(s), lambda r, s=s: [uni(r, s), np.maximum(away(r, s), 0)],
         lambda g, y: g * (y > 0))
    case("sigmoid", str(s), lambda r, s=s: [uni(r, s, -6, 6)], lambda x: 1 / (1 + np.exp(-x)))
    case("tanh", str(s), lambda r, s=s: [uni(r, s, -3, 3)],
         lambda x: (np.exp(2 * x) - 1) / (np.exp(2 * x) + 1))
    case("erf", str(s), lambda r, s=s: [uni(r, s, -3, 3)], lambda x: tn(torch.erf(tt(x))))
case("sigmoid", "large", lambda r: [np.array([-800.0, -40.0, 0.0, 40.0, 800.0])],
     lambda x: tn(torch.sigmoid(tt(x))), grad=False)

for alpha in (0.1, 0.0, 2.0, -0.5):
    for s in [(9,), (3, 4)]:
        case("leaky_relu", f"a{alpha}-{s}", lambda r, s=s: [away(r, s)],
             lambda x, a=alpha: np.where(x > 0, x, a * x), attrs=dict(alpha=alpha))
        case("leaky_relu_grad", f"a{alpha}-{s}", lambda r, s=s: [uni(r, s), away(r, s)],
             lambda g, x, a=alpha: vjp(lambda t: F.leaky_relu(t, a), [x], g), attrs=dict(alpha=alpha))
    # at exactly 0 PyTorch's backward takes the negative slope (x > 0 ? g : g * alpha)
    case("leaky_relu_grad", f"a{alpha}-at-zero", lambda r: [uni(r, (4,)), np.array([0.0, -0.0, 1.0, -1.0])],
         lambda g, x, a=alpha: vjp(lambda t: F.leaky_relu(t, a), [x], g), attrs=dict(alpha=alpha))

for alpha in (1.0, 0.5, 2.0):
    for s in [(9,), (2, 5)]:
        case("elu", f"a{alpha}-{s}", lambda r, s=s: [away(r, s, 0.1, 3)],
             lambda x, a=alpha: tn(F.elu(tt(x), alpha=a)), attrs=dict(alpha=alpha))

        def _elu_grad_make(r, s=s, a=alpha):
            x = away(r, s, 0.1, 3)
            y = np.where(x > 0, x, a * np.expm1(x))
            return [uni(r, s), x, y]
        case("elu_grad", f"a{alpha}-{s}", _elu_grad_make,
             lambda g, x, y, a=alpha: vjp(lambda t: F.elu(t, alpha=a), [x], g), attrs=dict(alpha=alpha))

case("elu_grad", "at-zero", lambda r: [uni(r, (4,)), np.array([0.0, -0.0, 0.5, -0.5]),
                                         np.array([0.0, 0.0, 0.5, np.expm1(-0.5)])],
     lambda g, x, y: vjp(F.elu, [x], g), attrs=dict(alpha=1.0))
case("relu_grad", "at-zero", lambda r: [uni(r, (4,)), np.array([0.0, -0.0, 0.5, 0.0])],
     lambda g, y: vjp(F.relu, [y], g))

for s in [(9,), (3, 4)]:
    case("softplus", str(s), lambda r, s=s: [uni(r, s, -5, 5)], lambda x: tn(F.softplus(tt(x))))
# PyTorch's threshold: linear above 20; below it log1p(exp(x)); far negative exp(x)
case("softplus", "extremes", lambda r: [np.array([-50.0, -19.0, 19.0, 19.9, 25.0, 300.0])],
     lambda x: tn(F.softplus(tt(x))))

for approx in ("none", "tanh"):
    for s in [(11,), (3, 4)]:
        case("gelu", f"{approx}-{s}", lambda r, s=s: [uni(r, s, -4, 4)],
             lambda x, ap=approx: tn(F.gelu(tt(x), approximate=ap)), attrs=dict(approximate=approx))
        case("gelu_grad", f"{approx}-{s}", lambda r, s=s: [uni(r, s), uni(r, s, -4, 4)],
             lambda g, x, ap=approx: vjp(lambda t: F.gelu(t, approximate=ap), [x], g),
             attrs=dict(approximate=approx))

# losses and masks
for sa, sb in [((4, 3), (4, 3)), ((2, 5), (5,)), ((6,), ())]:
    case("sigmoid_cross_entropy", f"{sa}x{sb}",
         lambda r, sa=sa, sb=sb: [uni(r, sa, -30, 30) if sa == (6,) else uni(r, sa, -4, 4), uni(r, sb, 0, 1)],
         lambda x, t: tn(F.binary_cross_entropy_with_logits(
             *torch.broadcast_tensors(tt(x), tt(t)), reduction="none")))

case("cast", "same", lambda r: [uni(r, (3, 4))], lambda x, dt=None: x, attrs=lambda dt: dict(dtype=dt))
case("cast", "to-f64", lambda r: [uni(r, (5,))], lambda x: x, attrs=dict(dtype="float64"))
case("cast", "to-f32", lambda r: [uni(r, (2, 3))], lambda x: x.astype(np.float32), attrs=dict(dtype="float32"))
case("cast", "to-i32-trunc", lambda r: [np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 3.0])],
     lambda x: np.trunc(x).astype(np.int32), attrs=dict(dtype="int32"))
case("cast", "from-i64", lambda r: [labels(r, (3, 4), 100) - 50], lambda x: x * 1.0,
     attrs=lambda dt: dict(dtype=dt))

# select: the condition is kept away from 0 (its sign is the kink), the branches broadcast
for sc, sa, sb in [((3, 4), (3, 4), (3, 4)), ((), (2, 3), (2, 3)), ((3, 1), (4,), ()), ((5,), (2, 5), (5,))]:
    case("select", f"{sc}-{sa}-{sb}", lambda r, sc=sc, sa=sa, sb=sb: [away(r, sc), uni(r, sa), uni(r, sb)],
         lambda c, a, b: np.where(c > 0, a, b))

# mixed precision: the finiteness flag and the rounding to a half type (PyTorch's conversions)
_SPECIAL = np.array([0.0, -0.0, 1.0, 65504.0, 65520.0, 70000.0, -1e6, 1e-8, 2.0 ** -24, 1 + 2.0 ** -11,
                     1 + 3 * 2.0 ** -11, 3.4e38, np.inf, -np.inf])


def _torch_round(x, dtype):
    with np.errstate(over="ignore"):
        return tn(torch.from_numpy(np.asarray(x, np.float32)).to(dtype).to(torch.float64))


for half, tdtype in (("float16", torch.float16), ("bfloat16", torch.bfloat16)):
    case("round_precision", f"{half}-random", lambda r: [uni(r, (7, 9), -300, 300)],
         lambda x, t=tdtype: _torch_round(x, t), attrs=dict(dtype=half), grad=False)
    case("round_precision", f"{half}-edges", lambda r: [_SPECIAL.copy()],
         lambda x, t=tdtype: _torch_round(x, t), attrs=dict(dtype=half), grad=False)
case("all_finite", "finite", lambda r: [uni(r, (3, 4)), uni(r, (5,))], lambda a, b: np.array(1.0), grad=False)
case("all_finite", "inf", lambda r: [uni(r, (3, 4)), np.array([1.0, np.inf, 2.0])], lambda a, b: np.array(0.0),
     grad=False)
case("all_finite", "nan-0d", lambda r: [np.array(np.nan)], lambda a: np.array(0.0), grad=False)

for ratio, s in [(0.5, (200, 50)), (0.2, (7, 301)), (0.0, (10, 10))]:
    case("dropout_mask", f"r{ratio}-{s}", lambda r, s=s: [uni(r, s)], None, attrs=dict(ratio=ratio), random=True)

# constants
case("scalar", "float", lambda r: [], lambda: np.array(2.5), attrs=lambda dt: dict(value=2.5, dtype=dt))
case("scalar", "int32", lambda r: [], lambda: np.array(-3, dtype=np.int32), attrs=dict(value=-3.0, dtype="int32"))
# iota: each element's index along one axis (torch.arange, broadcast over the other axes)
for shape, axis, kind in [((4, 3), 0, None), ((2, 5), -1, "int64"), ((3,), 0, None), ((2, 3, 4), 1, "int32")]:
    def _iota_ref(shape=shape, axis=axis, kind=kind):
        along = torch.arange(shape[axis]).view([-1 if k == axis % len(shape) else 1 for k in range(len(shape))])
        out = tn(along.expand(*shape))
        return out if kind is None else out.astype(kind)
    case("iota", f"{shape}-{axis}-{kind or 'float'}", lambda r: [], _iota_ref,
         attrs=(lambda dt, shape=shape, axis=axis: dict(shape=shape, axis=axis, dtype=dt)) if kind is None
         else dict(shape=shape, axis=axis, dtype=kind))
case("constant", "matrix", lambda r: [], lambda: np.arange(6.0).reshape(2, 3) / 4,
     attrs=lambda dt: dict(value=(np.arange(6).reshape(2, 3) / 4).astype(dt)))
case("constant", "int", lambda r: [], lambda: np.array([[1, -2, 3]], dtype=np.int64),
     attrs=dict(value=np.array([[1, -2, 3]], dtype=np.int64)))

# matmul: transpose flags, batches, broadcasting of batch dims, odd sizes
for sa, sb, ta, tb in [((3, 4), (4, 5), False, False), ((4, 3), (4, 5), True, False),
                       ((3, 4), (5, 4), False, True), ((4, 3), (5, 4), True, True),
                       ((2, 3, 4), (2, 4, 5), False, False), ((2, 1, 3, 4), (3, 5, 4), False, True),
                       ((4, 3), (2, 4, 5), True, False), ((1, 7), (7, 1), False, False),
                       ((1, 9), (12, 9), False, True), ((9, 1), (9, 12), True, False), ((1, 9), (9, 12), False, False)]:
    def _mm_ref(a, b, ta=ta, tb=tb):
        a = np.swapaxes(a, -1, -2) if ta else a
        b = np.swapaxes(b, -1, -2) if tb else b
        return np.einsum("...ij,...jk->...ik", a, b)
    case("matmul", f"{sa}{'T' if ta else ''}x{sb}{'T' if tb else ''}",
         lambda r, sa=sa, sb=sb: [uni(r, sa), uni(r, sb)], _mm_ref, attrs=dict(trans_a=ta, trans_b=tb))

# reductions: axis sets incl. negative, keepdims, all axes, the empty axis set, and reduced axes
# between kept ones (global pooling in the blocked layout: [N, C/16, H, W, 16] over H and W)
for s, axes, keep in [((3, 4), (1,), False), ((3, 4), (0,), True), ((2, 3, 5), (0, 2), False),
                      ((2, 3, 5), (-1,), True), ((2, 3, 4), (0, 1, 2), False), ((4, 3), (), False),
                      ((3, 7, 5), (1,), False), ((2, 3, 4, 5, 16), (2, 3), True)]:
    def _sum_ref(x, axes=axes, keep=keep):
        return tn(torch.sum(tt(x), dim=axes, keepdim=keep)) if axes else x

    def _mean_ref(x, axes=axes, keep=keep):
        return tn(torch.mean(tt(x), dim=axes, keepdim=keep)) if axes else x
    attrs = dict(axes=axes, keepdims=keep)
    case("reduce_sum", f"{s}-{axes}-{keep}", lambda r, s=s: [uni(r, s)], _sum_ref, attrs=attrs)
    case("reduce_mean", f"{s}-{axes}-{keep}", lambda r, s=s: [uni(r, s)], _mean_ref, attrs=attrs)
    if axes:
        kept = tuple(1 if i in {a % len(s) for a in axes} else d for i, d in enumerate(s))
        case("reduce_mean_grad", f"{s}-{axes}",
             lambda r, kept=kept: [uni(r, kept)],
             lambda g, s=s, axes=axes: vjp(lambda t: torch.mean(t, dim=axes, keepdim=True), [np.zeros(s)], g),
             attrs=dict(shape=s, axes=axes))

for s, target in [((3, 1), (2, 3, 4)), ((), (2, 2)), ((4,), (3, 4)), ((2, 1, 5), (2, 3, 5))]:
    case("broadcast_to", f"{s}->{target}", lambda r, s=s: [uni(r, s)],
         lambda x, target=target: x + np.zeros(target), attrs=dict(shape=target))

for s, axes in [((6, 3, 4, 5), (0, 2, 3)), ((5, 7), (0,)), ((2, 3, 4), (0, 2))]:
    def _bessel_make(r, s=s, axes=axes):
        return [uni(r, s).var(axis=axes)]          # a biased variance over `axes`

    def _bessel_ref(var, s=s, axes=axes):
        # the unbiased variance of the same data, from the biased one
        rng = np.random.default_rng(zlib.crc32(f"bessel_correct-{s}-{axes}".encode()))
        x = uni(rng, s)
        np.testing.assert_allclose(x.var(axis=axes), var)
        return tn(torch.var(tt(x), dim=axes, correction=1))
    count = int(np.prod([s[a] for a in axes]))
    case("bessel_correct", f"{s}-{axes}", _bessel_make, _bessel_ref, attrs=dict(count=count))

# collectives: in one process (the one-rank communicator) the sum over ranks is the value itself
for s in [(2, 3), (7,), ()]:
    case("allreduce_sum", f"{s}", lambda r, s=s: [uni(r, s)], lambda x: np.array(np.asarray(x).tolist()))

# data movement
for s, src, dst in [((2, 3, 4), "cpu", "cpu:1"), ((5,), "cpu:1", "cpu")]:
    case("transfer", f"{s}-{src}-{dst}", lambda r, s=s: [uni(r, s)], lambda x: np.array(x.tolist()),
         attrs=dict(src=src, dst=dst))
for s, target in [((2, 3, 4), (6, 4)), ((2, 3, 4), (4, 1, 6)), ((5,), (1, 5, 1)), ((3, 1), (3,))]:
    case("reshape", f"{s}->{target}", lambda r, s=s: [uni(r, s)],
         lambda x, target=target: np.array(x.ravel().tolist()).reshape(target), attrs=dict(shape=target))

for s, perm in [((3, 4), (1, 0)), ((2, 3, 4), (2, 0, 1)), ((2, 3, 4, 5), (0, 2, 1, 3)), ((2, 3), (0, 1))]:
    case("transpose", f"{s}-{perm}", lambda r, s=s: [uni(r, s)],
         lambda x, perm=perm: tn(tt(x).permute(*perm).contiguous()), attrs=dict(perm=perm))

for shapes, axis in [([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 5)], -1), ([(2, 2, 3), (2, 1, 3)], 1)]:
    case("concat", f"{shapes}-{axis}", lambda r, shapes=shapes: [uni(r, s) for s in shapes],
         lambda *xs, axis=axis: tn(torch.cat([tt(x) for x in xs], dim=axis)), attrs=dict(axis=axis))

for s, axis, start, stop in [((5, 4), 0, 1, 3), ((3, 7), -1, 2, 7), ((2, 5, 3), 1, 0, 1)]:
    def _slice_ref(x, axis=axis, start=start, stop=stop):
        return np.take(x, np.arange(start, stop), axis=axis)
    case("slice", f"{s}-{axis}-{start}:{stop}", lambda r, s=s: [uni(r, s)], _slice_ref,
         attrs=dict(axis=axis, start=start, stop=stop))

for s, axis, before, after in [((3, 4), 0, 2, 0), ((2, 3), -1, 1, 3), ((2, 3, 2), 1, 0, 2)]:
    def _pad_ref(x, axis=axis, before=before, after=after):
        shape = list(x.shape)
        ax = axis % x.ndim
        shape[ax] += before + after
        out = np.zeros(shape)
        index = [slice(None)] * x.ndim
        index[ax] = slice(before, before + x.shape[ax])
        out[tuple(index)] = x
        return out
    case("pad_axis", f"{s}-{axis}-{before}-{after}", lambda r, s=s: [uni(r, s)], _pad_ref,
         attrs=dict(axis=axis, before=before, after=after))

# softmax family: axis variants
for s, axis in [((4, 5), 1), ((4, 5), 0), ((2, 3, 4), -1), ((2, 3, 4), 1), ((3,), 0)]:
    case("softmax", f"{s}-{axis}", lambda r, s=s: [uni(r, s, -3, 3)],
         lambda x, axis=axis: tn(torch.softmax(tt(x), dim=axis)), attrs=dict(axis=axis))
    case("log_softmax", f"{s}-{axis}", lambda r, s=s: [uni(r, s, -3, 3)],
         lambda x, axis=axis: tn(torch.log_softmax(tt(x), dim=axis)), attrs=dict(axis=axis))
case("softmax", "large-logits", lambda r: [np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -999.0]])],
     lambda x: tn(torch.softmax(tt(x), dim=1)), attrs=dict(axis=1), grad=False)
case("log_softmax", "large-logits", lambda r: [np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -999.0]])],
     lambda x: tn(torch.log_softmax(tt(x), dim=1)), attrs=dict(axis=1), grad=False)


def log_softmax_np(x, axis):
    m = x.max(axis=axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


# nll_loss (+ grad): class axis variants, ignore_index, int32 labels
def _torch_nll(logp, label, axis, ignore_index):
    t = torch.movedim(logp, axis, 1) if logp.ndim > 1 else logp.reshape(1, -1)
    lab = tl(label) if logp.ndim > 1 else tl(label).reshape(1)
    return F.nll_loss(t, lab, ignore_index=-100 if ignore_index is None else ignore_index)


for s, axis, ignore, ldtype in [((4, 5), 1, None, np.int64), ((2, 3, 4), 1, None, np.int32),
                                ((3, 4, 6), -1, None, np.int64), ((5, 3), 1, 1, np.int64),
                                ((6, 4), 1, -1, np.int64), ((2, 4, 3), 1, 2, np.int32)]:
    lshape = s[:axis % len(s)] + s[axis % len(s) + 1:]
    classes = s[axis]

    def _nll_make(r, s=s, axis=axis, lshape=lshape, classes=classes, ignore=ignore, ldtype=ldtype):
        lab = labels(r, lshape, classes, ldtype)
        if ignore is not None:
            lab.flat[::3] = ignore              # every third position ignored, also -1 outside the range
            lab.flat[1] = (ignore + 1) % classes if ignore >= 0 else 0
        logp = log_softmax_np(uni(r, s, -2, 2), axis)
        return [logp, lab]

    attrs = dict(axis=axis, ignore_index=ignore)
    case("nll_loss", f"{s}-{axis}-ign{ignore}", _nll_make,
         lambda logp, lab, axis=axis, ignore=ignore: tn(_torch_nll(tt(logp), lab, axis, ignore)), attrs=attrs)
    case("nll_loss_grad", f"{s}-{axis}-ign{ignore}",
         lambda r, mk=_nll_make: [np.array(r.uniform(0.5, 2.0))] + mk(r),
         lambda g, logp, lab, axis=axis, ignore=ignore: vjp(
             lambda t: _torch_nll(t, lab, axis, ignore), [logp], g), attrs=attrs)


# accuracy: distinct scores (no ties), class axis variants, top_k
for s, axis, k in [((8, 5), 1, 1), ((8, 5), 1, 2), ((2, 4, 3), 1, 1), ((3, 2, 6), -1, 3)]:
    lshape = s[:axis % len(s)] + s[axis % len(s) + 1:]

    def _acc_ref(scores, lab, axis=axis, k=k):
        moved = np.moveaxis(scores, axis, -1).reshape(-1, scores.shape[axis])
        top = torch.topk(tt(moved), k, dim=1).indices.numpy()
        return np.array(np.mean([lab.reshape(-1)[i] in top[i] for i in range(len(top))]))
    case("accuracy", f"{s}-{axis}-top{k}",
         lambda r, s=s, lshape=lshape, axis=axis: [distinct(r, s), labels(r, lshape, s[axis])],
         _acc_ref, attrs=dict(axis=axis, top_k=k))


# conv2d and its two gradient ops from one set of geometries
CONV = [
    # id, x shape, w shape, stride, pad, dilation, group
    ("basic", (2, 3, 5, 5), (4, 3, 3, 3), (1, 1), (0, 0), (1, 1), 1),
    ("s2p1-odd", (1, 2, 7, 6), (3, 2, 3, 2), (2, 2), (1, 1), (1, 1), 1),
    ("s2-unused-rows", (2, 2, 6, 6), (2, 2, 3, 3), (2, 2), (0, 0), (1, 1), 1),
    ("dil2p2", (2, 2, 8, 7), (2, 2, 3, 3), (1, 1), (2, 2), (2, 2), 1),
    ("group2-s21-p10", (2, 4, 5, 5), (6, 2, 3, 3), (2, 1), (1, 0), (1, 1), 2),
    ("depthwise", (1, 3, 6, 6), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1), 3),
    # depthwise with a channel multiplier, stride 2 and unequal padding; dilated; unpadded 5x5
    # (the native kernels' direct loops: every tap's valid span of rows and columns)
    ("depthwise-x2-s2-p10", (2, 3, 7, 6), (6, 1, 3, 3), (2, 2), (1, 0), (1, 1), 3),
    ("depthwise-dil2-p2", (2, 4, 7, 8), (4, 1, 3, 3), (1, 1), (2, 2), (2, 2), 4),
    ("depthwise-k5-s12-wide", (1, 2, 9, 21), (2, 1, 5, 5), (1, 2), (0, 2), (1, 1), 2),
    ("1x1", (3, 5, 4, 3), (2, 5, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    ("mixed-dil12-g2", (2, 4, 7, 9), (4, 2, 2, 3), (1, 2), (1, 2), (1, 2), 2),
    # stride 1: the native input gradient gathers (flipped weight, padding k-1-pad), except where
    # the padding reaches the kernel size
    ("group2-s1-k23-p10", (2, 4, 6, 5), (6, 2, 2, 3), (1, 1), (1, 0), (1, 1), 2),
    ("1x1-p1", (2, 3, 4, 4), (2, 3, 1, 1), (1, 1), (1, 1), (1, 1), 1),
    # output widths >= 16 take the CPU kernels' NCHW layout instead of the batch-last one
    ("wide-nchw-p1", (2, 2, 5, 20), (3, 2, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("wide-nchw-s12-dil-g2", (1, 4, 6, 40), (4, 2, 3, 3), (1, 2), (1, 1), (1, 2), 2),
]
for cid, xs, ws, stride, pad, dil, group in CONV:
    attrs = dict(stride=stride, pad=pad, dilation=dil, group=group)

    def _conv(x, w, stride=stride, pad=pad, dil=dil, group=group):
        return F.conv2d(x, w, stride=stride, padding=pad, dilation=dil, groups=group)
    ys = tuple(_conv(torch.zeros(xs, dtype=torch.float64), torch.zeros(ws, dtype=torch.float64)).shape)
    case("conv2d", cid, lambda r, xs=xs, ws=ws: [uni(r, xs), uni(r, ws)],
         lambda x, w, _conv=_conv: tn(_conv(tt(x), tt(w))), attrs=attrs)
    # with the optional bias input [O]
    case("conv2d", cid + "-bias", lambda r, xs=xs, ws=ws: [uni(r, xs), uni(r, ws), uni(r, (ws[0],))],
         lambda x, w, bias, _conv=_conv: tn(_conv(tt(x), tt(w))) + bias.reshape(1, -1, 1, 1), attrs=attrs)
    case("conv2d_grad_input", cid, lambda r, xs=xs, ws=ws, ys=ys: [uni(r, ys), uni(r, ws)],
         lambda g, w, _conv=_conv, xs=xs: vjp(_conv, [np.zeros(xs), w], g, index=0),
         attrs=dict(attrs, input_hw=xs[2:]))
    case("conv2d_grad_weight", cid, lambda r, xs=xs, ys=ys: [uni(r, ys), uni(r, xs)],
         lambda g, x, _conv=_conv, ws=ws: vjp(_conv, [x, np.zeros(ws)], g, index=1),
         attrs=dict(attrs, kernel=ws[2:]))


# the blocked channel layout (the layout pass's ops): reorders written here as explicit index
# loops, the blocked convolution against torch between them (in the plan: the weight fed, so the
# numpy kernel; the native one, which takes frozen weights, is tests/runtime/test_blocked_layout.py's)
def _nchw_to_blocked(x, block=16):
    n, c, h, w = x.shape
    out = np.zeros((n, -(-c // block), h, w, block), x.dtype)       # a padded last block's lanes: 0
    for ch in range(c):
        out[:, ch // block, :, :, ch % block] = x[:, ch]
    return out


def _blocked_to_nchw(y, channels=None):
    n, cb, h, w, block = y.shape
    channels = cb * block if channels is None else channels
    out = np.empty((n, channels, h, w), y.dtype)
    for ch in range(channels):
        out[:, ch] = y[:, ch // block, :, :, ch % block]
    return out


for bid, xs in [("one-block", (2, 16, 3, 4)), ("three-blocks", (1, 48, 2, 5)), ("padded-24", (2, 24, 3, 2)),
                ("padded-3", (1, 3, 2, 2))]:
    case("to_blocked", bid, lambda r, xs=xs: [uni(r, xs)], _nchw_to_blocked, attrs=dict(block=16))
    bs = (xs[0], -(-xs[1] // 16), xs[2], xs[3], 16)
    case("from_blocked", bid, lambda r, bs=bs: [uni(r, bs)],
         lambda y, c=xs[1]: _blocked_to_nchw(y, c), attrs=dict(block=16, channels=xs[1]))
BLOCKED_CONV = [
    # id, x shape (NCHW), w shape, stride, pad, group
    ("1x1", (2, 32, 3, 5), (48, 32, 1, 1), (1, 1), (0, 0), 1),
    ("3x3-s2-p1", (1, 16, 7, 6), (32, 16, 3, 3), (2, 2), (1, 1), 1),
    ("depthwise-p1", (2, 32, 5, 5), (32, 1, 3, 3), (1, 1), (1, 1), 32),
    ("grouped-2", (1, 64, 4, 5), (32, 32, 3, 3), (1, 1), (1, 1), 2),
]
for bid, xs, ws, stride, pad, group in BLOCKED_CONV:
    battrs = dict(stride=stride, pad=pad, dilation=(1, 1), group=group, block=16)

    def _blocked_conv(x, w, bias, stride=stride, pad=pad, group=group):
        y = F.conv2d(tt(_blocked_to_nchw(x)), tt(w), tt(bias), stride=stride, padding=pad, groups=group)
        return _nchw_to_blocked(tn(y))
    bxs = (xs[0], xs[1] // 16, xs[2], xs[3], 16)
    case("conv2d_blocked", bid, lambda r, bxs=bxs, ws=ws: [uni(r, bxs), uni(r, ws), uni(r, (ws[0],))],
         _blocked_conv, attrs=battrs)


def _nchw_into_blocked_conv(x, w, bias):       # an RGB image read as NCHW, written blocked
    return _nchw_to_blocked(tn(F.conv2d(tt(x), tt(w), tt(bias), stride=2, padding=1)))


case("conv2d_blocked", "nchw-input", lambda r: [uni(r, (2, 3, 7, 6)), uni(r, (32, 3, 3, 3)), uni(r, (32,))],
     _nchw_into_blocked_conv, attrs=dict(stride=(2, 2), pad=(1, 1), dilation=(1, 1), group=1, block=16))


for bid, xs, kernel, stride, pad, ceil in [("k3s2-ceil", (2, 32, 7, 7), (3, 3), (2, 2), (0, 0), True),
                                          ("k3s1p1", (1, 16, 5, 6), (3, 3), (1, 1), (1, 1), False)]:
    bxs = (xs[0], xs[1] // 16, xs[2], xs[3], 16)

    def _blocked_pool(x, kernel=kernel, stride=stride, pad=pad, ceil=ceil):
        return _nchw_to_blocked(tn(F.max_pool2d(tt(_blocked_to_nchw(x)), kernel, stride, pad, ceil_mode=ceil)))
    case("max_pool2d_blocked", bid, lambda r, bxs=bxs: [distinct(r, bxs)], _blocked_pool,
         attrs=dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil, block=16))


# conv2d_max_pool2d (the fusion pass's op), in both of the CPU kernel's layouts
FUSED_CONV_POOL = [
    # id, x shape, w shape, conv stride, pad, dilation, group, pool kernel, pool stride, bias
    ("narrow", (2, 3, 9, 9), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, (2, 2), (2, 2), True),
    ("narrow-k3s2-g2", (2, 4, 8, 8), (6, 2, 3, 3), (1, 1), (0, 0), (1, 1), 2, (3, 3), (2, 2), False),
    ("wide-nchw", (2, 2, 6, 21), (3, 2, 3, 3), (1, 1), (1, 1), (1, 1), 1, (2, 2), (2, 2), True),
    ("wide-dil-s12", (1, 2, 7, 40), (2, 2, 2, 3), (1, 2), (0, 1), (1, 2), 1, (2, 3), (1, 2), True),
]
for fid, xs, ws, stride, pad, dil, group, pk, ps, with_bias in FUSED_CONV_POOL:
    fattrs = dict(stride=stride, pad=pad, dilation=dil, group=group, pool_kernel=pk, pool_stride=ps,
                  pool_pad=(0, 0), pool_ceil_mode=False)

    def _conv_pool(x, w, *bias, stride=stride, pad=pad, dil=dil, group=group, pk=pk, ps=ps):
        y = F.conv2d(tt(x), tt(w), tt(bias[0]) if bias else None, stride=stride, padding=pad,
                     dilation=dil, groups=group)
        return tn(F.max_pool2d(y, pk, ps))
    case("conv2d_max_pool2d", fid,
         lambda r, xs=xs, ws=ws, b=with_bias: [uni(r, xs), uni(r, ws)] + ([uni(r, (ws[0],))] if b else []),
         _conv_pool, attrs=fattrs)


# fused_elementwise / fused_epilogue (the fusion passes' ops): programs over inputs ("x", i),
# earlier steps ("t", j) and an epilogue's head ("h",); broadcast operands; fan-out inside the
# program; ops that cannot run in place; and one group large enough to run block by block.
def _step(op, *args, **attrs):
    return make_step(op, args, attrs)


X0, X1, X2, X3, T0, T1, T2, H = ("x", 0), ("x", 1), ("x", 2), ("x", 3), ("t", 0), ("t", 1), ("t", 2), ("h",)
FUSED_ELEMENTWISE = [
    # id, input shapes, program, outputs, independent reference
    ("bias-relu", [(3, 4), (4,), ()], (_step("mul", X0, X1), _step("add", T0, X2), _step("relu", T1)), (2,),
     lambda a, b, c: np.maximum(a * b + c, 0)),
    ("swish-leaky", [(2, 3, 5)], (_step("sigmoid", X0), _step("mul", X0, T0), _step("leaky_relu", T1, alpha=0.1)), (2,),
     lambda a: (lambda y: np.where(y > 0, y, 0.1 * y))(a / (1 + np.exp(-a)))),
    ("channel-scale", [(2, 3, 4, 4), (1, 3, 1, 1), (1, 3, 1, 1)],
     (_step("sub", X0, X1), _step("mul", T0, X2), _step("tanh", T1)), (2,),
     lambda a, m, s: np.tanh((a - m) * s)),
    # 1100 x 1024 values: 4.5 MB in float32, so the kernel cuts it into blocks (rows and columns
    # broadcast from both sides)
    ("blocked", [(1100, 1024), (1024,), (1100, 1)],
     (_step("mul", X0, X1), _step("add", T0, X2), _step("elu", T1, alpha=1.0)), (2,),
     lambda a, b, c: (lambda y: np.where(y > 0, y, np.expm1(np.minimum(y, 0))))(a * b + c)),
]
for fid, shapes, program, outs, ref in FUSED_ELEMENTWISE:
    case("fused_elementwise", fid, lambda r, shapes=shapes: [uni(r, sh) for sh in shapes], ref,
         attrs=dict(program=program, outputs=outs), grad=False)

FUSED_EPILOGUE = [
    ("gemm-bias-relu", [(5, 4), (3, 4), (3,)], "matmul", dict(trans_a=False, trans_b=True), 2,
     (_step("add", H, X2), _step("relu", T0)), lambda a, w, b: np.maximum(a @ w.T + b, 0)),
    ("conv-residual-relu", [(2, 3, 6, 6), (4, 3, 3, 3), (4,), (2, 4, 6, 6)], "conv2d",
     dict(stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=1), 3,
     (_step("add", H, X3), _step("relu", T0)),
     lambda x, w, b, res: np.maximum(tn(F.conv2d(tt(x), tt(w), tt(b), padding=1)) + res, 0)),
    ("dgrad-relu-grad", [(2, 4, 5, 5), (4, 3, 3, 3), (2, 3, 7, 7)], "conv2d_grad_input",
     dict(stride=(1, 1), pad=(0, 0), dilation=(1, 1), group=1, input_hw=(7, 7)), 2,
     (_step("relu_grad", H, X2),),
     lambda g, w, y: vjp(lambda t: F.conv2d(t, tt(w)), [np.zeros((2, 3, 7, 7))], g) * (y > 0)),
    ("conv-pool-gelu", [(1, 2, 8, 8), (3, 2, 3, 3)], "conv2d_max_pool2d",
     dict(stride=(1, 1), pad=(1, 1), dilation=(1, 1), group=1, pool_kernel=(2, 2), pool_stride=(2, 2),
          pool_pad=(0, 0), pool_ceil_mode=False), 2,
     (_step("gelu", H, approximate="tanh"),),
     lambda x, w: tn(F.gelu(F.max_pool2d(F.conv2d(tt(x), tt(w), padding=1), 2, 2), approximate="tanh"))),
]
for fid, shapes, head, head_attrs, k, program, ref in FUSED_EPILOGUE:
    case("fused_epilogue", fid, lambda r, shapes=shapes: [uni(r, sh) for sh in shapes], ref,
         attrs=dict(head=head, head_attrs=tuple(sorted(head_attrs.items())), head_inputs=k, program=program,
                    outputs=(len(program) - 1,)), grad=False)


# pooling (+ grads): odd sizes, stride/pad variants, ceil_mode, count_include_pad
POOL = [
    # id, x shape, kernel, stride, pad, ceil_mode
    ("k2s2", (2, 3, 6, 6), (2, 2), (2, 2), (0, 0), False),
    ("k3s2p1-odd", (1, 2, 7, 5), (3, 3), (2, 2), (1, 1), False),
    ("k3s2p1-ceil", (2, 2, 6, 6), (3, 3), (2, 2), (1, 1), True),
    ("k2s2p1-ceil-drop-last", (1, 2, 5, 5), (2, 2), (2, 2), (1, 1), True),
    ("k3s2-ceil-partial", (1, 3, 8, 7), (3, 3), (2, 2), (0, 0), True),
    ("k23-s12-p11", (2, 1, 5, 7), (2, 3), (1, 2), (1, 1), False),
    ("overlap-k3s1", (1, 2, 5, 4), (3, 3), (1, 1), (0, 0), False),
    ("k3s1p1-same", (2, 2, 6, 5), (3, 3), (1, 1), (1, 1), False),
    ("square-out-asym-divisor", (1, 2, 5, 6), (3, 2), (2, 2), (1, 0), True),
]
for pid, xs, k, s, p, ceil in POOL:
    pattrs = dict(kernel=k, stride=s, pad=p, ceil_mode=ceil)

    def _maxp(x, k=k, s=s, p=p, ceil=ceil):
        return F.max_pool2d(x, k, s, p, ceil_mode=ceil)
    ys = tuple(_maxp(torch.zeros(xs, dtype=torch.float64)).shape)
    case("max_pool2d", pid, lambda r, xs=xs: [distinct(r, xs)], lambda x, f=_maxp: tn(f(tt(x))), attrs=pattrs)
    case("max_pool2d_grad", pid, lambda r, xs=xs, ys=ys: [uni(r, ys), distinct(r, xs)],
         lambda g, x, f=_maxp: vjp(f, [x], g), attrs=pattrs)
    for cip in (True, False):
        aattrs = dict(pattrs, count_include_pad=cip)

        def _avgp(x, k=k, s=s, p=p, ceil=ceil, cip=cip):
            return F.avg_pool2d(x, k, s, p, ceil_mode=ceil, count_include_pad=cip)
        if cip is False and p == (0, 0) and not ceil:
            continue                          # identical to count_include_pad=True
        case("avg_pool2d", f"{pid}-cip{cip}", lambda r, xs=xs: [uni(r, xs)],
             lambda x, f=_avgp: tn(f(tt(x))), attrs=aattrs)
        case("avg_pool2d_grad", f"{pid}-cip{cip}", lambda r, ys=ys: [uni(r, ys)],
             lambda g, f=_avgp, xs=xs: vjp(f, [np.zeros(xs)], g), attrs=dict(aattrs, input_hw=xs[2:]))
# ties: PyTorch's CPU kernel routes each window's gradient to its first maximum (row-major)
case("max_pool2d_grad", "ties-first-max",
     lambda r: [uni(r, (1, 2, 3, 3)), r.integers(0, 3, (1, 2, 6, 6)).astype(float)],
     lambda g, x: vjp(lambda t: F.max_pool2d(t, 3, 2, 1), [x], g),
     attrs=dict(kernel=(3, 3), stride=(2, 2), pad=(1, 1), ceil_mode=False))


# power: integer, fractional and negative exponents (fractional ones on positive bases, as torch)
for exponent, make in [(2.0, uni), (3.0, uni), (0.5, positive), (-1.5, positive), (0.0, uni), (1.0, uni)]:
    case("power", f"{exponent}", lambda r, make=make: [make(r, (3, 5))],
         lambda x, exponent=exponent: tn(torch.pow(tt(x), exponent)), attrs=dict(exponent=exponent))

# embedding: repeated indices (their rows' gradients add up), int32 and int64, any index rank
for ishape, rows, idtype in [((4,), 6, np.int64), ((2, 5), 3, np.int32), ((), 4, np.int64)]:
    def _emb_make(r, ishape=ishape, rows=rows, idtype=idtype):
        return [uni(r, (rows, 3)), r.integers(0, rows, ishape).astype(idtype)]
    case("embedding", f"{ishape}-{rows}-{np.dtype(idtype).name}", _emb_make,
         lambda table, index: tn(torch.nn.functional.embedding(torch.from_numpy(index).long(), tt(table))),
         attrs=dict(layer="embed"))
    case("embedding_grad", f"{ishape}-{rows}", lambda r, mk=_emb_make, ishape=ishape: [uni(r, ishape + (3,)), mk(r)[1]],
         lambda g, index, rows=rows: vjp(lambda t: torch.nn.functional.embedding(
             torch.from_numpy(index).long(), t), [np.zeros((rows, 3))], g), attrs=dict(rows=rows))

# topk: values and indices along each axis; distinct values (torch's order among ties is unspecified)
for shape, axis, k in [((4, 6), 1, 1), ((4, 6), 1, 3), ((3, 4, 5), 0, 2), ((3, 4, 5), -1, 5)]:
    for values in (True, False):
        case("topk", f"{shape}-{axis}-{k}-{'values' if values else 'indices'}",
             lambda r, shape=shape: [r.permutation(int(np.prod(shape))).reshape(shape) / 7.0],
             lambda x, axis=axis, k=k, values=values: (
                 tn(torch.topk(tt(x), k, dim=axis).values) if values
                 else torch.topk(tt(x), k, dim=axis).indices.numpy().astype(x.dtype)),
             attrs=dict(axis=axis, k=k, values=values))

# -- running one node --------------------------------------------------------------------------
def one_node_graph(case: Case, arrays, attrs):
    graph = Graph("test")
    vals = []
    for i, a in enumerate(arrays):
        v = Value(TensorType(tuple(a.shape), str(a.dtype)), name=f"x{i}")
        graph.inputs[f"x{i}"] = v
        vals.append(v)
    y = Builder(graph, case.id).op(case.op, *vals, **attrs)
    return graph, vals, y


def feeds(arrays):
    return {f"x{i}": a for i, a in enumerate(arrays)}


def run_plan(graph, inputs, seed=0):
    plan = Plan(graph, {}, {}, runtime=RuntimeState(np.random.default_rng(seed)))
    return {k: np.array(v) for k, v in plan.run(inputs).items()}


def upcast(a):
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def assert_close(actual, expected, tol, what=""):
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if actual.dtype.kind in "iub" or expected.dtype.kind in "iub":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    finite = np.abs(expected[np.isfinite(expected)])
    scale = max(1.0, float(np.max(finite, initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol * scale, err_msg=what)


DETERMINISTIC = [c for c in CASES if not c.random]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DETERMINISTIC, ids=str)
def test_forward(case: Case, dtype):
    arrays = case.inputs(dtype)
    attrs = case.attrs_for(dtype)
    graph, _, y = one_node_graph(case, arrays, attrs)
    graph.outputs["y"] = y
    expected = np.asarray(case.ref(*[upcast(a) for a in arrays]))
    got_interp = interpret(graph, feeds(arrays), {})[0]["y"]
    got_plan = run_plan(graph, feeds(arrays))["y"]
    for name, got in (("interpreter", got_interp), ("plan", got_plan)):
        assert got.dtype == np.dtype(y.dtype), f"{name}: dtype {got.dtype}, type says {y.dtype}"
        tol = TOL["float32"] if "float32" in (y.dtype, *(str(a.dtype) for a in arrays)) else TOL["float64"]
        assert_close(got, expected, tol, f"{case.id} {name}")


RANDOM = [c for c in CASES if c.random]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", RANDOM, ids=str)
def test_forward_random(case: Case, dtype):
    """Impure ops: values, keep rate, reproducibility per seed, plan == interpreter for one seed."""
    arrays = case.inputs(dtype)
    ratio = case.attrs["ratio"]
    graph, _, y = one_node_graph(case, arrays, case.attrs)
    graph.outputs["y"] = y
    interp = interpret(graph, feeds(arrays), {}, rng=np.random.default_rng(7))[0]["y"]
    plan = run_plan(graph, feeds(arrays), seed=7)["y"]
    np.testing.assert_array_equal(interp, plan)
    assert plan.dtype == np.dtype(dtype)
    scale = float(np.dtype(dtype).type(1.0 / (1.0 - ratio)))
    assert set(np.unique(plan)) <= {0.0, scale}
    keep = float(np.mean(plan != 0))
    n = plan.size
    assert abs(keep - (1 - ratio)) <= 5 * math.sqrt(ratio * (1 - ratio) / n) + 1e-12
    other = run_plan(graph, feeds(arrays), seed=8)["y"]
    if ratio > 0:
        assert not np.array_equal(other, plan), "a different seed must give a different mask"
    # mean of the inverted-dropout mask is ~1 (unbiased)
    assert abs(float(plan.mean()) - 1.0) <= 5 * math.sqrt(ratio / max(1 - ratio, 1e-9) / n) + 1e-12


# -- gradients ----------------------------------------------------------------------------------
def float_indices(arrays):
    return [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]


def grad_cases():
    out = []
    for c in CASES:
        if c.random or not c.grad or OPS[c.op].grad is None:
            continue
        arrays = c.inputs("float64")
        attrs = c.attrs_for("float64")
        graph, _, y = one_node_graph(c, arrays, attrs)
        if not float_indices(arrays) or y.dtype != "float64":
            continue                  # integer / float32 outputs: finite differences need float64
        out.append(c)
    return out


GRAD_CASES = grad_cases()
FD_EPS = 1e-6
FD_MAX_ELEMENTS = 24


def build_loss_graph(case: Case, arrays):
    graph, vals, y = one_node_graph(case, arrays, case.attrs_for("float64"))
    r = Value(TensorType(y.shape, y.dtype), name="r")
    graph.inputs["r"] = r
    b = Builder(graph, "loss")
    prod = b.mul(y, r)
    loss = b.reduce_sum(prod, range(prod.rank))
    graph.outputs["loss"] = loss
    wrt = [vals[i] for i in float_indices(arrays)]
    grads = differentiate(graph, loss, wrt)
    names = {}
    for i, v in zip(float_indices(arrays), wrt):
        if grads[v.id] is not None:
            graph.outputs[f"g{i}"] = grads[v.id]
            names[i] = f"g{i}"
    return graph, y, names


@pytest.mark.parametrize("case", GRAD_CASES, ids=str)
def test_gradient(case: Case):
    arrays = case.inputs("float64")
    graph, y, names = build_loss_graph(case, arrays)
    rng = np.random.default_rng(99)
    r = rng.uniform(-1, 1, tuple(y.shape))
    inputs = dict(feeds(arrays), r=r)
    interp = interpret(graph, inputs, {})[0]
    plan = run_plan(graph, inputs)

    expected_loss = float(np.sum(np.asarray(case.ref(*arrays)) * r))
    np.testing.assert_allclose(interp["loss"], expected_loss, rtol=1e-10, atol=1e-12)

    for i in float_indices(arrays):
        x = arrays[i]
        analytic = interp[names[i]] if i in names else np.zeros_like(x)   # None: zero gradient
        assert analytic.shape == x.shape and analytic.dtype == x.dtype
        if i in names:
            assert_close(plan[names[i]], analytic, 1e-12, f"{case.id}: plan vs interpreter, input {i}")
        flat = np.arange(x.size)
        if x.size > FD_MAX_ELEMENTS:
            flat = rng.choice(x.size, FD_MAX_ELEMENTS, replace=False)
        for k in flat:
            idx = np.unravel_index(k, x.shape)
            plus = [a.copy() for a in arrays]
            minus = [a.copy() for a in arrays]
            plus[i][idx] += FD_EPS
            minus[i][idx] -= FD_EPS
            # difference before the sum: no cancellation against the untouched outputs
            diff = np.asarray(case.ref(*plus)) - np.asarray(case.ref(*minus))
            fd = float(np.sum(diff * r)) / (2 * FD_EPS)
            assert abs(analytic[idx] - fd) <= 1e-6 * abs(fd) + 1e-8, \
                f"{case.id}: d/dx{i}{list(idx)} analytic {analytic[idx]!r} vs finite difference {fd!r}"


def test_cast_gradient_crosses_dtypes():
    """cast f64 -> f32: the gradient comes back as float64 and equals r (cast is the identity)."""
    graph = Graph("test")
    x = Value(TensorType((3, 4), "float64"), name="x")
    r = Value(TensorType((3, 4), "float32"), name="r")
    graph.inputs.update(x=x, r=r)
    b = Builder(graph, "t")
    loss = b.reduce_sum(b.mul(b.op("cast", x, dtype="float32"), r), (0, 1))
    g = differentiate(graph, loss, [x])[x.id]
    assert g.dtype == "float64"
    graph.outputs["g"] = g
    rv = np.random.default_rng(0).uniform(-1, 1, (3, 4)).astype(np.float32)
    inputs = {"x": np.ones((3, 4)), "r": rv}
    for got in (interpret(graph, inputs, {})[0]["g"], run_plan(graph, inputs)["g"]):
        assert got.dtype == np.float64
        np.testing.assert_array_equal(got, rv.astype(np.float64))


# -- coverage and registry self-checks ------------------------------------------------------------
# Ops deliberately absent from the table, with the reason. Empty: every op, grad helpers included,
# has forward cases; helpers are differentiated only through their parent's gradient test.
TABLE_EXCLUSIONS: dict[str, str] = {
    "loop": "its body is a subgraph attribute: tests/ops/test_control_flow.py checks it (numpy, "
            "finite-difference gradients, plans against the interpreter)",
    "if": "its branches are subgraph attributes: tests/ops/test_control_flow.py checks it",
    "allreduce_start": "one half of a pair sharing a pending request: tests/parallel/test_collectives.py "
                       "checks the pair in one process, tests/parallel/test_data_parallel.py under mpiexec",
    "allreduce_wait": "the other half of that pair: tests/parallel/test_collectives.py",
    "matmul_bias_gradient": "two outputs (the table's cases have one): tests/runtime/test_capture.py checks "
                            "its CPU kernel and the GPU's against numpy, and the pass that makes it",
}

# Ops (not named *_grad, not constants, not random) that legitimately have no gradient rule.
NO_GRAD_RULE = {
    "iota": "it reads no input: positions of the bound sizes, like a constant",
    "all_finite": "a flag on the gradients themselves (mixed precision), never on a loss path",
    "round_precision": "made after the backward pass exists, where a CPU stores float16 as float32",
    "accuracy": "a metric: piecewise constant in the scores, never on a loss path",
    "topk": "ArgMax's op: indices are piecewise constant, and Caffe's ArgMax has no backward either",
    "bessel_correct": "only feeds the running-variance state update, which is never differentiated",
    "conv2d_max_pool2d": "made by an inference-only fusion: in a train graph the pooling gradient also "
                         "reads the convolution's output, so the fusion never fires there",
    "fused_elementwise": "made by a fusion pass after autodiff: the backward pass is already ops",
    "conv2d_blocked": "made by the layout pass, which leaves graphs with a backward pass alone",
    "max_pool2d_blocked": "made by the layout pass, which leaves graphs with a backward pass alone",
    "fused_epilogue": "made by a fusion pass after autodiff: the backward pass is already ops",
    "matmul_bias_gradient": "made by a fusion pass after autodiff, from gradient ops",
}
CONSTANT_OPS = {"scalar", "constant"}
# gradient helpers: named *_grad or *_grad_<what> (conv2d_grad_input, conv2d_grad_weight)
GRAD_HELPERS = {n for n in OPS if n.endswith("_grad") or "_grad_" in n}
RANDOM_OPS = {name for name, op in OPS.items() if not op.pure}


def test_every_op_in_table():
    in_table = {c.op for c in CASES}
    unknown = in_table - set(OPS)
    assert not unknown, f"table names unknown ops: {sorted(unknown)}"
    missing = set(OPS) - in_table - set(TABLE_EXCLUSIONS)
    assert not missing, f"ops with no case in the table: {sorted(missing)}"
    assert not (set(TABLE_EXCLUSIONS) & in_table), "an excluded op is in the table after all"
    for op in OPS:
        if op in TABLE_EXCLUSIONS:
            continue
        n = sum(c.op == op for c in CASES)
        minimum = 1 if op in CONSTANT_OPS else 2
        assert n >= minimum, f"op {op} has only {n} case(s)"


def test_every_differentiable_op_has_a_gradient_case():
    covered = {c.op for c in GRAD_CASES}
    differentiable = {n for n, op in OPS.items() if op.grad is not None} - RANDOM_OPS
    assert differentiable - covered - set(TABLE_EXCLUSIONS) == set()


def test_grad_helpers_are_emitted_by_their_parents():
    """Every gradient helper op appears in the backward graph of some gradient case (so the helper's forward
    test plus the parent's finite-difference test cover it)."""
    emitted = set()
    for c in GRAD_CASES:
        graph, _, _ = build_loss_graph(c, c.inputs("float64"))
        emitted |= {n.op for n in graph.nodes}
    assert GRAD_HELPERS - emitted == set()


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_op_has_a_cpu_kernel(dtype):
    missing = []
    for op in OPS:
        try:
            entry = KERNELS.lookup(op, "cpu", dtype)
        except LookupError:
            missing.append(op)
            continue
        assert callable(entry.factory)
    assert not missing, f"ops without a CPU kernel for {dtype}: {missing}"


# Elementwise ops without a scalar expression (so without generated C or CUDA code), and why.
NO_SCALAR_EXPR = {
    "cast": "a change of dtype is no step of a program that computes in one dtype",
    "dropout_mask": "random: it draws from the executor's generator, which generated code does not reach",
    "gelu_grad": "none written yet: its kernels and fused programs holding it run numpy",
}


def test_elementwise_ops_state_the_facts_kernels_read():
    """Each elementwise op says whether it may run in place, and the CPU kernel's in-place flag
    is that fact; the ops without a scalar expression are the justified ones."""
    elementwise = {n for n, op in OPS.items() if op.elementwise}
    assert len(elementwise) > 20
    for name in sorted(elementwise):
        op = OPS[name]
        assert isinstance(op.in_place, bool), f"{name} does not say whether it may run in place"
        for dtype in DTYPES:
            assert KERNELS.lookup(name, "cpu", dtype).inplace is op.in_place, name
    for name, op in OPS.items():
        if name not in elementwise:
            assert (op.in_place, op.scalar_expr, op.numpy_call) == (None, None, None), name
    assert {n for n in elementwise if OPS[n].scalar_expr is None} == set(NO_SCALAR_EXPR)


def test_native_elementwise_builders_claim_only_ops_with_a_scalar_expression():
    claimed = {op for op, device in KERNELS.natives if device == "cpu" and op in OPS and OPS[op].elementwise}
    with_expr = {n for n, op in OPS.items() if op.elementwise and op.scalar_expr is not None}
    assert claimed == with_expr


def test_grad_rules():
    lacking = {n for n, op in OPS.items() if op.grad is None and n not in GRAD_HELPERS}
    lacking -= CONSTANT_OPS | RANDOM_OPS
    assert lacking == set(NO_GRAD_RULE), (
        f"ops without a grad rule: {sorted(lacking)}; justified exceptions: {sorted(NO_GRAD_RULE)}")
    # helpers are only ever produced by a gradient rule; none is itself differentiated, except the
    # transposed convolution, which is also Deconvolution's forward (as in Caffe)
    assert {n for n in GRAD_HELPERS if OPS[n].grad is not None} == {"conv2d_grad_input"}


def test_every_layer_has_a_lowering():
    from layers import LAYERS
    assert LAYERS, "the layer catalog is empty"
    for name, ldef in LAYERS.items():
        assert ldef.type == name
        assert callable(ldef.lower), f"layer {name} has no lowering"


# -- in-place kernels ---------------------------------------------------------------------------
def inplace_cases():
    out = []
    for c in DETERMINISTIC:
        if c.op in CONSTANT_OPS:
            continue
        entry = KERNELS.lookup(c.op, "cpu", "float64")
        if not entry.inplace:
            continue
        arrays = c.inputs("float64")
        _, _, y = one_node_graph(c, arrays, c.attrs_for("float64"))
        allowed = entry.inplace_pairs(y.producer).get(0, ())
        if any(a.shape == tuple(y.shape) and str(a.dtype) == y.dtype and i in allowed for i, a in enumerate(arrays)):
            out.append(c)             # some input can be the output's storage
    return out


INPLACE_CASES = inplace_cases()


def test_inplace_kernels_are_covered():
    inplace_ops = {o for (o, d, _), e in KERNELS.entries.items() if d == "cpu" and e.inplace}
    assert inplace_ops, "no in-place kernels registered?"
    assert inplace_ops - {c.op for c in INPLACE_CASES} == set()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", INPLACE_CASES, ids=str)
def test_inplace_kernel_matches_out_of_place(case: Case, dtype):
    arrays = case.inputs(dtype)
    graph, vals, y = one_node_graph(case, arrays, case.attrs_for(dtype))
    node = y.producer
    out_shape = tuple(y.shape)
    entry = KERNELS.lookup(case.op, "cpu", dtype)

    def ctx():
        return KernelContext(node, dict(node.attrs), [a.shape for a in arrays], [out_shape], dtype, CPU,
                             RuntimeState(np.random.default_rng(0)), np)

    fresh = np.empty(out_shape, y.dtype)
    entry.factory(ctx())([a.copy() for a in arrays], [fresh])
    aliased = 0
    for i, a in enumerate(arrays):
        if a.shape != out_shape or str(a.dtype) != y.dtype or i not in entry.inplace_pairs(node).get(0, ()):
            continue
        aliased += 1
        ins = [b.copy() for b in arrays]
        buf = ins[i]
        entry.factory(ctx())(ins, [buf])
        np.testing.assert_array_equal(buf, fresh, err_msg=f"{case.id}: output aliasing input {i}")
    assert aliased


# -- shape rules that must reject --------------------------------------------------------------
@pytest.mark.parametrize("start,stop", [(3, 8), (-2, 1), (0, 6)])
def test_slice_rejects_out_of_range_bounds(start, stop):
    """The type must match what runs: x[5] sliced [3:8] would type as length 5 but run as 2."""
    from toolkit.ops import ShapeError
    graph = Graph("test")
    x = Value(TensorType((5,), "float64"), name="x")
    graph.inputs["x"] = x
    with pytest.raises(ShapeError, match="out of range"):
        Builder(graph).op("slice", x, axis=0, start=start, stop=stop)
    assert Builder(graph).op("slice", x, axis=0, start=0, stop=5).shape == (5,)


def test_maximum_ties_route_gradient_to_first_input():
    """Documented rule (Caffe's Eltwise MAX): at a == b the whole gradient goes to a.
    PyTorch's torch.maximum splits it instead (0.5 / 0.5); this pins the toolkit's choice."""
    graph = Graph("test")
    a = Value(TensorType((3,), "float64"), name="a")
    b = Value(TensorType((3,), "float64"), name="b")
    graph.inputs.update(a=a, b=b)
    bld = Builder(graph, "t")
    loss = bld.reduce_sum(bld.op("maximum", a, b), (0,))
    grads = differentiate(graph, loss, [a, b])
    graph.outputs.update(ga=grads[a.id], gb=grads[b.id])
    inputs = {"a": np.array([1.0, 2.0, 0.0]), "b": np.array([1.0, 1.0, 5.0])}
    for got in (interpret(graph, inputs, {})[0], run_plan(graph, inputs)):
        np.testing.assert_array_equal(got["ga"], [1.0, 1.0, 0.0])
        np.testing.assert_array_equal(got["gb"], [0.0, 0.0, 1.0])

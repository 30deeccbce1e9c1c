"""The op table's cases of arithmetic, activations, losses and masks, mixed precision, constants,
matmul, reductions, collectives, data movement, softmax, nll_loss, accuracy, power, embedding and
topk: each with its maker of inputs and an independent reference (numpy or PyTorch)."""
from __future__ import annotations

import zlib

import numpy as np
import torch
import torch.nn.functional as F

from tests.ops.op_case_makers import Case, away, case_adder, distinct, labels, positive, tl, tn, tt, uni, vjp

CASES: list[Case] = []
case = case_adder(CASES)


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

# a mean's gradient share (reduce_mean_grad's g / count, as the fusion pass spreads it)
for s, count in [((3, 4), 12), ((1, 5, 1, 1), 49), ((), 7)]:
    case("div_count", f"{s}/{count}", lambda r, s=s: [uni(r, s)],
         lambda x, count=count: tn(tt(x) / count), attrs=dict(count=count))

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

"""The op table's cases of convolution and its gradients, the blocked channel layout, the fused
ops (conv2d_max_pool2d, fused_elementwise, fused_epilogue) and pooling with its gradients: each
with its maker of inputs and an independent reference (PyTorch, or loops written here)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tests.ops.op_case_makers import Case, case_adder, distinct, tn, tt, uni, vjp
from toolkit.ops.fused import make_step

CASES: list[Case] = []
case = case_adder(CASES)


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
    # 3x3 at stride 1 and 2 over rows of 8 outputs and more (the vectorised plane function:
    # masked loads at both edges, the last vector overlapping the one before it)
    ("depthwise-3x3-wide-x2", (1, 2, 5, 21), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), 2),
    ("depthwise-3x3-s2-wide", (2, 3, 6, 37), (3, 1, 3, 3), (2, 2), (1, 1), (1, 1), 3),
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
# numpy kernel; the native one, which takes frozen weights, is tests/kernels/test_blocked_layout.py's)
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

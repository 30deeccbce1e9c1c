"""The op table's cases of the channels-last layout (ops/nhwc.py, the layout pass's ops on a GPU):
the reorders written here as explicit index loops, the convolution and pooling against PyTorch's
NCHW ops between permutes."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from tests.ops.op_case_makers import Case, case_adder, distinct, tn, tt, uni, vjp

CASES: list[Case] = []
case = case_adder(CASES)


def _loops_to_nhwc(x):
    n, c, h, w = x.shape
    y = np.empty((n, h, w, c), x.dtype)
    for i in range(n):
        for k in range(c):
            for p in range(h):
                for q in range(w):
                    y[i, p, q, k] = x[i, k, p, q]
    return y


def _loops_from_nhwc(y):
    n, h, w, c = y.shape
    x = np.empty((n, c, h, w), y.dtype)
    for i in range(n):
        for k in range(c):
            x[i, k] = y[i, :, :, k]
    return x


for rid, shape in [("odd", (2, 3, 4, 5)), ("one-position", (3, 8, 1, 1))]:
    case("to_nhwc", rid, lambda r, shape=shape: [uni(r, shape)], _loops_to_nhwc)
    case("from_nhwc", rid, lambda r, shape=shape: [uni(r, (shape[0], shape[2], shape[3], shape[1]))],
         _loops_from_nhwc)

CONV = [
    # id, NCHW x shape, OIHW w shape, stride, pad, dilation, group
    ("3x3-p1", (2, 8, 6, 5), (4, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    ("1x1-s2", (2, 6, 7, 7), (8, 6, 1, 1), (2, 2), (0, 0), (1, 1), 1),
    ("group2-dil2", (1, 4, 8, 7), (6, 2, 3, 3), (1, 2), (2, 1), (2, 2), 2),
    ("depthwise", (2, 3, 6, 6), (3, 1, 3, 3), (2, 1), (1, 1), (1, 1), 3),
]
for cid, xs, ws, stride, pad, dil, group in CONV:
    def _conv(x, w, *bias, stride=stride, pad=pad, dil=dil, group=group):
        y = F.conv2d(tt(x.transpose(0, 3, 1, 2)), tt(w.transpose(0, 3, 1, 2)), tt(bias[0]) if bias else None,
                     stride=stride, padding=pad, dilation=dil, groups=group)
        return tn(y).transpose(0, 2, 3, 1)
    nx, nw = (xs[0], xs[2], xs[3], xs[1]), (ws[0], ws[2], ws[3], ws[1])
    attrs = dict(stride=stride, pad=pad, dilation=dil, group=group)
    case("nhwc_conv2d", cid, lambda r, nx=nx, nw=nw: [uni(r, nx), uni(r, nw)], _conv, attrs=attrs)
    case("nhwc_conv2d", cid + "-bias", lambda r, nx=nx, nw=nw: [uni(r, nx), uni(r, nw), uni(r, (nw[0],))], _conv,
         attrs=attrs)

POOL = [
    # id, NCHW x shape, kernel, stride, pad, ceil
    ("k3s2p1", (2, 5, 7, 7), (3, 3), (2, 2), (1, 1), False),
    ("k3s2-ceil", (1, 4, 8, 6), (3, 3), (2, 2), (0, 0), True),
    ("k2", (2, 3, 4, 6), (2, 2), (2, 2), (0, 0), False),
]
for pid, xs, kernel, stride, pad, ceil in POOL:
    nx = (xs[0], xs[2], xs[3], xs[1])

    def _maxp(x, kernel=kernel, stride=stride, pad=pad, ceil=ceil):
        return tn(F.max_pool2d(tt(x.transpose(0, 3, 1, 2)), kernel, stride, pad, ceil_mode=ceil)).transpose(0, 2, 3, 1)
    case("nhwc_max_pool2d", pid, lambda r, nx=nx: [distinct(r, nx)], _maxp,
         attrs=dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil))
    for cip in (True, False):
        def _avgp(x, kernel=kernel, stride=stride, pad=pad, ceil=ceil, cip=cip):
            y = F.avg_pool2d(tt(x.transpose(0, 3, 1, 2)), kernel, stride, pad, ceil_mode=ceil, count_include_pad=cip)
            return tn(y).transpose(0, 2, 3, 1)
        case("nhwc_avg_pool2d", f"{pid}-cip{cip}", lambda r, nx=nx: [uni(r, nx)], _avgp,
             attrs=dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil, count_include_pad=cip))


# the gradients of a train step, channels last: the NCHW cases' PyTorch gradients between permutes
def _nchw(a):
    return a.transpose(0, 3, 1, 2)


def _nhwc(a):
    return np.ascontiguousarray(a.transpose(0, 2, 3, 1))


for cid, xs, ws, stride, pad, dil, group in CONV:
    attrs = dict(stride=stride, pad=pad, dilation=dil, group=group)

    def _conv(x, w, stride=stride, pad=pad, dil=dil, group=group):
        return F.conv2d(x, w, stride=stride, padding=pad, dilation=dil, groups=group)
    ys = tuple(_conv(torch.zeros(xs, dtype=torch.float64), torch.zeros(ws, dtype=torch.float64)).shape)
    nys, nws, nxs = (ys[0], ys[2], ys[3], ys[1]), (ws[0], ws[2], ws[3], ws[1]), (xs[0], xs[2], xs[3], xs[1])
    case("nhwc_conv2d_backward_data", cid, lambda r, nys=nys, nws=nws: [uni(r, nys), uni(r, nws)],
         lambda g, w, _conv=_conv, xs=xs: _nhwc(vjp(_conv, [np.zeros(xs), _nchw(w)], _nchw(g), index=0)),
         attrs=dict(attrs, input_hw=xs[2:]))
    case("nhwc_conv2d_backward_filter", cid, lambda r, nys=nys, nxs=nxs: [uni(r, nys), uni(r, nxs)],
         lambda g, x, _conv=_conv, ws=ws: _nhwc(vjp(_conv, [_nchw(x), np.zeros(ws)], _nchw(g), index=1)),
         attrs=dict(attrs, kernel=ws[2:]))

for pid, xs, kernel, stride, pad, ceil in POOL:
    nx = (xs[0], xs[2], xs[3], xs[1])
    pattrs = dict(kernel=kernel, stride=stride, pad=pad, ceil_mode=ceil)

    def _maxp(x, kernel=kernel, stride=stride, pad=pad, ceil=ceil):
        return F.max_pool2d(x, kernel, stride, pad, ceil_mode=ceil)
    ys = tuple(_maxp(torch.zeros(xs, dtype=torch.float64)).shape)
    ny = (ys[0], ys[2], ys[3], ys[1])
    case("nhwc_max_pool2d_backward", pid, lambda r, ny=ny, nx=nx: [uni(r, ny), distinct(r, nx)],
         lambda g, x, f=_maxp: _nhwc(vjp(f, [_nchw(x)], _nchw(g))), attrs=pattrs)

    def _avgp(x, kernel=kernel, stride=stride, pad=pad, ceil=ceil):
        return F.avg_pool2d(x, kernel, stride, pad, ceil_mode=ceil, count_include_pad=True)
    case("nhwc_avg_pool2d_backward", pid, lambda r, ny=ny: [uni(r, ny)],
         lambda g, f=_avgp, xs=xs: _nhwc(vjp(f, [np.zeros(xs)], _nchw(g))),
         attrs=dict(pattrs, count_include_pad=True, input_hw=xs[2:]))

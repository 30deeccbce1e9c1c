"""CPU convolution as im2col + one GEMM per group, in one of two layouts chosen per convolution.

The kernels work on a padded copy of the input in a layout other than NCHW, so that the
window copies (im2col) and the scatter-adds (col2im) move long contiguous runs:
- CHWN (batch last) for narrow outputs: runs of OW*N elements;
- CNHW (channel first) for wide outputs: runs of OW, and the move back to NCHW copies whole
  H*W planes instead of single elements.
Both give the GEMM one [K, positions] matrix per group. The bias rides in the GEMM as an extra
column of the weight against a row of ones in the columns (no separate pass over the output).
Padded buffers and the ones row are written once, when the plan is built.

Every kernel here is written against an array module ``xp`` (numpy here; the GPU back end builds
the same kernels over CuPy, whose GEMM is cuBLAS), so the two devices share one implementation.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...backend.registry import register_kernel
from ...ops.conv import conv_out_size
from ...ops.fused import split_attrs

# Output widths from this one up use CNHW: measured on LeNet-sized layers, the window copies
# with runs of >= 16 elements cost less than CHWN's element-wise transposes back to NCHW.
CNHW_MIN_WIDTH = 16


def strided_view(xp, src, shape, strides):
    """A read-only window view of ``src`` in either array module."""
    if xp is np:
        return as_strided(src, shape=shape, strides=strides, writeable=False)
    return xp.lib.stride_tricks.as_strided(src, shape=shape, strides=strides)


class _Geometry:
    """Shapes, layout and buffers shared by the three convolution kernels."""

    def __init__(self, x_shape, w_shape, out_hw, attrs, dtype, xp=np):
        self.xp = xp
        self.n, self.c, self.h, self.w = x_shape
        self.o, self.cg, self.kh, self.kw = w_shape
        self.oh, self.ow = out_hw
        (self.sh, self.sw), (self.ph, self.pw), (self.dh, self.dw) = attrs["stride"], attrs["pad"], attrs["dilation"]
        self.g = attrs["group"]
        self.og = self.o // self.g
        self.k = self.cg * self.kh * self.kw
        self.positions = self.oh * self.ow * self.n
        self.dtype = np.dtype(dtype)
        self.layout = "CNHW" if self.ow >= CNHW_MIN_WIDTH else "CHWN"
        # NCHW axis -> position in the layout, and back
        self.perm = (1, 0, 2, 3) if self.layout == "CNHW" else (1, 2, 3, 0)
        self.inverse = tuple(int(i) for i in np.argsort(self.perm))

    def _dims(self, n, c, h, w):
        nchw = (n, c, h, w)
        return tuple(nchw[a] for a in self.perm)

    def padded(self):
        """A zeroed input-sized buffer, padded, in the layout."""
        return self.xp.zeros(self._dims(self.n, self.c, self.h + 2 * self.ph, self.w + 2 * self.pw), self.dtype)

    def interior(self, buf):
        idx = self._dims(slice(None), slice(None), slice(self.ph, self.ph + self.h), slice(self.pw, self.pw + self.w))
        return buf[idx]

    def windows(self, src):
        """[G, C/G, kH, kW, <positions in layout order>] view of a padded buffer."""
        strides = dict(zip("nchw", (src.strides[self.perm.index(a)] for a in range(4))))
        pos_shape = {"n": self.n, "h": self.oh, "w": self.ow}
        pos_stride = {"n": strides["n"], "h": self.sh * strides["h"], "w": self.sw * strides["w"]}
        order = [a for a in ("nchw"[i] for i in self.perm) if a != "c"]
        return strided_view(self.xp, src, (self.g, self.cg, self.kh, self.kw) + tuple(pos_shape[a] for a in order),
                            (self.cg * strides["c"], strides["c"], self.dh * strides["h"],
                             self.dw * strides["w"]) + tuple(pos_stride[a] for a in order))

    def to_nchw(self, rows):
        """A [C or O, <positions>] array in layout order as an NCHW view."""
        shape = self._dims(self.n, rows.shape[0], self.oh, self.ow)
        return rows.reshape(shape).transpose(self.inverse)

    def from_nchw(self, g, buf):
        """The NCHW output gradient as GEMM rows [G, O/G, positions]."""
        self.xp.copyto(buf.reshape(self._dims(self.n, self.o, self.oh, self.ow)), g.transpose(self.perm))
        return buf


class _Forward:
    """The forward convolution into a [G, O/G, positions] buffer in the layout (bias folded in)."""

    def __init__(self, geo: _Geometry, has_bias: bool):
        self.geo, self.has_bias = geo, has_bias
        xp = self.xp = geo.xp
        k = geo.k + has_bias
        self.padded = geo.padded()
        self.cols = xp.empty((geo.g, k, geo.positions), geo.dtype)
        if has_bias:
            self.cols[:, geo.k, :] = 1.0                 # the ones row that multiplies the bias column
        self.windows = geo.windows(self.padded)
        self.window_cols = self.cols[:, :geo.k].reshape(self.windows.shape)
        self.interior = geo.interior(self.padded)
        self.weights = xp.empty((geo.g, geo.og, k), geo.dtype)
        self.rows = xp.empty((geo.g, geo.og, geo.positions), geo.dtype)

    def __call__(self, ins) -> np.ndarray:
        geo, xp = self.geo, self.xp
        self.weights[:, :, :geo.k] = ins[1].reshape(geo.g, geo.og, geo.k)
        if self.has_bias:
            self.weights[:, :, geo.k] = ins[2].reshape(geo.g, geo.og)
        xp.copyto(self.interior, ins[0].transpose(geo.perm))
        xp.copyto(self.window_cols, self.windows)
        xp.matmul(self.weights, self.cols, out=self.rows)
        return self.rows


def conv2d(ctx, xp=np):
    geo = _Geometry(ctx.in_shapes[0], ctx.in_shapes[1], ctx.out_shapes[0][2:], ctx.attrs, ctx.dtype, xp)
    forward = _Forward(geo, len(ctx.in_shapes) == 3)
    out_view = geo.to_nchw(forward.rows.reshape(geo.o, geo.positions))

    def run(ins, outs):
        forward(ins)
        xp.copyto(outs[0], out_view)
    return run


def conv2d_max_pool2d(ctx, xp=np):
    """Pools the convolution's rows in its layout, then moves only the pooled result to NCHW.
    The fusion pass guarantees an unpadded, floor-mode pooling (every window inside the input)."""
    conv_attrs, pool = split_attrs(ctx.attrs)
    n, c, h, w = ctx.in_shapes[0]
    o, _cg, kh, kw = ctx.in_shapes[1]
    (sh, sw), (ph, pw), (dh, dw) = conv_attrs["stride"], conv_attrs["pad"], conv_attrs["dilation"]
    out_hw = (conv_out_size(h, kh, sh, ph, dh), conv_out_size(w, kw, sw, pw, dw))
    geo = _Geometry(ctx.in_shapes[0], ctx.in_shapes[1], out_hw, conv_attrs, ctx.dtype, xp)
    forward = _Forward(geo, len(ctx.in_shapes) == 3)
    conv_out = forward.rows.reshape(geo._dims(n, o, *out_hw))
    ph_out, pw_out = ctx.out_shapes[0][2:]
    (pkh, pkw), (psh, psw) = pool["kernel"], pool["stride"]
    pooled = xp.empty(geo._dims(n, o, ph_out, pw_out), geo.dtype)
    windows = []
    for i in range(pkh):
        for j in range(pkw):
            hs = slice(i, i + psh * (ph_out - 1) + 1, psh)
            ws = slice(j, j + psw * (pw_out - 1) + 1, psw)
            windows.append(conv_out[geo._dims(slice(None), slice(None), hs, ws)])
    pooled_nchw = pooled.transpose(geo.inverse)

    def run(ins, outs):
        forward(ins)
        xp.copyto(pooled, windows[0])
        for view in windows[1:]:
            xp.maximum(pooled, view, out=pooled)
        xp.copyto(outs[0], pooled_nchw)
    return run


def conv2d_grad_weight(ctx, xp=np):
    g_shape, x_shape = ctx.in_shapes
    geo = _Geometry(x_shape, ctx.out_shapes[0], g_shape[2:], ctx.attrs, ctx.dtype, xp)
    padded = geo.padded()
    cols = xp.empty((geo.g, geo.k, geo.positions), geo.dtype)
    windows, interior = geo.windows(padded), geo.interior(padded)
    window_cols = cols.reshape(windows.shape)
    g_rows = xp.empty((geo.g, geo.og, geo.positions), geo.dtype)

    def run(ins, outs):
        g, x = ins
        xp.copyto(interior, x.transpose(geo.perm))
        xp.copyto(window_cols, windows)
        # dW[g] = G[g] cols[g]^T: the sum over images and positions happens inside the GEMM
        xp.matmul(geo.from_nchw(g, g_rows), cols.swapaxes(-1, -2), out=outs[0].reshape(geo.g, geo.og, geo.k))
    return run


def conv2d_grad_input(ctx, xp=np):
    g_shape, w_shape = ctx.in_shapes
    geo = _Geometry(ctx.out_shapes[0], w_shape, g_shape[2:], ctx.attrs, ctx.dtype, xp)
    g_rows = xp.empty((geo.g, geo.og, geo.positions), geo.dtype)
    dcols = xp.empty((geo.g, geo.k, geo.positions), geo.dtype)
    target = geo.padded()
    # the same window geometry as the forward pass, but writable: each kernel offset's slice
    pieces = dcols.reshape(geo.windows(target).shape)
    spans = []
    for i in range(geo.kh):
        for j in range(geo.kw):
            hs = slice(i * geo.dh, i * geo.dh + geo.sh * (geo.oh - 1) + 1, geo.sh)
            ws = slice(j * geo.dw, j * geo.dw + geo.sw * (geo.ow - 1) + 1, geo.sw)
            view = target[geo._dims(slice(None), slice(None), hs, ws)]
            spans.append((pieces[:, :, i, j].reshape(view.shape), view))
    interior_nchw = geo.interior(target).transpose(geo.inverse)

    def run(ins, outs):
        g, w = ins
        wt = w.reshape(geo.g, geo.og, geo.k).swapaxes(-1, -2)
        xp.matmul(wt, geo.from_nchw(g, g_rows), out=dcols)
        # col2im: scatter-add each kernel offset's columns back onto the (padded) input grid
        target.fill(0)
        for piece, view in spans:
            xp.add(view, piece, out=view)
        xp.copyto(outs[0], interior_nchw)
    return run


# the same builders over numpy; the GPU back end registers them over CuPy
CONV_KERNELS = {"conv2d": conv2d, "conv2d_max_pool2d": conv2d_max_pool2d,
                "conv2d_grad_weight": conv2d_grad_weight, "conv2d_grad_input": conv2d_grad_input}
for _op, _builder in CONV_KERNELS.items():
    register_kernel(_op, "cpu")(_builder)

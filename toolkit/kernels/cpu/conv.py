"""CPU convolution as im2col + one GEMM per group, computed in a batch-last (C, H, W, N) layout.

Why batch-last: the im2col copy and the col2im scatter-add move [.., OW, N] runs that are
contiguous in memory (OW*N elements instead of OW), which makes them several times faster in
numpy than NCHW windows. The price is one transpose of the input and one of the output, both
cheap next to the GEMM. Padded buffers are zeroed once; only their interior is written per call.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..registry import register_kernel


class _Geometry:
    """Everything about one convolution's shapes that the three kernels share."""

    def __init__(self, x_shape, w_shape, out_hw, attrs, dtype):
        self.n, self.c, self.h, self.w = x_shape
        self.o, self.cg, self.kh, self.kw = w_shape
        self.oh, self.ow = out_hw
        (self.sh, self.sw), (self.ph, self.pw), (self.dh, self.dw) = attrs["stride"], attrs["pad"], attrs["dilation"]
        self.g = attrs["group"]
        self.og = self.o // self.g
        self.k = self.cg * self.kh * self.kw
        self.pn = self.oh * self.ow * self.n
        self.dtype = np.dtype(dtype)

    def padded_chwn(self):
        """Zeroed [C, H+2pH, W+2pW, N] buffer; the convolution reads its interior."""
        return np.zeros((self.c, self.h + 2 * self.ph, self.w + 2 * self.pw, self.n), self.dtype)

    def interior(self, buf):
        return buf[:, self.ph: self.ph + self.h, self.pw: self.pw + self.w, :]

    def windows(self, src):
        """[G, C/G, kH, kW, OH, OW, N] view of a CHWN buffer at every kernel offset."""
        s_c, s_h, s_w, s_n = src.strides
        return as_strided(src, shape=(self.g, self.cg, self.kh, self.kw, self.oh, self.ow, self.n),
                          strides=(self.cg * s_c, s_c, self.dh * s_h, self.dw * s_w, self.sh * s_h,
                                   self.sw * s_w, s_n), writeable=False)

    def im2col(self, x, padded, cols):
        """Columns [G, K, OH*OW*N] of the NCHW input x."""
        np.copyto(self.interior(padded), x.transpose(1, 2, 3, 0))
        np.copyto(cols.reshape(self.g, self.cg, self.kh, self.kw, self.oh, self.ow, self.n), self.windows(padded))
        return cols

    def cols_buffer(self):
        return np.empty((self.g, self.k, self.pn), self.dtype)

    def grad_chwn(self, g, buf):
        """The NCHW output gradient as [G, O/G, OH*OW*N]."""
        np.copyto(buf.reshape(self.o, self.oh, self.ow, self.n), g.transpose(1, 2, 3, 0))
        return buf


@register_kernel("conv2d", "cpu")
def conv2d_cpu(ctx):
    geo = _Geometry(ctx.in_shapes[0], ctx.in_shapes[1], ctx.out_shapes[0][2:], ctx.attrs, ctx.dtype)
    padded, cols = geo.padded_chwn(), geo.cols_buffer()
    y_chwn = np.empty((geo.g, geo.og, geo.pn), geo.dtype)

    def run(ins, outs):
        x, w = ins
        np.matmul(w.reshape(geo.g, geo.og, geo.k), geo.im2col(x, padded, cols), out=y_chwn)
        np.copyto(outs[0], y_chwn.reshape(geo.o, geo.oh, geo.ow, geo.n).transpose(3, 0, 1, 2))
    return run


@register_kernel("conv2d_grad_weight", "cpu")
def conv2d_grad_weight_cpu(ctx):
    g_shape, x_shape = ctx.in_shapes
    geo = _Geometry(x_shape, ctx.out_shapes[0], g_shape[2:], ctx.attrs, ctx.dtype)
    padded, cols = geo.padded_chwn(), geo.cols_buffer()
    g_chwn = np.empty((geo.g, geo.og, geo.pn), geo.dtype)

    def run(ins, outs):
        g, x = ins
        columns = geo.im2col(x, padded, cols)
        # dW[g] = G[g] cols[g]^T, the sum over batch and positions done inside the GEMM
        np.matmul(geo.grad_chwn(g, g_chwn), columns.swapaxes(-1, -2), out=outs[0].reshape(geo.g, geo.og, geo.k))
    return run


@register_kernel("conv2d_grad_input", "cpu")
def conv2d_grad_input_cpu(ctx):
    g_shape, w_shape = ctx.in_shapes
    geo = _Geometry(ctx.out_shapes[0], w_shape, g_shape[2:], ctx.attrs, ctx.dtype)
    g_chwn = np.empty((geo.g, geo.og, geo.pn), geo.dtype)
    dcols = geo.cols_buffer()
    target = geo.padded_chwn()
    pieces = dcols.reshape(geo.c, geo.kh, geo.kw, geo.oh, geo.ow, geo.n)
    spans = [(i, j, target[:, i * geo.dh: i * geo.dh + geo.sh * (geo.oh - 1) + 1: geo.sh,
                           j * geo.dw: j * geo.dw + geo.sw * (geo.ow - 1) + 1: geo.sw, :])
             for i in range(geo.kh) for j in range(geo.kw)]

    def run(ins, outs):
        g, w = ins
        wt = w.reshape(geo.g, geo.og, geo.k).swapaxes(-1, -2)
        np.matmul(wt, geo.grad_chwn(g, g_chwn), out=dcols)
        # col2im: scatter-add each kernel offset's columns back onto the (padded) input grid
        target.fill(0)
        for i, j, view in spans:
            np.add(view, pieces[:, i, j], out=view)
        np.copyto(outs[0], geo.interior(target).transpose(3, 0, 1, 2))
    return run

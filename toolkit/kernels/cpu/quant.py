"""numpy kernels of the int8 ops (ops/quant.py): quantize/dequantize, and qconv2d / qgemm as
one float64 GEMM each (im2col for the convolution), requantized by the same float32 steps as the
ops' definition, so that they equal the references bit for bit.

Why float64: BLAS has no integer GEMM, and numpy's int64 matmul is a plain loop. Every product
|x - zp| * |w| is at most 255 * 128 = 32640, so every partial sum of K of them, in any order, is
an integer below K * 32640, exact in float64 while that is below 2**53 (K up to 2.7e11: asserted).
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_kernel
from ...ops.conv import _windows
from ...ops.quant import QRANGE, output_multipliers

PRODUCT_MAX = 255 * 128
INT32 = np.iinfo(np.int32)


def _exact(k: int) -> None:
    assert k * PRODUCT_MAX < 2 ** 53, f"a sum of {k} int8 products may leave float64's exact integers"


def requantizer(out_dtype: str, x_scale, w_scales, relu: bool, y_scale=None, y_zero_point=None, channel_axis=1,
                rank=2):
    """acc (float64 holding int32 sums) -> the output, written into ``out``. For a quantized
    output the clamp comes before the rounding, on the float32 value, with bounds that are
    integers (so exactly float32): clamp(rint(v) + zp, lo, hi) == rint(clamp(v, lo - zp, hi - zp)) + zp,
    and ReLU's max(q, zp) is the lower bound zp - zp = 0."""
    shape = [1] * rank
    shape[channel_axis] = -1
    m = output_multipliers(x_scale, w_scales, out_dtype, y_scale).reshape(shape)
    if out_dtype != "float32":
        lo, hi = QRANGE[out_dtype]
        lo = max(lo, y_zero_point) if relu else lo
        lo_v, hi_v = np.float32(lo - y_zero_point), np.float32(hi - y_zero_point)

    def run(acc, out):
        if acc.size and (acc.max() > INT32.max or acc.min() < INT32.min):
            raise ValueError(f"an int32 accumulator overflows (sum in [{acc.min():.0f}, {acc.max():.0f}])")
        v = acc.astype(np.float32) * m       # float64 integer -> float32 rounds as int32 -> float32 does
        if out_dtype == "float32":
            if relu:
                np.maximum(v, np.float32(0), out=out)
            else:
                out[...] = v
            return
        np.clip(v, lo_v, hi_v, out=v)
        np.rint(v, out=v)
        v += np.float32(y_zero_point)        # |v| <= 255 here: exact
        out[...] = v
    return run


@register_kernel("quantize_linear", "cpu")
def quantize_linear_cpu(ctx):
    scale, zp, dtype = np.float32(ctx.attrs["scale"]), ctx.attrs["zero_point"], ctx.attrs["dtype"]
    lo, hi = QRANGE[dtype]

    def run(ins, outs):
        v = ins[0].astype(np.float32) / scale
        np.rint(v, out=v)
        # clamp before adding the zero point: rint(v) may be huge, v + zp then inexact
        np.clip(v, np.float32(lo - zp), np.float32(hi - zp), out=v)
        v += np.float32(zp)
        outs[0][...] = v
    return run


@register_kernel("dequantize_linear", "cpu")
def dequantize_linear_cpu(ctx):
    scale, zp = np.float32(ctx.attrs["scale"]), ctx.attrs["zero_point"]

    def run(ins, outs):
        np.multiply((ins[0].astype(np.int32) - np.int32(zp)).astype(np.float32), scale, out=outs[0])
    return run


@register_kernel("qgemm", "cpu")
def qgemm_cpu(ctx):
    a = ctx.attrs
    _exact(ctx.in_shapes[0][1])
    store = requantizer(a.get("out_dtype", "float32"), a["a_scale"], a["b_scales"], a.get("relu", False),
                        a.get("y_scale"), a.get("y_zero_point"))
    zp = a["a_zero_point"]

    def run(ins, outs):
        acc = (ins[0].astype(np.float64) - zp) @ ins[1].astype(np.float64).T
        if len(ins) == 3:
            acc += ins[2]
        store(acc, outs[0])
    return run


@register_kernel("qconv2d", "cpu")
def qconv2d_cpu(ctx):
    a = ctx.attrs
    n, c, h, w = ctx.in_shapes[0]
    o, cg, kh, kw = ctx.in_shapes[1]
    _, _, oh, ow = ctx.out_shapes[0]
    group, (ph, pw), zp = a["group"], a["pad"], a["x_zero_point"]
    og, k = o // group, cg * kh * kw
    _exact(k)
    store = requantizer(a.get("out_dtype", "float32"), a["x_scale"], a["w_scales"], a.get("relu", False),
                        a.get("y_scale"), a.get("y_zero_point"), rank=4)
    window = dict(stride=a["stride"], dilation=a["dilation"])
    # the padded, shifted input: padding holds x_zero_point, whose shifted value is 0
    xp = np.zeros((1, c, h + 2 * ph, w + 2 * pw))
    cols = np.empty((group, cg, kh, kw, oh, ow))

    def run(ins, outs):
        wm = ins[1].astype(np.float64).reshape(group, og, k)
        acc = np.empty((n, o, oh * ow))
        for img in range(n):                  # one image's columns at a time: bounded scratch
            np.subtract(ins[0][img], zp, out=xp[0, :, ph:ph + h, pw:pw + w], dtype=np.float64)
            for i in range(kh):
                for j in range(kw):
                    cols[:, :, i, j] = _windows(xp, i, j, oh, ow, window)[0].reshape(group, cg, oh, ow)
            np.matmul(wm, cols.reshape(group, k, oh * ow), out=acc[img].reshape(group, og, oh * ow))
        if len(ins) == 3:
            acc += ins[2].reshape(1, -1, 1)
        store(acc.reshape(n, o, oh, ow), outs[0])
    return run

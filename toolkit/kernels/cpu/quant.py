"""numpy kernels of the int8 ops (ops/quant.py): quantize/dequantize, qadd, qconcat, the average
poolings, and qconv2d / qgemm as
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
from ...ops.quant import (
    QRANGE,
    average_multipliers,
    output_multipliers,
    qavg_pool2d_accumulate,
    requantize_values,
    scale_ratio,
)

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
        np.copyto(v, 0, where=np.isnan(v))       # NaN to 0, as the reference says
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


# -- int8 between the quantized layers: qadd, qconcat, qavg_pool2d, qglobal_avg_pool ------------------
# The ops' definitions are float32 steps on whole arrays; these kernels take the same steps with the
# per-plan constants (scale ratios, bounds, each window's multiplier) worked out once, when the plan
# is built. They serve every machine until native ones exist.
def _store(out_dtype: str, y_zero_point: int, relu: bool = False):
    """v (float32, in output steps) -> ``out``: clamp, round half to even, add the zero point."""
    lo, hi = QRANGE[out_dtype]
    lo = max(lo, y_zero_point) if relu else lo
    lo_v, hi_v, zp = np.float32(lo - y_zero_point), np.float32(hi - y_zero_point), np.float32(y_zero_point)

    def run(v, out):
        np.clip(v, lo_v, hi_v, out=v)
        np.rint(v, out=v)
        v += zp
        out[...] = v
    return run


@register_kernel("qadd", "cpu")
def qadd_cpu(ctx):
    a = ctx.attrs
    ra, rb = scale_ratio(a["a_scale"], a["y_scale"]), scale_ratio(a["b_scale"], a["y_scale"])
    za, zb = np.float32(a["a_zero_point"]), np.float32(a["b_zero_point"])
    store = _store(a["out_dtype"], a["y_zero_point"], a.get("relu", False))

    def run(ins, outs):
        # q - zp is exact in float32 (|q - zp| <= 255), as the definition's int32 difference
        va = ins[0].astype(np.float32)
        va -= za
        va *= ra
        vb = ins[1].astype(np.float32)
        vb -= zb
        vb *= rb
        va += vb
        store(va, outs[0])
    return run


@register_kernel("qconcat", "cpu")
def qconcat_cpu(ctx):
    a = ctx.attrs
    axis = a["axis"] % len(ctx.out_shapes[0])
    params = list(zip(a["x_scales"], a["x_zero_points"]))

    def run(ins, outs):
        start = 0
        for x, (s, z) in zip(ins, params):
            part = [slice(None)] * outs[0].ndim
            part[axis] = slice(start, start + x.shape[axis])
            outs[0][tuple(part)] = requantize_values(x, s, z, a["y_scale"], a["y_zero_point"], a["out_dtype"])
            start += x.shape[axis]
    return run


@register_kernel("qavg_pool2d", "cpu")
def qavg_pool2d_cpu(ctx):
    from ...ops.pool import avg_divisor
    a = ctx.attrs
    n, c, h, w = ctx.in_shapes[0]
    _, _, oh, ow = ctx.out_shapes[0]
    counts = avg_divisor(h, w, oh, ow, a)
    m = average_multipliers(a["x_scale"], a["y_scale"], counts)
    store = _store(a["out_dtype"], a["y_zero_point"])
    keys = ("kernel", "stride", "pad", "ceil_mode", "x_zero_point")

    def run(ins, outs):
        acc = qavg_pool2d_accumulate(ins[0], *(a[k] for k in keys))
        store(acc.astype(np.float32) * m, outs[0])
    return run


@register_kernel("qglobal_avg_pool", "cpu")
def qglobal_avg_pool_cpu(ctx):
    a = ctx.attrs
    n, c, h, w = ctx.in_shapes[0]
    m = average_multipliers(a["x_scale"], a["y_scale"], h * w)
    offset = np.int64(a["x_zero_point"]) * h * w
    store = _store(a["out_dtype"], a["y_zero_point"])
    # every partial sum of H * W values of at most 255 in magnitude is an integer below 2**24, exact
    # in float32 in any order: one matrix-vector product (5x numpy's int64 sum over a short axis)
    ones = np.ones(h * w, dtype=np.float32) if 255 * h * w < 2 ** 24 else None

    def run(ins, outs):
        x = ins[0]
        rows = x.reshape(-1, h * w)
        if ones is not None:
            acc = (rows.astype(np.float32) @ ones).astype(np.int64)
        else:
            acc = rows.sum(axis=1, dtype=np.int64)
        acc -= offset                        # the zero points' share taken off once
        store(acc.astype(np.float32).reshape(outs[0].shape) * m, outs[0])
    return run

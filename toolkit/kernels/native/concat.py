"""Generated concatenation and zero padding along one axis: per index of the axes before
``axis``, each input's run of prod(shape[axis:]) elements copied into its place in the output
(padding: zero runs before and after the input's), in parallel over those indices. An inception
or fire module's join (channels of NCHW or of the blocked layout) and LRN's channel padding are
a handful of contiguous copies per image that numpy's kernels ran on one thread."""
from __future__ import annotations

from ...backend.registry import register_native
from ...codegen.loops import Buf, For, Kernel, Names, Store, as_size, lift, parallel_from, size_product
from ...codegen.native import NativeCall
from ...ops.rules import norm_axis
from .elementwise import PARALLEL_MIN_ELEMENTS

# the dtypes the generated concat is built for; any other falls back to the numpy kernel
CONCAT_KERNEL_DTYPES = ("float32", "float64", "int64", "int32")


def _i(v):
    return lift(as_size(v), "int64")


@register_native("concat", "cpu", run_time_sizes=True)
def concat_native(ctx, ins, outs):
    if ctx.dtype not in CONCAT_KERNEL_DTYPES:
        return None
    out_shape = [as_size(d) for d in ctx.out_shapes[0]]
    axis = norm_axis(ctx.attrs["axis"], len(out_shape))
    outer = size_product(out_shape[:axis])
    row = size_product(out_shape[axis:])                 # one outer index's run in the output
    runs = [size_product(shape[axis:]) for shape in ctx.in_shapes]
    names = Names()
    y = Buf("y", ctx.dtype, outer * row, const=False)
    xs = [Buf(f"x{i}", ctx.dtype, outer * run) for i, run in enumerate(runs)]
    o, q = names.var("o"), names.var("q")
    body, start = [], 0
    for x, run in zip(xs, runs):
        if run:
            body.append(For(q, _i(0), _i(run), [Store(y, o * row + start + q, x[o * run + q])], vector=True))
        start += run
    parallel = parallel_from(ctx.threads, outer * row, PARALLEL_MIN_ELEMENTS) if outer > 1 else False
    loop = For(o, _i(0), _i(outer), body, parallel=parallel)
    return NativeCall(Kernel("concat", xs + [y], [loop], ctx.threads), list(ins) + [outs[0]])


@register_native("pad_axis", "cpu", run_time_sizes=True)
def pad_axis_native(ctx, ins, outs):
    if ctx.dtype not in CONCAT_KERNEL_DTYPES:
        return None
    in_shape = [as_size(d) for d in ctx.in_shapes[0]]
    axis = norm_axis(ctx.attrs["axis"], len(in_shape))
    before, length = as_size(ctx.attrs["before"]), in_shape[axis]
    outer = size_product(in_shape[:axis])
    inner = size_product(in_shape[axis + 1:])
    row = size_product(ctx.out_shapes[0][axis:])
    run = length * inner
    names = Names()
    x = Buf("x", ctx.dtype, outer * run)
    y = Buf("y", ctx.dtype, outer * row, const=False)
    o, q = names.var("o"), names.var("q")
    zero = lift(0.0 if ctx.dtype.startswith("float") else 0, ctx.dtype)
    start = before * inner
    body = [For(q, _i(0), _i(start), [Store(y, o * row + q, zero)], vector=True),
            For(q, _i(0), _i(run), [Store(y, o * row + start + q, x[o * run + q])], vector=True),
            For(q, _i(start + run), _i(row), [Store(y, o * row + q, zero)], vector=True)]
    parallel = parallel_from(ctx.threads, outer * row, PARALLEL_MIN_ELEMENTS) if outer > 1 else False
    loop = For(o, _i(0), _i(outer), body, parallel=parallel)
    return NativeCall(Kernel("pad_axis", [x, y], [loop], ctx.threads), [ins[0], outs[0]])

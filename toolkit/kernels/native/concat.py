"""Generated concatenation: each input's run of prod(shape[axis:]) elements per index of the
axes before ``axis`` copied into its place in the output, in parallel over those (index, input)
pieces. An inception or fire module's join (channels of NCHW or of the blocked layout) is a
handful of contiguous copies per image that numpy's kernel ran on one thread."""
from __future__ import annotations

import numpy as np

from ...codegen.loops import Buf, For, Kernel, Names, Store, lift
from ...codegen.native import NativeCall
from ...ops.rules import norm_axis
from ...backend.registry import register_native
from .elementwise import PARALLEL_MIN_ELEMENTS

DTYPES = ("float32", "float64", "int64", "int32")


def _i(v):
    return lift(int(v), "int64")


@register_native("concat", "cpu")
def concat_native(ctx, ins, outs):
    if ctx.dtype not in DTYPES:
        return None
    out_shape = [int(d) for d in ctx.out_shapes[0]]
    axis = norm_axis(ctx.attrs["axis"], len(out_shape))
    outer = int(np.prod(out_shape[:axis]))
    row = int(np.prod(out_shape[axis:]))                 # one outer index's run in the output
    runs = [int(np.prod([int(d) for d in shape[axis:]])) for shape in ctx.in_shapes]
    names = Names()
    y = Buf("y", ctx.dtype, outer * row, const=False)
    xs = [Buf(f"x{i}", ctx.dtype, outer * run) for i, run in enumerate(runs)]
    o, q = names.var("o"), names.var("q")
    body, start = [], 0
    for x, run in zip(xs, runs):
        if run:
            body.append(For(q, _i(0), _i(run), [Store(y, o * row + start + q, x[o * run + q])], vector=True))
        start += run
    loop = For(o, _i(0), _i(outer), body, parallel=ctx.threads > 1 and outer > 1 and outer * row >= PARALLEL_MIN_ELEMENTS)
    return NativeCall(Kernel("concat", xs + [y], [loop], ctx.threads), list(ins) + [outs[0]])

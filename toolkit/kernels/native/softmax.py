"""Generated softmax and log-softmax over one axis.

The input is viewed as (outer, classes, inner); each (outer, inner) position is one row read
with stride ``inner``. A row takes three passes, as the numpy kernel does: its maximum (NaN
propagates, as np.max), the sum of exp(x - max) accumulated in double precision, then the
outputs. Every pass reads and writes only its own row, so the kernel may run in place.
Threads share the rows.
"""
from __future__ import annotations

from ...backend.registry import register_native
from ...codegen.loops import (
    Buf,
    Cast,
    For,
    Kernel,
    Let,
    Names,
    Set,
    Store,
    as_size,
    call,
    lift,
    maximum,
    parallel_from,
    size_product,
)
from ...codegen.native import NativeCall
from .elementwise import FLOATS, PARALLEL_MIN_ELEMENTS


def _i(v):
    return lift(as_size(v), "int64")


def softmax_kernel(name: str, shape, axis: int, dtype: str, log: bool, threads: int) -> Kernel:
    axis %= len(shape)
    outer, classes, inner = size_product(shape[:axis]), as_size(shape[axis]), size_product(shape[axis + 1:])
    names = Names()
    size = outer * classes * inner
    x = Buf("x", dtype, size)
    y = Buf("y", dtype, size, const=False)
    row, c = names.var("row"), names.var("c")
    top, total = names.var("m", dtype), names.var("s", "float64")
    base = names.var("base")

    def at(k):
        return base + k * inner

    def over_classes(body, reduction=None):
        return For(c, _i(0), _i(classes), body, reduction=reduction)

    shifted = x[at(c)] - top
    body = [Let(base, (row // inner) * (classes * inner) + row % inner),
            Let(top, lift(float("-inf"), dtype)),
            over_classes([Set(top, maximum(top, x[at(c)]))]),
            Let(total, lift(0.0, "float64"))]
    if log:
        log_total = names.var("ls", dtype)
        body += [over_classes([Set(total, total + Cast("float64", call("exp", shifted)))], reduction=total),
                 Let(log_total, call("log", Cast(dtype, total))),
                 over_classes([Store(y, at(c), shifted - log_total)])]
    else:                              # the exponentials wait in y for the sum
        e, rounded = names.var("e", dtype), names.var("sum", dtype)
        body += [over_classes([Let(e, call("exp", shifted)), Store(y, at(c), e),
                               Set(total, total + Cast("float64", e))], reduction=total),
                 Let(rounded, Cast(dtype, total)),
                 over_classes([Store(y, at(c), y[at(c)] / rounded)])]
    loop = For(row, _i(0), _i(outer * inner), body, parallel=parallel_from(threads, size, PARALLEL_MIN_ELEMENTS // 4))
    return Kernel(name, [x, y], [loop], threads)


def _builder(log: bool):
    def build(ctx, ins, outs):
        if ctx.dtype not in FLOATS or not ctx.in_shapes[0]:
            return None
        kernel = softmax_kernel("log_softmax" if log else "softmax", [as_size(d) for d in ctx.in_shapes[0]],
                                ctx.attrs["axis"], ctx.dtype, log, ctx.threads)
        return NativeCall(kernel, [ins[0], outs[0]])
    return build


register_native("softmax", "cpu", run_time_sizes=True)(_builder(False))
register_native("log_softmax", "cpu", run_time_sizes=True)(_builder(True))

"""What every generated convolution kernel shares: the shape of a convolution, the output
positions whose window lies inside the input, and the fused elementwise epilogue over a range
of an image's channels (conv.py's im2col kernels, depthwise.py's direct ones)."""
from __future__ import annotations

import numpy as np

from ...codegen.loops import Buf, For, Let, Names, lift, select
from .elementwise import operand_layout, program_body


def i64(v):
    return lift(int(v), "int64")


class ConvShape:
    def __init__(self, x_shape, w_shape, y_hw, attrs):
        self.n, self.c, self.h, self.w = (int(d) for d in x_shape)
        self.o, self.cg, self.kh, self.kw = (int(d) for d in w_shape)
        self.oh, self.ow = (int(d) for d in y_hw)
        (self.sh, self.sw), (self.ph, self.pw), (self.dh, self.dw) = attrs["stride"], attrs["pad"], attrs["dilation"]
        self.g = int(attrs["group"])
        self.og = self.o // self.g
        self.k = self.cg * self.kh * self.kw
        self.p = self.oh * self.ow
        self.padded = bool(self.ph or self.pw)


def valid_span(names: Names, out_size: int, in_size: int, stride: int, pad: int, offset) -> tuple[list, object, object]:
    """Lets for [lo, hi): the output positions o whose input position o*stride - pad + offset
    lies inside [0, in_size). Hoisting the bounds out of the copy loop leaves a plain strided
    copy there, which the compiler vectorises."""
    lo, hi = names.var("lo"), names.var("hi")
    first = i64(pad) - offset                           # o*stride >= pad - offset
    last = i64(in_size - 1 + pad) - offset              # o*stride <= in_size - 1 + pad - offset
    lo_expr = select(first.gt(0), (first + (stride - 1)) // stride, i64(0))
    hi_expr = select(last.ge(0), last // stride + 1, i64(0))
    hi_expr = select(hi_expr.gt(out_size), i64(out_size), hi_expr)
    lo_expr = select(lo_expr.gt(hi_expr), hi_expr, lo_expr)
    return [Let(hi, hi_expr), Let(lo, lo_expr)], lo, hi


def epilogue_statements(names, program, outputs, group_shape, in_shapes, views, dtype, x_bufs, out_bufs, head: Buf,
                        n, o_lo, o_hi, positions=None) -> list | None:
    """The elementwise program over image n, channels [o_lo, o_hi) of a [N, O, H, W] group, and
    only its positions [q_lo, q_hi) where ``positions`` gives them (None if the operands do not
    step through the positions uniformly).

    The positions of a channel are one loop where every operand steps through them uniformly
    (a whole plane, or a value per channel), marked as vector lanes: the program reads and
    writes each position's own elements only. Without the mark the compiler guards the loop
    with an overlap test, which an in-place epilogue (the output is the GEMM's array) always
    fails, and runs it scalar with a branch per element (a ReLU after a 1024 x 196 GEMM took
    as long as the GEMM)."""
    _, _, hh, ww = group_shape
    o, y, z, q = names.var("o"), names.var("y"), names.var("z"), names.var("q")
    layouts = {i: operand_layout(in_shapes[i], group_shape, (views[i] if i < len(views) else ()) or None)
               for i in x_bufs}
    flat = all(strides[2] == strides[3] * ww for strides, _ in layouts.values())
    if positions is not None and not flat:
        return None
    q_lo, q_hi = positions if positions is not None else (i64(0), i64(hh * ww))

    def index_of(key):
        if key[0] == "x":
            strides, off = layouts[key[1]]
            expr = lift(off, "int64")
            steps = ((n, strides[0]), (o, strides[1]), (q, strides[3])) if flat else zip((n, o, y, z), strides)
            for var, st in steps:
                if st:
                    expr = expr + var * st
            return expr
        if flat:
            return (n * group_shape[1] + o) * (hh * ww) + q
        return ((n * group_shape[1] + o) * hh + y) * ww + z
    operands = {("x", i): b for i, b in x_bufs.items()}
    operands[("h",)] = head
    body = program_body(program, outputs, operands, dtype, index_of, out_bufs, names)
    if body is None:
        return None
    if flat:
        return [For(o, o_lo, o_hi, [For(q, q_lo, q_hi, body, vector=True)])]
    return [For(o, o_lo, o_hi, [For(y, i64(0), i64(hh), [For(z, i64(0), i64(ww), body, vector=True)])])]


def epilogue_buffers(program, ctx, ins, outs, shape, params: list, arrays: list):
    """The buffers of a fused epilogue's program (the inputs it reads, its outputs over
    ``shape``), appended to the kernel's params and arrays; ({}, []) without a program."""
    if program is None:
        return {}, []
    dtype = ctx.dtype
    used = sorted({r[1] for _op, args, _a in program[0] for r in args if r[0] == "x"})
    x_bufs = {i: Buf(f"e{i}", dtype, int(np.prod(ctx.in_shapes[i]))) for i in used}
    out_bufs = [Buf(f"out{j}", dtype, int(np.prod(shape)), const=False) for j in range(len(program[1]))]
    params += list(x_bufs.values()) + out_bufs
    arrays += [ins[i] for i in used] + list(outs)
    return x_bufs, out_bufs



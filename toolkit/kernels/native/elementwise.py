"""Generated kernels for elementwise work: single ops, fused programs, and GEMM epilogues.

A program becomes one loop nest over the group's shape: each element's steps are scalar
expressions kept in registers, so a chain of k ops reads its inputs and writes its outputs once,
whatever k is. Broadcast operands and inputs read through a view are addressed by strides;
dimensions whose strides line up are merged, so a same-shape chain is one flat loop the compiler
vectorises. A matmul epilogue tiles the GEMM's rows (or, for a few rows, its columns) across
threads and runs the program over each tile while it is still in cache.
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_native
from ...codegen import microkernel
from ...codegen import rowdot as rowdot_source
from ...codegen.loops import (
    Buf,
    Cast,
    Const,
    Expr,
    Extern,
    For,
    Gemm,
    Kernel,
    Let,
    Names,
    Set,
    Store,
    as_size,
    lift,
    parallel_from,
    select,
    size_product,
)
from ...codegen.native import NativeCall
from ...ops.base import get_op
from ...ops.elementwise import ELEMENTWISE_IMPL
from ...ops.fused import head_parts

# Below this many elements a parallel loop costs more to start than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 15
FLOATS = ("float32", "float64")
# storage dtype -> the dtype a loop program computes in (loops.py: a Load converts, a Store rounds)
COMPUTE_DTYPE = {"float16": "float32"}


def step_expr(op: str, a: list, attrs: dict, dtype: str):
    """The scalar expression of one program step, with numpy's semantics (the op's own, from its
    OpDef); None where the op has none."""
    if op == "scale":                  # not a graph op: a native builder's multiply by a constant
        factor = attrs["factor"]       # a float, or a double expression of run-time sizes
        return a[0] * (Cast(dtype, factor) if isinstance(factor, Expr) else Const(float(factor), dtype))
    scalar = get_op(op).scalar_expr
    return None if scalar is None else scalar(*a, dtype=dtype, **attrs)


def _strides(shape) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


def operand_layout(in_shape, group_shape, view=None) -> tuple[list[int], int]:
    """Element strides of an operand over the group's dimensions (0 where it broadcasts) and its
    starting offset; ``view`` = (axis, start, stop) reads a slice of the operand in place."""
    full = list(in_shape)
    strides = _strides(full)
    offset = 0
    shape = list(full)
    if view:
        axis, start, stop = view
        offset = start * strides[axis]
        shape[axis] = stop - start
    shift = len(group_shape) - len(shape)
    out = []
    for d in range(len(group_shape)):
        j = d - shift
        out.append(0 if j < 0 or shape[j] == 1 else strides[j])
    return out, offset


def merge_dims(shape, layouts: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Merge neighbouring dimensions along which every operand steps uniformly."""
    dims = [as_size(d) for d in shape] or [1]
    layouts = [list(s) or [0] for s in layouts] if shape else [[0] for _ in layouts]
    d = len(dims) - 2
    while d >= 0:
        if all(s[d] == s[d + 1] * dims[d + 1] for s in layouts):
            dims[d] *= dims[d + 1]
            del dims[d + 1]
            for s in layouts:
                s[d] = s[d + 1]                       # the merged stride is the inner one
                del s[d + 1]
        d -= 1
    return dims, layouts


def program_body(program, outputs, operands: dict, dtype: str, index_of, out_bufs, names: Names) -> list | None:
    """Statements computing one element: Lets per step, Stores per output. ``operands`` maps
    ("x", i) / ("h",) to Bufs; ``index_of(key)`` gives that operand's index expression."""
    body, values, stores = [], [], []
    out_of: dict[int, list[int]] = {}          # a step may leave twice (stored in two dtypes)
    for k, s in enumerate(outputs):
        out_of.setdefault(s, []).append(k)
    for s, (op, args, attrs) in enumerate(program):
        a = []
        for ref in args:
            if ref[0] == "t":
                a.append(values[ref[1]])
            else:
                key = ("h",) if ref[0] == "h" else ("x", ref[1])
                a.append(operands[key][index_of(key)])
        expr = step_expr(op, a, dict(attrs), dtype)
        if expr is None:
            return None
        v = names.var("t", dtype)
        body.append(Let(v, expr))
        values.append(v)
        for k in out_of.get(s, ()):
            stores.append(Store(out_bufs[k], index_of(("o", k)), v))
    # every read of the element before any write: an output may share memory with an input
    # (in-place plans) or, in an epilogue, with the head's result
    return body + stores


def elementwise_kernel(name: str, program, outputs, in_shapes, group_shape, dtype: str, views, threads: int,
                       head: bool = False, min_parallel: int = PARALLEL_MIN_ELEMENTS,
                       flat: bool = False, in_dtypes=(), out_dtypes=()) -> tuple[Kernel, list] | None:
    """(kernel, parameter keys) of a program over ``group_shape``; None if a step is unsupported.
    Parameter keys: ("x", i) for the inputs the program reads, ("o", k), and ("h",) for a head.
    The outermost loop is parallel from ``min_parallel`` elements (0 for a GPU, whose threads
    need a parallel loop to run at all). ``flat`` makes the nest one parallel loop over every
    element, each dimension's index recovered by division: what a GPU wants, since only the
    outermost loop is spread over threads (a [2, 64, 28, 28] group would otherwise get 2).
    ``in_dtypes`` / ``out_dtypes``: the stored dtype of each input / output where it is not
    ``dtype`` (ops/fused.py; the CUDA dialect's float16 loads widen and its stores round)."""
    used = sorted({r[1] for _op, args, _a in program for r in args if r[0] == "x"})
    keys = [("x", i) for i in used] + [("o", k) for k in range(len(outputs))] + ([("h",)] if head else [])
    size = size_product(group_shape)
    layouts, offsets = [], []
    for key in keys:
        if key[0] == "x":
            view = views[key[1]] if key[1] < len(views) else ()
            strides, offset = operand_layout(in_shapes[key[1]], group_shape, view or None)
        else:
            strides, offset = _strides(group_shape), 0
        layouts.append(strides)
        offsets.append(offset)
    dims, merged = merge_dims(group_shape, layouts)
    names = Names()
    compute = COMPUTE_DTYPE.get(dtype, dtype)   # float16 buffers, float32 arithmetic (GPU dialect only)
    bufs = {}
    for n, key in enumerate(keys):
        if key[0] == "x":
            stored = in_dtypes[key[1]] if in_dtypes else dtype
            bufs[key] = Buf(f"x{key[1]}", stored, int(np.prod(in_shapes[key[1]], dtype=np.int64)))
        elif key[0] == "o":
            bufs[key] = Buf(f"o{key[1]}", out_dtypes[key[1]] if out_dtypes else dtype, size, const=False)
        else:
            bufs[key] = Buf("h", dtype, size)
    loop_vars = [names.var("i") for _ in dims]
    position = {key: n for n, key in enumerate(keys)}

    def index_of(key):
        n = position[key]
        expr = lift(offsets[n], "int64")
        for v, stride in zip(loop_vars, merged[n]):
            if stride:
                expr = expr + v * stride if not (isinstance(expr, Const) and expr.value == 0) else v * stride
        return expr

    operands = {k: b for k, b in bufs.items() if k[0] in ("x", "h")}
    body = program_body(program, outputs, operands, compute, index_of, [bufs[("o", k)] for k in range(len(outputs))],
                        names)
    if body is None:
        return None
    if flat:
        element = names.var("e")
        lets, inner = [], 1
        for depth in range(len(dims) - 1, -1, -1):
            index = element // inner if inner > 1 else element
            lets.insert(0, Let(loop_vars[depth], index % dims[depth] if depth > 0 else index))
            inner *= dims[depth]
        return Kernel(name, [bufs[k] for k in keys],
                      [For(element, lift(0, "int64"), lift(size, "int64"), lets + body, parallel=True)], threads), keys
    parallel = parallel_from(threads, size, min_parallel)
    for depth in range(len(dims) - 1, -1, -1):
        body = [For(loop_vars[depth], lift(0, "int64"), lift(dims[depth], "int64"), body,
                    parallel=parallel if depth == 0 else False, vector=depth == len(dims) - 1)]
    return Kernel(name, [bufs[k] for k in keys], body, threads), keys


def _arrays_for(keys, ins, outs, head=None):
    out = []
    for key in keys:
        out.append(ins[key[1]] if key[0] == "x" else outs[key[1]] if key[0] == "o" else head)
    return out


@register_native("fused_elementwise", "cpu", run_time_sizes=True)
def fused_elementwise_native(ctx, ins, outs):
    if ctx.dtype not in FLOATS:
        return None
    built = elementwise_kernel("fused", ctx.attrs["program"], ctx.attrs["outputs"], ctx.in_shapes,
                               tuple(ctx.out_shapes[0]), ctx.dtype, ctx.attrs.get("views", ()), ctx.threads)
    if built is None:
        return None
    kernel, keys = built
    return NativeCall(kernel, _arrays_for(keys, ins, outs))


def one_step_call(name: str, step, ctx, ins, outs):
    """A single program step over the output's shape, its inputs broadcast: a NativeCall, or
    None where a dtype differs or the step is unsupported."""
    if ctx.dtype not in FLOATS or any(a.dtype != np.dtype(ctx.dtype) for a in list(ins) + list(outs)):
        return None
    built = elementwise_kernel(name, (step,), (0,), ctx.in_shapes, tuple(ctx.out_shapes[0]), ctx.dtype, (),
                               ctx.threads)
    if built is None:
        return None
    kernel, keys = built
    return NativeCall(kernel, _arrays_for(keys, ins, outs))


def _single_op(op):
    def builder(ctx, ins, outs):
        step = (op, tuple(("x", i) for i in range(len(ins))), tuple(sorted(ctx.attrs.items())))
        return one_step_call(op, step, ctx, ins, outs)
    return builder


for _op in ELEMENTWISE_IMPL:
    if get_op(_op).scalar_expr is not None:
        register_native(_op, "cpu", run_time_sizes=True)(_single_op(_op))


# -- matmul and its epilogue -------------------------------------------------------------------
def gemm_tiles(m: int, n: int, k: int, threads: int) -> tuple[int, int]:
    """(row tiles, column tiles) for sharing one GEMM among threads, or (1, 1) when there is too
    little work to share. Each thread's BLAS call packs its own panels of A (rows x k) and B
    (k x columns), so the split is the one that packs less: columns when B (the weights of a
    layer at a small batch) is the bigger operand, rows otherwise."""
    if threads <= 1 or 2 * m * n * k < 500_000:
        return 1, 1
    rows_ok, cols_ok = m >= 8 * threads, n >= 64 * threads
    by_rows = -(-m // threads) * k + k * n
    by_cols = m * k + k * -(-n // threads)
    if cols_ok and (not rows_ok or by_cols < by_rows):
        return 1, threads
    if rows_ok:
        return threads, 1
    return 1, 1


def _vector_times_matrix(names, a, b, c, k: int, n: int, trans_b: bool, c0, nc, dtype) -> list:
    """c[c0 : c0+nc] = a [k] x op(B): one row of A, as a fully connected layer at batch 1. The
    BLAS library's GEMM packs all of B on every call, which for a layer's weight (AlexNet's fc6:
    151 MB) triples the memory traffic of a product that is only a read of B; here B is read
    once, as rows: dot products over B's rows [N, K], or a sum of scaled rows of B [K, N]."""
    j, kk = names.var("j"), names.var("k")
    if trans_b:
        acc = names.var("acc", dtype)
        return [For(j, c0, c0 + nc, [Let(acc, lift(0.0, dtype)),
                                     For(kk, lift(0, "int64"), lift(k, "int64"),
                                         [Set(acc, acc + a[kk] * b[j * k + kk])], reduction=acc),
                                     Store(c, j, acc)])]
    scale = names.var("ak", dtype)
    return [For(j, c0, c0 + nc, [Store(c, j, lift(0.0, dtype))], vector=True),
            For(kk, lift(0, "int64"), lift(k, "int64"), [Let(scale, a[kk]), For(j, c0, c0 + nc, [
                Store(c, j, scale * b[kk * n + j], accumulate=True)], vector=True)])]


def matmul_kernel(name, a_shape, b_shape, trans_a, trans_b, dtype, threads, epilogue=None):
    """C = op(A) op(B) for 2-D operands, tiled over threads; ``epilogue(names, c, row0, rows,
    col0, cols)`` adds statements run on each tile after its GEMM. Returns (kernel, a, b, c)."""
    m = a_shape[1] if trans_a else a_shape[0]
    k = a_shape[0] if trans_a else a_shape[1]
    n = b_shape[0] if trans_b else b_shape[1]
    a = Buf("a", dtype, a_shape[0] * a_shape[1])
    b = Buf("b", dtype, b_shape[0] * b_shape[1])
    c = Buf("c", dtype, m * n, const=False)
    row_tiles, col_tiles = gemm_tiles(m, n, k, threads)
    rowdot = m == 1 and trans_b and dtype == "float32" and microkernel.available()
    if m == 1 and trans_b and not rowdot:
        # dot products over B's rows in the loop language stay on one thread: inside a parallel
        # loop gcc keeps the vector reduction's lanes in memory, and AlexNet's fc6 (4096 rows of
        # 9216) took 17 ms on two threads against 8.6 ms on one (codegen/rowdot.py's doesn't)
        row_tiles, col_tiles = 1, 1
    names = Names()
    tile = names.var("tile")
    rows_per = -(-m // row_tiles)
    cols_per = n if col_tiles == 1 else -(-n // (16 * col_tiles)) * 16   # whole cache lines of C
    col_tiles = -(-n // cols_per)
    r0, c0 = names.var("r"), names.var("c")
    nr, nc = names.var("nr"), names.var("nc")
    body = [Let(r0, (tile // col_tiles) * rows_per), Let(c0, (tile % col_tiles) * cols_per),
            Let(nr, _imin(lift(rows_per, "int64"), lift(m, "int64") - r0)),
            Let(nc, _imin(lift(cols_per, "int64"), lift(n, "int64") - c0))]
    a_off = r0 if trans_a else r0 * a_shape[1]
    b_off = c0 * b_shape[1] if trans_b else c0
    if rowdot:
        body.append(Extern("tk_rowdot", ((a, lift(0, "int64")), (b, c0 * k), lift(k, "int64"), nc, (c, c0)),
                           rowdot_source.C_SOURCE))
    elif m == 1:
        body += _vector_times_matrix(names, a, b, c, k, n, trans_b, c0, nc, dtype)
    else:
        body.append(Gemm(trans_a, trans_b, nr, nc, lift(k, "int64"), a, a_off, a_shape[1], b, b_off, b_shape[1],
                         c, r0 * n + c0, n))
    if epilogue is not None:
        body += epilogue(names, c, r0, nr, c0, nc)
    loop = For(tile, lift(0, "int64"), lift(row_tiles * col_tiles, "int64"), body, parallel=row_tiles * col_tiles > 1)
    return Kernel(name, [a, b, c], [loop], threads), a, b, c


def _imin(x, y):
    return select(x.lt(y), x, y)


@register_native("matmul", "cpu", run_time_sizes=True)
def matmul_native(ctx, ins, outs):
    if ctx.dtype not in FLOATS or len(ctx.in_shapes[0]) != 2 or len(ctx.in_shapes[1]) != 2:
        return None
    kernel, *_ = matmul_kernel("matmul", ctx.in_shapes[0], ctx.in_shapes[1], ctx.attrs["trans_a"],
                               ctx.attrs["trans_b"], ctx.dtype, ctx.threads)
    return NativeCall(kernel, [ins[0], ins[1], outs[0]])


def matmul_epilogue_native(ctx, ins, outs):
    """fused_epilogue headed by a matmul (a convolution head is conv.py's; epilogue.py chooses)."""
    head, head_attrs, k = head_parts(ctx.attrs)
    if ctx.dtype not in FLOATS or any(len(s) != 2 for s in ctx.in_shapes[:2]):
        return None
    program, outputs = ctx.attrs["program"], ctx.attrs["outputs"]
    views = ctx.attrs.get("views", ())
    group = tuple(ctx.out_shapes[0])
    m, n = group
    used = sorted({r[1] for _op, args, _a in program for r in args if r[0] == "x"})
    layouts = {i: operand_layout(ctx.in_shapes[i], group, (views[i] if i < len(views) else ()) or None) for i in used}
    bufs = {("x", i): Buf(f"x{i}", ctx.dtype, int(np.prod(ctx.in_shapes[i], dtype=np.int64))) for i in used}
    out_bufs = [Buf(f"o{j}", ctx.dtype, m * n, const=False) for j in range(len(outputs))]
    state = {}

    def epilogue(names, c, r0, nr, c0, nc):
        i, j = names.var("i"), names.var("j")

        def index_of(key):
            if key[0] == "x":
                (si, sj), off = layouts[key[1]]
                expr = lift(off, "int64")
                return expr + i * si + j * sj
            return i * n + j
        operands = dict(bufs)
        operands[("h",)] = c
        body = program_body(program, outputs, operands, ctx.dtype, index_of, out_bufs, names)
        if body is None:
            state["unsupported"] = True
            return []
        inner = For(j, c0, c0 + nc, body, vector=True)      # each element's own reads and writes
        return [For(i, r0, r0 + nr, [inner])]

    # the GEMM writes the first output's array, which the program then reads as the head and
    # overwrites element by element (every element's reads come before its writes)
    kernel, a, b, c = matmul_kernel("epilogue", ctx.in_shapes[0], ctx.in_shapes[1], head_attrs["trans_a"],
                                    head_attrs["trans_b"], ctx.dtype, ctx.threads, epilogue)
    if state.get("unsupported"):
        return None
    kernel.params = [a, b, c] + [bufs[("x", i)] for i in used] + out_bufs
    return NativeCall(kernel, [ins[0], ins[1], outs[0]] + [ins[i] for i in used] + list(outs))

"""Max and average pooling and their gradients as CUDA kernels of our own, NCHW and channels last
(``max_pool2d``, ``avg_pool2d``, their ``_grad`` ops and the four ``nhwc_`` ops), where the array
programs they replace (kernels/cpu/pool.py over CuPy) copy the input into a padded buffer and
spend one CuPy kernel per window offset (five per offset for max pooling's gradient).

One kernel serves both layouts: it takes the element strides of n, c, h and w, and its threads
walk the elements in memory order (channels last: the channel varies fastest), so neighbouring
threads read neighbouring addresses either way. Grid-stride loops, one thread per output
element forward and one per input element backward.

The semantics are the CPU kernels' (PyTorch's): a window position outside the input holds the
lowest value for max (-inf) and 0 for average; average divides by ``avg_divisor`` (ceil_mode and
count_include_pad), multiplying by its reciprocal in the storage type as the CPU does; max
propagates NaN as np.maximum does. Max's gradient goes to each window's first maximum in row-major
window order (a window whose maximum is NaN passes none, as the CPU's equality test passes none,
where PyTorch's passes it to the NaN; a non-finite g reaches its window's maximum alone, as in
PyTorch, where the CPU's multiplication by a 0/1 mask also gives NaN to the window's other
elements, inf * 0): one kernel writes each window's winning offset, a second gathers, for each
input element, the gradients of the windows that chose it. Both gradients are gathers, each
element's terms added in the CPU's order of window offsets, so there are no atomics: a captured
plan equals the kernel-by-kernel one bit for bit, and float32 and float64 results equal the CPU
kernel's bit for bit (the same sums in the same order; a product is rounded before it is added,
``__fmul_rn`` keeping NVRTC from contracting the two into an FMA). float16 is read and written as
CudaDialect does (``unsigned short`` + tk_h2f / tk_f2h) and computed in float32: the CPU's float32
result on the same inputs rounded once, where the array program's float16 sums round at every
term. Other dtypes (max pooling's uint8 and int8, bfloat16) keep the array program this module
specialises.

Compiled by NVRTC when a plan is built (``cuda.compiled_source``); the tests compile the same
source for the host (tests/runtime/gpu_stand_in.py).
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from ...backend.devices import gpu_module
from ...backend.registry import KERNELS, SPECIALISED
from ...codegen.render import HALF_HELPERS
from ...ops.nhwc import nchw_shape
from ...ops.pool import avg_divisor
from .cuda import THREADS_PER_BLOCK, compiled_source

cp = gpu_module()

STORAGE = {"float32": "float", "float64": "double", "float16": "unsigned short"}
MAX_BLOCKS = 132 * 16

# which of this module's kernels the plans built so far run: (op, dtype) -> how many
BUILT: Counter = Counter()

PRELUDE = HALF_HELPERS + r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef __CUDA_ARCH__
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
#endif
"""


def _unit(dtype: str, index: str, winner: str) -> str:
    """The four kernels for one storage type, ``index`` the integer type of the element
    arithmetic (int where every offset fits, for cheaper divisions), ``winner`` that of max
    pooling's chosen offsets."""
    half = dtype == "float16"
    acc = "double" if dtype == "float64" else "float"
    return PRELUDE + f"""
typedef {STORAGE[dtype]} T;
typedef {acc} A;
typedef {index} IX;
typedef {winner} Q;
#define LD(X) ((A){"tk_h2f(X)" if half else "(X)"})
#define ST(X) ({"tk_f2h(X)" if half else "(X)"})
#define MUL_RN(A_, B_) ({"__dmul_rn" if dtype == "float64" else "__fmul_rn"}((A_), (B_)))

/* the sizes and element strides of a pooling: x [n, c, h, w] and its pooled [n, c, oh, ow] */
struct tk_pool {{
    IX n, c, h, w, oh, ow;
    IX xn, xc, xh, xw, yn, yc, yh, yw;
    int kh, kw, sh, sw, ph, pw, last;
}};

__device__ inline tk_pool tk_geometry(const long long *s, int last) {{
    tk_pool p;
    p.n = (IX)s[0]; p.c = (IX)s[1]; p.h = (IX)s[2]; p.w = (IX)s[3]; p.oh = (IX)s[4]; p.ow = (IX)s[5];
    p.xn = (IX)s[6]; p.xc = (IX)s[7]; p.xh = (IX)s[8]; p.xw = (IX)s[9];
    p.yn = (IX)s[10]; p.yc = (IX)s[11]; p.yh = (IX)s[12]; p.yw = (IX)s[13];
    p.kh = (int)s[14]; p.kw = (int)s[15]; p.sh = (int)s[16]; p.sw = (int)s[17]; p.ph = (int)s[18];
    p.pw = (int)s[19]; p.last = last;
    return p;
}}

/* element t of an [n, c, rows, cols] array in its memory order (channels last: c fastest) */
__device__ inline void tk_split(IX t, IX c_size, IX rows, IX cols, int last, IX *n, IX *c, IX *r, IX *q) {{
    if (last) {{ *c = t % c_size; t /= c_size; *q = t % cols; t /= cols; *r = t % rows; *n = t / rows; }}
    else {{ *q = t % cols; t /= cols; *r = t % rows; t /= rows; *c = t % c_size; *n = t / c_size; }}
}}

/* the maximum of output (n, c, oy, ox)'s window as np.maximum's chain over the offsets in
   row-major order (NaN wins and stays), and the offset of its first occurrence: the first
   maximum, or kh * kw where the maximum is NaN (no element equals it) */
__device__ inline A tk_window_max(const T *x, const tk_pool &p, IX n, IX c, IX oy, IX ox, int *first) {{
    const T *image = x + n * p.xn + c * p.xc;
    IX y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
    A best = -INFINITY;
    int at = 0, q = 0;
    for (int i = 0; i < p.kh; i++) {{
        IX iy = y0 + i;
        bool row = iy >= 0 && iy < p.h;
        for (int j = 0; j < p.kw; j++, q++) {{
            IX ix = x0 + j;
            A v = row && ix >= 0 && ix < p.w ? LD(image[iy * p.xh + ix * p.xw]) : (A)-INFINITY;
            if (q == 0) best = v;
            else if (best == best && (v != v || v > best)) {{ best = v; at = q; }}
        }}
    }}
    *first = best == best ? at : p.kh * p.kw;
    return best;
}}

extern "C" __global__ void tk_max_pool(const T *x, T *y, const long long *sizes, int last) {{
    tk_pool p = tk_geometry(sizes, last);
    IX total = p.n * p.c * p.oh * p.ow, step = (IX)gridDim.x * blockDim.x;
    for (IX t = (IX)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {{
        IX n, c, oy, ox;
        int first;
        tk_split(t, p.c, p.oh, p.ow, p.last, &n, &c, &oy, &ox);
        A best = tk_window_max(x, p, n, c, oy, ox, &first);
        y[n * p.yn + c * p.yc + oy * p.yh + ox * p.yw] = ST(best);
    }}
}}

/* each window's first maximum as its offset i * kw + j (kh * kw: none), laid out as y */
extern "C" __global__ void tk_max_pool_winners(const T *x, Q *winner, const long long *sizes, int last) {{
    tk_pool p = tk_geometry(sizes, last);
    IX total = p.n * p.c * p.oh * p.ow, step = (IX)gridDim.x * blockDim.x;
    for (IX t = (IX)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {{
        IX n, c, oy, ox;
        int first;
        tk_split(t, p.c, p.oh, p.ow, p.last, &n, &c, &oy, &ox);
        tk_window_max(x, p, n, c, oy, ox, &first);
        winner[n * p.yn + c * p.yc + oy * p.yh + ox * p.yw] = (Q)first;
    }}
}}

/* dx at input (n, c, iy, ix): the sum, over the windows that contain it in the CPU's order of
   offsets (i, j) row-major, of g where the window chose this element (max: ``winner``) or of
   g * 1/divisor rounded to T (``average``: ``inverse``) */
extern "C" __global__ void tk_pool_gather(const T *g, const Q *winner, const A *inverse, T *dx,
                                          const long long *sizes, int last, int average) {{
    tk_pool p = tk_geometry(sizes, last);
    IX total = p.n * p.c * p.h * p.w, step = (IX)gridDim.x * blockDim.x;
    for (IX t = (IX)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {{
        IX n, c, iy, ix;
        tk_split(t, p.c, p.h, p.w, p.last, &n, &c, &iy, &ix);
        IX py = iy + p.ph, px = ix + p.pw, image = n * p.yn + c * p.yc;
        A sum = 0;
        for (int i = (int)(py % p.sh); i < p.kh && i <= py; i += p.sh) {{
            IX oy = (py - i) / p.sh;
            if (oy >= p.oh) continue;
            for (int j = (int)(px % p.sw); j < p.kw && j <= px; j += p.sw) {{
                IX ox = (px - j) / p.sw;
                if (ox >= p.ow) continue;
                IX o = image + oy * p.yh + ox * p.yw;
                if (!average) {{
                    if (winner[o] == (Q)(i * p.kw + j)) sum += LD(g[o]);
                }} else {{
                    sum += MUL_RN(LD(g[o]), inverse[oy * p.ow + ox]);
                }}
            }}
        }}
        dx[n * p.xn + c * p.xc + iy * p.xh + ix * p.xw] = ST(sum);
    }}
}}

/* the window's sum (0 outside the input) in the CPU's order of offsets, times 1/divisor */
extern "C" __global__ void tk_avg_pool(const T *x, const A *inverse, T *y, const long long *sizes, int last) {{
    tk_pool p = tk_geometry(sizes, last);
    IX total = p.n * p.c * p.oh * p.ow, step = (IX)gridDim.x * blockDim.x;
    for (IX t = (IX)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += step) {{
        IX n, c, oy, ox;
        tk_split(t, p.c, p.oh, p.ow, p.last, &n, &c, &oy, &ox);
        const T *image = x + n * p.xn + c * p.xc;
        IX y0 = oy * p.sh - p.ph, x0 = ox * p.sw - p.pw;
        A sum = 0;
        int q = 0;
        for (int i = 0; i < p.kh; i++) {{
            IX iy = y0 + i;
            bool row = iy >= 0 && iy < p.h;
            for (int j = 0; j < p.kw; j++, q++) {{
                IX ix = x0 + j;
                A v = row && ix >= 0 && ix < p.w ? LD(image[iy * p.xh + ix * p.xw]) : (A)0;
                sum = q == 0 ? v : sum + v;
            }}
        }}
        y[n * p.yn + c * p.yc + oy * p.yh + ox * p.yw] = ST(sum * inverse[oy * p.ow + ox]);
    }}
}}
"""


def _strides(shape_nchw, channels_last: bool) -> tuple[int, int, int, int]:
    """The element strides of n, c, h, w of a contiguous array of these NCHW sizes."""
    n, c, h, w = shape_nchw
    return (h * w * c, 1, w * c, c) if channels_last else (c * h * w, h * w, w, 1)


class Pooling:
    """One pooling's geometry on the device: the sizes table its kernels read, the launch
    configuration, the compiled kernels for its dtype."""

    def __init__(self, x_shape, y_shape, attrs, dtype: str, channels_last: bool):
        self.x_shape, self.y_shape = tuple(x_shape), tuple(y_shape)     # NCHW sizes
        self.last = np.int32(1 if channels_last else 0)
        (kh, kw), (sh, sw), (ph, pw) = attrs["kernel"], attrs["stride"], attrs["pad"]
        big = max(int(np.prod(self.x_shape, dtype=np.int64)), int(np.prod(self.y_shape, dtype=np.int64)))
        # int where no element index, nor one a grid-stride step past the last, reaches 2^31
        index = "int" if big + MAX_BLOCKS * THREADS_PER_BLOCK < 2 ** 31 else "long long"
        winner = "unsigned char" if kh * kw < 255 else "int"
        self.winner_dtype = np.uint8 if winner == "unsigned char" else np.int32
        self.unit = _unit(dtype, index, winner)
        sizes = (*self.x_shape, *self.y_shape[2:], *_strides(self.x_shape, channels_last),
                 *_strides(self.y_shape, channels_last), kh, kw, sh, sw, ph, pw)
        # on the device once, at a fixed address (a captured graph replays it)
        self.sizes = cp.asarray(np.array(sizes, np.int64))
        self.accumulator = np.float64 if dtype == "float64" else np.float32
        self.attrs = attrs

    def grid(self, count: int) -> tuple[tuple[int], tuple[int]]:
        return (max(1, min(MAX_BLOCKS, -(-count // THREADS_PER_BLOCK))),), (THREADS_PER_BLOCK,)

    def kernel(self, name: str):
        return compiled_source(self.unit, name)

    def inverse_divisors(self):
        """1 / each output position's divisor, rounded to the accumulator type, as [oh * ow]."""
        h, w = self.x_shape[2:]
        oh, ow = self.y_shape[2:]
        return cp.asarray((1.0 / avg_divisor(h, w, oh, ow, self.attrs)).astype(self.accumulator).reshape(-1))


def _count(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def max_pool_launcher(pool: Pooling):
    """launch(x, y): y = the window maxima of x."""
    kernel = pool.kernel("tk_max_pool")
    grid, block = pool.grid(_count(pool.y_shape))

    def launch(x, y):
        kernel(grid, block, (x, y, pool.sizes, pool.last))
    return launch


def max_pool_grad_launcher(pool: Pooling):
    """launch(g, x, dx): each window's g to its first maximum, gathered per input element."""
    winners = pool.kernel("tk_max_pool_winners")
    gather = pool.kernel("tk_pool_gather")
    winner = cp.empty(pool.y_shape, pool.winner_dtype)        # scratch of the plan's own (fixed address)
    no_inverse = cp.empty((1,), pool.accumulator)
    out_grid, block = pool.grid(_count(pool.y_shape))
    in_grid, _ = pool.grid(_count(pool.x_shape))

    def launch(g, x, dx):
        winners(out_grid, block, (x, winner, pool.sizes, pool.last))
        gather(in_grid, block, (g, winner, no_inverse, dx, pool.sizes, pool.last, np.int32(0)))
    return launch


def avg_pool_launcher(pool: Pooling):
    """launch(x, y): y = each window's sum times 1 / its divisor."""
    kernel = pool.kernel("tk_avg_pool")
    inverse = pool.inverse_divisors()
    grid, block = pool.grid(_count(pool.y_shape))

    def launch(x, y):
        kernel(grid, block, (x, inverse, y, pool.sizes, pool.last))
    return launch


def avg_pool_grad_launcher(pool: Pooling):
    """launch(g, dx): each input element's sum of g * 1 / divisor over the windows holding it."""
    gather = pool.kernel("tk_pool_gather")
    inverse = pool.inverse_divisors()
    no_winner = cp.empty((1,), pool.winner_dtype)
    grid, block = pool.grid(_count(pool.x_shape))

    def launch(g, dx):
        gather(grid, block, (g, no_winner, inverse, dx, pool.sizes, pool.last, np.int32(1)))
    return launch


def _geometry(ctx, x_shape, y_shape, channels_last: bool) -> Pooling:
    if channels_last:
        x_shape, y_shape = nchw_shape(x_shape), nchw_shape(y_shape)
    return Pooling(x_shape, y_shape, ctx.attrs, ctx.dtype, channels_last)


def _max_forward(ctx, channels_last):
    launch = max_pool_launcher(_geometry(ctx, ctx.in_shapes[0], ctx.out_shapes[0], channels_last))
    return lambda ins, outs: launch(ins[0], outs[0])


def _max_backward(ctx, channels_last):
    g_shape, x_shape = ctx.in_shapes
    launch = max_pool_grad_launcher(_geometry(ctx, x_shape, g_shape, channels_last))
    return lambda ins, outs: launch(ins[0], ins[1], outs[0])


def _avg_forward(ctx, channels_last):
    launch = avg_pool_launcher(_geometry(ctx, ctx.in_shapes[0], ctx.out_shapes[0], channels_last))
    return lambda ins, outs: launch(ins[0], outs[0])


def _avg_backward(ctx, channels_last):
    launch = avg_pool_grad_launcher(_geometry(ctx, ctx.out_shapes[0], ctx.in_shapes[0], channels_last))
    return lambda ins, outs: launch(ins[0], outs[0])


# op -> (the builder of its run, whether its operands are channels last)
BUILDERS = {"max_pool2d": (_max_forward, False), "max_pool2d_grad": (_max_backward, False),
            "avg_pool2d": (_avg_forward, False), "avg_pool2d_grad": (_avg_backward, False),
            "nhwc_max_pool2d": (_max_forward, True), "nhwc_max_pool2d_backward": (_max_backward, True),
            "nhwc_avg_pool2d": (_avg_forward, True), "nhwc_avg_pool2d_backward": (_avg_backward, True)}


def _specialiser(op: str):
    build, channels_last = BUILDERS[op]

    def make(fallback):
        def factory(ctx):
            if ctx.dtype not in STORAGE or 0 in (_count(s) for s in list(ctx.in_shapes) + list(ctx.out_shapes)):
                return fallback(ctx)
            fast = build(ctx, channels_last)
            BUILT[op, ctx.dtype] += 1
            slow = []

            def run(ins, outs):
                if all(a.flags.c_contiguous for a in list(ins) + list(outs)):
                    return fast(ins, outs)
                # a view the planner left strided (none today): the array program, built when
                # first needed, since its padded buffers are as large as the input
                if not slow:
                    slow.append(fallback(ctx))
                slow[0](ins, outs)
            return run
        factory.__name__ = f"{op}_cuda"
        return factory
    make.__qualname__ = f"cuda_pooling_over_arrays[{op}]"
    return make


# in place of the array programs (arrays.py's and nhwc.py's), kept as the fallback for other dtypes
for _op in BUILDERS:
    KERNELS.specialise(_op, "gpu", SPECIALISED)(_specialiser(_op))


def fused_max_pool(x_shape, y_shape, pool_attrs: dict, dtype: str):
    """launch(x, y) of conv2d_max_pool2d's pooling step over its NCHW convolution output, or
    None for a dtype these kernels do not store."""
    if dtype not in STORAGE:
        return None
    attrs = dict(pool_attrs, pad=tuple(pool_attrs.get("pad", (0, 0))))
    BUILT["conv2d_max_pool2d", dtype] += 1
    return max_pool_launcher(Pooling(x_shape, y_shape, attrs, dtype, channels_last=False))

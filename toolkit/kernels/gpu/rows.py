"""One CUDA kernel each for what CuPy spends several on: softmax and log-softmax, the NLL loss
and its gradient, accuracy, and the finiteness check of every gradient that dynamic loss
scaling reads.

Each works on rows: the class axis of a [outer, n, inner] view (the op's axis), so that no
operand is moved to make its axis last. Softmax gives each row a warp (32 lanes stride over the
row; maxima and sums by shuffles), computing in float32 for float32 and float16 and in float64
for float64. The losses and accuracy are one warp over all rows (their outputs are one number).
``all_finite`` reads every input in one launch from a table of their addresses; the last warp
to finish (a retirement counter) writes the flag and clears the counters for the next run, so a
replayed graph needs nothing reset.

The sources are compiled by NVRTC when a plan is built (``cuda.compiled_source``). Written for a
warp of ``TK_WARP`` lanes: 32 on the device, 1 where the tests compile them for the host (each
emulated thread then is a warp of its own, and the shuffles are the identity).
"""
from __future__ import annotations

import numpy as np

from ...backend.devices import gpu_module
from ...backend.registry import KERNELS, SPECIALISED
from ...codegen.render import HALF_HELPERS
from .cuda import THREADS_PER_BLOCK, compiled_source
from .dispatched import half_accumulator

cp = gpu_module()

STORAGE = {"float32": "float", "float64": "double", "float16": "unsigned short"}
LABELS = {"int64": "long long", "int32": "int"}
WARPS_PER_BLOCK = THREADS_PER_BLOCK // 32
MAX_BLOCKS = 132 * 8

PRELUDE = HALF_HELPERS + r"""
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifdef __CUDA_ARCH__
#define TK_WARP 32
template <typename A> __device__ inline A tk_warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) { A w = __shfl_xor_sync(0xffffffffu, v, o); v = w > v ? w : v; }
    return v;
}
template <typename A> __device__ inline A tk_warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
#else
#define TK_WARP 1
template <typename A> inline A tk_warp_max(A v) { return v; }
template <typename A> inline A tk_warp_sum(A v) { return v; }
static inline unsigned int atomicAdd(unsigned int *p, unsigned int v) { unsigned int old = *p; *p += v; return old; }
static inline int atomicOr(int *p, int v) { int old = *p; *p |= v; return old; }
static inline void __threadfence() {}
#endif
"""


def _types(dtype: str) -> tuple[str, str, str, str]:
    """(storage type, accumulator type, load macro, store macro) of a float dtype."""
    acc = "double" if dtype == "float64" else "float"
    if dtype == "float16":
        return STORAGE[dtype], acc, "tk_h2f(%s)", "tk_f2h(%s)"
    return STORAGE[dtype], acc, "(%s)", "(%s)"


def _unit(dtype: str, label: str = "int64") -> str:
    t, a, ld, st = _types(dtype)
    lab = LABELS[label]
    load = ld % "X"
    return PRELUDE + f"""
typedef {t} T;
typedef {a} A;
typedef {lab} L;
#define LD(X) ((A){load})
#define ST(X) ({st % "(X)"})

extern "C" __global__ void tk_softmax(const T *x, T *y, long rows, long n, long inner, int log_form) {{
    long lane = threadIdx.x % TK_WARP;
    long warps = (long)gridDim.x * blockDim.x / TK_WARP;
    for (long row = ((long)blockIdx.x * blockDim.x + threadIdx.x) / TK_WARP; row < rows; row += warps) {{
        long base = (row / inner) * n * inner + row % inner;
        A m = -INFINITY;
        for (long j = lane; j < n; j += TK_WARP) {{ A v = LD(x[base + j * inner]); m = v > m ? v : m; }}
        m = tk_warp_max(m);
        A s = 0;
        for (long j = lane; j < n; j += TK_WARP) s += exp(LD(x[base + j * inner]) - m);
        s = tk_warp_sum(s);
        A shift = log_form ? m + log(s) : m;
        for (long j = lane; j < n; j += TK_WARP) {{
            A v = LD(x[base + j * inner]) - shift;
            y[base + j * inner] = ST(log_form ? v : exp(v) / s);
        }}
    }}
}}

/* out = -(sum of logp[row, label[row]] over kept rows) / kept rows; NaN when a kept label is out of range */
extern "C" __global__ void tk_nll_loss(const T *logp, const L *label, T *out, long rows, long n, long inner,
                                       long long ignore, int has_ignore) {{
    if (blockIdx.x != 0 || threadIdx.x >= TK_WARP) return;
    A total = 0, kept = 0, bad = 0;
    for (long row = threadIdx.x; row < rows; row += TK_WARP) {{
        long long c = label[row];
        if (has_ignore && c == ignore) continue;
        kept += 1;
        if (c < 0 || c >= n) {{ bad += 1; continue; }}
        total += LD(logp[(row / inner) * n * inner + c * inner + row % inner]);
    }}
    total = tk_warp_sum(total); kept = tk_warp_sum(kept); bad = tk_warp_sum(bad);
    if (threadIdx.x == 0) out[0] = ST(bad > 0 ? (A)NAN : -total / kept);
}}

/* the kept rows, counted by one warp into count[0] (for a gradient with an ignore_index) */
extern "C" __global__ void tk_count_kept(const L *label, A *count, long rows, long long ignore) {{
    if (blockIdx.x != 0 || threadIdx.x >= TK_WARP) return;
    A kept = 0;
    for (long row = threadIdx.x; row < rows; row += TK_WARP) kept += label[row] != ignore;
    kept = tk_warp_sum(kept);
    if (threadIdx.x == 0) count[0] = kept;
}}

/* d logp: -g / kept at each kept row's label, 0 elsewhere; without an ignore_index every row is kept */
extern "C" __global__ void tk_nll_loss_grad(const T *g, const L *label, const A *count, T *out, long rows, long n,
                                            long inner, long long ignore, int has_ignore) {{
    A share = -LD(g[0]) / (has_ignore ? (count[0] > 0 ? count[0] : (A)1) : (A)rows);
    long total = rows * n, step = (long)gridDim.x * blockDim.x;
    for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {{
        long inner_i = e % inner, c = (e / inner) % n, row = (e / (inner * n)) * inner + inner_i;
        long long lab = label[row];
        int keep = !(has_ignore && lab == ignore);
        out[e] = ST(keep && lab == c ? share : (A)0);
    }}
}}

/* the fraction of rows where fewer than top_k classes score above the (clipped) label's */
extern "C" __global__ void tk_accuracy(const T *scores, const L *label, T *out, long rows, long n, long inner,
                                       long top_k) {{
    if (blockIdx.x != 0 || threadIdx.x >= TK_WARP) return;
    A right = 0;
    for (long row = threadIdx.x; row < rows; row += TK_WARP) {{
        long long c = label[row];
        c = c < 0 ? 0 : (c >= n ? n - 1 : c);
        long base = (row / inner) * n * inner + row % inner;
        A truth = LD(scores[base + c * inner]);
        long higher = 0;
        for (long j = 0; j < n; j++) higher += LD(scores[base + j * inner]) > truth;
        right += higher < top_k;
    }}
    right = tk_warp_sum(right);
    if (threadIdx.x == 0) out[0] = ST(right / rows);
}}

/* flag[0] = 1 when every element of every table entry is finite, else 0. ``state``: [bad, warps
   retired], zero between runs: the last warp to retire writes the flag and clears them */
extern "C" __global__ void tk_all_finite(const unsigned long long *tables, const long long *sizes, int count,
                                         float *flag, unsigned int *state) {{
    long step = (long)gridDim.x * blockDim.x;
    int bad = 0;
    for (int t = 0; t < count; t++) {{
        const T *x = (const T *)tables[t];
        for (long e = (long)blockIdx.x * blockDim.x + threadIdx.x; e < sizes[t]; e += step) {{
            A v = LD(x[e]);
            bad |= !(v - v == 0);            /* inf - inf and nan - nan are nan */
        }}
    }}
#ifdef __CUDA_ARCH__
    bad = __any_sync(0xffffffffu, bad);
#endif
    if (threadIdx.x % TK_WARP != 0) return;
    if (bad) atomicOr((int *)&state[0], 1);
    __threadfence();
    unsigned int warps = gridDim.x * blockDim.x / TK_WARP;
    if (atomicAdd(&state[1], 1u) == warps - 1) {{
        __threadfence();
        flag[0] = ((volatile unsigned int *)state)[0] ? 0.0f : 1.0f;
        state[0] = 0;
        state[1] = 0;
    }}
}}
"""


def _function(dtype: str, name: str, label: str = "int64"):
    return compiled_source(_unit(dtype, label), name)


def _rows(shape, axis: int) -> tuple[int, int, int]:
    """(outer, n, inner) of ``shape`` around ``axis``."""
    axis %= len(shape)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, int(shape[axis]), inner


def _blocks(threads_needed: int) -> tuple[int]:
    return (max(1, min(MAX_BLOCKS, -(-threads_needed // THREADS_PER_BLOCK))),)


def _contiguous(arrays) -> bool:
    return all(a.flags.c_contiguous for a in arrays)


def _softmax_factory(log: bool, fallback):
    def factory(ctx):
        if ctx.dtype not in STORAGE:
            return fallback(ctx)
        outer, n, inner = _rows(ctx.in_shapes[0], ctx.attrs["axis"])
        rows = outer * inner
        if rows == 0 or n == 0:
            return fallback(ctx)
        function = _function(ctx.dtype, "tk_softmax")
        grid = _blocks(rows * 32)
        args = (np.int64(rows), np.int64(n), np.int64(inner), np.int32(log))
        slow = fallback(ctx)

        def run(ins, outs):
            if not _contiguous((ins[0], outs[0])):
                return slow(ins, outs)
            function(grid, (THREADS_PER_BLOCK,), (ins[0], outs[0]) + args)
        return run
    return factory


def _label_type(ctx) -> str | None:
    label = ctx.node.inputs[-1].dtype              # the labels come last (scores, labels; g, logp, labels)
    return label if label in LABELS and ctx.dtype in STORAGE else None


def _one_warp(name: str, extra):
    """A factory of the kernel ``name`` run by one warp over every row of (scores, labels) into
    a one-element output; ``extra(ctx)`` its arguments after (rows, n, inner)."""
    def maker(fallback):
        def factory(ctx):
            label = _label_type(ctx)
            outer, n, inner = _rows(ctx.in_shapes[0], ctx.attrs["axis"])
            if label is None or outer * inner == 0 or n == 0:
                return fallback(ctx)
            function = _function(ctx.dtype, name, label)
            args = (np.int64(outer * inner), np.int64(n), np.int64(inner)) + extra(ctx)
            slow = fallback(ctx)

            def run(ins, outs):
                if not _contiguous(ins):
                    return slow(ins, outs)
                function((1,), (32,), (ins[0], ins[1], outs[0]) + args)
            return run
        return factory
    return maker


_nll_loss = _one_warp("tk_nll_loss", lambda ctx: (np.int64(ctx.attrs["ignore_index"] or 0),
                                                  np.int32(ctx.attrs["ignore_index"] is not None)))
_accuracy = _one_warp("tk_accuracy", lambda ctx: (np.int64(ctx.attrs["top_k"]),))


def _nll_loss_grad(fallback):
    def factory(ctx):
        label = _label_type(ctx)
        if label is None:
            return fallback(ctx)
        outer, n, inner = _rows(ctx.in_shapes[1], ctx.attrs["axis"])
        rows = outer * inner
        ignore = ctx.attrs["ignore_index"]
        grad = _function(ctx.dtype, "tk_nll_loss_grad", label)
        counter = _function(ctx.dtype, "tk_count_kept", label) if ignore is not None else None
        count = cp.zeros((1,), half_accumulator(ctx.dtype) or ctx.dtype)
        grid = _blocks(max(rows * n, 1))
        args = (np.int64(rows), np.int64(n), np.int64(inner), np.int64(ignore or 0), np.int32(ignore is not None))
        slow = fallback(ctx)

        def run(ins, outs):
            g, _logp, lab = ins
            if not _contiguous((lab, outs[0])):
                return slow(ins, outs)
            if counter is not None:
                counter((1,), (32,), (lab, count, np.int64(rows), np.int64(ignore)))
            grad(grid, (THREADS_PER_BLOCK,), (g, lab, count, outs[0]) + args)
        return run
    return factory


def _all_finite(fallback):
    def factory(ctx):
        dtypes = {v.dtype for v in ctx.node.inputs}
        if len(dtypes) != 1 or ctx.dtype not in STORAGE:
            return fallback(ctx)
        function = _function(ctx.dtype, "tk_all_finite")
        sizes_host = np.array([int(np.prod(s, dtype=np.int64)) for s in ctx.in_shapes], np.int64)
        sizes = cp.asarray(sizes_host)
        state = cp.zeros((2,), cp.uint32)
        grid = _blocks(int(min(sizes_host.max(initial=1), MAX_BLOCKS * THREADS_PER_BLOCK)))
        slow = fallback(ctx)
        table = {"addresses": None, "device": None}

        def run(ins, outs):
            if not _contiguous(ins):
                return slow(ins, outs)
            addresses = tuple(_address(a) for a in ins)
            if addresses != table["addresses"]:     # a plan's buffers never move: built once
                table["device"] = cp.asarray(np.array(addresses, np.uint64))
                table["addresses"] = addresses
            function(grid, (THREADS_PER_BLOCK,), (table["device"], sizes, np.int32(len(ins)), outs[0], state))
        return run
    return factory


def _address(array) -> int:
    ptr = getattr(array.data, "ptr", None)
    return ptr if ptr is not None else array.ctypes.data


MAKERS = {"softmax": lambda slow: _softmax_factory(False, slow),
          "log_softmax": lambda slow: _softmax_factory(True, slow),
          "nll_loss": _nll_loss, "nll_loss_grad": _nll_loss_grad, "accuracy": _accuracy, "all_finite": _all_finite}


# these kernels in place of the array-program ones registered for the same ops (dispatched.py,
# arrays.py), which each keeps as its fallback (a dtype, a label type or a layout not its own)
for _op, _make in MAKERS.items():
    KERNELS.specialise(_op, "gpu", SPECIALISED)(_make)

"""Native kernels of the int8 ops between the quantized layers: qadd, qconcat, qavg_pool2d,
qglobal_avg_pool and dequantize_linear (ops/quant.py), in C called once per chunk of elements
or planes (``C_SOURCE``), the chunks in parallel.

Each takes the numpy kernel's float32 steps (kernels/cpu/quant.py) in the same order, so the
outputs are equal bit for bit: q - zp as float32 (exact: |q - zp| <= 255), one float32 multiply
per term, one float32 add (qadd), the clamp to the output range less the zero point (integer
bounds: clamping before rounding is clamping after), nearbyintf (round half to even) and + zp.
The build's flags (codegen/toolchain.py: -O3 -march=native -std=gnu11) let GCC contract a
multiply and a later add into one fused multiply-add, one rounding instead of two: qadd's
(a - za) * ra + (b - zb) * rb compiled to vfmadd. The functions are compiled under
``#pragma GCC optimize ("fp-contract=off")`` (restored after them) and marked noinline, so that
no caller built with contraction inlines them and contracts their arithmetic.
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_native
from ...codegen.loops import Buf, Extern, For, Kernel, Let, Names, lift, select
from ...codegen.native import NativeCall
from ...ops.quant import QRANGE, average_multipliers, scale_ratio
from .conv_parts import i64

CHUNK = 1 << 14                  # elements per parallel chunk of the elementwise kernels
PLANES_PER_CHUNK = 64            # (image, channel) planes per parallel chunk of the poolings
SIGNED = {"uint8": 0, "int8": 1}
INT32_MAX = 2 ** 31 - 1
MAX_POOL_WIDTH = 1 << 14         # qavg_pool2d's per-row column sums (int32) live on the stack: 64 KiB at most

C_SOURCE = r"""
/* int8 ops between the quantized layers (kernels/native/quant_between.py): the numpy kernels'
   float32 steps, in their order, with no fused multiply-add (see the module's docstring). */
#pragma GCC push_options
#pragma GCC optimize ("fp-contract=off")
#define TK_Q8_PUT(TY, v, lo, hi, zp) ((TY)(int32_t)(nearbyintf((v) < (lo) ? (lo) : (v) > (hi) ? (hi) : (v)) + (zp)))
#define TK_Q8_TYPES(M) M(uu, uint8_t, uint8_t) M(us, uint8_t, int8_t) M(su, int8_t, uint8_t) M(ss, int8_t, int8_t)

/* qadd: y = put(((a - za) * ra) + ((b - zb) * rb)), for one a type and b, y types */
#define TK_Q8_ADD(SUF, TB, TY) \
static __attribute__((noinline)) void tk_q8_add_##SUF(const TA *a, const TB *b, int64_t n, float za, float ra, \
        float zb, float rb, float lo, float hi, float zp, TY *y) { \
    for (int64_t i = 0; i < n; i++) { \
        float va = ((float)a[i] - za) * ra; \
        float vb = ((float)b[i] - zb) * rb; \
        float v = va + vb; \
        y[i] = TK_Q8_PUT(TY, v, lo, hi, zp); \
    } \
}
#define TA uint8_t
TK_Q8_ADD(uuu, uint8_t, uint8_t) TK_Q8_ADD(uus, uint8_t, int8_t) TK_Q8_ADD(usu, int8_t, uint8_t)
TK_Q8_ADD(uss, int8_t, int8_t)
#undef TA
#define TA int8_t
TK_Q8_ADD(suu, uint8_t, uint8_t) TK_Q8_ADD(sus, uint8_t, int8_t) TK_Q8_ADD(ssu, int8_t, uint8_t)
TK_Q8_ADD(sss, int8_t, int8_t)
#undef TA

/* types = 4 * a_signed + 2 * b_signed + y_signed */
static void tk_q8_add(const void *a, const void *b, int64_t n, float za, float ra, float zb, float rb, float lo,
                      float hi, float zp, int64_t types, void *y) {
    switch (types) {
    case 0: tk_q8_add_uuu(a, b, n, za, ra, zb, rb, lo, hi, zp, y); break;
    case 1: tk_q8_add_uus(a, b, n, za, ra, zb, rb, lo, hi, zp, y); break;
    case 2: tk_q8_add_usu(a, b, n, za, ra, zb, rb, lo, hi, zp, y); break;
    case 3: tk_q8_add_uss(a, b, n, za, ra, zb, rb, lo, hi, zp, y); break;
    case 4: tk_q8_add_suu(a, b, n, za, ra, zb, rb, lo, hi, zp, y); break;
    case 5: tk_q8_add_sus(a, b, n, za, ra, zb, rb, lo, hi, zp, y); break;
    case 6: tk_q8_add_ssu(a, b, n, za, ra, zb, rb, lo, hi, zp, y); break;
    default: tk_q8_add_sss(a, b, n, za, ra, zb, rb, lo, hi, zp, y); break;
    }
}

/* dequantize_linear: y = (q - zp) * scale */
static __attribute__((noinline)) void tk_q8_dequantize(const void *q, int64_t is_signed, int64_t n, float zp,
                                                        float scale, float *y) {
    if (is_signed) {
        const int8_t *s = (const int8_t *)q;
        for (int64_t i = 0; i < n; i++) y[i] = ((float)s[i] - zp) * scale;
    } else {
        const uint8_t *s = (const uint8_t *)q;
        for (int64_t i = 0; i < n; i++) y[i] = ((float)s[i] - zp) * scale;
    }
}

/* qconcat's part at another scale: quantize_linear(dequantize_linear(x)): the float32 value
   (x - xz) * xs, divided by ys (a division, as quantize_linear), rounded, clamped, + zp */
#define TK_Q8_REQUANT(SUF, TX, TY) \
static __attribute__((noinline)) void tk_q8_requant_##SUF(const TX *x, int64_t n, float xz, float xs, float ys, \
        float lo, float hi, float zp, TY *y) { \
    for (int64_t i = 0; i < n; i++) { \
        float d = ((float)x[i] - xz) * xs; \
        float v = nearbyintf(d / ys); \
        v = v < lo ? lo : v; \
        v = v > hi ? hi : v; \
        y[i] = (TY)(int32_t)(v + zp); \
    } \
}
TK_Q8_TYPES(TK_Q8_REQUANT)

/* x copied as it is (the same scale, zero point and type) or requantized; types = 2 * x_signed + y_signed,
   or -1 for the copy */
static void tk_q8_concat_part(const void *x, int64_t n, float xz, float xs, float ys, float lo, float hi, float zp,
                              int64_t types, void *y) {
    switch (types) {
    case -1: {
        const uint8_t *s = (const uint8_t *)x;
        uint8_t *d = (uint8_t *)y;
        for (int64_t i = 0; i < n; i++) d[i] = s[i];
        break;
    }
    case 0: tk_q8_requant_uu(x, n, xz, xs, ys, lo, hi, zp, y); break;
    case 1: tk_q8_requant_us(x, n, xz, xs, ys, lo, hi, zp, y); break;
    case 2: tk_q8_requant_su(x, n, xz, xs, ys, lo, hi, zp, y); break;
    default: tk_q8_requant_ss(x, n, xz, xs, ys, lo, hi, zp, y); break;
    }
}

/* qavg_pool2d over planes [0, planes): each window's int32 sum of x - xz over the positions inside
   the image (padding is the zero point: 0 once shifted), times its multiplier m[i * OW + j]. An
   output row first sums its window's input rows into one int32 per column (a loop the compiler
   vectorises), then each window adds its kw columns: integer sums, equal in any order. */
#define TK_Q8_AVG(SUF, TX, TY) \
static __attribute__((noinline)) void tk_q8_avg_pool_##SUF(const TX *x, int64_t planes, int64_t H, int64_t W, \
        int64_t OH, int64_t OW, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int32_t xz, \
        const float *m, float lo, float hi, float zp, TY *y, int32_t *cols) { \
    for (int64_t p = 0; p < planes; p++) { \
        const TX *xp = x + p * H * W; \
        TY *yp = y + p * OH * OW; \
        for (int64_t i = 0; i < OH; i++) { \
            int64_t r0 = i * sh - ph, r1 = r0 + kh; \
            r0 = r0 < 0 ? 0 : r0; r1 = r1 > H ? H : r1; \
            int32_t shift = (int32_t)(r1 - r0) * xz; \
            for (int64_t c = 0; c < W; c++) cols[c] = -shift; \
            for (int64_t r = r0; r < r1; r++) \
                for (int64_t c = 0; c < W; c++) cols[c] += (int32_t)xp[r * W + c]; \
            for (int64_t j = 0; j < OW; j++) { \
                int64_t c0 = j * sw - pw, c1 = c0 + kw; \
                c0 = c0 < 0 ? 0 : c0; c1 = c1 > W ? W : c1; \
                int32_t acc = 0; \
                for (int64_t c = c0; c < c1; c++) acc += cols[c]; \
                float v = (float)acc * m[i * OW + j]; \
                yp[i * OW + j] = TK_Q8_PUT(TY, v, lo, hi, zp); \
            } \
        } \
    } \
}
TK_Q8_TYPES(TK_Q8_AVG)

/* cols: W int32 of scratch on the calling thread's stack (W is at most MAX_POOL_WIDTH) */
static void tk_q8_avg_pool(const void *x, int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t kh,
                           int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t xz, const float *m,
                           float lo, float hi, float zp, int64_t types, void *y) {
    int32_t cols[W];
#define TK_Q8_AVG_ARGS planes, H, W, OH, OW, kh, kw, sh, sw, ph, pw, (int32_t)xz, m, lo, hi, zp, y, cols
    switch (types) {
    case 0: tk_q8_avg_pool_uu(x, TK_Q8_AVG_ARGS); break;
    case 1: tk_q8_avg_pool_us(x, TK_Q8_AVG_ARGS); break;
    case 2: tk_q8_avg_pool_su(x, TK_Q8_AVG_ARGS); break;
    default: tk_q8_avg_pool_ss(x, TK_Q8_AVG_ARGS); break;
    }
#undef TK_Q8_AVG_ARGS
}

/* qglobal_avg_pool over planes [0, planes): (sum of the plane's HW values - offset) times m, where
   offset = xz * HW takes the zero points' share off once */
#define TK_Q8_GLOBAL(SUF, TX, TY) \
static __attribute__((noinline)) void tk_q8_global_avg_##SUF(const TX *x, int64_t planes, int64_t hw, int32_t offset, \
        float m, float lo, float hi, float zp, TY *y) { \
    for (int64_t p = 0; p < planes; p++) { \
        const TX *xp = x + p * hw; \
        int32_t acc = 0; \
        for (int64_t i = 0; i < hw; i++) acc += xp[i]; \
        float v = (float)(acc - offset) * m; \
        y[p] = TK_Q8_PUT(TY, v, lo, hi, zp); \
    } \
}
TK_Q8_TYPES(TK_Q8_GLOBAL)

static void tk_q8_global_avg(const void *x, int64_t planes, int64_t hw, int64_t offset, float m, float lo, float hi,
                             float zp, int64_t types, void *y) {
    switch (types) {
    case 0: tk_q8_global_avg_uu(x, planes, hw, (int32_t)offset, m, lo, hi, zp, y); break;
    case 1: tk_q8_global_avg_us(x, planes, hw, (int32_t)offset, m, lo, hi, zp, y); break;
    case 2: tk_q8_global_avg_su(x, planes, hw, (int32_t)offset, m, lo, hi, zp, y); break;
    default: tk_q8_global_avg_ss(x, planes, hw, (int32_t)offset, m, lo, hi, zp, y); break;
    }
}
#pragma GCC pop_options
"""


def _f32(v) -> object:
    """A float32 constant of the C call (its value printed exactly: codegen/render.py)."""
    return lift(float(np.float32(v)), "float32")


def _bounds(out_dtype: str, zp: int, relu: bool = False):
    """The store's clamp bounds (the output range less the zero point; ReLU raises lo to zp) and zp."""
    lo, hi = QRANGE[out_dtype]
    lo = max(lo, zp) if relu else lo
    return _f32(lo - zp), _f32(hi - zp), _f32(zp)


def _chunked(ctx, size: int, call) -> list:
    """A loop over the chunks of ``size`` elements, parallel where there are several:
    ``call(start, count)`` gives one chunk's Extern."""
    names = Names()
    c, start = names.var("c"), names.var("start")
    chunks = -(-size // CHUNK)
    count = select((i64(size) - start).lt(i64(CHUNK)), i64(size) - start, i64(CHUNK))
    return [For(c, i64(0), i64(chunks), [Let(start, c * CHUNK), call(start, count)],
                parallel=ctx.threads > 1 and chunks > 1)]


def _planes(ctx, planes: int, call) -> list:
    names = Names()
    c, start = names.var("c"), names.var("start")
    chunks = -(-planes // PLANES_PER_CHUNK)
    count = select((i64(planes) - start).lt(i64(PLANES_PER_CHUNK)), i64(planes) - start, i64(PLANES_PER_CHUNK))
    return [For(c, i64(0), i64(chunks), [Let(start, c * PLANES_PER_CHUNK), call(start, count)],
                parallel=ctx.threads > 1 and chunks > 1)]


@register_native("dequantize_linear", "cpu")
def dequantize_linear_native(ctx, ins, outs):
    in_dtype = str(ins[0].dtype)
    size = int(np.prod(ctx.in_shapes[0]))
    if in_dtype not in SIGNED or size == 0:
        return None
    a = ctx.attrs
    q, y = Buf("q", in_dtype, size), Buf("y", "float32", size, const=False)
    body = _chunked(ctx, size, lambda start, count: Extern(
        "tk_q8_dequantize", ((q, start), i64(SIGNED[in_dtype]), count, _f32(a["zero_point"]), _f32(a["scale"]),
                             (y, start)), C_SOURCE))
    return NativeCall(Kernel("dequantize_linear", [q, y], body, ctx.threads), [ins[0], outs[0]])


@register_native("qadd", "cpu")
def qadd_native(ctx, ins, outs):
    a_dtype, b_dtype, y_dtype = str(ins[0].dtype), str(ins[1].dtype), str(outs[0].dtype)
    size = int(np.prod(ctx.in_shapes[0]))
    if any(d not in SIGNED for d in (a_dtype, b_dtype, y_dtype)) or size == 0:
        return None
    at = ctx.attrs
    ra, rb = scale_ratio(at["a_scale"], at["y_scale"]), scale_ratio(at["b_scale"], at["y_scale"])
    lo, hi, zp = _bounds(y_dtype, at["y_zero_point"], bool(at.get("relu", False)))
    types = 4 * SIGNED[a_dtype] + 2 * SIGNED[b_dtype] + SIGNED[y_dtype]
    a, b = Buf("a", a_dtype, size), Buf("b", b_dtype, size)
    y = Buf("y", y_dtype, size, const=False)
    body = _chunked(ctx, size, lambda start, count: Extern(
        "tk_q8_add", ((a, start), (b, start), count, _f32(at["a_zero_point"]), _f32(ra), _f32(at["b_zero_point"]),
                      _f32(rb), lo, hi, zp, i64(types), (y, start)), C_SOURCE))
    return NativeCall(Kernel("qadd", [a, b, y], body, ctx.threads), [ins[0], ins[1], outs[0]])


@register_native("qconcat", "cpu")
def qconcat_native(ctx, ins, outs):
    """Each (outer index, input) pair's run of elements is one call: a copy where the input has
    the output's scale, zero point and type (as requantize_values), else requantized."""
    at, y_dtype = ctx.attrs, str(outs[0].dtype)
    out_shape = tuple(int(d) for d in ctx.out_shapes[0])
    axis = at["axis"] % len(out_shape)
    outer, inner = int(np.prod(out_shape[:axis])), int(np.prod(out_shape[axis + 1:]))
    if y_dtype not in SIGNED or any(str(x.dtype) not in SIGNED for x in ins) or 0 in out_shape:
        return None
    lo, hi, zp = _bounds(y_dtype, at["y_zero_point"])
    row = out_shape[axis] * inner                  # one outer index's elements of the output
    y = Buf("y", y_dtype, outer * row, const=False)
    names = Names()
    o = names.var("o")
    bufs, calls, offset = [], [], 0
    for k, (x, s, z) in enumerate(zip(ins, at["x_scales"], at["x_zero_points"])):
        run = int(np.prod(ctx.in_shapes[k][axis:]))
        xb = Buf(f"x{k}", str(x.dtype), max(outer * run, 1))
        bufs.append(xb)
        same = (float(s), int(z), str(x.dtype)) == (float(at["y_scale"]), int(at["y_zero_point"]), y_dtype)
        types = -1 if same else 2 * SIGNED[str(x.dtype)] + SIGNED[y_dtype]
        if run:
            calls.append(Extern("tk_q8_concat_part", (
                (xb, o * run), i64(run), _f32(z), _f32(s), _f32(at["y_scale"]), lo, hi, zp, i64(types),
                (y, o * row + offset)), C_SOURCE))
        offset += run
    body = [For(o, i64(0), i64(outer), calls, parallel=ctx.threads > 1 and outer > 1)]
    arrays = [x if x.size else np.zeros(1, x.dtype) for x in ins]
    return NativeCall(Kernel("qconcat", bufs + [y], body, ctx.threads), arrays + [outs[0]])


@register_native("qavg_pool2d", "cpu")
def qavg_pool2d_native(ctx, ins, outs):
    from ...ops.pool import avg_divisor
    at, x_dtype, y_dtype = ctx.attrs, str(ins[0].dtype), str(outs[0].dtype)
    n, c, h, w = (int(d) for d in ctx.in_shapes[0])
    oh, ow = (int(d) for d in ctx.out_shapes[0][2:])
    (kh, kw), (sh, sw), (ph, pw) = at["kernel"], at["stride"], at["pad"]
    if x_dtype not in SIGNED or y_dtype not in SIGNED or 0 in (n, c, h, w, oh, ow) or w > MAX_POOL_WIDTH:
        return None
    if kh * kw * 255 > INT32_MAX:
        return None                                # an int32 sum could overflow: the numpy kernel reports it
    mult = np.ascontiguousarray(average_multipliers(at["x_scale"], at["y_scale"], avg_divisor(h, w, oh, ow, at)),
                                dtype=np.float32).reshape(-1)
    lo, hi, zp = _bounds(y_dtype, at["y_zero_point"])
    x, y = Buf("x", x_dtype, n * c * h * w), Buf("y", y_dtype, n * c * oh * ow, const=False)
    m = Buf("m", "float32", oh * ow)
    body = _planes(ctx, n * c, lambda start, count: Extern("tk_q8_avg_pool", (
        (x, start * (h * w)), count, i64(h), i64(w), i64(oh), i64(ow), i64(kh), i64(kw), i64(sh), i64(sw), i64(ph),
        i64(pw), i64(at["x_zero_point"]), (m, i64(0)), lo, hi, zp, i64(2 * SIGNED[x_dtype] + SIGNED[y_dtype]),
        (y, start * (oh * ow))), C_SOURCE))
    return NativeCall(Kernel("qavg_pool2d", [x, m, y], body, ctx.threads), [ins[0], mult, outs[0]])


@register_native("qglobal_avg_pool", "cpu")
def qglobal_avg_pool_native(ctx, ins, outs):
    at, x_dtype, y_dtype = ctx.attrs, str(ins[0].dtype), str(outs[0].dtype)
    n, c, h, w = (int(d) for d in ctx.in_shapes[0])
    if x_dtype not in SIGNED or y_dtype not in SIGNED or 0 in (n, c, h, w) or 255 * h * w > INT32_MAX:
        return None                                # a plane's int32 sum could overflow
    m = average_multipliers(at["x_scale"], at["y_scale"], h * w)
    lo, hi, zp = _bounds(y_dtype, at["y_zero_point"])
    x, y = Buf("x", x_dtype, n * c * h * w), Buf("y", y_dtype, n * c, const=False)
    body = _planes(ctx, n * c, lambda start, count: Extern("tk_q8_global_avg", (
        (x, start * (h * w)), count, i64(h * w), i64(int(at["x_zero_point"]) * h * w), _f32(m), lo, hi, zp,
        i64(2 * SIGNED[x_dtype] + SIGNED[y_dtype]), (y, start)), C_SOURCE))
    return NativeCall(Kernel("qglobal_avg_pool", [x, y], body, ctx.threads), [ins[0], outs[0]])

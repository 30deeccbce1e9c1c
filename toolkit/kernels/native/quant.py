"""Native int8 kernels: qgemm and qconv2d (ops/quant.py) as integer GEMM tiles in portable C,
the bias, requantization and ReLU fused into the store.

The tile widens both operands to int16 (activations shifted by their zero point, so in
[-255, 255]; weights in [-128, 127]) and sums int16 x int16 products in int32: the compiler
turns that reduction into AVX2's vpmaddwd (pairs of products added in int32, never saturating),
unlike vpmaddubsw, whose int16 sums of u8 x s8 pairs saturate. Each step sums one row of A
against four rows of B, so each load of A serves four multiply-adds.

- qgemm: the activations [M, K] are shifted and widened once per run; the weight [N, K] is
  widened too where M is large, else read as int8 and widened as it is loaded (a batch-1 fully
  connected layer reads its weight once: widening it first doubled the time); the tiles (blocks
  of rows by blocks of columns) run in parallel.
- qconv2d: each image is shifted, widened and transposed to NHWC (a parallel pass over its
  rows), so that a window's row of the im2row matrix is kh*kw contiguous copies of Cg channels
  (zeros where the window leaves the image: the shifted zero point); the weight is packed to
  [O, kh, kw, Cg] to match. The tiles are (image, group, block of output positions), each
  building its block of im2row rows in the thread's own scratch, then multiplying it by all the
  group's output channels.

The store is the ops' definition step for step: float32(acc) * m[o] (one float32 multiply, no
add after it, so nothing for the compiler to contract into an FMA), then for a quantized output
the clamp to [lo - zp, hi - zp] (integers, exact in float32; lo is zp under ReLU), nearbyintf
(round half to even) and + zp, which equals the definition's round, add, max and clamp.

Sums of more than ``MAX_K`` products could leave int32 in the tile; those layers keep the numpy
kernel, whose int64 check reports it.
"""
from __future__ import annotations

import numpy as np

from ...backend.registry import register_native
from ...codegen.loops import Buf, Extern, For, Kernel, Let, Names, ThreadIndex, select
from ...codegen.native import NativeCall
from ...ops.quant import QRANGE, output_multipliers
from .conv_parts import ConvShape, i64

MAX_K = (2 ** 31 - 1) // (255 * 128)     # products of at most 255 * 128: the sum stays in int32
ROWS_PER_TILE = 64                       # rows of A per tile (im2row: 64 * K int16 in L2)
COLS_PER_TILE = 64                       # columns (output channels) per qgemm tile
KINDS = {"float32": 0, "uint8": 1, "int8": 2}
# qgemm widens its weight to int16 once per run from this many rows of A on; below, the tile
# widens each weight vector as it loads it. Measured on AlexNet's fc6 ([M, 9216] x [4096, 9216],
# one core of the 2-core AMD EPYC): M = 1 5.6 ms against 12.0 widened first, M = 16 23 against
# 40, M = 64 131 against 116
WIDEN_FROM_ROWS = 32

_SOURCE = r"""
/* int8 GEMM tiles and their requantizing store (kernels/native/quant.py) */
#define TK_Q_ROWS 64
/* out[at + i*stride] = store(acc[i] + bias) for i in [0, count): one output channel's run, a
   loop per kind so that each is branch-free and vectorises where stride is 1. acc + bias is
   added modulo 2**32: where the true sum fits int32 (the only case the reference accepts) that
   is the sum, and no signed overflow is left for the compiler to assume away. */
static void tk_q_store(const int32_t *acc, int64_t count, int32_t bias, float mult, int kind, float lo, float hi,
                       int32_t zp, int relu, void *out, int64_t at, int64_t stride) {
#define TK_Q_V(i) ((float)(int32_t)((uint32_t)acc[i] + (uint32_t)bias) * mult)
    if (kind == 0) {
        float *y = (float *)out + at;
        if (relu) for (int64_t i = 0; i < count; i++) { float v = TK_Q_V(i); y[i * stride] = v > 0.0f ? v : 0.0f; }
        else for (int64_t i = 0; i < count; i++) y[i * stride] = TK_Q_V(i);
    } else if (kind == 1) {
        uint8_t *y = (uint8_t *)out + at;
        for (int64_t i = 0; i < count; i++) {
            float v = TK_Q_V(i);
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            y[i * stride] = (uint8_t)((int32_t)nearbyintf(v) + zp);
        }
    } else {
        int8_t *y = (int8_t *)out + at;
        for (int64_t i = 0; i < count; i++) {
            float v = TK_Q_V(i);
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            y[i * stride] = (int8_t)((int32_t)nearbyintf(v) + zp);
        }
    }
#undef TK_Q_V
}

TILES
/* dst[i] = src[i] - zp as int16, for n elements of uint8 (is_signed 0) or int8 */
static void tk_q_shift(const void *src, int64_t is_signed, int64_t n, int64_t zp, int16_t *dst) {
    if (is_signed) {
        const int8_t *s = (const int8_t *)src;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = (int16_t)(s[i] - zp);
    } else {
        const uint8_t *s = (const uint8_t *)src;
#pragma omp simd
        for (int64_t i = 0; i < n; i++) dst[i] = (int16_t)(s[i] - zp);
    }
}

/* row h of every channel of one image, shifted, into NHWC: dst[(h*W + w)*C + c] = x[c][h][w] - zp */
static void tk_q_nhwc_row(const void *x, int64_t is_signed, int64_t C, int64_t H, int64_t W, int64_t h,
                          int64_t zp, int16_t *dst) {
    for (int64_t c = 0; c < C; c++) {
        int16_t *d = dst + h * W * C + c;
        if (is_signed) {
            const int8_t *s = (const int8_t *)x + (c * H + h) * W;
            for (int64_t w = 0; w < W; w++) d[w * C] = (int16_t)(s[w] - zp);
        } else {
            const uint8_t *s = (const uint8_t *)x + (c * H + h) * W;
            for (int64_t w = 0; w < W; w++) d[w * C] = (int16_t)(s[w] - zp);
        }
    }
}

/* the weight [O, Cg, kh, kw] as int16 [O, kh, kw, Cg] */
static void tk_q_pack_weight(const int8_t *w, int64_t O, int64_t Cg, int64_t taps, int16_t *dst) {
    for (int64_t o = 0; o < O; o++)
        for (int64_t c = 0; c < Cg; c++)
            for (int64_t t = 0; t < taps; t++) dst[(o * taps + t) * Cg + c] = w[(o * Cg + c) * taps + t];
}

/* im2row rows of output positions [p0, p1) of group g from an NHWC image: row (p - p0) holds,
   tap by tap, the window's Cg channels (0 outside the image) */
static void tk_q_im2row(const int16_t *xs, int64_t C, int64_t H, int64_t W, int64_t g, int64_t Cg, int64_t OW,
                        int64_t p0, int64_t p1, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                        int64_t pw, int64_t dh, int64_t dw, int16_t *rows) {
    int64_t K = kh * kw * Cg;
    for (int64_t p = p0; p < p1; p++) {
        int64_t oh = p / OW, ow = p % OW;
        int16_t *row = rows + (p - p0) * K;
        for (int64_t ki = 0; ki < kh; ki++) {
            int64_t ih = oh * sh - ph + ki * dh;
            for (int64_t kj = 0; kj < kw; kj++) {
                int64_t iw = ow * sw - pw + kj * dw;
                int16_t *d = row + (ki * kw + kj) * Cg;
                if (ih >= 0 && ih < H && iw >= 0 && iw < W)
                    memcpy(d, xs + (ih * W + iw) * C + g * Cg, Cg * sizeof(int16_t));
                else
                    memset(d, 0, Cg * sizeof(int16_t));
            }
        }
    }
}
/* depthwise (one input channel per group): output channel o of image n, directly. The plane is
   copied shifted and padded (the padding 0: the shifted zero point) into the thread's scratch,
   then each output row sums its taps in int32, vectorised along the row, and is stored. */
static void tk_q_dw_plane(const void *x, int64_t is_signed, int64_t H, int64_t W, int64_t zp, const int8_t *w,
                          int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                          int64_t dw, int64_t OH, int64_t OW, int16_t *xpad, int32_t *acc, const int32_t *bias,
                          const float *mult, int64_t kind, int64_t lo, int64_t hi, int64_t yzp, int64_t relu,
                          void *out, int64_t at) {
    int64_t PW = W + 2 * pw, PH = H + 2 * ph;
    memset(xpad, 0, PH * PW * sizeof(int16_t));
    for (int64_t h = 0; h < H; h++) tk_q_shift((const char *)x + h * W, is_signed, W, zp, xpad + (h + ph) * PW + pw);
    for (int64_t oh = 0; oh < OH; oh++) {
        for (int64_t ow = 0; ow < OW; ow++) acc[ow] = 0;
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++) {
                int32_t wv = w[ki * kw + kj];
                const int16_t *src = xpad + (oh * sh + ki * dh) * PW + kj * dw;
                if (sw == 1) for (int64_t ow = 0; ow < OW; ow++) acc[ow] += wv * src[ow];
                else for (int64_t ow = 0; ow < OW; ow++) acc[ow] += wv * src[ow * sw];
            }
        tk_q_store(acc, OW, bias ? bias[0] : 0, mult[0], (int)kind, (float)lo, (float)hi, (int32_t)yzp, (int)relu,
                   out, at + oh * OW, 1);
    }
}
"""


# the dot products and the tile, for B held as int16 (widened once per run: the convolutions'
# packed weights, which every row of A meets) and as int8 (widened as it is loaded, vpmovsxbw:
# a GEMM of a few rows, where widening the whole weight first would cost as much as the products)
_TILE = r"""/* No `omp simd reduction` on these sums: with it gcc 12 widens each product to int32 (vpmullw and
   unpacks); without it, it recognises the widening dot product and emits vpmaddwd. */
static inline int32_t tk_q_dotSUFFIX(const int16_t *a, const BTYPE *b, int64_t K) {
    int32_t s = 0;
    for (int64_t k = 0; k < K; k++) s += (int32_t)a[k] * (int32_t)b[k];
    return s;
}

/* out[m*sm + n*sn] = store(sum_k A[m*lda + k] * B[n*ldb + k] + bias[n]) for m in [m0, m1), n in [n0, n1).
   Four rows of B against one row of A at a time, B's four rows (4 * K int16) kept in L1 while
   every row of A streams past them: measured on a 64 x 576 x 64 tile, this order and shape ran
   at 52 GMAC/s where 2 x 4 sums with A's rows outside (B's from L2) ran at 35, gcc spilling the
   2 x 4 form's operands to the stack. */
static void tk_q_tileSUFFIX(const int16_t *A, int64_t lda, int64_t m0, int64_t m1, const BTYPE *B, int64_t ldb,
                      int64_t n0, int64_t n1, int64_t K, const int32_t *bias, const float *mult, int64_t kind,
                      int64_t lo, int64_t hi, int64_t zp, int64_t relu, void *out, int64_t sm, int64_t sn) {
    int32_t acc[4][TK_Q_ROWS];
    float flo = (float)lo, fhi = (float)hi;
    for (int64_t r0 = m0; r0 < m1; r0 += TK_Q_ROWS) {
        int64_t r1 = r0 + TK_Q_ROWS < m1 ? r0 + TK_Q_ROWS : m1;
        for (int64_t n = n0; n < n1; n += 4) {
            int64_t cols = n1 - n < 4 ? n1 - n : 4;
            if (cols == 4) {
                const BTYPE *b0 = B + n * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb;
                for (int64_t m = r0; m < r1; m++) {
                    const int16_t *a0 = A + m * lda;
                    int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                    for (int64_t k = 0; k < K; k++) {
                        int32_t x0 = a0[k];
                        s0 += x0 * b0[k]; s1 += x0 * b1[k]; s2 += x0 * b2[k]; s3 += x0 * b3[k];
                    }
                    acc[0][m - r0] = s0; acc[1][m - r0] = s1; acc[2][m - r0] = s2; acc[3][m - r0] = s3;
                }
            } else {
                for (int64_t j = 0; j < cols; j++)
                    for (int64_t m = r0; m < r1; m++)
                        acc[j][m - r0] = tk_q_dotSUFFIX(A + m * lda, B + (n + j) * ldb, K);
            }
            for (int64_t j = 0; j < cols; j++)
                tk_q_store(acc[j], r1 - r0, bias ? bias[n + j] : 0, mult[n + j], (int)kind, flo, fhi, (int32_t)zp,
                           (int)relu, out, r0 * sm + (n + j) * sn, sm);
        }
    }
}

"""
SOURCE = _SOURCE.replace("TILES\n", _TILE.replace("SUFFIX", "").replace("BTYPE", "int16_t") +
                         _TILE.replace("SUFFIX", "_b8").replace("BTYPE", "int8_t"))


def _store_args(attrs, out_dtype: str):
    """(kind, lo, hi, zp, relu) of the fused store, as tk_q_tile takes them."""
    relu = bool(attrs.get("relu", False))
    if out_dtype == "float32":
        return i64(0), i64(0), i64(0), i64(0), i64(int(relu))
    zp = attrs["y_zero_point"]
    lo, hi = QRANGE[out_dtype]
    lo = max(lo, zp) if relu else lo
    return i64(KINDS[out_dtype]), i64(lo - zp), i64(hi - zp), i64(zp), i64(int(relu))


def _mult(attrs, scale_key, scales_key, out_dtype):
    return np.ascontiguousarray(output_multipliers(attrs[scale_key], attrs[scales_key], out_dtype,
                                                   attrs.get("y_scale")), dtype=np.float32)


def _min(a, b):
    return select(a.lt(b), a, b)


@register_native("qgemm", "cpu")
def qgemm_native(ctx, ins, outs):
    (m, k), (n, _) = ctx.in_shapes[0], ctx.in_shapes[1]
    if k > MAX_K or k == 0:
        return None
    attrs, out_dtype = ctx.attrs, str(outs[0].dtype)
    names = Names()
    a = Buf("a", str(ins[0].dtype), m * k)
    b = Buf("b", "int8", n * k)
    bias = Buf("bias", "int32", n) if len(ins) == 3 else None
    mult = Buf("mult", "float32", n)
    y = Buf("y", out_dtype, m * n, const=False)
    a16 = Buf("a16", "int16", m * k, const=False)
    mult_arr = _mult(attrs, "a_scale", "b_scales", out_dtype)
    params = [a, b] + ([bias] if bias else []) + [mult, y, a16]
    arrays = [ins[0], ins[1]] + ([ins[2]] if bias else []) + [mult_arr, outs[0], np.zeros(m * k, np.int16)]
    row, t, m0, n0 = names.var("row"), names.var("t"), names.var("m0"), names.var("n0")
    is_signed = i64(int(a.dtype == "int8"))
    parallel = ctx.threads > 1
    steps = [For(row, i64(0), i64(m), [Extern("tk_q_shift", ((a, row * k), is_signed, i64(k),
                                                             i64(attrs["a_zero_point"]), (a16, row * k)), SOURCE)],
                 parallel=parallel and m > 1)]
    if m < WIDEN_FROM_ROWS:
        fn, weight = "tk_q_tile_b8", b          # each weight row meets few rows: widened as loaded
    else:
        fn, weight = "tk_q_tile", Buf("b16", "int16", n * k, const=False)
        params.append(weight)
        arrays.append(np.zeros(n * k, np.int16))
        steps.append(Extern("tk_q_shift", ((b, i64(0)), i64(1), i64(n * k), i64(0), (weight, i64(0))), SOURCE))
    n_tiles = -(-n // COLS_PER_TILE)
    tiles = -(-m // ROWS_PER_TILE) * n_tiles
    steps.append(For(t, i64(0), i64(tiles), [
        Let(m0, (t // n_tiles) * ROWS_PER_TILE), Let(n0, (t % n_tiles) * COLS_PER_TILE),
        Extern(fn, ((a16, i64(0)), i64(k), m0, _min(m0 + ROWS_PER_TILE, i64(m)), (weight, i64(0)), i64(k),
                    n0, _min(n0 + COLS_PER_TILE, i64(n)), i64(k), (bias, i64(0)) if bias else None,
                    (mult, i64(0)), *_store_args(attrs, out_dtype), (y, i64(0)), i64(n), i64(1)), SOURCE)],
        parallel=parallel and tiles > 1))
    return NativeCall(Kernel("qgemm", params, steps, ctx.threads), arrays)


@register_native("qconv2d", "cpu")
def qconv2d_native(ctx, ins, outs):
    s = ConvShape(ctx.in_shapes[0], ctx.in_shapes[1], ctx.out_shapes[0][2:], ctx.attrs)
    if s.k > MAX_K:
        return None
    attrs, out_dtype = ctx.attrs, str(outs[0].dtype)
    names = Names()
    taps = s.kh * s.kw
    image = s.c * s.h * s.w
    x = Buf("x", str(ins[0].dtype), s.n * image)
    w = Buf("w", "int8", s.o * s.k)
    bias = Buf("bias", "int32", s.o) if len(ins) == 3 else None
    mult = Buf("mult", "float32", s.o)
    y = Buf("y", out_dtype, s.n * s.o * s.p, const=False)
    is_signed = i64(int(x.dtype == "int8"))
    head = [x, w] + ([bias] if bias else []) + [mult, y]
    head_arrays = [ins[0], ins[1]] + ([ins[2]] if bias else []) + [_mult(attrs, "x_scale", "w_scales", out_dtype),
                                                                   outs[0]]
    if s.g > 1 and s.cg == 1:
        return _depthwise(ctx, s, x, w, bias, mult, y, head_arrays, head, is_signed, out_dtype)
    xs = Buf("xs", "int16", s.n * image, const=False)
    wp = Buf("wp", "int16", s.o * s.k, const=False)
    rows = Buf("rows", "int16", ctx.threads * ROWS_PER_TILE * s.k, const=False)
    params = head + [xs, wp, rows]
    arrays = head_arrays + [np.zeros(xs.size, np.int16), np.zeros(wp.size, np.int16), np.zeros(rows.size, np.int16)]
    parallel = ctx.threads > 1
    r, t, img, g, p0, p1, slot = (names.var(v) for v in ("r", "t", "img", "g", "p0", "p1", "slot"))
    # every image's rows, shifted and transposed to NHWC
    nhwc = For(r, i64(0), i64(s.n * s.h), [
        Let(img, r // s.h),
        Extern("tk_q_nhwc_row", ((x, img * image), is_signed, i64(s.c), i64(s.h), i64(s.w), r % s.h,
                                 i64(attrs["x_zero_point"]), (xs, img * image)), SOURCE)], parallel=parallel)
    pack = Extern("tk_q_pack_weight", ((w, i64(0)), i64(s.o), i64(s.cg), i64(taps), (wp, i64(0))), SOURCE)
    blocks = -(-s.p // ROWS_PER_TILE)
    scratch = (rows, slot * (ROWS_PER_TILE * s.k))
    tile = For(t, i64(0), i64(s.n * s.g * blocks), [
        Let(slot, ThreadIndex()), Let(img, t // (s.g * blocks)), Let(g, (t // blocks) % s.g),
        Let(p0, (t % blocks) * ROWS_PER_TILE), Let(p1, _min(p0 + ROWS_PER_TILE, i64(s.p))),
        Extern("tk_q_im2row", ((xs, img * image), i64(s.c), i64(s.h), i64(s.w), g, i64(s.cg), i64(s.ow), p0, p1,
                               i64(s.kh), i64(s.kw), i64(s.sh), i64(s.sw), i64(s.ph), i64(s.pw), i64(s.dh),
                               i64(s.dw), scratch), SOURCE),
        Extern("tk_q_tile", (scratch, i64(s.k), i64(0), p1 - p0, (wp, g * (s.og * s.k)), i64(s.k), i64(0),
                             i64(s.og), i64(s.k), (bias, g * s.og) if bias else None, (mult, g * s.og),
                             *_store_args(attrs, out_dtype), (y, (img * s.o + g * s.og) * s.p + p0), i64(1),
                             i64(s.p)), SOURCE)],
        parallel=parallel)
    return NativeCall(Kernel("qconv2d", params, [nhwc, pack, tile], ctx.threads), arrays)


def _depthwise(ctx, s: ConvShape, x, w, bias, mult, y, arrays, params, is_signed, out_dtype) -> NativeCall:
    """One parallel iteration per (image, output channel) plane: ``tk_q_dw_plane``. im2row would
    copy each input value kh*kw times for kh*kw multiply-adds per output (MobileNet's 3x3
    layers: 9.4 ms against 0.28 ms for the float32 depthwise kernel at [1, 32, 112, 112])."""
    names = Names()
    padded = (s.h + 2 * s.ph) * (s.w + 2 * s.pw)
    xpad = Buf("xpad", "int16", ctx.threads * padded, const=False)
    acc = Buf("acc", "int32", ctx.threads * s.ow, const=False)
    t, img, o, slot = (names.var(v) for v in ("t", "img", "o", "slot"))
    image = s.c * s.h * s.w
    plane = For(t, i64(0), i64(s.n * s.o), [
        Let(slot, ThreadIndex()), Let(img, t // s.o), Let(o, t % s.o),
        Extern("tk_q_dw_plane", (
            (x, img * image + (o // s.og) * (s.h * s.w)), is_signed, i64(s.h), i64(s.w),
            i64(ctx.attrs["x_zero_point"]), (w, o * (s.kh * s.kw)), i64(s.kh), i64(s.kw), i64(s.sh), i64(s.sw),
            i64(s.ph), i64(s.pw), i64(s.dh), i64(s.dw), i64(s.oh), i64(s.ow), (xpad, slot * padded),
            (acc, slot * s.ow), (bias, o) if bias else None, (mult, o), *_store_args(ctx.attrs, out_dtype),
            (y, i64(0)), t * s.p), SOURCE)], parallel=ctx.threads > 1)
    return NativeCall(Kernel("qconv2d_dw", params + [xpad, acc], [plane], ctx.threads),
                      arrays + [np.zeros(xpad.size, np.int16), np.zeros(acc.size, np.int32)])

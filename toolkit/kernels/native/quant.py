"""Native int8 kernels: qgemm, qconv2d and quantize_linear (ops/quant.py), the bias,
requantization and ReLU fused into the store.

On a processor with AVX2 the convolutions, the GEMMs of 4 rows or more and the depthwise
convolutions run the packed kernels of quant_packed.py (vpmaddwd tiles; a frozen weight packed
once when the plan is built; a stride-1 convolution read from its packed image without im2col).
Elsewhere, and for a GEMM of fewer rows, the portable tiles below run:

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
from ...codegen.loops import Buf, Extern, For, Kernel, Let, Names, ThreadIndex, lift, select
from ...codegen.native import NativeCall
from ...ops.quant import QRANGE, output_multipliers
from . import quant_packed
from .conv_parts import ConvShape, i64
from .winograd import constant_weight

MAX_K = (2 ** 31 - 1) // (255 * 128)     # products of at most 255 * 128: the sum stays in int32
ROWS_PER_TILE = 64                       # rows of A per tile (im2row: 64 * K int16 in L2)
COLS_PER_TILE = 64                       # columns (output channels) per qgemm tile
KINDS = {"float32": 0, "uint8": 1, "int8": 2}
# qgemm widens its weight to int16 once per run from this many rows of A on; below, the tile
# widens each weight vector as it loads it. Measured on AlexNet's fc6 ([M, 9216] x [4096, 9216],
# one core of the 2-core AMD EPYC): M = 1 5.6 ms against 12.0 widened first, M = 16 23 against
# 40, M = 64 131 against 116
WIDEN_FROM_ROWS = 32
# the packed GEMM (quant_packed.py, AVX2) runs qgemm from this many rows of A on: its tile spans
# 16 rows, so fewer waste most of it, and a batch-1 layer reads its weight once either way
PACKED_FROM_ROWS = 4
QGEMM_ROWS = 64                          # rows of A per packed qgemm block (its thread's scratch)
DIRECT_BLOCK = 256                       # positions per parallel block of a stride-1 convolution
GATHER_BYTES = 96 << 10                  # a gathered block's windows: within the core's L2 share
GATHER_MAX = 256

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
    if quant_packed.available() and m >= PACKED_FROM_ROWS:
        return _packed_qgemm(ctx, ins, outs, m, k, n)
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
        if quant_packed.available() and s.kh * s.kw <= quant_packed.DW_MAX_TAPS:
            return _packed_depthwise(ctx, s, head, head_arrays, is_signed)
        return _depthwise(ctx, s, x, w, bias, mult, y, head_arrays, head, is_signed, out_dtype)
    if quant_packed.available():
        return _packed_conv(ctx, s, w, head, head_arrays, is_signed)
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


def _packed_weight(ctx, w: Buf, groups: int, og: int, cg: int, taps: int):
    """(the packed weight's buffer, its array, the steps that pack it): a constant weight is
    packed here, once, when the plan is built; one given at run time by a step on every run."""
    frozen = constant_weight(ctx)
    words = quant_packed.packed_words(groups, og, cg, taps)
    wp = Buf("wp", "int32", words, const=frozen is not None)
    if frozen is not None:
        return wp, quant_packed.pack_weight(np.asarray(frozen, np.int8).reshape(groups * og, cg, taps, 1), groups), []
    step = Extern("tk_q8_pack_weight", ((w, i64(0)), i64(groups), i64(og), i64(cg), i64(taps), (wp, i64(0))),
                  quant_packed.C_SOURCE)
    return wp, np.zeros(words, np.int32), [step]


def _packed_conv(ctx, s: ConvShape, w: Buf, head: list, head_arrays: list, is_signed) -> NativeCall:
    """qconv2d on the packed int8 GEMM (quant_packed.py): every image's channel pairs packed into
    padded planes once per run, then blocks of output positions in parallel, each against all of
    its group's output channels; a stride-1 convolution reads the planes in place, any other
    gathers each block's windows into the thread's scratch first."""
    attrs, out_dtype = ctx.attrs, str(head_arrays[-1].dtype)
    names = Names()
    x, bias, mult, y = head[0], (head[2] if len(head) == 5 else None), head[-2], head[-1]
    npair = quant_packed.pairs(s.cg)
    prow, pcol = s.h + 2 * s.ph, s.w + 2 * s.pw
    plane = prow * pcol
    taps = s.kh * s.kw
    # the direct tiles read up to a tile's width (and the widest tap) past the last plane's end
    slack = quant_packed.NC + (s.kw - 1) * s.dw + pcol
    planes = Buf("planes", "int32", s.n * s.g * npair * plane + slack, const=False)
    wp, wp_array, prologue = _packed_weight(ctx, w, s.g, s.og, s.cg, taps)
    params, arrays = head + [planes, wp], head_arrays + [np.zeros(planes.size, np.int32), wp_array]
    parallel = ctx.threads > 1
    t, img, g, pr, q0, slot = (names.var(v) for v in ("t", "img", "g", "pr", "q0", "slot"))
    second = i64(1) if s.cg % 2 == 0 else select(pr.lt(npair - 1), i64(1), i64(0))
    pack = For(t, i64(0), i64(s.n * s.g * npair), [
        Let(img, t // (s.g * npair)), Let(g, (t // npair) % s.g), Let(pr, t % npair),
        Extern("tk_q8_pack_plane", ((x, (img * s.c + g * s.cg + 2 * pr) * (s.h * s.w)), second, is_signed,
                                    i64(s.h), i64(s.w), i64(attrs["x_zero_point"]), i64(s.ph), i64(s.pw),
                                    i64(prow), i64(pcol), (planes, t * plane)), quant_packed.C_SOURCE)],
        parallel=parallel)
    store = (*_store_args(attrs, out_dtype), (y, (img * s.o + g * s.og) * s.p), i64(s.p))
    group_words = quant_packed.packed_words(1, s.og, s.cg, taps)
    common = ((wp, g * group_words), i64(s.og), (planes, (img * s.g + g) * (npair * plane)), i64(plane),
              i64(npair))
    channel = ((bias, g * s.og) if bias else None, (mult, g * s.og))
    if (s.sh, s.sw) == (1, 1) and reads_in_place(s, pcol):
        qend = s.oh * pcol                  # positions on the padded width
        block = DIRECT_BLOCK
        blocks = -(-qend // block)
        tile = Extern("tk_q8_conv_direct", (*common, i64(s.kh), i64(s.kw), i64(s.dh), i64(s.dw), q0,
                                            _min(q0 + block, i64(qend)), i64(qend), i64(pcol), i64(s.ow), *channel,
                                            *store), quant_packed.C_SOURCE)
    else:
        block = gather_width(taps, npair)
        blocks = -(-s.p // block)
        scratch = Buf("scratch", "int32", ctx.threads * taps * npair * block, const=False)
        params.append(scratch)
        arrays.append(np.zeros(scratch.size, np.int32))
        tile = Extern("tk_q8_conv_gather", (*common, i64(s.kh), i64(s.kw), i64(s.sh), i64(s.sw), i64(s.dh),
                                            i64(s.dw), q0, _min(q0 + block, i64(s.p)), i64(s.p), i64(pcol),
                                            i64(s.ow), (scratch, slot * (taps * npair * block)), i64(block),
                                            *channel, *store), quant_packed.C_SOURCE)
    tiles = For(t, i64(0), i64(s.n * s.g * blocks), [
        Let(slot, ThreadIndex()), Let(img, t // (s.g * blocks)), Let(g, (t // blocks) % s.g),
        Let(q0, (t % blocks) * block), tile], parallel=parallel)
    return NativeCall(Kernel("qconv2d_packed", params, prologue + [pack, tiles], ctx.threads), arrays)


def reads_in_place(s: ConvShape, pcol: int) -> bool:
    """Whether a stride-1 convolution's tiles read its packed planes in place: where counting
    positions on the padded width costs at most a quarter more tiles than gathering the windows.
    Gathering copies every window's words, which a layer of few output channels feels most.
    Measured with 3x3 layers, one core of the AMD EPYC (best of 15): 16 -> 32 channels on 4 x 4
    images, batch 16, 0.030 ms gathered, 0.045 in place (2 tiles for 16 positions); 16 -> 16 on
    8 x 8 (5 tiles for 4), 0.065 in place, 0.126 gathered; 64 -> 64 on 14 x 14, 0.137 in place,
    0.169 gathered; 512 -> 512 on 7 x 7, 6.7 ms in place, 6.4 gathered."""
    tile = quant_packed.NC
    return -(-s.oh * pcol // tile) * 4 <= -(-s.p // tile) * 5


def gather_width(taps: int, npair: int) -> int:
    """Positions per gathered block: a multiple of the tile's 16 whose windows (taps * npair
    words each) fill at most GATHER_BYTES of scratch, at least one tile."""
    per_position = taps * npair * 4
    return max(quant_packed.NC, min(GATHER_MAX, GATHER_BYTES // per_position) // quant_packed.NC * quant_packed.NC)


def _packed_qgemm(ctx, ins, outs, m: int, k: int, n: int) -> NativeCall:
    """qgemm on the packed int8 GEMM: blocks of A's rows packed as pairs into the thread's
    scratch, then multiplied by every packed weight row (the output channels on the tile's
    broadcast side, A's rows along its vectors)."""
    attrs, out_dtype = ctx.attrs, str(outs[0].dtype)
    names = Names()
    a = Buf("a", str(ins[0].dtype), m * k)
    b = Buf("b", "int8", n * k)
    bias = Buf("bias", "int32", n) if len(ins) == 3 else None
    mult = Buf("mult", "float32", n)
    y = Buf("y", out_dtype, m * n, const=False)
    npair = quant_packed.pairs(k)
    width = min(QGEMM_ROWS, -(-m // quant_packed.NC) * quant_packed.NC)
    wp, wp_array, prologue = _packed_weight(ctx, b, 1, n, k, 1)
    rows = Buf("rows", "int32", ctx.threads * npair * width, const=False)
    params = [a, b] + ([bias] if bias else []) + [mult, y, wp, rows]
    arrays = [ins[0], ins[1]] + ([ins[2]] if bias else []) + [_mult(attrs, "a_scale", "b_scales", out_dtype),
                                                              outs[0], wp_array, np.zeros(rows.size, np.int32)]
    t, m0, slot = names.var("t"), names.var("m0"), names.var("slot")
    blocks = -(-m // width)
    tiles = For(t, i64(0), i64(blocks), [
        Let(slot, ThreadIndex()), Let(m0, t * width),
        Extern("tk_q8_qgemm_rows", ((a, i64(0)), i64(int(a.dtype == "int8")), m0, _min(m0 + width, i64(m)), i64(m),
                                    i64(k), i64(attrs["a_zero_point"]), (rows, slot * (npair * width)), i64(width),
                                    (wp, i64(0)), i64(n), (bias, i64(0)) if bias else None, (mult, i64(0)),
                                    *_store_args(attrs, out_dtype), (y, i64(0))),
               quant_packed.C_SOURCE)], parallel=ctx.threads > 1 and blocks > 1)
    return NativeCall(Kernel("qgemm_packed", params, prologue + [tiles], ctx.threads), arrays)


def _packed_depthwise(ctx, s: ConvShape, head: list, head_arrays: list, is_signed) -> NativeCall:
    """A depthwise qconv2d (one input channel per group) as ``tk_q8_dw_plane`` per (image,
    output channel) in parallel: float32 FMAs on the shifted plane, exact for its few taps."""
    names = Names()
    x, w, bias, mult, y = head[0], head[1], (head[2] if len(head) == 5 else None), head[-2], head[-1]
    out_dtype = str(head_arrays[-1].dtype)
    padded = (s.h + 2 * s.ph) * (s.w + 2 * s.pw)
    xpad = Buf("xpad", "float32", ctx.threads * padded, const=False)
    t, img, o, slot = (names.var(v) for v in ("t", "img", "o", "slot"))
    image = s.c * s.h * s.w
    plane = For(t, i64(0), i64(s.n * s.o), [
        Let(slot, ThreadIndex()), Let(img, t // s.o), Let(o, t % s.o),
        Extern("tk_q8_dw_plane", (
            (x, img * image + (o // s.og) * (s.h * s.w)), is_signed, i64(s.h), i64(s.w),
            i64(ctx.attrs["x_zero_point"]), (w, o * (s.kh * s.kw)), i64(s.kh), i64(s.kw), i64(s.sh), i64(s.sw),
            i64(s.ph), i64(s.pw), i64(s.dh), i64(s.dw), i64(s.oh), i64(s.ow), (xpad, slot * padded),
            (bias, o) if bias else None, (mult, o), *_store_args(ctx.attrs, out_dtype), (y, t * s.p)),
            quant_packed.C_SOURCE)], parallel=ctx.threads > 1)
    return NativeCall(Kernel("qconv2d_dw_packed", head + [xpad], [plane], ctx.threads),
                      head_arrays + [np.zeros(xpad.size, np.float32)])


QUANTIZE_CHUNK = 1 << 14                 # elements per parallel chunk of quantize_linear


@register_native("quantize_linear", "cpu")
def quantize_linear_native(ctx, ins, outs):
    """float32 to uint8 / int8 in C (``tk_q8_quantize``): at a quantized net's entry the numpy
    kernel's several passes and its call cost more than a small convolution."""
    if str(ins[0].dtype) != "float32":
        return None
    attrs, dtype = ctx.attrs, str(outs[0].dtype)
    size = int(np.prod(ctx.in_shapes[0]))
    zp = attrs["zero_point"]
    lo, hi = QRANGE[dtype]
    x = Buf("x", "float32", size)
    y = Buf("y", dtype, size, const=False)
    names = Names()
    c, start = names.var("c"), names.var("start")
    chunks = -(-size // QUANTIZE_CHUNK)
    body = For(c, i64(0), i64(chunks), [
        Let(start, c * QUANTIZE_CHUNK),
        Extern("tk_q8_quantize", ((x, start), _min(i64(size) - start, i64(QUANTIZE_CHUNK)),
                                  lift(float(np.float32(attrs["scale"])), "float32"), lift(float(lo - zp), "float32"),
                                  lift(float(hi - zp), "float32"), i64(zp), i64(KINDS[dtype]), (y, start)),
               quant_packed.C_SOURCE)], parallel=ctx.threads > 1 and chunks > 1)
    return NativeCall(Kernel("quantize_linear", [x, y], [body], ctx.threads), [ins[0], outs[0]])

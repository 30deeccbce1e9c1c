"""The toolkit's own single-precision GEMM for a weight packed ahead: C[M, N] = Wp x B, where the
weight W [M, K] is stored in panels of MR rows, each panel [K][MR] (``pack_panels``), and B is
read in place (rows of N contiguous floats, any row stride: an image's [C, H*W], im2col's columns),
and the common convolution epilogues (a bias per row, a residual added, a ReLU) are applied to the
tile in registers as it is stored, instead of in passes over C afterwards.

This is the shape of every forward convolution GEMM: the weight is the same on every run, so it
is packed once when the plan is built (or once per run, in the kernel, where it is fed at run
time), and the BLAS library's own packing of both operands on every call is saved. The inner
tile keeps MR x (16 * NV) results in AVX-512 registers (8 x 48: 24 accumulators), broadcasting
one packed weight per row and loading NV vectors of B per step of K; the last vector of a row
of B is masked, so no column count needs padding. K is taken in blocks of KC so that a block of
B stays in the core's caches across the panels.

Measured against numpy's OpenBLAS on ResNet-50's and MobileNet's 1x1 shapes, one thread of an
AMD EPYC (Zen 4), hot caches: 108-114 GFLOP/s against 98-101 on 196-784 columns, 87-88 against
79-84 on 49 (the README's real-nets section has the whole-net figures).

On AVX-512 processors (``available()``) the tile is 8 x 48; on AVX2 with FMA
(``gemm_available()``), which has 16 vector registers, it is 4 x 24 (half a panel, the same
packing), the tiles ordered by the weight's size (see that branch of C_SOURCE). Measured on
MobileNet v2's 1x1 shapes, one thread of an AVX2 AMD EPYC (Zen 3), hot caches, against
OpenBLAS's SGEMM of the same shape (no epilogue): 80-92 GFLOP/s against 70-89 on 196-3136
columns, 69-77 against 79-82 on 49. Elsewhere the BLAS path stays.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

MR = 8            # rows of a panel: one broadcast weight per row and step of K
KC = 256          # steps of K per block


@lru_cache(maxsize=1)
def available() -> bool:
    """This processor has AVX-512F (which -march=native then targets). A compiler too old to
    target it compiles the plain C form of the same function below (correct, slower) rather than
    failing the plan's unit; no compiler is run to find out, so a compiler that hangs costs
    nothing here."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512f" in flags


@lru_cache(maxsize=1)
def gemm_available() -> bool:
    """This processor runs the packed GEMM in vector registers: AVX-512F (the 8 x 48 tile), or
    AVX2 with FMA (a 4 x 24 tile of 8-float vectors, two per panel). Only the GEMM: the blocked
    layout's kernels (codegen/blocked.py) stay AVX-512's (``available()``)."""
    if available():
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx2" in flags and "fma" in flags


def panels(m: int) -> int:
    return -(-m // MR)


def packed_size(m: int, k: int) -> int:
    return panels(m) * MR * k


def pack_panels(w: np.ndarray) -> np.ndarray:
    """W [M, K] as panels [ceil(M/MR)][K][MR], rows past M zero: flat, float32."""
    m, k = w.shape
    padded = np.zeros((panels(m) * MR, k), np.float32)
    padded[:m] = w
    return np.ascontiguousarray(padded.reshape(panels(m), MR, k).transpose(0, 2, 1)).reshape(-1)


C_SOURCE = r"""
#ifdef __AVX512F__
#include <immintrin.h>
#define TK_MR 8
#define TK_KC 256
/* MR rows x NV vectors of 16 columns of C (the last vector masked to ``last``) over kc steps
   of K: C = (accumulate ? C : 0) + Wpanel[0:kc][MR] x B[0:kc][cols]; rows >= ``rows`` not stored */
#define TK_PGEMM_TILE(NV)                                                                         \
static inline void tk_pgemm_tile##NV(int64_t kc, const float *restrict wp, const float *restrict b, \
                                     int64_t ldb, float *restrict c, int64_t ldc, __mmask16 last,  \
                                     int accumulate, int rows, const float *bias,                  \
                                     const float *res, int64_t ldr, int relu) {                    \
    __m512 acc[TK_MR][NV];                                                                        \
    _Pragma("GCC unroll 8") for (int i = 0; i < TK_MR; i++)                                        \
        _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) acc[i][v] = _mm512_setzero_ps();       \
    for (int64_t k = 0; k < kc; k++) {                                                            \
        const float *br = b + k * ldb;                                                            \
        __m512 bv[NV];                                                                            \
        _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++)                                       \
            bv[v] = v == NV - 1 ? _mm512_maskz_loadu_ps(last, br + 16 * v) : _mm512_loadu_ps(br + 16 * v); \
        const float *a = wp + k * TK_MR;                                                          \
        _Pragma("GCC unroll 8") for (int i = 0; i < TK_MR; i++) {                                  \
            __m512 ai = _mm512_set1_ps(a[i]);                                                     \
            _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++)                                   \
                acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);                                \
        }                                                                                         \
    }                                                                                             \
    _Pragma("GCC unroll 8") for (int i = 0; i < TK_MR; i++) {                                      \
        if (i < rows) {                                                                           \
            float *cr = c + i * ldc;                                                              \
            _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) {                                 \
                __mmask16 m = v == NV - 1 ? last : (__mmask16)0xFFFF;                             \
                __m512 r = acc[i][v];                                                             \
                if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, cr + 16 * v));       \
                if (bias) r = _mm512_add_ps(r, _mm512_set1_ps(bias[i]));                          \
                if (res) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m, res + i * ldr + 16 * v));   \
                if (relu) r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q),        \
                                                   _mm512_max_ps(r, _mm512_setzero_ps()), r);     \
                _mm512_mask_storeu_ps(cr + 16 * v, m, r);                                         \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
}
TK_PGEMM_TILE(1)
TK_PGEMM_TILE(2)
TK_PGEMM_TILE(3)

/* C[m, n] (row stride ldc) = beta * C + Wp x B, Wp: the panels of m rows ([K][MR] each, K = k),
   B [k, n] with row stride ldb; beta is 0 or 1. The epilogue, applied as the last block of K is
   stored (each NULL / 0 for none): + bias[row], + res[row * ldr + column], then max(., 0) with
   NaN kept (numpy's maximum; _mm512_max_ps alone would turn a NaN into 0) */
static void tk_pgemm_ep(int64_t m, int64_t n, int64_t k, const float *wp, const float *b, int64_t ldb,
                        float beta, float *c, int64_t ldc, const float *bias, const float *res, int64_t ldr,
                        int relu) {
    for (int64_t k0 = 0; k0 < k; k0 += TK_KC) {
        int64_t kc = k - k0 < TK_KC ? k - k0 : TK_KC;
        int accumulate = k0 > 0 || beta != 0.0f;
        int final = k0 + kc >= k;
        for (int64_t r0 = 0; r0 < m; r0 += TK_MR) {
            const float *panel = wp + (r0 / TK_MR) * k * TK_MR + k0 * TK_MR;
            int rows = m - r0 < TK_MR ? (int)(m - r0) : TK_MR;
            const float *tile_bias = final && bias ? bias + r0 : NULL;
            int tile_relu = final && relu;
            for (int64_t c0 = 0; c0 < n; c0 += 48) {
                int64_t cols = n - c0 < 48 ? n - c0 : 48;
                int nv = (int)((cols + 15) / 16);
                __mmask16 last = (__mmask16)((1u << (cols - 16 * (nv - 1))) - 1u);
                const float *bp = b + k0 * ldb + c0;
                float *cp = c + r0 * ldc + c0;
                const float *rp = final && res ? res + r0 * ldr + c0 : NULL;
                if (nv == 3)
                    tk_pgemm_tile3(kc, panel, bp, ldb, cp, ldc, last, accumulate, rows, tile_bias, rp, ldr, tile_relu);
                else if (nv == 2)
                    tk_pgemm_tile2(kc, panel, bp, ldb, cp, ldc, last, accumulate, rows, tile_bias, rp, ldr, tile_relu);
                else
                    tk_pgemm_tile1(kc, panel, bp, ldb, cp, ldc, last, accumulate, rows, tile_bias, rp, ldr, tile_relu);
            }
        }
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TK_MR 8
#define TK_KC 256
#define TK_HR 4
#define TK_L2_WEIGHT (256 << 10)
/* AVX2 has 16 vector registers, not 32: a tile is half a panel, TK_HR rows x NV vectors of 8
   columns of C (TK_HR * NV accumulators, NV loads of B and a broadcast: all 16 registers at
   NV = 3), the panel's other half a second tile over the same block of B. A full tile loads B
   unmasked: the edge tile's lane mask would be a 17th register, spilled inside the loop over K.
   The epilogue is the AVX-512 tile's. */
#define TK_PGEMM_TILE8(NV, MASKED)                                                                \
static __attribute__((noinline)) void tk_pgemm_tile8_##NV##_##MASKED(int64_t kc, const float *restrict wp,          \
                                       const float *restrict b, int64_t ldb, float *restrict c,   \
                                       int64_t ldc, __m256i last, int accumulate, int rows,        \
                                       const float *bias, const float *res, int64_t ldr, int relu) { \
    __m256 acc[TK_HR][NV];                                                                        \
    _Pragma("GCC unroll 4") for (int i = 0; i < TK_HR; i++)                                        \
        _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) acc[i][v] = _mm256_setzero_ps();       \
    for (int64_t k = 0; k < kc; k++) {                                                            \
        const float *br = b + k * ldb;                                                            \
        __m256 bv[NV];                                                                            \
        _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) {                                     \
            bv[v] = MASKED && v == NV - 1 ? _mm256_maskload_ps(br + 8 * v, last)                  \
                                          : _mm256_loadu_ps(br + 8 * v);                          \
            __asm__("" : "+x"(bv[v]));    /* in a register: not reloaded by each row's FMA */     \
        }                                                                                         \
        const float *a = wp + k * TK_MR;                                                          \
        _Pragma("GCC unroll 4") for (int i = 0; i < TK_HR; i++) {                                  \
            __m256 ai = _mm256_broadcast_ss(a + i);                                               \
            _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++)                                   \
                acc[i][v] = _mm256_fmadd_ps(ai, bv[v], acc[i][v]);                                \
        }                                                                                         \
    }                                                                                             \
    _Pragma("GCC unroll 4") for (int i = 0; i < TK_HR; i++) {                                      \
        if (i < rows) {                                                                           \
            float *cr = c + i * ldc;                                                              \
            _Pragma("GCC unroll 3") for (int v = 0; v < NV; v++) {                                 \
                int masked = MASKED && v == NV - 1;   /* AMD's masked store is microcoded: slow */ \
                __m256 r = acc[i][v];                                                             \
                if (accumulate) r = _mm256_add_ps(r, masked ? _mm256_maskload_ps(cr + 8 * v, last) \
                                                            : _mm256_loadu_ps(cr + 8 * v));        \
                if (bias) r = _mm256_add_ps(r, _mm256_set1_ps(bias[i]));                          \
                if (res) r = _mm256_add_ps(r, masked ? _mm256_maskload_ps(res + i * ldr + 8 * v, last) \
                                                     : _mm256_loadu_ps(res + i * ldr + 8 * v));    \
                if (relu) r = _mm256_blendv_ps(_mm256_max_ps(r, _mm256_setzero_ps()), r,          \
                                               _mm256_cmp_ps(r, r, _CMP_UNORD_Q));                \
                if (masked) _mm256_maskstore_ps(cr + 8 * v, last, r);                             \
                else _mm256_storeu_ps(cr + 8 * v, r);                                             \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
}
TK_PGEMM_TILE8(3, 0)
TK_PGEMM_TILE8(2, 1)
TK_PGEMM_TILE8(3, 1)

/* The last columns of C where they are 8 or fewer: a whole panel's TK_MR rows x one masked
   vector, so that eight chains of FMAs (not four) hide the FMA's latency (7x7 maps' 49th column) */
static __attribute__((noinline)) void tk_pgemm_edge8(int64_t kc, const float *restrict wp, const float *restrict b,
                                                     int64_t ldb, float *restrict c, int64_t ldc, __m256i last,
                                                     int accumulate, int rows, const float *bias,
                                                     const float *res, int64_t ldr, int relu) {
    __m256 acc[TK_MR];
    _Pragma("GCC unroll 8") for (int i = 0; i < TK_MR; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; k++) {
        __m256 bv = _mm256_maskload_ps(b + k * ldb, last);
        const float *a = wp + k * TK_MR;
        _Pragma("GCC unroll 8") for (int i = 0; i < TK_MR; i++)
            acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + i), bv, acc[i]);
    }
    _Pragma("GCC unroll 8") for (int i = 0; i < TK_MR; i++) {
        if (i < rows) {
            __m256 r = acc[i];
            if (accumulate) r = _mm256_add_ps(r, _mm256_maskload_ps(c + i * ldc, last));
            if (bias) r = _mm256_add_ps(r, _mm256_set1_ps(bias[i]));
            if (res) r = _mm256_add_ps(r, _mm256_maskload_ps(res + i * ldr, last));
            if (relu) r = _mm256_blendv_ps(_mm256_max_ps(r, _mm256_setzero_ps()), r,
                                           _mm256_cmp_ps(r, r, _CMP_UNORD_Q));
            _mm256_maskstore_ps(c + i * ldc, last, r);
        }
    }
}

/* One tile: rows [r0, r0 + TK_HR) x columns [c0, c0 + 24) of C over the block k0 + [0, kc) */
static inline void tk_pgemm_tile8(int64_t m, int64_t n, int64_t k, int64_t k0, int64_t kc, int64_t r0,
                                  int64_t c0, const float *wp, const float *b, int64_t ldb, float *c,
                                  int64_t ldc, int accumulate, int final, const float *bias, const float *res,
                                  int64_t ldr, int relu) {
    int rows = m - r0 < TK_HR ? (int)(m - r0) : TK_HR;
    /* rows r0.. are lanes r0 % MR.. of their panel */
    const float *panel = wp + (r0 / TK_MR) * k * TK_MR + k0 * TK_MR + r0 % TK_MR;
    const float *tile_bias = final && bias ? bias + r0 : NULL;
    int tile_relu = final && relu;
    int64_t cols = n - c0 < 24 ? n - c0 : 24;
    const float *bp = b + k0 * ldb + c0;
    float *cp = c + r0 * ldc + c0;
    const float *rp = final && res ? res + r0 * ldr + c0 : NULL;
    if (cols == 24) {
        tk_pgemm_tile8_3_0(kc, panel, bp, ldb, cp, ldc, _mm256_setzero_si256(), accumulate, rows, tile_bias, rp,
                           ldr, tile_relu);
        return;
    }
    int nv = (int)((cols + 7) / 8);
    __m256i last = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(cols - 8 * (nv - 1))),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    if (nv == 1) {            /* a whole panel from its first half; nothing from its second */
        if (r0 % TK_MR == 0)
            tk_pgemm_edge8(kc, panel, bp, ldb, cp, ldc, last, accumulate, m - r0 < TK_MR ? (int)(m - r0) : TK_MR,
                           tile_bias, rp, ldr, tile_relu);
        return;
    }
    if (nv == 3)
        tk_pgemm_tile8_3_1(kc, panel, bp, ldb, cp, ldc, last, accumulate, rows, tile_bias, rp, ldr, tile_relu);
    else if (nv == 2)
        tk_pgemm_tile8_2_1(kc, panel, bp, ldb, cp, ldc, last, accumulate, rows, tile_bias, rp, ldr, tile_relu);
}

/* the contract of the AVX-512 tk_pgemm_ep above. The order of the tiles depends on the weight:
   where a block of K of it fits half the L2 cache (MobileNet v2's 1x1 layers but the last), the
   columns go outside, so a strip of B (kc x 24) stays in L1 while every row of the weight passes
   over it, and B is read from memory once; a larger weight goes outside, each of its blocks
   passing over the whole block of B (as on AVX-512). With the rows outside, a narrow weight over
   many columns (144 -> 24 over 56x56) read B, 1.8 MB, once per 4 rows. */
static void tk_pgemm_ep(int64_t m, int64_t n, int64_t k, const float *wp, const float *b, int64_t ldb,
                        float beta, float *c, int64_t ldc, const float *bias, const float *res, int64_t ldr,
                        int relu) {
    for (int64_t k0 = 0; k0 < k; k0 += TK_KC) {
        int64_t kc = k - k0 < TK_KC ? k - k0 : TK_KC;
        int accumulate = k0 > 0 || beta != 0.0f;
        int final = k0 + kc >= k;
        int64_t weight_bytes = (m + TK_MR - 1) / TK_MR * TK_MR * kc * (int64_t)sizeof(float);
        if (weight_bytes <= TK_L2_WEIGHT) {
            for (int64_t c0 = 0; c0 < n; c0 += 24)
                for (int64_t r0 = 0; r0 < m; r0 += TK_HR)
                    tk_pgemm_tile8(m, n, k, k0, kc, r0, c0, wp, b, ldb, c, ldc, accumulate, final, bias, res, ldr,
                                   relu);
        } else {
            for (int64_t r0 = 0; r0 < m; r0 += TK_HR)
                for (int64_t c0 = 0; c0 < n; c0 += 24)
                    tk_pgemm_tile8(m, n, k, k0, kc, r0, c0, wp, b, ldb, c, ldc, accumulate, final, bias, res, ldr,
                                   relu);
        }
    }
}

#else
/* the same contract in plain C, for a compiler that does not target AVX-512 or AVX2 here */
static void tk_pgemm_ep(int64_t m, int64_t n, int64_t k, const float *wp, const float *b, int64_t ldb,
                        float beta, float *c, int64_t ldc, const float *bias, const float *res, int64_t ldr,
                        int relu) {
    for (int64_t r = 0; r < m; r++) {
        const float *panel = wp + (r / 8) * k * 8 + r % 8;
        for (int64_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int64_t q = 0; q < k; q++) acc += panel[q * 8] * b[q * ldb + j];
            if (beta != 0.0f) acc += c[r * ldc + j];
            if (bias) acc += bias[r];
            if (res) acc += res[r * ldr + j];
            if (relu && !(acc > 0.0f) && acc == acc) acc = 0.0f;    /* numpy: NaN kept, -0 to 0 */
            c[r * ldc + j] = acc;
        }
    }
}
#endif
static void tk_pgemm(int64_t m, int64_t n, int64_t k, const float *wp, const float *b, int64_t ldb,
                     float beta, float *c, int64_t ldc) {
    tk_pgemm_ep(m, n, k, wp, b, ldb, beta, c, ldc, NULL, NULL, 0, 0);
}
"""

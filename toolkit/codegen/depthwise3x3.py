"""One output plane of a 3x3 depthwise convolution (stride 1 or 2, no dilation), its bias and a
ReLU applied as it is stored, as a C function that generated kernels call (loops.Extern):
MobileNet's depthwise layers on an AVX2 processor.

The loop language's form (kernels/native/depthwise.py) copies each plane, zero-padded and split
by column phase, into scratch, sums the taps from the copy, then passes over the plane again for
the ReLU. Here each vector of 8 outputs loads its three input rows straight from the plane (a
row above or below the image reads a row of zeros), three vectors a row at stride 1, and at
stride 2 two pairs of vectors split into their even and odd columns; the bias starts the sum and
the ReLU is applied in the register before the one store. A vector whose columns reach past
the row (at either edge) loads masked, the columns outside reading 0, so the padding costs no
copy and no scalar loop; the last vector of a row overlaps the one before it rather than
running past the row, and a row of fewer than 8 outputs (a 7x7 map) is one vector. The output
rows go by pairs, each input row loaded once for both: at stride 1 the four input rows of two
output rows, the middle two feeding both (12 loads a pair of vectors for 18 FMAs, where one row
at a time loads 18); at stride 2 five rows, the middle one shared.

Without AVX2 the same contract compiles in plain C.
"""
from __future__ import annotations

MAX_WIDTH = 4096          # the row of zeros is on the stack

# Two output rows of one stride, made from a vector function of two rows (tk_dw3x3_vec2 at stride
# 1, tk_dw3x3_vec2_s2 at 2): the same C for both strides, written once. The vector functions stay
# two (see tk_dw3x3_vec2_s2's comment on why).
_ROW_PAIR = r"""/* two output rows at stride @STRIDE@ (y0 and y1 = y0 + ow_n), their vectors placed as tk_dw3x3_row's */
static inline void tk_dw3x3_row2@SUFFIX@(const float *const *rows, const __m256 *wv, __m256 vstart,
                                 float *y0, float *y1, int64_t w, int64_t ow_n, int64_t pad, int relu,
                                 int64_t lo, int64_t last) {
    __m256 v0, v1;
    if (ow_n < 8) {
        tk_dw3x3_vec2@SUFFIX@(rows, wv, vstart, -pad, w, 0, &v0, &v1);
        float lanes0[8], lanes1[8];
        _mm256_storeu_ps(lanes0, tk_dw3x3_relu(v0, relu));
        _mm256_storeu_ps(lanes1, tk_dw3x3_relu(v1, relu));
        for (int64_t j = 0; j < ow_n; j++) { y0[j] = lanes0[j]; y1[j] = lanes1[j]; }
        return;
    }
    for (int64_t ow0 = 0;; ow0 += 8) {
        if (ow0 > ow_n - 8) ow0 = ow_n - 8;
        int64_t col = ow0@TIMES@ - pad;
        if (ow0 >= lo && ow0 <= last) tk_dw3x3_vec2@SUFFIX@(rows, wv, vstart, col, w, 1, &v0, &v1);
        else tk_dw3x3_vec2@SUFFIX@(rows, wv, vstart, col, w, 0, &v0, &v1);
        _mm256_storeu_ps(y0 + ow0, tk_dw3x3_relu(v0, relu));
        _mm256_storeu_ps(y1 + ow0, tk_dw3x3_relu(v1, relu));
        if (ow0 == ow_n - 8) break;
    }
}
"""


def _row_pair(stride: int) -> str:
    suffix, times = ("", "") if stride == 1 else ("_s2", f" * {stride}")
    return _ROW_PAIR.replace("@STRIDE@", str(stride)).replace("@SUFFIX@", suffix).replace("@TIMES@", times) + "\n"


C_SOURCE = r"""
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
/* row[col + j] for j in [0, 8), 0 where col + j is outside [0, w) (a masked load reads nothing
   there, so the padding costs no branch and no copy) */
static inline __m256 tk_dw3x3_load(const float *row, int64_t col, int64_t w, int inside) {
    if (inside) return _mm256_loadu_ps(row + col);
    __m256i at = _mm256_add_epi32(_mm256_set1_epi32((int)col), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i ok = _mm256_and_si256(_mm256_cmpgt_epi32(at, _mm256_set1_epi32(-1)),
                                  _mm256_cmpgt_epi32(_mm256_set1_epi32((int)w), at));
    return _mm256_maskload_ps(row + col, ok);
}

/* the even and odd columns of row[col, col + 16): [x0 x2 .. x14], [x1 x3 .. x15] */
static inline void tk_dw3x3_split(const float *row, int64_t col, int64_t w, int inside, __m256 *even, __m256 *odd) {
    __m256 a = tk_dw3x3_load(row, col, w, inside), b = tk_dw3x3_load(row, col + 8, w, inside);
    *even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    *odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

/* the 8 outputs from column col of the rows' (bias included), ``inside`` a constant where the
   callers inline it, so the plain and the masked loads are two loops without a test; a sum per
   row, added at the end, so that a vector's FMAs are three chains of three, not one of nine
   (whose latency the core could not hide behind the next vectors') */
static inline __m256 tk_dw3x3_vec(const float *const *rows, const __m256 *wv, __m256 start, int64_t col, int64_t w,
                                  int64_t s, int inside) {
    __m256 acc[3];
    for (int ki = 0; ki < 3; ki++) {
        const float *r = rows[ki];
        __m256 a = ki == 0 ? start : _mm256_setzero_ps();
        if (s == 1) {
            a = _mm256_fmadd_ps(wv[ki * 3], tk_dw3x3_load(r, col, w, inside), a);
            a = _mm256_fmadd_ps(wv[ki * 3 + 1], tk_dw3x3_load(r, col + 1, w, inside), a);
            a = _mm256_fmadd_ps(wv[ki * 3 + 2], tk_dw3x3_load(r, col + 2, w, inside), a);
        } else {
            __m256 e0, o0, e2, o2;
            tk_dw3x3_split(r, col, w, inside, &e0, &o0);
            tk_dw3x3_split(r, col + 2, w, inside, &e2, &o2);
            a = _mm256_fmadd_ps(wv[ki * 3], e0, a);
            a = _mm256_fmadd_ps(wv[ki * 3 + 1], o0, a);
            a = _mm256_fmadd_ps(wv[ki * 3 + 2], e2, a);
        }
        acc[ki] = a;
    }
    return _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), acc[2]);
}

/* the ReLU in the register (a NaN kept: max would turn it into 0) */
static inline __m256 tk_dw3x3_relu(__m256 acc, int relu) {
    if (!relu) return acc;
    return _mm256_blendv_ps(_mm256_max_ps(acc, _mm256_setzero_ps()), acc, _mm256_cmp_ps(acc, acc, _CMP_UNORD_Q));
}

/* stride 1: the 8 outputs from column col of two output rows, from their four input rows; each
   input row's three shifted vectors loaded once and used by both output rows it reaches (12
   loads for 18 FMAs where two calls of tk_dw3x3_vec load 18), a chain per (output row, input
   row) as there */
static inline void tk_dw3x3_vec2(const float *const *rows, const __m256 *wv, __m256 start, int64_t col, int64_t w,
                                 int inside, __m256 *out0, __m256 *out1) {
    __m256 a0[3], a1[3];
    for (int r = 0; r < 4; r++) {
        const float *row = rows[r];
        __m256 l0 = tk_dw3x3_load(row, col, w, inside), l1 = tk_dw3x3_load(row, col + 1, w, inside),
               l2 = tk_dw3x3_load(row, col + 2, w, inside);
        if (r < 3) {                 /* tap row r of output row 0 */
            __m256 a = r == 0 ? start : _mm256_setzero_ps();
            a = _mm256_fmadd_ps(wv[r * 3], l0, a);
            a = _mm256_fmadd_ps(wv[r * 3 + 1], l1, a);
            a0[r] = _mm256_fmadd_ps(wv[r * 3 + 2], l2, a);
        }
        if (r > 0) {                 /* tap row r - 1 of output row 1 */
            int k = r - 1;
            __m256 a = k == 0 ? start : _mm256_setzero_ps();
            a = _mm256_fmadd_ps(wv[k * 3], l0, a);
            a = _mm256_fmadd_ps(wv[k * 3 + 1], l1, a);
            a1[k] = _mm256_fmadd_ps(wv[k * 3 + 2], l2, a);
        }
    }
    *out0 = _mm256_add_ps(_mm256_add_ps(a0[0], a0[1]), a0[2]);
    *out1 = _mm256_add_ps(_mm256_add_ps(a1[0], a1[1]), a1[2]);
}

""" + _row_pair(1) + r"""
/* stride 2: the 8 outputs from column col of two output rows, from their five input rows; the
   middle row's even and odd columns split once for both output rows (5 rows' loads and shuffles
   where two calls of tk_dw3x3_vec take 6). Its own function rather than tk_dw3x3_vec2 with the
   stride as a parameter: that form, measured, made the compiler's stride-1 code 8-14% slower */
static inline void tk_dw3x3_vec2_s2(const float *const *rows, const __m256 *wv, __m256 start, int64_t col,
                                    int64_t w, int inside, __m256 *out0, __m256 *out1) {
    __m256 a0[3], a1[3];
    for (int r = 0; r < 5; r++) {
        __m256 e0, o0, e2, o2;
        tk_dw3x3_split(rows[r], col, w, inside, &e0, &o0);
        tk_dw3x3_split(rows[r], col + 2, w, inside, &e2, &o2);
        if (r < 3) {                 /* tap row r of output row 0 */
            __m256 a = r == 0 ? start : _mm256_setzero_ps();
            a = _mm256_fmadd_ps(wv[r * 3], e0, a);
            a = _mm256_fmadd_ps(wv[r * 3 + 1], o0, a);
            a0[r] = _mm256_fmadd_ps(wv[r * 3 + 2], e2, a);
        }
        if (r >= 2) {                /* tap row r - 2 of output row 1 */
            int k = r - 2;
            __m256 a = k == 0 ? start : _mm256_setzero_ps();
            a = _mm256_fmadd_ps(wv[k * 3], e0, a);
            a = _mm256_fmadd_ps(wv[k * 3 + 1], o0, a);
            a1[k] = _mm256_fmadd_ps(wv[k * 3 + 2], e2, a);
        }
    }
    *out0 = _mm256_add_ps(_mm256_add_ps(a0[0], a0[1]), a0[2]);
    *out1 = _mm256_add_ps(_mm256_add_ps(a1[0], a1[1]), a1[2]);
}

""" + _row_pair(2) + r"""
/* y[oh][ow] = relu?(bias + sum over ki, kj of wt[ki*3 + kj] * x[oh*s - pad + ki][ow*s - pad + kj]),
   input h x w, output oh_n x ow_n, positions outside the input read as 0: vectors of 8 outputs
   from column 0, the last one overlapping the one before it rather than running past the row;
   those whose loads stay inside the row ([lo, last]) load plainly, the others masked; a row of
   fewer than 8 outputs one masked vector, its first lanes stored */
static inline void tk_dw3x3_row(const float *const *rows, const __m256 *wv, __m256 vstart, float *yr, int64_t w,
                                int64_t ow_n, int64_t s, int64_t pad, int relu, int64_t lo, int64_t last) {
    const __m256 vzero = _mm256_setzero_ps();
    if (ow_n < 8) {           /* one vector, masked, its first ow_n lanes stored */
        __m256 acc = tk_dw3x3_vec(rows, wv, vstart, -pad, w, s, 0);
        if (relu) acc = _mm256_blendv_ps(_mm256_max_ps(acc, vzero), acc, _mm256_cmp_ps(acc, acc, _CMP_UNORD_Q));
        float lanes[8];
        _mm256_storeu_ps(lanes, acc);
        for (int64_t j = 0; j < ow_n; j++) yr[j] = lanes[j];
        return;
    }
    for (int64_t ow0 = 0;; ow0 += 8) {
        if (ow0 > ow_n - 8) ow0 = ow_n - 8;
        int64_t col = ow0 * s - pad;
        __m256 acc = ow0 >= lo && ow0 <= last ? tk_dw3x3_vec(rows, wv, vstart, col, w, s, 1)
                                              : tk_dw3x3_vec(rows, wv, vstart, col, w, s, 0);
        if (relu) acc = _mm256_blendv_ps(_mm256_max_ps(acc, vzero), acc, _mm256_cmp_ps(acc, acc, _CMP_UNORD_Q));
        _mm256_storeu_ps(yr + ow0, acc);
        if (ow0 == ow_n - 8) break;
    }
}

static void tk_dw3x3(const float *x, int64_t h, int64_t w, const float *wt, const float *bias, float *y,
                     int64_t oh_n, int64_t ow_n, int64_t s, int64_t pad, int relu) {
    float zeros[w + 24];
    for (int64_t i = 0; i < w + 24; i++) zeros[i] = 0.0f;
    __m256 wv[9];
    for (int t = 0; t < 9; t++) wv[t] = _mm256_set1_ps(wt[t]);
    const __m256 vstart = _mm256_set1_ps(bias ? bias[0] : 0.0f);
    int64_t lo = (pad + s - 1) / s;                              /* col >= 0 */
    int64_t last = s == 1 ? w + pad - 10 : (w + pad - 18) / 2;   /* the loads end inside the row */
    int64_t oh = 0;
    if (s == 1)                   /* output rows by pairs, sharing their middle two input rows */
        for (; oh + 2 <= oh_n; oh += 2) {
            const float *rows[4];
            for (int r = 0; r < 4; r++) {
                int64_t ih = oh - pad + r;
                rows[r] = ih >= 0 && ih < h ? x + ih * w : zeros;
            }
            tk_dw3x3_row2(rows, wv, vstart, y + oh * ow_n, y + (oh + 1) * ow_n, w, ow_n, pad, relu, lo, last);
        }
    else                          /* and at stride 2, sharing the middle one of their five */
        for (; oh + 2 <= oh_n; oh += 2) {
            const float *rows[5];
            for (int r = 0; r < 5; r++) {
                int64_t ih = oh * 2 - pad + r;
                rows[r] = ih >= 0 && ih < h ? x + ih * w : zeros;
            }
            tk_dw3x3_row2_s2(rows, wv, vstart, y + oh * ow_n, y + (oh + 1) * ow_n, w, ow_n, pad, relu, lo, last);
        }
    for (; oh < oh_n; oh++) {     /* an odd last row */
        const float *rows[3];
        for (int ki = 0; ki < 3; ki++) {
            int64_t ih = oh * s - pad + ki;
            rows[ki] = ih >= 0 && ih < h ? x + ih * w : zeros;
        }
        if (s == 1)
            tk_dw3x3_row(rows, wv, vstart, y + oh * ow_n, w, ow_n, 1, pad, relu, lo, last);
        else
            tk_dw3x3_row(rows, wv, vstart, y + oh * ow_n, w, ow_n, 2, pad, relu, lo, last);
    }
}
#else
/* the same contract in plain C, for a compiler that does not target AVX2 on this processor */
static void tk_dw3x3(const float *x, int64_t h, int64_t w, const float *wt, const float *bias, float *y,
                     int64_t oh_n, int64_t ow_n, int64_t s, int64_t pad, int relu) {
    for (int64_t oh = 0; oh < oh_n; oh++)
        for (int64_t ow = 0; ow < ow_n; ow++) {
            float acc = bias ? bias[0] : 0.0f;
            for (int64_t ki = 0; ki < 3; ki++) {
                int64_t ih = oh * s - pad + ki;
                if (ih < 0 || ih >= h) continue;
                for (int64_t kj = 0; kj < 3; kj++) {
                    int64_t iw = ow * s - pad + kj;
                    if (iw >= 0 && iw < w) acc += wt[ki * 3 + kj] * x[ih * w + iw];
                }
            }
            y[oh * ow_n + ow] = relu && !(acc > 0.0f) && acc == acc ? 0.0f : acc;  /* NaN kept */
        }
}
#endif
"""

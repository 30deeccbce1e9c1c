"""Dot products of one vector with many rows, as a C function that generated kernels call
(loops.Extern): a fully connected layer at batch 1, whose weight [N, K] is read once, row by row.

The loop language's vector reduction, inside a parallel loop, is compiled by gcc with its lanes
kept in memory: AlexNet's fc6 (4096 rows of 9216) took 17 ms on two threads against 8.6 ms on
one, so the product ran on one thread while the read of the weight (the bound) could use both
cores. Here each row keeps two vector accumulators in registers (the last vector masked), four
rows at a time, so that the threads split the rows and the memory bandwidth with them.
"""
from __future__ import annotations

C_SOURCE = r"""
#ifdef __AVX512F__
#include <immintrin.h>
/* c[j] = a . b[j] for the rows j of [0, rows), b's rows k floats apart */
static void tk_rowdot(const float *a, const float *b, int64_t k, int64_t rows, float *c) {
    const int64_t full = k / 16 * 16;
    const __mmask16 last = (__mmask16)((1u << (k - full)) - 1u);
    int64_t j = 0;
    for (; j + 4 <= rows; j += 4) {
        const float *b0 = b + j * k, *b1 = b0 + k, *b2 = b1 + k, *b3 = b2 + k;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
        for (int64_t q = 0; q < full; q += 16) {
            __m512 av = _mm512_loadu_ps(a + q);
            s0 = _mm512_fmadd_ps(av, _mm512_loadu_ps(b0 + q), s0);
            s1 = _mm512_fmadd_ps(av, _mm512_loadu_ps(b1 + q), s1);
            s2 = _mm512_fmadd_ps(av, _mm512_loadu_ps(b2 + q), s2);
            s3 = _mm512_fmadd_ps(av, _mm512_loadu_ps(b3 + q), s3);
        }
        if (last) {
            __m512 av = _mm512_maskz_loadu_ps(last, a + full);
            s0 = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(last, b0 + full), s0);
            s1 = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(last, b1 + full), s1);
            s2 = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(last, b2 + full), s2);
            s3 = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(last, b3 + full), s3);
        }
        c[j] = _mm512_reduce_add_ps(s0);
        c[j + 1] = _mm512_reduce_add_ps(s1);
        c[j + 2] = _mm512_reduce_add_ps(s2);
        c[j + 3] = _mm512_reduce_add_ps(s3);
    }
    for (; j < rows; j++) {
        const float *br = b + j * k;
        __m512 s = _mm512_setzero_ps();
        for (int64_t q = 0; q < full; q += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + q), _mm512_loadu_ps(br + q), s);
        if (last) s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(last, a + full), _mm512_maskz_loadu_ps(last, br + full), s);
        c[j] = _mm512_reduce_add_ps(s);
    }
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
static inline float tk_rowdot_sum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
/* the AVX-512 function's contract with 8-float vectors: four rows at a time, two accumulators a
   row (8 chains of FMAs), the last vector masked */
static void tk_rowdot(const float *a, const float *b, int64_t k, int64_t rows, float *c) {
    const int64_t full = k / 8 * 8;
    const __m256i last = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(k - full)),
                                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    int64_t j = 0;
    for (; j + 4 <= rows; j += 4) {
        const float *b0 = b + j * k, *b1 = b0 + k, *b2 = b1 + k, *b3 = b2 + k;
        __m256 s[4][2];
        for (int r = 0; r < 4; r++) s[r][0] = s[r][1] = _mm256_setzero_ps();
        int64_t q = 0;
        for (; q + 16 <= full; q += 16) {
            __m256 a0 = _mm256_loadu_ps(a + q), a1 = _mm256_loadu_ps(a + q + 8);
            s[0][0] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b0 + q), s[0][0]);
            s[0][1] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b0 + q + 8), s[0][1]);
            s[1][0] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b1 + q), s[1][0]);
            s[1][1] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b1 + q + 8), s[1][1]);
            s[2][0] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b2 + q), s[2][0]);
            s[2][1] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b2 + q + 8), s[2][1]);
            s[3][0] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(b3 + q), s[3][0]);
            s[3][1] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(b3 + q + 8), s[3][1]);
        }
        for (; q < full; q += 8) {
            __m256 av = _mm256_loadu_ps(a + q);
            s[0][0] = _mm256_fmadd_ps(av, _mm256_loadu_ps(b0 + q), s[0][0]);
            s[1][0] = _mm256_fmadd_ps(av, _mm256_loadu_ps(b1 + q), s[1][0]);
            s[2][0] = _mm256_fmadd_ps(av, _mm256_loadu_ps(b2 + q), s[2][0]);
            s[3][0] = _mm256_fmadd_ps(av, _mm256_loadu_ps(b3 + q), s[3][0]);
        }
        if (full < k) {
            __m256 av = _mm256_maskload_ps(a + full, last);
            s[0][1] = _mm256_fmadd_ps(av, _mm256_maskload_ps(b0 + full, last), s[0][1]);
            s[1][1] = _mm256_fmadd_ps(av, _mm256_maskload_ps(b1 + full, last), s[1][1]);
            s[2][1] = _mm256_fmadd_ps(av, _mm256_maskload_ps(b2 + full, last), s[2][1]);
            s[3][1] = _mm256_fmadd_ps(av, _mm256_maskload_ps(b3 + full, last), s[3][1]);
        }
        for (int r = 0; r < 4; r++) c[j + r] = tk_rowdot_sum8(_mm256_add_ps(s[r][0], s[r][1]));
    }
    for (; j < rows; j++) {
        const float *br = b + j * k;
        __m256 s = _mm256_setzero_ps();
        for (int64_t q = 0; q < full; q += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + q), _mm256_loadu_ps(br + q), s);
        if (full < k) s = _mm256_fmadd_ps(_mm256_maskload_ps(a + full, last), _mm256_maskload_ps(br + full, last), s);
        c[j] = tk_rowdot_sum8(s);
    }
}
#else
/* the same contract in plain C, for a compiler that does not target AVX-512 or AVX2 here */
static void tk_rowdot(const float *a, const float *b, int64_t k, int64_t rows, float *c) {
    for (int64_t j = 0; j < rows; j++) {
        float s = 0.0f;
        for (int64_t q = 0; q < k; q++) s += a[q] * b[j * k + q];
        c[j] = s;
    }
}
#endif
"""

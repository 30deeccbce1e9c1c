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
#else
/* the same contract in plain C, for a compiler that does not target AVX-512 on this processor */
static void tk_rowdot(const float *a, const float *b, int64_t k, int64_t rows, float *c) {
    for (int64_t j = 0; j < rows; j++) {
        float s = 0.0f;
        for (int64_t q = 0; q < k; q++) s += a[q] * b[j * k + q];
        c[j] = s;
    }
}
#endif
"""

"""The packed int8 GEMM of the native int8 kernels (kernels/native/quant.py): its C source, its
weight packing (done once when the plan is built where the weight is a constant) and the
processor check that chooses it.

The GEMM computes C[o, q] = sum over taps t and channel pairs p of W[o, t, p] . B[t, p, q], with
both operands int16 and every product pair summed by AVX2's vpmaddwd into int32: exact for any
int8 weight (-128 included) against activations shifted by their zero point ([-255, 255]), where
vpmaddubsw's u8 x s8 pair sums would saturate int16 once two weights pass 64 in magnitude
(ONNX Runtime avoids that on AVX2 by quantizing weights to 7 bits; the quantize pass makes
full-range weights, so this kernel widens instead).

- The weight is packed as, per group, panels of ``MR`` output channels, each [taps][pairs][MR]
  words, a word holding the weights of two consecutive input channels (int16, the even channel
  in the low half): one vpbroadcastd per channel and step. Channels past the group's and the odd
  channel's partner are 0.
- B is read as words too, a word holding two consecutive channels' activations at one position,
  its taps at ``offsets``: a convolution of stride 1 reads its image itself, packed once per run
  as planes of channel pairs, shifted by the zero point and padded (the padding is then 0): tap
  (i, j) of output position (oh, ow) is word (oh + i*dh) * PW + ow + j*dw of the plane, so the
  positions are counted on the padded width (q = oh * PW + ow) and the PW - OW columns past
  each row's end are computed and dropped. No im2col copy. Other strides gather each block of
  positions' windows from the packed image into a per-thread scratch first.
- The tile is ``MR`` = 6 channels x 16 positions (12 ymm accumulators, two loads of B and a
  broadcast per step: 15 of the 16 registers); the store adds the bias, requantizes and applies
  the ReLU in vectors as the ops define it (float32(acc) * m, clamp, round half to even, + zero
  point), each lane the scalar definition's value (no FMA: one multiply).

On a processor without AVX2 the same functions are plain C (correct, slower); kernels/native/
quant.py keeps its portable tiles there instead (``available()``).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

MR = 6            # output channels per panel: one broadcast weight word each per step
NC = 16           # positions per tile: two vectors of eight int32 sums
# the depthwise kernel's float32 sums of products |x - zp| * |w| <= 255 * 128 stay exact integers
# (below 2**24) for at most this many taps
DW_MAX_TAPS = (1 << 24) // (255 * 128)


@lru_cache(maxsize=1)
def available() -> bool:
    """This processor has AVX2 (which -march=native then targets, as microkernel.py checks for
    AVX-512)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx2" in flags


def pairs(channels: int) -> int:
    return -(-channels // 2)


def panels(rows: int) -> int:
    return -(-rows // MR)


def packed_words(groups: int, og: int, cg: int, taps: int) -> int:
    return groups * panels(og) * taps * pairs(cg) * MR


def pack_weight(w: np.ndarray, groups: int) -> np.ndarray:
    """The int8 weight [O, Cg, kh, kw] as the kernel's packed words (int32 holding two int16),
    flat: per group, panels [taps][pairs][MR]."""
    o, cg, kh, kw = w.shape
    og, taps, npair, npanel = o // groups, kh * kw, pairs(cg), panels(o // groups)
    wide = np.zeros((groups, npanel * MR, npair * 2, taps), np.int16)
    wide[:, :og, :cg] = w.reshape(groups, og, cg, taps)
    # [g, panel, MR, pair, 2, taps] -> [g, panel, taps, pair, MR, 2]
    wide = wide.reshape(groups, npanel, MR, npair, 2, taps).transpose(0, 1, 5, 3, 2, 4)
    return np.ascontiguousarray(wide).reshape(-1).view(np.int32)


C_SOURCE = r"""
/* packed int8 GEMM (kernels/native/quant_packed.py) */
#ifdef __AVX2__
#include <immintrin.h>
#endif
#define TK_Q8_MR 6
#define TK_Q8_NC 16

/* acc[i][j] = sum_t sum_p W[(t*npair + p)*MR + i] . B[p*plane + off[t] + j], int16 pairs into int32.
   Not inlined: gcc 12 compiled the inlined copy's loop 1.7x slower (a 3x3 layer of 64 channels
   on a 56 x 56 image, one core of the AMD EPYC: 2.6 ms against 1.6). The AVX2 step is assembly
   (AT&T syntax, as gcc and clang take it); every other compiler target runs the plain C below. */
static __attribute__((noinline, noclone)) void tk_q8_tile(const int32_t *restrict w, const int32_t *restrict b,
                                                          int64_t plane, const int64_t *off, int64_t taps,
                                                          int64_t npair, int32_t *restrict acc) {
#ifdef __AVX2__
    /* One step (a pair of channels) in assembly: twelve accumulators, the two vectors of B and
       two temporaries are the sixteen ymm registers. Written with intrinsics, gcc 12 either kept
       some accumulators on the stack or added a register copy per multiply-add depending on the
       unit around the tile (a loop 1.5-4x slower). */
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
            c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, t0, t1;
    for (int64_t t = 0; t < taps; t++) {
        const int32_t *bt = b + off[t];
        const int32_t *wt = w + t * npair * TK_Q8_MR;
        for (int64_t p = 0; p < npair; p++) {
            __m256i b0 = _mm256_loadu_si256((const __m256i *)(bt + p * plane));
            __m256i b1 = _mm256_loadu_si256((const __m256i *)(bt + p * plane + 8));
            __asm__(
                "vpbroadcastd 0(%[w]), %[t0]\n\t"
                "vpmaddwd %[b0], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c00], %[c00]\n\t"
                "vpmaddwd %[b1], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c01], %[c01]\n\t"
                "vpbroadcastd 4(%[w]), %[t0]\n\t"
                "vpmaddwd %[b0], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c10], %[c10]\n\t"
                "vpmaddwd %[b1], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c11], %[c11]\n\t"
                "vpbroadcastd 8(%[w]), %[t0]\n\t"
                "vpmaddwd %[b0], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c20], %[c20]\n\t"
                "vpmaddwd %[b1], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c21], %[c21]\n\t"
                "vpbroadcastd 12(%[w]), %[t0]\n\t"
                "vpmaddwd %[b0], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c30], %[c30]\n\t"
                "vpmaddwd %[b1], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c31], %[c31]\n\t"
                "vpbroadcastd 16(%[w]), %[t0]\n\t"
                "vpmaddwd %[b0], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c40], %[c40]\n\t"
                "vpmaddwd %[b1], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c41], %[c41]\n\t"
                "vpbroadcastd 20(%[w]), %[t0]\n\t"
                "vpmaddwd %[b0], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c50], %[c50]\n\t"
                "vpmaddwd %[b1], %[t0], %[t1]\n\t"
                "vpaddd %[t1], %[c51], %[c51]\n\t"
                : [c00] "+x"(c00), [c01] "+x"(c01), [c10] "+x"(c10), [c11] "+x"(c11), [c20] "+x"(c20),
                  [c21] "+x"(c21), [c30] "+x"(c30), [c31] "+x"(c31), [c40] "+x"(c40), [c41] "+x"(c41),
                  [c50] "+x"(c50), [c51] "+x"(c51), [t0] "=&x"(t0), [t1] "=&x"(t1)
                : [b0] "x"(b0), [b1] "x"(b1), [w] "r"(wt + p * TK_Q8_MR),
                  "m"(*(const int32_t (*)[TK_Q8_MR])(wt + p * TK_Q8_MR)));
        }
    }
#define TK_Q8_OUT(i)                                                       \
    _mm256_storeu_si256((__m256i *)(acc + i * TK_Q8_NC), c##i##0);         \
    _mm256_storeu_si256((__m256i *)(acc + i * TK_Q8_NC + 8), c##i##1);
    TK_Q8_OUT(0) TK_Q8_OUT(1) TK_Q8_OUT(2) TK_Q8_OUT(3) TK_Q8_OUT(4) TK_Q8_OUT(5)
#undef TK_Q8_OUT
#else
    for (int i = 0; i < TK_Q8_MR * TK_Q8_NC; i++) acc[i] = 0;
    for (int64_t t = 0; t < taps; t++)
        for (int64_t p = 0; p < npair; p++)
            for (int i = 0; i < TK_Q8_MR; i++) {
                const int16_t *wv = (const int16_t *)(w + (t * npair + p) * TK_Q8_MR + i);
                const int16_t *bv = (const int16_t *)(b + p * plane + off[t]);
                for (int j = 0; j < TK_Q8_NC; j++)
                    acc[i * TK_Q8_NC + j] += (int32_t)wv[0] * bv[2 * j] + (int32_t)wv[1] * bv[2 * j + 1];
            }
#endif
}

/* one channel's 16 sums (acc) stored as the ops define it: v = float32(acc + bias) * mult, then
   max(v, 0) for a float32 output under ReLU, else clamp to [lo, hi] (the output range less the
   zero point, lo = 0 under ReLU), round half to even, + zp. Column j is position q0 + j on rows
   of pw positions of which the first ow are real (q < qend); position (r, c) is element
   at + (r*ow + c)*sq of out. */
static void tk_q8_store(const int32_t *acc, int32_t bias, float mult, int kind, float lo, float hi, int32_t zp,
                        int relu, void *out, int64_t at, int64_t sq, int64_t q0, int64_t qend, int64_t pw,
                        int64_t ow) {
    int32_t vi[TK_Q8_NC];
    float vf[TK_Q8_NC];
    int64_t r0 = q0 / pw, c0 = q0 % pw;
    /* all 16 contiguous in out: within one row, or rows without dropped columns (pw == ow) */
    int whole = (pw == ow || c0 + TK_Q8_NC <= ow) && q0 + TK_Q8_NC <= qend && sq == 1;
#ifdef __AVX2__
    __m256 m = _mm256_set1_ps(mult);
    __m256i bv = _mm256_set1_epi32(bias);
    __m256 v[2];
    for (int h = 0; h < 2; h++) {
        __m256i sum = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(acc + 8 * h)), bv);
        v[h] = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), m);
    }
    if (kind == 0) {
        if (relu) for (int h = 0; h < 2; h++) v[h] = _mm256_max_ps(v[h], _mm256_setzero_ps());
        if (whole) {
            float *y = (float *)out + at + r0 * ow + c0;
            _mm256_storeu_ps(y, v[0]);
            _mm256_storeu_ps(y + 8, v[1]);
            return;
        }
        _mm256_storeu_ps(vf, v[0]);
        _mm256_storeu_ps(vf + 8, v[1]);
    } else {
        __m256i q[2];
        for (int h = 0; h < 2; h++) {
            __m256 c = _mm256_min_ps(_mm256_max_ps(v[h], _mm256_set1_ps(lo)), _mm256_set1_ps(hi));
            q[h] = _mm256_add_epi32(_mm256_cvtps_epi32(c), _mm256_set1_epi32(zp));
        }
        if (whole) {
            /* the values are in the output's range: the saturating packs are exact */
            __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xD8);
            __m128i lo8 = _mm256_castsi256_si128(w16), hi8 = _mm256_extracti128_si256(w16, 1);
            __m128i b8 = kind == 1 ? _mm_packus_epi16(lo8, hi8) : _mm_packs_epi16(lo8, hi8);
            _mm_storeu_si128((__m128i *)((int8_t *)out + at + r0 * ow + c0), b8);
            return;
        }
        _mm256_storeu_si256((__m256i *)vi, q[0]);
        _mm256_storeu_si256((__m256i *)(vi + 8), q[1]);
    }
#else
    for (int j = 0; j < TK_Q8_NC; j++) {
        float v = (float)(int32_t)((uint32_t)acc[j] + (uint32_t)bias) * mult;
        if (kind == 0) vf[j] = relu ? (v > 0.0f ? v : 0.0f) : v;
        else {
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            vi[j] = (int32_t)nearbyintf(v) + zp;
        }
    }
#endif
    int64_t r = r0, c = c0;
    for (int j = 0; j < TK_Q8_NC && q0 + j < qend; j++) {
        if (c < ow) {
            int64_t e = at + (r * ow + c) * sq;
            if (kind == 0) ((float *)out)[e] = vf[j];
            else if (kind == 1) ((uint8_t *)out)[e] = (uint8_t)vi[j];
            else ((int8_t *)out)[e] = (int8_t)vi[j];
        }
        if (++c == pw) { c = 0; r++; }
    }
}

/* C for positions [q0, q1) (tiles of 16 from q0) and every output channel of one group: the
   packed weight wp (og channels), B's words at b (column q at b[... + q - qb]); the channel o's
   results stored at at + o*so (tk_q8_store's geometry) */
static void tk_q8_gemm(const int32_t *wp, int64_t og, const int32_t *b, int64_t qb, int64_t plane,
                       const int64_t *off, int64_t taps, int64_t npair, int64_t q0, int64_t q1, int64_t qend,
                       int64_t pw, int64_t ow, const int32_t *bias, const float *mult, int64_t kind, int64_t lo,
                       int64_t hi, int64_t zp, int64_t relu, void *out, int64_t at, int64_t so, int64_t sq) {
    int32_t acc[TK_Q8_MR * TK_Q8_NC] __attribute__((aligned(32)));
    int64_t panel_words = taps * npair * TK_Q8_MR;
    for (int64_t q = q0; q < q1; q += TK_Q8_NC) {
        for (int64_t o0 = 0; o0 < og; o0 += TK_Q8_MR) {
            tk_q8_tile(wp + (o0 / TK_Q8_MR) * panel_words, b + (q - qb), plane, off, taps, npair, acc);
            int64_t rows = og - o0 < TK_Q8_MR ? og - o0 : TK_Q8_MR;
            for (int64_t i = 0; i < rows; i++)
                tk_q8_store(acc + i * TK_Q8_NC, bias ? bias[o0 + i] : 0, mult[o0 + i], (int)kind, (float)lo,
                            (float)hi, (int32_t)zp, (int)relu, out, at + (o0 + i) * so, sq, q, qend, pw, ow);
        }
    }
}

/* one plane of channel pairs: dst[r*pw + c] = (x[0] - zp, x[1] - zp) at input (r - ph, c - pl), 0
   outside the image (the padding) and in the high half where the pair has no second channel
   (second 0); x: uint8 (is_signed 0) or int8 planes [h, w], the second one after the first */
static void tk_q8_pack_plane(const void *x, int64_t second, int64_t is_signed, int64_t h, int64_t w, int64_t zp,
                             int64_t ph, int64_t pl, int64_t prow, int64_t pw, int32_t *dst) {
    for (int64_t r = 0; r < prow; r++) {
        uint32_t *d = (uint32_t *)dst + r * pw;
        int64_t ih = r - ph;
        if (ih < 0 || ih >= h) {
            for (int64_t c = 0; c < pw; c++) d[c] = 0;
            continue;
        }
        for (int64_t c = 0; c < pl; c++) d[c] = 0;
        for (int64_t c = pl + w; c < pw; c++) d[c] = 0;
        d += pl;
        if (is_signed) {
            const int8_t *s0 = (const int8_t *)x + ih * w, *s1 = s0 + h * w;
            if (second) for (int64_t c = 0; c < w; c++)
                d[c] = (uint32_t)(uint16_t)(int16_t)(s0[c] - zp) | (uint32_t)(uint16_t)(int16_t)(s1[c] - zp) << 16;
            else for (int64_t c = 0; c < w; c++) d[c] = (uint32_t)(uint16_t)(int16_t)(s0[c] - zp);
        } else {
            const uint8_t *s0 = (const uint8_t *)x + ih * w, *s1 = s0 + h * w;
            if (second) for (int64_t c = 0; c < w; c++)
                d[c] = (uint32_t)(uint16_t)(int16_t)(s0[c] - zp) | (uint32_t)(uint16_t)(int16_t)(s1[c] - zp) << 16;
            else for (int64_t c = 0; c < w; c++) d[c] = (uint32_t)(uint16_t)(int16_t)(s0[c] - zp);
        }
    }
}

/* the tap offsets of a stride-1 convolution over planes of width pw: (i*dh)*pw + j*dw */
static void tk_q8_taps(int64_t kh, int64_t kw, int64_t dh, int64_t dw, int64_t pw, int64_t *off) {
    for (int64_t i = 0; i < kh; i++)
        for (int64_t j = 0; j < kw; j++) off[i * kw + j] = i * dh * pw + j * dw;
}

/* a stride-1 convolution's positions [q0, q1) (on the padded width) of one image and group,
   read from its packed planes (npair planes of `plane` words, rows of pw) */
static void tk_q8_conv_direct(const int32_t *wp, int64_t og, const int32_t *img, int64_t plane, int64_t npair,
                              int64_t kh, int64_t kw, int64_t dh, int64_t dw, int64_t q0, int64_t q1, int64_t qend,
                              int64_t pw, int64_t ow, const int32_t *bias, const float *mult, int64_t kind, int64_t lo,
                              int64_t hi, int64_t zp, int64_t relu, void *out, int64_t so) {
    int64_t off[kh * kw];
    tk_q8_taps(kh, kw, dh, dw, pw, off);
    tk_q8_gemm(wp, og, img, 0, plane, off, kh * kw, npair, q0, q1, qend, pw, ow, bias, mult, kind, lo, hi, zp, relu,
               out, 0, so, 1);
}

/* any other convolution's positions [q0, q1) (q = oh*ow + ow, q1 - q0 <= width): each tap's
   pairs gathered from the packed planes into rows of `width` words of the scratch, then the GEMM */
static void tk_q8_conv_gather(const int32_t *wp, int64_t og, const int32_t *img, int64_t plane, int64_t npair,
                              int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t q0,
                              int64_t q1, int64_t p, int64_t pw, int64_t ow, int32_t *scratch, int64_t width,
                              const int32_t *bias, const float *mult, int64_t kind, int64_t lo, int64_t hi, int64_t zp,
                              int64_t relu, void *out, int64_t so) {
    int64_t taps = kh * kw;
    int64_t off[taps];
    for (int64_t t = 0; t < taps; t++) {
        off[t] = t * npair * width;
        int64_t di = (t / kw) * dh, dj = (t % kw) * dw;
        for (int64_t pr = 0; pr < npair; pr++) {
            const int32_t *src = img + pr * plane + di * pw + dj;
            int32_t *row = scratch + off[t] + pr * width;
            /* output row by output row: a loop without a branch per word */
            int64_t r = q0 / ow, c = q0 % ow;
            for (int64_t q = q0; q < q1; r++, c = 0) {
                int64_t n = ow - c < q1 - q ? ow - c : q1 - q;
                const int32_t *s = src + r * sh * pw + c * sw;
                int32_t *d = row + (q - q0);
                if (sw == 1) for (int64_t k = 0; k < n; k++) d[k] = s[k];
                else for (int64_t k = 0; k < n; k++) d[k] = s[k * sw];
                q += n;
            }
        }
    }
    tk_q8_gemm(wp, og, scratch, q0, width, off, taps, npair, q0, q1, p, ow, ow, bias, mult, kind, lo, hi, zp, relu,
               out, 0, so, 1);
}

/* qgemm's rows [m0, m1) of A [m, k] as words of two consecutive k (shifted by zp, the odd k's
   partner 0) into dst[p*width + r - m0], then C for them against all n packed weight rows,
   stored at out[r*n + o] */
static void tk_q8_qgemm_rows(const void *a, int64_t is_signed, int64_t m0, int64_t m1, int64_t m, int64_t k,
                             int64_t zp, int32_t *dst, int64_t width, const int32_t *wp, int64_t n,
                             const int32_t *bias, const float *mult, int64_t kind, int64_t lo, int64_t hi,
                             int64_t yzp, int64_t relu, void *out) {
    int64_t npair = (k + 1) / 2;
    for (int64_t r = m0; r < m1; r++) {
        for (int64_t p = 0; p < npair; p++) {
            int64_t k0 = 2 * p;
            int32_t v0, v1;
            if (is_signed) {
                const int8_t *s = (const int8_t *)a + r * k;
                v0 = s[k0] - zp; v1 = k0 + 1 < k ? s[k0 + 1] - zp : 0;
            } else {
                const uint8_t *s = (const uint8_t *)a + r * k;
                v0 = s[k0] - zp; v1 = k0 + 1 < k ? s[k0 + 1] - zp : 0;
            }
            dst[p * width + (r - m0)] =
                (int32_t)((uint32_t)(uint16_t)(int16_t)v0 | (uint32_t)(uint16_t)(int16_t)v1 << 16);
        }
    }
    int64_t off[1] = {0};
    tk_q8_gemm(wp, n, dst, m0, width, off, 1, npair, m0, m1, m1, m, m, bias, mult, kind, lo, hi, yzp, relu, out, 0,
               1, n);
}

/* the weight [O, Cg, taps] (int8) packed as pack_weight does, for a weight given at run time */
static void tk_q8_pack_weight(const int8_t *w, int64_t groups, int64_t og, int64_t cg, int64_t taps, int32_t *dst) {
    int64_t npair = (cg + 1) / 2, npanel = (og + TK_Q8_MR - 1) / TK_Q8_MR;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t panel = 0; panel < npanel; panel++)
            for (int64_t t = 0; t < taps; t++)
                for (int64_t p = 0; p < npair; p++)
                    for (int64_t i = 0; i < TK_Q8_MR; i++) {
                        int64_t o = panel * TK_Q8_MR + i, c = 2 * p;
                        int16_t v0 = 0, v1 = 0;
                        if (o < og) {
                            const int8_t *src = w + ((g * og + o) * cg) * taps + t;
                            v0 = src[c * taps];
                            if (c + 1 < cg) v1 = src[(c + 1) * taps];
                        }
                        dst[((((g * npanel + panel) * taps + t) * npair + p) * TK_Q8_MR) + i] =
                            (int32_t)((uint32_t)(uint16_t)v0 | (uint32_t)(uint16_t)v1 << 16);
                    }
}

/* depthwise: one (image, channel) plane. The plane is copied shifted by the zero point and
   padded (with 0) into float32 scratch, then each run of 16 outputs of a row sums its taps with
   FMAs: every product (|x - zp| <= 255, |w| <= 128) and every partial sum is an integer below
   2**24 in magnitude for kh*kw <= 514 taps (DW_MAX_TAPS), so float32 holds them exactly and the order of the
   sums does not matter; the sums are converted back to int32 for the store. */
static void tk_q8_dw_plane(const void *x, int64_t is_signed, int64_t h, int64_t w, int64_t zp, const int8_t *wt,
                           int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pl, int64_t dh,
                           int64_t dw, int64_t oh, int64_t ow, float *xpad, const int32_t *bias, const float *mult,
                           int64_t kind, int64_t lo, int64_t hi, int64_t yzp, int64_t relu, void *out) {
    int64_t pw = w + 2 * pl, prow = h + 2 * ph;
    float wf[kh * kw];
    for (int64_t t = 0; t < kh * kw; t++) wf[t] = (float)wt[t];
    for (int64_t r = 0; r < prow; r++) {
        float *d = xpad + r * pw;
        int64_t ih = r - ph;
        if (ih < 0 || ih >= h) { for (int64_t c = 0; c < pw; c++) d[c] = 0.0f; continue; }
        for (int64_t c = 0; c < pl; c++) d[c] = 0.0f;
        for (int64_t c = pl + w; c < pw; c++) d[c] = 0.0f;
        if (is_signed) {
            const int8_t *s = (const int8_t *)x + ih * w;
            for (int64_t c = 0; c < w; c++) d[pl + c] = (float)(s[c] - zp);
        } else {
            const uint8_t *s = (const uint8_t *)x + ih * w;
            for (int64_t c = 0; c < w; c++) d[pl + c] = (float)(s[c] - zp);
        }
    }
    int32_t acc[TK_Q8_NC] __attribute__((aligned(32)));
    int32_t b = bias ? bias[0] : 0;
    for (int64_t r = 0; r < oh; r++) {
        for (int64_t c0 = 0; c0 < ow; c0 += TK_Q8_NC) {
            const float *base = xpad + r * sh * pw + c0 * sw;
#ifdef __AVX2__
            if (sw == 1 && c0 + TK_Q8_NC <= ow) {
                __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
                for (int64_t i = 0; i < kh; i++)
                    for (int64_t j = 0; j < kw; j++) {
                        const float *src = base + i * dh * pw + j * dw;
                        __m256 wv = _mm256_set1_ps(wf[i * kw + j]);
                        s0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(src), s0);
                        s1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(src + 8), s1);
                    }
                _mm256_store_si256((__m256i *)acc, _mm256_cvtps_epi32(s0));
                _mm256_store_si256((__m256i *)(acc + 8), _mm256_cvtps_epi32(s1));
            } else
#endif
            {
                int64_t n = ow - c0 < TK_Q8_NC ? ow - c0 : TK_Q8_NC;
                for (int64_t k = 0; k < n; k++) {
                    float s = 0.0f;
                    for (int64_t i = 0; i < kh; i++)
                        for (int64_t j = 0; j < kw; j++) s += wf[i * kw + j] * base[i * dh * pw + j * dw + k * sw];
                    acc[k] = (int32_t)s;
                }
            }
            tk_q8_store(acc, b, mult[0], (int)kind, (float)lo, (float)hi, (int32_t)yzp, (int)relu, out, r * ow, 1,
                        c0, ow, ow, ow);
        }
    }
}

/* quantize_linear over x[0, n): y = clamp(round_half_even(x / scale), lo, hi) + zp, where lo and hi
   are the output range less zp (ops/quant.py's order: divide, round, clamp, add), NaN to 0 as
   numpy's cast does; kind 1 uint8, 2 int8. A float32 division, not a multiply by 1/scale. */
static void tk_q8_quantize(const float *x, int64_t n, float scale, float lo, float hi, int64_t zp, int64_t kind,
                           void *out) {
    if (kind == 1) {
        uint8_t *y = (uint8_t *)out;
        for (int64_t i = 0; i < n; i++) {
            float v = nearbyintf(x[i] / scale);
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            y[i] = v == v ? (uint8_t)((int32_t)v + (int32_t)zp) : 0;
        }
    } else {
        int8_t *y = (int8_t *)out;
        for (int64_t i = 0; i < n; i++) {
            float v = nearbyintf(x[i] / scale);
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            y[i] = v == v ? (int8_t)((int32_t)v + (int32_t)zp) : 0;
        }
    }
}
"""

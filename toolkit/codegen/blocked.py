"""Convolution kernels for the blocked channel layout (NCHWc, 16 channels a block: one AVX-512
vector), as C functions that generated kernels call (loops.Extern): the loop language cannot
say "keep these 24 vectors in registers", and these tiles live on exactly that.

Dense (``tk_bconv``): a tile is 6 output positions x 4 blocks of 16 output channels, 24
accumulators. Each step of K (an input channel of a tap) broadcasts one input value per
position and loads one 16-wide weight row per output block: the vector lanes run over output
channels, so a 7x7 map keeps every lane busy where a kernel vectorised over positions fills 49
of 64. Positions are found through a table of window origins (``pos_off``), so any stride,
and padding (on a padded copy of the input), share the one tile. The weight is packed once,
when the plan is built: block ob's rows [C/16][taps][16 in][16 out], contiguous. An NCHW
input (an RGB image: 3 channels, a sixteenth of a block) runs through the same tile with blocks
of one channel, [C][taps][1 in][16 out]: its output comes out blocked with no reorder.

Depthwise (``tk_bdw_direct``): one block of 16 channels, 8 (or 4 or 2) positions a tile: per tap one weight
vector and one input vector per position, read straight from the unpadded plane; the positions
whose window crosses the border take one at a time, skipping the taps in the padding.

Both apply the epilogue as they store: + bias, + a residual of the output's layout, ReLU with
NaN kept (numpy's maximum). A plain C form of each (same contract) serves a compiler that does
not target AVX-512; the layout pass only chooses these kernels where the processor has it.
"""
from __future__ import annotations

BLOCK = 16        # channels a block: one float32 AVX-512 vector
TILE_POSITIONS = 6
TILE_BLOCKS = 4

C_SOURCE = r"""
#ifdef __AVX512F__
#include <immintrin.h>
static inline __m512 tk_b_finish(__m512 v, const float *bias, const float *res, int relu) {
    if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias));
    if (res) v = _mm512_add_ps(v, _mm512_loadu_ps(res));
    if (relu) v = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                                       _mm512_max_ps(v, _mm512_setzero_ps()), v);
    return v;
}
/* R positions (xr: their window origins; ``rows`` of them stored) x NO output blocks; w: the
   first block's packed rows, the next blocks ``wstride`` floats apart; y and res: the tile's
   first output, blocks ``ystride`` apart, positions 16 apart. R is 6, or 2 for the last
   positions of a map (a 7x7 map is 8 tiles of 6 and one position, which a 6-tile computes
   six times over) */
#define TK_BCONV_TILE(NO, LANES, R)                                                                \
static inline void tk_bconv_tile##NO##_##LANES##_##R(const float *const *xr, int64_t cbs,         \
        int64_t cb_stride, int64_t taps, const int64_t *tap_off, const float *w, int64_t wstride, \
        float *y, int64_t ystride, int rows, const float *bias, const float *res, int relu) {    \
    __m512 acc[R][NO];                                                                            \
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++)                                          \
        _Pragma("GCC unroll 4") for (int j = 0; j < NO; j++) acc[r][j] = _mm512_setzero_ps();     \
    for (int64_t cb = 0; cb < cbs; cb++) {                                                        \
        for (int64_t t = 0; t < taps; t++) {                                                      \
            const int64_t off = cb * cb_stride + tap_off[t];                                      \
            const float *xp[R];                                                                   \
            _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) xp[r] = xr[r] + off;             \
            for (int ci = 0; ci < LANES; ci++, w += 16) {                                         \
                __m512 wv[NO];                                                                    \
                _Pragma("GCC unroll 4") for (int j = 0; j < NO; j++) wv[j] = _mm512_loadu_ps(w + j * wstride); \
                _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                            \
                    __m512 a = _mm512_set1_ps(xp[r][ci]);                                         \
                    _Pragma("GCC unroll 4") for (int j = 0; j < NO; j++)                          \
                        acc[r][j] = _mm512_fmadd_ps(a, wv[j], acc[r][j]);                         \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
    }                                                                                             \
    _Pragma("GCC unroll 6") for (int r = 0; r < R; r++) {                                        \
        if (r < rows) {                                                                           \
            _Pragma("GCC unroll 4") for (int j = 0; j < NO; j++)                                  \
                _mm512_storeu_ps(y + j * ystride + r * 16,                                        \
                                 tk_b_finish(acc[r][j], bias ? bias + 16 * j : NULL,              \
                                             res ? res + j * ystride + r * 16 : NULL, relu));     \
        }                                                                                         \
    }                                                                                             \
}
TK_BCONV_TILE(1, 16, 6)
TK_BCONV_TILE(2, 16, 6)
TK_BCONV_TILE(3, 16, 6)
TK_BCONV_TILE(4, 16, 6)
TK_BCONV_TILE(1, 16, 2)
TK_BCONV_TILE(2, 16, 2)
TK_BCONV_TILE(3, 16, 2)
TK_BCONV_TILE(4, 16, 2)
TK_BCONV_TILE(1, 1, 6)
TK_BCONV_TILE(2, 1, 6)
TK_BCONV_TILE(3, 1, 6)
TK_BCONV_TILE(4, 1, 6)

/* positions [p_lo, p_hi) x output blocks [ob_lo, ob_hi) of one image. x: the image (or its padded
   copy), channel blocks cb_stride floats apart, each of ``lanes`` channels side by side (16; 1
   for an NCHW input, whose channels are planes: an RGB image into the blocked layout);
   pos_off[p]: position p's window origin in it; tap_off[t]: tap t's offset from the origin; wp:
   the packed weight (every block); y, res: the image's output and residual, blocks ystride
   floats apart; bias: [O] or NULL */
static void tk_bconv(const float *x, const int64_t *pos_off, int64_t p_lo, int64_t p_hi, int64_t cbs,
                     int64_t cb_stride, int64_t lanes, int64_t taps, const int64_t *tap_off, const float *wp,
                     int64_t ob_lo, int64_t ob_hi, float *y, int64_t ystride, const float *bias, const float *res,
                     int relu) {
    const int64_t wstride = cbs * taps * 16 * lanes;
    for (int64_t ob = ob_lo; ob < ob_hi; ob += 4) {
        int no = ob_hi - ob < 4 ? (int)(ob_hi - ob) : 4;
        const float *w = wp + ob * wstride;
        const float *b = bias ? bias + ob * 16 : NULL;
        for (int64_t p = p_lo; p < p_hi; p += 6) {
            int rows = p_hi - p < 6 ? (int)(p_hi - p) : 6;
            const float *xr[6];
            for (int r = 0; r < 6; r++) xr[r] = x + pos_off[p + (r < rows ? r : rows - 1)];
            float *yt = y + ob * ystride + p * 16;
            const float *rt = res ? res + ob * ystride + p * 16 : NULL;
#define TK_BCONV_CALL(NO, LANES, R) \
    tk_bconv_tile##NO##_##LANES##_##R(xr, cbs, cb_stride, taps, tap_off, w, wstride, yt, ystride, rows, b, rt, relu)
#define TK_BCONV_BLOCKS(LANES, R) \
    if (no == 4) TK_BCONV_CALL(4, LANES, R); else if (no == 3) TK_BCONV_CALL(3, LANES, R); \
    else if (no == 2) TK_BCONV_CALL(2, LANES, R); else TK_BCONV_CALL(1, LANES, R);
            if (lanes != 16) { TK_BCONV_BLOCKS(1, 6) }
            else if (rows <= 2) { TK_BCONV_BLOCKS(16, 2) }
            else { TK_BCONV_BLOCKS(16, 6) }
        }
    }
}

/* R positions of a depthwise row whose windows lie inside the plane, from window origin xr[r]
   (tap_off[t]: each tap's offset from it), into yo and its residual ro, 16 floats apart */
#define TK_BDW_TILE(R)                                                                              \
static inline void tk_bdw_tile##R(const float *const *xr, int64_t taps, const int64_t *tap_off,     \
                                  const float *w, float *yo, const float *ro, const float *bias,    \
                                  int relu) {                                                      \
    __m512 acc[R];                                                                                  \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();              \
    for (int64_t t = 0; t < taps; t++) {                                                            \
        __m512 wv = _mm512_loadu_ps(w + t * 16);                                                    \
        const int64_t off = tap_off[t];                                                             \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                        \
            acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(xr[r] + off), wv, acc[r]);                     \
    }                                                                                               \
    _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                            \
        _mm512_storeu_ps(yo + r * 16, tk_b_finish(acc[r], bias, ro ? ro + r * 16 : NULL, relu));   \
}
TK_BDW_TILE(8)
TK_BDW_TILE(4)
TK_BDW_TILE(2)

/* depthwise, one block of 16 channels, straight from the unpadded plane x [H][W][16] into y
   [OH][OW][16]: the positions whose window lies inside the plane take 8 (then 4, then 2) at a
   time without a test (tap_off: each tap's offset from the window's origin; the smaller tiles
   for the inside run's rest, which on a 14x14 map is a third of it), the border's one at a time,
   skipping the taps that fall in the padding */
static void tk_bdw_direct(const float *x, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t sh, int64_t sw,
                          int64_t ph, int64_t pw, int64_t kh, int64_t kw, int64_t dh, int64_t dw,
                          const int64_t *tap_off, const float *w, float *y, const float *bias, const float *res,
                          int relu) {
    const int64_t taps = kh * kw;
    /* ox in [ox_lo, ox_hi): the window's columns all inside */
    int64_t ox_lo = (pw + sw - 1) / sw, ox_hi = (W - 1 + pw - (kw - 1) * dw) / sw + 1;
    if (W - 1 + pw - (kw - 1) * dw < 0) ox_hi = 0;
    if (ox_hi > OW) ox_hi = OW;
    if (ox_lo > ox_hi) ox_lo = ox_hi;
    for (int64_t oy = 0; oy < OH; oy++) {
        const int64_t iy0 = oy * sh - ph;
        const int inside = iy0 >= 0 && iy0 + (kh - 1) * dh < H;
        int64_t ox = 0;
        while (ox < OW) {
            const int64_t run = inside && ox >= ox_lo ? ox_hi - ox : 0;
            if (run >= 2) {
                const int tile = run >= 8 ? 8 : run >= 4 ? 4 : 2;
                const float *xr[8];
                for (int r = 0; r < tile; r++) xr[r] = x + (iy0 * W + (ox + r) * sw - pw) * 16;
                float *yo = y + (oy * OW + ox) * 16;
                const float *ro = res ? res + (oy * OW + ox) * 16 : NULL;
                if (tile == 8) tk_bdw_tile8(xr, taps, tap_off, w, yo, ro, bias, relu);
                else if (tile == 4) tk_bdw_tile4(xr, taps, tap_off, w, yo, ro, bias, relu);
                else tk_bdw_tile2(xr, taps, tap_off, w, yo, ro, bias, relu);
                ox += tile;
                continue;
            }
            __m512 acc = _mm512_setzero_ps();
            const int64_t ix0 = ox * sw - pw;
            for (int64_t ky = 0; ky < kh; ky++) {
                const int64_t iy = iy0 + ky * dh;
                if (iy < 0 || iy >= H) continue;
                for (int64_t kx = 0; kx < kw; kx++) {
                    const int64_t ix = ix0 + kx * dw;
                    if (ix < 0 || ix >= W) continue;
                    acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + (iy * W + ix) * 16),
                                          _mm512_loadu_ps(w + (ky * kw + kx) * 16), acc);
                }
            }
            _mm512_storeu_ps(y + (oy * OW + ox) * 16,
                             tk_b_finish(acc, bias, res ? res + (oy * OW + ox) * 16 : NULL, relu));
            ox++;
        }
    }
}

#else
/* the same contracts in plain C, for a compiler that does not target AVX-512 on this processor */
static inline float tk_b_finish1(float v, const float *bias, const float *res, int l, int relu) {
    if (bias) v += bias[l];
    if (res) v += res[l];
    if (relu && !(v > 0.0f) && v == v) v = 0.0f;      /* numpy: NaN kept, -0 to 0 */
    return v;
}
static void tk_bconv(const float *x, const int64_t *pos_off, int64_t p_lo, int64_t p_hi, int64_t cbs,
                     int64_t cb_stride, int64_t lanes, int64_t taps, const int64_t *tap_off, const float *wp,
                     int64_t ob_lo, int64_t ob_hi, float *y, int64_t ystride, const float *bias, const float *res,
                     int relu) {
    const int64_t wstride = cbs * taps * 16 * lanes;
    for (int64_t ob = ob_lo; ob < ob_hi; ob++)
        for (int64_t p = p_lo; p < p_hi; p++)
            for (int l = 0; l < 16; l++) {
                float acc = 0.0f;
                const float *w = wp + ob * wstride + l;
                for (int64_t cb = 0; cb < cbs; cb++)
                    for (int64_t t = 0; t < taps; t++)
                        for (int ci = 0; ci < lanes; ci++, w += 16)
                            acc += x[pos_off[p] + cb * cb_stride + tap_off[t] + ci] * *w;
                y[ob * ystride + p * 16 + l] = tk_b_finish1(acc, bias ? bias + ob * 16 : NULL,
                                                            res ? res + ob * ystride + p * 16 : NULL, l, relu);
            }
}
static void tk_bdw_direct(const float *x, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t sh, int64_t sw,
                          int64_t ph, int64_t pw, int64_t kh, int64_t kw, int64_t dh, int64_t dw,
                          const int64_t *tap_off, const float *w, float *y, const float *bias, const float *res,
                          int relu) {
    (void)tap_off;
    for (int64_t oy = 0; oy < OH; oy++)
        for (int64_t ox = 0; ox < OW; ox++)
            for (int l = 0; l < 16; l++) {
                float acc = 0.0f;
                for (int64_t ky = 0; ky < kh; ky++) {
                    const int64_t iy = oy * sh - ph + ky * dh;
                    if (iy < 0 || iy >= H) continue;
                    for (int64_t kx = 0; kx < kw; kx++) {
                        const int64_t ix = ox * sw - pw + kx * dw;
                        if (ix < 0 || ix >= W) continue;
                        acc += x[(iy * W + ix) * 16 + l] * w[(ky * kw + kx) * 16 + l];
                    }
                }
                y[(oy * OW + ox) * 16 + l] = tk_b_finish1(acc, bias, res ? res + (oy * OW + ox) * 16 : NULL, l, relu);
            }
}
#endif
"""
